"""Issue 24's attacks by one logged-in user, measured on another user (security_bench.py
--attacks runs this; run alone as ``security_attacks.py ATTACK GRPC_ADDR STREAM_PORT
SECONDS`` it is the attacker process).

A `riverlog serve` process with authorization on and two users: ``attacker`` (every right
on streams ``att*``) and ``canary`` (on ``canary*``). The canary, in this process, publishes
over gRPC every 10 ms (Publish, ack policy LEADER: the time to its ack), consumes the same
stream (Subscribe) and asks FetchMetadata for one stream every 10 ms, while the attacker, in
its own process, runs one attack for the given seconds. Per attack: canary publish p99 and
FetchMetadata p99 (ms), messages the consumer had not received 2 s after the attack, the
attacker's completed requests, and the server's RSS growth (peak, sampled every 100 ms).
"""
from __future__ import annotations

import asyncio
import base64
import os
import shutil
import subprocess
import sys
import tempfile
import time

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE]

import security_bench  # noqa: E402

from riverlog.client.async_client import AsyncClient  # noqa: E402
from riverlog.protocol.liftbridge import api_pb2 as pb  # noqa: E402
from riverlog.protocol.liftbridge import api_pb2_grpc  # noqa: E402
from riverlog.protocol.rabbitmq_stream import frames as f  # noqa: E402
from riverlog.security.users import hash_password  # noqa: E402

PASSWORDS = {"attacker": "attacker-pw", "canary": "canary-pw"}
ATTACKS = ("fetch-metadata-10k", "fetch-metadata-200k", "rabbitmq-metadata-1k",
           "cursor-bomb", "rapid-reset", "large-publish", "publish-to-read-only")
MIB = 1024 * 1024


def basic(user: str) -> tuple[tuple[str, str]]:
    token = base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
    return (("authorization", f"Basic {token}"),)


def config(work: str) -> str:
    path = os.path.join(work, "attacks.yaml")
    security_bench.write_config(path, {user: hash_password(pw, 4)
                                       for user, pw in PASSWORDS.items()},
                                [["attacker", "att*", "*"], ["canary", "canary*", "*"]])
    return path


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


# -- the attacker ---------------------------------------------------------------------------
async def _loop(seconds: float, step) -> int:
    """Run ``await step()`` until ``seconds`` pass; the steps that completed."""
    done = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            await step()
        except grpc.aio.AioRpcError:
            pass
        done += 1
    return done


async def rapid_reset(host: str, port: int, seconds: float) -> int:
    """Open and reset streams as fast as the socket takes them, reconnecting whenever the
    server ends the connection. Returns the connections it ended."""
    ended = 0
    end = time.monotonic() + seconds
    headers = [(":method", "POST"), (":scheme", "http"), (":path", "/proto.API/FetchMetadata"),
               (":authority", "riverlog"), ("content-type", "application/grpc"),
               ("te", "trailers"), *basic("attacker")]
    while time.monotonic() < end:
        reader, writer = await asyncio.open_connection(host, port)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                    header_encoding="utf-8"))
        conn.initiate_connection()
        try:
            while time.monotonic() < end:
                for _ in range(100):
                    sid = conn.get_next_available_stream_id()
                    conn.send_headers(sid, headers)
                    conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
                writer.write(conn.data_to_send())
                await writer.drain()
                try:
                    data = await asyncio.wait_for(reader.read(65536), 0.001)
                except asyncio.TimeoutError:
                    continue
                if not data or any(isinstance(e, h2.events.ConnectionTerminated)
                                   for e in conn.receive_data(data)):
                    ended += 1
                    break
        except (ConnectionError, h2.exceptions.ProtocolError):
            ended += 1
        finally:
            writer.close()
    return ended


async def attack(name: str, grpc_addr: str, stream_port: int, seconds: float) -> int:
    who = basic("attacker")
    async with grpc.aio.insecure_channel(grpc_addr, options=[
            ("grpc.max_send_message_length", 128 * MIB)]) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        if name.startswith("fetch-metadata"):
            count = 10_000 if name.endswith("10k") else 200_000
            request = pb.FetchMetadataRequest(streams=[f"att{i}" for i in range(count)])
            return await _loop(seconds, lambda: stub.FetchMetadata(request, metadata=who,
                                                                   timeout=30))
        if name == "rabbitmq-metadata-1k":
            client = await AsyncClient.connect("127.0.0.1", stream_port, "attacker",
                                               PASSWORDS["attacker"])
            names = tuple(f"att{i}" for i in range(1000))
            try:
                return await _loop(seconds, lambda: client._request(
                    lambda corr: f.Metadata(corr, names)))
            finally:
                await client.close()
        if name == "cursor-bomb":
            ids = iter(range(10**9))
            pad = "x" * 240
            return await _loop(seconds, lambda: stub.SetCursor(pb.SetCursorRequest(
                stream="att", cursorId=f"{pad}{next(ids):015d}", offset=1), metadata=who,
                timeout=30))
        if name == "rapid-reset":
            host, _, port = grpc_addr.rpartition(":")
            return await rapid_reset(host, int(port), seconds)
        if name == "large-publish":
            big = pb.PublishRequest(stream="att", value=bytes(60 * MIB))

            async def three():
                await asyncio.gather(*(stub.Publish(big, metadata=who, timeout=30)
                                       for _ in range(3)), return_exceptions=True)
            return await _loop(seconds, three)
        if name == "publish-to-read-only":
            request = pb.PublishToSubjectRequest(subject="att.ro", value=b"x",
                                                 ackPolicy=pb.AckPolicy.LEADER)
            return await _loop(seconds, lambda: stub.PublishToSubject(request, metadata=who,
                                                                      timeout=5))
    raise SystemExit(f"unknown attack {name}")


