"""Liftbridge doors of riverlog side by side with NATS JetStream, on one nats-server.

Starts one nats-server with JetStream (file storage, in a temporary folder), a `riverlog serve`
connected to it with --nats-servers, and measures in one run, with the same message size and
the same number of messages in flight:

  plain NATS ingest      nats-py publishes plain messages on a stream's subject; the time
                         until riverlog has stored (committed) the last one
  envelope, LEADER acks  nats-py publishes enveloped Messages with an ack inbox, at most
                         --window unacknowledged; every ack received
  gRPC PublishAsync      one PublishAsync call (grpc.aio client) sending every message; every
                         PublishResponse received
  JetStream              nats-py js.publish_async to a file-storage stream (R1), at most
                         --window unacknowledged; every PubAck received

Acks mean the same on both sides: the message was appended (riverlog --durability interval
fsyncs within 200 ms; JetStream file storage syncs every 2 minutes by default). The clients
run in this process, so on a small machine client and servers share the CPU: compare the
ratios, not the absolute numbers, with other machines.

    .venv/bin/python benchmarks/liftbridge_bench.py [--messages 50000] [--size 256]
        [--window 256] [--durability interval]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import grpc
import nats

from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc
from riverlog.protocol.liftbridge.envelope import decode_ack, encode_publish
from riverlog.server.embedded_nats import find_nats_server

BANNER = re.compile(r"Liftbridge gRPC: (\S+:\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


async def bench_jetstream(url: str, n: int, payload: bytes, window: int) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=window)
    await js.add_stream(name="BENCH", subjects=["js.bench"], storage="file")
    start = time.perf_counter()
    futures = []
    for _ in range(n):
        futures.append(await js.publish_async("js.bench", payload))
    await asyncio.gather(*futures)
    elapsed = time.perf_counter() - start
    info = await js.stream_info("BENCH")
    assert info.state.messages == n, info.state
    await js.delete_stream("BENCH")
    await nc.close()
    return n / elapsed


async def wait_stored(stub, stream: str, last: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        meta = await stub.FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(stream=stream))
        if meta.metadata.highWatermark >= last:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{stream}: {meta.metadata.highWatermark + 1} of {last + 1} stored")
        await asyncio.sleep(0.005)


async def bench_plain(url: str, stub, n: int, payload: bytes) -> float:
    await stub.CreateStream(pb.CreateStreamRequest(name="plain", subject="lb.plain"))
    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    start = time.perf_counter()
    for _ in range(n):
        await nc.publish("lb.plain", payload)
    await nc.flush()
    await wait_stored(stub, "plain", n - 1)
    elapsed = time.perf_counter() - start
    await nc.close()
    return n / elapsed


async def bench_envelope(url: str, stub, n: int, payload: bytes, window: int) -> float:
    await stub.CreateStream(pb.CreateStreamRequest(name="env", subject="lb.env"))
    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    prefix = nc.new_inbox()
    slots = asyncio.Semaphore(window)
    done = asyncio.Event()
    acked = 0

    async def on_ack(msg) -> None:
        nonlocal acked
        ack = decode_ack(msg.data)
        assert ack is not None and ack.ackError == pb.Ack.Error.OK, ack
        acked += 1
        slots.release()
        if acked == n:
            done.set()

    await nc.subscribe(prefix, cb=on_ack)
    frames = [encode_publish(pb.Message(value=payload, ackInbox=prefix, correlationId=str(i)))
              for i in range(n)]
    start = time.perf_counter()
    for frame in frames:
        await slots.acquire()
        await nc.publish("lb.env", frame)
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - start
    await nc.close()
    return n / elapsed


async def bench_publish_async(stub, n: int, payload: bytes) -> float:
    await stub.CreateStream(pb.CreateStreamRequest(name="grpc", subject="lb.grpc"))
    requests = [pb.PublishRequest(stream="grpc", value=payload, correlationId=str(i))
                for i in range(n)]

    async def gen():
        for request in requests:
            yield request

    start = time.perf_counter()
    got = 0
    async for resp in stub.PublishAsync(gen()):
        assert not resp.HasField("asyncError"), resp
        got += 1
        if got == n:
            break
    elapsed = time.perf_counter() - start
    return n / elapsed


async def run(args, nats_url: str, grpc_addr: str) -> list[tuple[str, float]]:
    payload = os.urandom(args.size)
    results = []
    async with grpc.aio.insecure_channel(grpc_addr) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        await stub.FetchMetadata(pb.FetchMetadataRequest(), wait_for_ready=True, timeout=30)
        results.append(("JetStream publish_async, file storage (acked)",
                        await bench_jetstream(nats_url, args.messages, payload, args.window)))
        results.append(("riverlog plain NATS ingest (until stored)",
                        await bench_plain(nats_url, stub, args.messages, payload)))
        results.append(("riverlog envelope publish, LEADER acks",
                        await bench_envelope(nats_url, stub, args.messages, payload, args.window)))
        results.append(("riverlog gRPC PublishAsync (acked)",
                        await bench_publish_async(stub, args.messages, payload)))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--window", type=int, default=256, help="messages in flight")
    parser.add_argument("--durability", default="interval", choices=["always", "interval", "never"])
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="lb-bench-")
    nats_port = free_port()
    nats_proc = subprocess.Popen([find_nats_server(), "-a", "127.0.0.1", "-p", str(nats_port),
                                  "-js", "-sd", os.path.join(work, "jetstream")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    riverlog = None
    try:
        wait_port(nats_port)
        nats_url = f"nats://127.0.0.1:{nats_port}"
        riverlog = subprocess.Popen(
            [sys.executable, "-m", "riverlog", "serve", "-d", os.path.join(work, "riverlog"),
             "--nats-servers", nats_url, "--port", "0", "--stream-port", "0", "--level",
             "warning", "--durability", args.durability],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        grpc_addr = None
        for line in riverlog.stdout:
            m = BANNER.search(line)
            if m:
                grpc_addr = m.group(1)
                break
        if grpc_addr is None:
            raise SystemExit("riverlog serve did not start")
        results = asyncio.run(run(args, nats_url, grpc_addr))
    finally:
        if riverlog is not None:
            riverlog.send_signal(signal.SIGTERM)
            riverlog.wait(30)
        nats_proc.terminate()
        nats_proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    js = results[0][1]
    print(f"\n{args.messages} messages of {args.size} bytes, {args.window} in flight, "
          f"riverlog --durability {args.durability}, {os.cpu_count()} CPUs")
    print(f"{'':48} {'msgs/s':>10} {'vs JetStream':>13}")
    for name, rate in results:
        print(f"{name:48} {rate:10,.0f} {rate / js:12.2f}x")


if __name__ == "__main__":
    main()
