# What one gRPC client may cost the others on the Liftbridge gRPC door's h2 transport (issue
# 15, items 11 and 13): memory before login is bounded by HTTP/2's initial window and a
# handshake timeout; a subscriber holds at most one small read's serialized messages while
# its client is slow, and what subscribers held goes back to the OS when they end. Real
# server in this process (_sec.running), real grpcio clients in another process (their
# memory is not the server's) and raw HTTP/2 clients built with `h2`; memory is this
# process's resident set (_memory), with bounds far from both outcomes.
from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys

import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions

from _memory import MIB, peak_growth, rss
from _sec import PASSWORDS, running, security
from riverlog.config import SecurityConfig
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc

HERE = os.path.dirname(os.path.abspath(__file__))


async def publish(app, stream: str, messages: int, size: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
        stub = api_pb2_grpc.APIStub(channel)
        await stub.CreateStream(pb.CreateStreamRequest(name=stream, subject=stream), timeout=10)
        call = stub.PublishAsync(timeout=30)
        value = os.urandom(size)
        for i in range(messages):
            await call.write(pb.PublishRequest(stream=stream, value=value, correlationId=str(i),
                                               ackPolicy=pb.AckPolicy.LEADER))
        for _ in range(messages):
            await call.read()
        await call.done_writing()


async def line(proc: asyncio.subprocess.Process) -> str:
    return (await asyncio.wait_for(proc.stdout.readline(), 120)).decode().strip()


async def test_subscribers_memory_is_bounded_and_released(tmp_path):
    """Item 13: 2,000 Subscribe calls of 100 KB messages whose clients did not read took the
    server from 99 MB to 1,147 MB, and 1,150 MB after they cancelled. Here 300 of them."""
    async with running(tmp_path, SecurityConfig()) as app:
        await publish(app, "wide", 20, 100_000)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, os.path.join(HERE, "_subscribers.py"), f"127.0.0.1:{app.grpc.port}",
            "wide", "300", "6", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            start = rss()
            with peak_growth() as peak:
                assert await line(proc) == "ready"
                await asyncio.sleep(1)  # the server pushes what the clients' windows take
            proc.stdin.write(b"\n")
            assert await line(proc) == "cancelled"
            for _ in range(100):  # every call ended on the server
                if not app.liftbridge.subscribers:
                    break
                await asyncio.sleep(0.05)
            # memory.RELEASE_INTERVAL_S, and the release itself: slower on a loaded machine
            for _ in range(60):
                await asyncio.sleep(0.5)
                kept = rss() - start
                if kept < 100 * MIB:
                    break
        finally:
            proc.stdin.close()
            await proc.wait()
    # before: peak +593 MiB, kept +508 MiB; now about +160 and +30
    assert peak.growth < 300 * MIB, f"300 subscribers took {peak.growth / MIB:.0f} MiB"
    assert kept < 100 * MIB, f"{kept / MIB:.0f} MiB kept after 300 subscribers cancelled"


async def park(port: int, metadata: list[tuple[str, str]], size: int = 4 * MIB):
    """A raw HTTP/2 client (`h2`): start a Publish call with ``metadata`` and send as much of a
    ``size``-byte message as the server's windows let, until it lets no more for 0.5 s or
    ends the call. Returns (bytes sent, the call's grpc-status or None, the open writer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                header_encoding="utf-8"))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"),
                            (":path", "/proto.API/Publish"), (":authority", "riverlog"),
                            ("content-type", "application/grpc"), ("te", "trailers"),
                            *metadata])
    data = b"\x00" + size.to_bytes(4, "big") + bytes(16384)  # the message's first frame
    sent, status, open_ = 0, None, True
    while True:
        writer.write(conn.data_to_send())
        await writer.drain()
        room = 0
        if open_:
            try:
                room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
            except h2.exceptions.StreamClosedError:
                open_ = False
        if room > 0:
            conn.send_data(sid, data[:room])
            sent += room
            data = bytes(16384)
            continue
        try:
            received = await asyncio.wait_for(reader.read(65536), 0.5)
        except asyncio.TimeoutError:
            return sent, status, writer
        if not received:
            return sent, status, writer
        for event in conn.receive_data(received):
            if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                status = dict(event.headers).get("grpc-status", status)
            elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                open_ = False


async def test_memory_before_login_is_bounded(tmp_path, users):
    """Item 11: each HTTP/2 connection without credentials could park ~8 MiB of a partial
    60 MiB message, with no timeout (40 connections: +334 MB). Now a call is authenticated
    when its headers arrive: refused at once (UNAUTHENTICATED), having sent at most the
    initial 64 KiB window; a connection with no accepted call is closed. (A message over
    the 4 MiB limit, GrpcConfig.max_message_bytes, is refused from its length prefix
    alone, RESOURCE_EXHAUSTED; the parked messages here are 4 MiB, the largest taken.)"""
    async with running(tmp_path, security(users), grpc={"handshake_timeout_ms": 500}) as app:
        port = app.grpc.port
        with peak_growth() as peak:
            parked = await asyncio.gather(*(park(port, []) for _ in range(20)))
        for _, _, writer in parked:
            writer.close()
        assert peak.growth < 32 * MIB, f"20 connections before login took " \
                                       f"{peak.growth / MIB:.0f} MiB"
        assert [(sent <= 65535, status) for sent, status, _ in parked] == [(True, "16")] * 20

        # credentials that pass: the connection's windows open for the whole message
        token = base64.b64encode(f"alice:{PASSWORDS['alice']}".encode()).decode()
        sent, status, writer = await park(port, [("authorization", f"Basic {token}")],
                                          size=3 * MIB)
        writer.close()
        assert sent == 3 * MIB + 5 and status is None  # the whole message, then still waiting

        # a connection that sends nothing is closed after the handshake timeout
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while await asyncio.wait_for(reader.read(65536), 10):
                pass  # the server's SETTINGS, then GOAWAY, then the end
        finally:
            writer.close()