# -- the canary -----------------------------------------------------------------------------
def p99(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * 0.99))] * 1000 if values else 0.0


class Canary:
    """Publishes, consumes and asks metadata as ``canary`` until ``stop``."""

    def __init__(self, grpc_addr: str) -> None:
        self.addr = grpc_addr
        self.publish: list[float] = []
        self.metadata: list[float] = []
        self.sent = self.received = 0
        self.running = True

    async def _publisher(self, stub) -> None:
        while self.running:
            started = time.perf_counter()
            try:
                await stub.Publish(pb.PublishRequest(stream="canary", value=b"c" * 100,
                                                     ackPolicy=pb.AckPolicy.LEADER),
                                   metadata=basic("canary"), timeout=10)
                self.sent += 1
            except grpc.aio.AioRpcError:
                pass
            self.publish.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)

    async def _metadata(self, stub) -> None:
        while self.running:
            started = time.perf_counter()
            try:
                await stub.FetchMetadata(pb.FetchMetadataRequest(streams=["canary"]),
                                         metadata=basic("canary"), timeout=10)
            except grpc.aio.AioRpcError:
                pass
            self.metadata.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)

    async def _consumer(self, stub) -> None:
        call = stub.Subscribe(pb.SubscribeRequest(
            stream="canary", startPosition=pb.StartPosition.NEW_ONLY), metadata=basic("canary"))
        async for _ in call:
            self.received += 1

    def window(self) -> None:
        self.publish, self.metadata = [], []

    async def run(self) -> list[asyncio.Task]:
        loop = asyncio.get_running_loop()
        channels = [grpc.aio.insecure_channel(self.addr) for _ in range(3)]
        self.channels = channels
        stubs = [api_pb2_grpc.APIStub(c) for c in channels]
        tasks = [loop.create_task(self._consumer(stubs[2]))]
        await asyncio.sleep(0.5)
        tasks += [loop.create_task(self._publisher(stubs[0])),
                  loop.create_task(self._metadata(stubs[1]))]
        return tasks


async def measure(server: security_bench.Server, seconds: float,
                  attacks: tuple[str, ...]) -> list[tuple]:
    stub = api_pb2_grpc.APIStub(grpc.aio.insecure_channel(server.grpc_addr))
    for name, subject, who in (("canary", "canary", "canary"), ("att", "att", "attacker"),
                               ("att.ro", "att.ro", "attacker")):
        await stub.CreateStream(pb.CreateStreamRequest(name=name, subject=subject),
                                metadata=basic(who), timeout=10, wait_for_ready=True)
    await stub.SetStreamReadonly(pb.SetStreamReadonlyRequest(name="att.ro", readonly=True),
                                 metadata=basic("attacker"), timeout=10)
    canary = Canary(server.grpc_addr)
    tasks = await canary.run()
    rows = []
    for name in ("none",) + attacks:
        await asyncio.sleep(1)
        canary.window()
        base = peak = rss(server.proc.pid)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, os.path.abspath(__file__), name, server.grpc_addr,
            str(server.stream_port), str(seconds), stdout=subprocess.PIPE) \
            if name != "none" else None
        end = time.monotonic() + seconds
        while (proc is not None and proc.returncode is None) or time.monotonic() < end:
            peak = max(peak, rss(server.proc.pid))
            await asyncio.sleep(0.1)
            if proc is not None and time.monotonic() > end + 120:
                proc.kill()
        done = int((await proc.stdout.read()).strip() or 0) if proc is not None else 0
        if proc is not None:
            await proc.wait()
        publish, metadata = list(canary.publish), list(canary.metadata)
        await asyncio.sleep(2)
        rows.append((name, p99(publish), p99(metadata), canary.sent - canary.received,
                     done, (peak - base) / MIB))
    canary.running = False
    for task in tasks:
        task.cancel()
    for channel in canary.channels:
        await channel.close()
    return rows


def main(seconds: float, only: list[str] | None = None) -> None:
    """Print the table for ``only`` those attacks (default: every one of ATTACKS)."""
    work = tempfile.mkdtemp(prefix="security-attacks-")
    server = None
    try:
        server = security_bench.Server(work, "attacks", config(work))
        rows = asyncio.run(measure(server, seconds, tuple(only or ATTACKS)))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'attack':24s} {'publish p99 ms':>15s} {'metadata p99 ms':>16s} "
          f"{'not consumed':>13s} {'attacker ops':>13s} {'RSS +MiB':>9s}")
    for name, pub, meta, missing, done, grown in rows:
        print(f"{name:24s} {pub:15.1f} {meta:16.1f} {missing:13d} {done:13d} {grown:9.1f}")


if __name__ == "__main__":
    print(asyncio.run(attack(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))))
