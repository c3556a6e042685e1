# `riverlog serve --workers 2` (issue 31 item 0): one server made of two processes on this
# machine, as one cluster. Worker s0 takes the ports given on the command line; a stream
# created without a replication factor has one replica; leaders spread over both workers;
# rstream finds each stream's worker through Metadata from s0's port; one /metrics answers
# for both workers (a `worker` label on each sample), and s0's management API lists and
# closes a connection held by s1; a plain NATS
# publish on s0's NATS reaches a stream that s1 leads; a SIGKILLed worker is started again
# and serves its streams; SIGTERM stops every worker and the server exits 0. Waits are
# generous polls, never timed assertions.
from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from urllib.parse import quote

import aiohttp
import grpc
import nats
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer
from rstream import amqp_decoder

from _cluster import WAIT_S, metadata, until, values, with_stream
from compat._raw import RawPeer
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc
from riverlog.protocol.rabbitmq_stream import frames as f

GUEST = {"username": "guest", "password": "guest"}
STREAMS = [f"w{i}" for i in range(6)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(data: str, ports: dict[str, int]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "riverlog", "serve", "--workers", "2", "-d", data,
         "--stream-port", str(ports["stream"]), "--port", str(ports["grpc"]),
         "--nats-port", str(ports["nats"]), "--metrics-port", str(ports["metrics"]),
         "--management-port", str(ports["management"]), "--raft-bootstrap-seed"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def read_workers(proc: subprocess.Popen) -> dict[str, dict[str, str]]:
    """The workers' table printed before the "riverlog serving" line: id -> column -> value."""
    lines = []
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, f"serve ended: {proc.wait()} {proc.stderr.read()[-2000:]}"
        if line.startswith("riverlog serving"):
            break
        lines.append(line.rstrip())
    head = [h.strip() for h in lines[0].split("  ") if h]
    return {cells[0]: dict(zip(head, cells)) for cells in (li.split() for li in lines[1:])}


async def management(ports: dict[str, int], method: str, path: str):
    """``method path`` on worker s0's management API as guest: the JSON answer of a 200,
    else the status."""
    guest = base64.b64encode(b"guest:guest").decode()
    async with aiohttp.ClientSession(headers={"Authorization": f"Basic {guest}"}) as session:
        async with session.request(method, f"http://127.0.0.1:{ports['management']}{path}",
                                   timeout=aiohttp.ClientTimeout(total=30)) as answer:
            return await answer.json() if answer.status == 200 else answer.status


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def leaders(address: str) -> dict[str, tuple[str, int]]:
    """stream -> (leader, replica count) in ``address``'s FetchMetadata, once it lists all
    of STREAMS."""
    async def listed():
        meta = await metadata(address)
        if meta is None:
            return None
        found = {s.name: list(s.partitions.values())[0] for s in meta.streamMetadata}
        if not all(n in found and found[n].leader for n in STREAMS):
            return None
        return {n: (found[n].leader, len(found[n].replicas)) for n in STREAMS}
    return await until("every stream listed with a leader", listed)


async def test_two_workers_serve_as_one_server(tmp_path):
    ports = {k: free_port() for k in ("stream", "grpc", "nats", "metrics", "management")}
    proc = start(str(tmp_path / "data"), ports)
    try:
        rows = read_workers(proc)
        assert sorted(rows) == ["s0", "s1"]
        assert rows["s0"]["RabbitMQ Stream"] == f"127.0.0.1:{ports['stream']}"
        assert rows["s0"]["NATS"] == f"127.0.0.1:{ports['nats']}"
        assert rows["s0"]["management"] == f"127.0.0.1:{ports['management']}"
        grpc_at = f"127.0.0.1:{ports['grpc']}"

        async with Producer("127.0.0.1", ports["stream"], **GUEST) as producer:
            for name in STREAMS:
                await producer.create_stream(name)
        placed = await leaders(grpc_at)
        assert {count for _, count in placed.values()} == {1}, placed  # one replica each
        assert {leader for leader, _ in placed.values()} == {"s0", "s1"}, placed

        # rstream sends each stream's messages to its worker (Metadata), reads them back
        async with Producer("127.0.0.1", ports["stream"], **GUEST) as producer:
            for name in STREAMS:
                for i in range(5):
                    await producer.send_wait(name, AMQPMessage(body=f"{name}-{i}".encode()))
        for name in STREAMS:
            got: list[bytes] = []
            done = asyncio.Event()

            async def on_message(message, context, got=got, done=done):
                got.append(bytes(message.body))
                if len(got) == 5:
                    done.set()
            async with Consumer("127.0.0.1", ports["stream"], **GUEST) as consumer:
                await consumer.start()
                await consumer.subscribe(name, on_message, decoder=amqp_decoder,
                                         offset_specification=ConsumerOffsetSpecification(
                                             OffsetType.FIRST))
                await asyncio.wait_for(done.wait(), WAIT_S)
            assert got == [f"{name}-{i}".encode() for i in range(5)]

        # one /metrics, on the port given, for both workers: each sample names its worker
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics']}/metrics",
                                    timeout=30) as answer:
            text = answer.read().decode()
        assert 'riverlog_worker_up{worker="s0"} 1.0' in text
        assert 'riverlog_worker_up{worker="s1"} 1.0' in text
        for name, (leader, _) in placed.items():  # counted by the worker leading it
            assert (f'riverlog_published_messages_total{{door="rabbitmq_stream",'
                    f'stream="{name}",vhost="/",worker="{leader}"}} 5.0') in text, name

        # one management API: s0 lists and closes a connection (and its publisher) of s1
        s1_stream = next(n for n, (leader, _) in placed.items() if leader == "s1")
        s1_host, s1_port = rows["s1"]["RabbitMQ Stream"].rsplit(":", 1)
        peer = await RawPeer.open(s1_host, int(s1_port))
        try:
            answer = await peer.request(f.DeclarePublisher(peer.next_corr(), 7, "ref",
                                                           s1_stream))
            assert answer.response_code == 1
            listed = await management(ports, "GET", "/api/connections")
            (name,) = [c["name"] for c in listed if c["name"].endswith(f":{s1_port}")]
            publishers = await management(ports, "GET", "/api/stream/publishers")
            assert [p["queue"]["name"] for p in publishers if p["publisher_id"] == 7] == \
                [s1_stream]
            one = await management(ports, "GET", f"/api/connections/{quote(name, safe='')}")
            assert one["name"] == name
            assert await management(ports, "DELETE",
                                    f"/api/connections/{quote(name, safe='')}") == 204
            assert await peer.wait_closed(WAIT_S) is not None
        finally:
            peer.close()
        assert await management(ports, "GET", "/api/connections/nosuch") == 404

        # a Liftbridge stream led by s1 takes a plain NATS publish made on s0's NATS
        async with grpc.aio.insecure_channel(grpc_at) as channel:
            api = api_pb2_grpc.APIStub(channel)
            for i in range(6):
                await api.CreateStream(pb.CreateStreamRequest(
                    subject=f"lb.{i}", name=f"lb{i}", partitions=1, replicationFactor=1))
        meta = await until("the Liftbridge streams", lambda: with_stream(grpc_at, "lb5"))
        on_s1 = sorted(s.name for s in meta.streamMetadata if s.name.startswith("lb")
                       and list(s.partitions.values())[0].leader == "s1")
        assert on_s1, "no Liftbridge stream led by s1"
        nc = await nats.connect(f"nats://127.0.0.1:{ports['nats']}")
        try:
            await nc.publish(f"lb.{on_s1[0][2:]}", b"plain through s0")
            await nc.flush()
        finally:
            await nc.drain()
        assert await values(rows["s1"]["Liftbridge gRPC"], on_s1[0], 0) == [b"plain through s0"]

        # a SIGKILLed worker is started again and serves its streams
        os.kill(int(rows["s1"]["pid"]), signal.SIGKILL)

        async def read_again():
            try:
                return await asyncio.wait_for(
                    values(rows["s1"]["Liftbridge gRPC"], s1_stream, 4), 10)
            except (grpc.aio.AioRpcError, asyncio.TimeoutError):  # s1 not serving yet
                return None
        got = await until("s1 serving again", read_again)
        assert len(got) == 5
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(WAIT_S)
    assert code == 0, proc.stderr.read()[-2000:]
    assert not alive(int(rows["s0"]["pid"]))
    assert "worker s1 exited with code -9" in proc.stderr.read()
