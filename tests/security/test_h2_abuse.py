# Abuse of the gRPC door's HTTP/2 transport by a logged-in client (issue 24): HTTP/2 rapid
# reset (CVE-2023-44487) gets GOAWAY ENHANCE_YOUR_CALM as nghttp2 answers it, and a request
# over the maximum message size is refused at once with RESOURCE_EXHAUSTED. Real server in
# this process (_sec.running) with authorization on; a raw HTTP/2 client built with `h2`
# over a socket and real grpcio clients.
from __future__ import annotations

import asyncio
import base64
import time

import grpc

import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest

from _memory import MIB
from _sec import PASSWORDS, basic, running, security, status_of
from riverlog.protocol.grpc_h2 import (H2_RUN, RESET_BURST, GrpcH2Connection, ProtocolError,
                                       ResetBudget)
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc


class RawClient:
    """An HTTP/2 client (`h2`) logged in as alice: opens calls and resets them."""

    def __init__(self, reader, writer) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        token = base64.b64encode(f"alice:{PASSWORDS['alice']}".encode()).decode()
        self.headers = [(":method", "POST"), (":scheme", "http"),
                        (":path", "/proto.API/FetchMetadata"), (":authority", "riverlog"),
                        ("content-type", "application/grpc"), ("te", "trailers"),
                        ("authorization", f"Basic {token}")]
        self.terminated: h2.events.ConnectionTerminated | None = None

    async def open_and_reset(self, count: int) -> None:
        for i in range(count):
            sid = self.conn.get_next_available_stream_id()
            self.conn.send_headers(sid, self.headers)
            self.conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
            if i % 100 == 99:
                await self.flush()
        await self.flush()

    async def flush(self) -> None:
        self.writer.write(self.conn.data_to_send())
        await self.writer.drain()

    async def read(self, quiet: float) -> bool:
        """Read what the server sends until it is quiet for ``quiet`` seconds (True) or
        closes the connection (False)."""
        while True:
            try:
                data = await asyncio.wait_for(self.reader.read(65536), quiet)
            except asyncio.TimeoutError:
                return True
            if not data:
                return False
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.ConnectionTerminated):
                    self.terminated = event
            await self.flush()


async def test_rapid_reset_gets_goaway_enhance_your_calm(tmp_path, users):
    """20,000 opens and resets in 3.2 s drew no GOAWAY before, and stalled the loop. The
    budget is per client host, across its connections."""
    async with running(tmp_path, security(users)) as app:
        client = RawClient(*await asyncio.open_connection("127.0.0.1", app.grpc.port))
        try:
            await client.open_and_reset(RESET_BURST // 2)  # within the allowance: served
            assert await client.read(0.5) and client.terminated is None
            await client.open_and_reset(RESET_BURST)
            open_ = True
            for _ in range(50):
                open_ = await client.read(0.2)
                if not open_ or client.terminated is not None:
                    break
            assert client.terminated is not None, "no GOAWAY after a flood of resets"
            assert client.terminated.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
            for _ in range(50):
                if not open_:
                    break
                open_ = await client.read(0.2)
            assert not open_, "the connection stayed open after GOAWAY"
        finally:
            client.writer.close()
        # reconnecting does not bring a fresh budget: half of one ends it again (the budget
        # refills at RESET_RATE a second, far fewer in the time this takes)
        again = RawClient(*await asyncio.open_connection("127.0.0.1", app.grpc.port))
        try:
            await again.open_and_reset(RESET_BURST // 2)
            for _ in range(50):
                if not await again.read(0.2) or again.terminated is not None:
                    break
            assert again.terminated is not None
            assert again.terminated.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        finally:
            again.writer.close()
        # a client that does not reset streams is served as before
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
            await api_pb2_grpc.APIStub(channel).FetchMetadata(
                pb.FetchMetadataRequest(), metadata=basic("alice"), timeout=10)


async def test_a_request_over_the_maximum_size_is_refused_at_once(tmp_path, users):
    """A Publish of 8-60 MB hung until the client's deadline before."""
    async with running(tmp_path, security(users)) as app, \
            grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
        stub = api_pb2_grpc.APIStub(channel)
        alice = basic("alice")
        for size in (5 * MIB, 9 * MIB, 60 * MIB):
            started = time.monotonic()
            assert await status_of(stub.Publish(pb.PublishRequest(
                stream="orders.eu", value=bytes(size)), metadata=alice, timeout=60)) == \
                grpc.StatusCode.RESOURCE_EXHAUSTED, size
            assert time.monotonic() - started < 20, size
        await stub.FetchMetadata(pb.FetchMetadataRequest(), metadata=alice, timeout=10)


async def test_a_message_larger_than_the_connection_window_is_taken(tmp_path, users):
    """With the maximum message size raised past the 8 MiB connection window, a 9-20 MiB
    Publish hung until the client's deadline before: the connection window was spent on
    the message's first 8 MiB and given back only once the whole message was in."""
    async with running(tmp_path, security(users), grpc={"max_message_bytes": 12 * MIB,
                                                   "replication_max_bytes": 12 * MIB}) as app, \
            grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}", options=[
                ("grpc.max_send_message_length", 64 * MIB)]) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        await stub.CreateStream(pb.CreateStreamRequest(name="orders.eu", subject="orders.eu"),
                                metadata=basic("ops"), timeout=10)
        for size in (9 * MIB, 11 * MIB):
            ack = (await stub.Publish(pb.PublishRequest(
                stream="orders.eu", value=bytes(size), ackPolicy=pb.AckPolicy.LEADER),
                metadata=basic("alice"), timeout=30)).ack
            assert ack.stream == "orders.eu"
        # three big calls at once and a small one on the same connection: none waits
        big = [stub.Publish(pb.PublishRequest(stream="orders.eu", value=bytes(9 * MIB)),
                            metadata=basic("alice"), timeout=30) for _ in range(3)]
        small = stub.FetchMetadata(pb.FetchMetadataRequest(), metadata=basic("alice"),
                                   timeout=30)
        await asyncio.gather(small, *big)
        assert await status_of(stub.Publish(pb.PublishRequest(
            stream="orders.eu", value=bytes(13 * MIB)), metadata=basic("alice"),
            timeout=30)) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_flood_past_the_budget_is_parsed_only_a_little():
    """h2 parses all it is handed before its events are seen: a 256 KiB read of ~2,500
    HEADERS+RST_STREAM pairs was parsed whole (~0.2 s) before the budget's GOAWAY. Now at
    most H2_RUN frames go to h2 at once, so it stops soon after the budget is spent."""
    server = GrpcH2Connection(4 * MIB)
    server.resets = ResetBudget(clock=lambda: 0.0)  # no refill: time stands still
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                  header_encoding="utf-8"))
    client.initiate_connection()
    client.receive_data(server.data_to_send())
    headers = [(":method", "POST"), (":scheme", "http"), (":path", "/proto.API/FetchMetadata"),
               (":authority", "riverlog"), ("content-type", "application/grpc")]
    for _ in range(RESET_BURST + 2000):
        sid = client.get_next_available_stream_id()
        client.send_headers(sid, headers)
        client.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
    with pytest.raises(ProtocolError, match="rapid reset"):
        server.receive(client.data_to_send())
    parsed = server.h2.highest_inbound_stream_id // 2 + 1  # client streams are odd
    assert RESET_BURST < parsed <= RESET_BURST + H2_RUN < RESET_BURST + 2000, parsed
