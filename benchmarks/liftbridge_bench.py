"""Liftbridge doors of riverlog side by side with NATS JetStream, on one nats-server.

Starts one nats-server with JetStream (file storage, in a temporary folder), a `riverlog serve`
connected to it with --nats-servers, and measures in one run, with the same message size and
the same number of messages in flight:

  plain NATS ingest      nats-py publishes plain messages on a stream's subject; the time
                         until riverlog has stored (committed) the last one
  envelope, LEADER acks  nats-py publishes enveloped Messages with an ack inbox, at most
                         --window unacknowledged; every ack received
  gRPC PublishAsync      once per gRPC transport (--transports; riverlog serve
                         --grpc-transport grpcio|h2, each a fresh server): --clients load
                         generator processes, each with --calls PublishAsync calls on one
                         channel, sending --messages in all; every PublishResponse received
                         and every message stored
  JetStream              nats-py js.publish_async to a file-storage stream (R1), at most
                         --window unacknowledged; every PubAck received

The PublishAsync load generator is an independent gRPC client in other processes: --load node
(@grpc/grpc-js, benchmarks/grpc_load; `npm install` there first, benchmark only) or --load
python (grpcio's sync client, this file's --worker mode). Both encode requests before the clock
starts. Acks mean the same on both sides: the message was appended (riverlog --durability
interval fsyncs within 200 ms; JetStream file storage syncs every 2 minutes by default). The
NATS clients run in this process, and on a small machine clients and servers share the CPU:
compare the ratios, not the absolute numbers, with other machines.

    .venv/bin/python benchmarks/liftbridge_bench.py [--messages 50000] [--size 256]
        [--window 256] [--durability interval] [--transports grpcio,h2] [--load node|python]
        [--clients 2] [--calls 1]
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
HERE = os.path.dirname(os.path.abspath(__file__))
NODE_LOAD = os.path.join(HERE, "grpc_load")
PROTO = os.path.join(HERE, "..", "riverlog", "protocol", "liftbridge", "api.proto")


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


async def bench_envelope(url: str, stub, n: int, payload: bytes, window: int,
                         ack_policy: int = pb.AckPolicy.LEADER, subject: str = "lb.env") -> float:
    """msgs/s of ``n`` enveloped publishes on NATS ``subject`` with ``ack_policy``, at most
    ``window`` unacknowledged, every Ack checked. With ``stub`` the stream "env" is created
    on ``subject`` first; without, it must exist (liftbridge_side_by_side.py makes its own)."""
    if stub is not None:
        await stub.CreateStream(pb.CreateStreamRequest(name="env", subject=subject))
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
    frames = [encode_publish(pb.Message(value=payload, ackInbox=prefix, correlationId=str(i),
                                        ackPolicy=ack_policy))
              for i in range(n)]
    start = time.perf_counter()
    for frame in frames:
        await slots.acquire()
        await nc.publish(subject, frame)
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - start
    await nc.close()
    return n / elapsed


def worker(addr: str, stream: str, n: int, size: int, calls: int,
           ack_policy: int = pb.AckPolicy.LEADER) -> None:
    """--worker: the grpcio (sync) load generator, speaking the node generator's protocol
    (prints "ready", waits for a line on stdin, prints "done <acked> <seconds>")."""
    value = b"x" * size
    per = n // calls
    batches = [[pb.PublishRequest(stream=stream, value=value, correlationId=f"{c}-{i}",
                                  ackPolicy=ack_policy)
                for i in range(per)] for c in range(calls)]
    channel = grpc.insecure_channel(addr)
    grpc.channel_ready_future(channel).result(timeout=30)
    stub = api_pb2_grpc.APIStub(channel)
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.perf_counter()
    acked = 0
    responses = [stub.PublishAsync(iter(batch)) for batch in batches]
    for batch, call in zip(batches, responses):
        for resp in call:
            if resp.HasField("asyncError"):
                raise SystemExit(f"asyncError: {resp.asyncError}")
            acked += 1
            if acked % per == 0:
                call.cancel()
                break
    print(f"done {acked} {time.perf_counter() - start}", flush=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bench_publish_async(stub, n: int, payload: bytes) -> float:
    """One PublishAsync call from this process's grpc.aio ``stub`` (security_bench.py uses it:
    its channels carry TLS and call credentials, which the load generators do not)."""
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


def bench_publish_async_load(args, grpc_addr: str, stream: str, server_pid: int,
                             ack_policy: int = pb.AckPolicy.LEADER, create: bool = True):
    """(msgs/s, server CPU us per message) of --clients load generator processes sending
    --messages in all with ``ack_policy`` (the python generator only, for another than
    LEADER) to ``stream`` (created here unless ``create`` is false: cluster_bench.py makes
    its replicated streams and passes the leader's ``grpc_addr``)."""
    channel = grpc.insecure_channel(grpc_addr)
    stub = api_pb2_grpc.APIStub(channel)
    if create:
        stub.CreateStream(pb.CreateStreamRequest(name=stream, subject=f"lb.{stream}"),
                          timeout=10)
    per = args.messages // args.clients
    if args.load == "node":
        assert ack_policy == pb.AckPolicy.LEADER, "the node generator sends LEADER acks"
        cmd = ["node", os.path.join(NODE_LOAD, "publish_async.js")]
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker"]
    cmd += [grpc_addr, stream, str(per), str(args.size), str(args.calls)]
    if args.load == "node":
        cmd.append(PROTO)
    else:
        cmd.append(str(ack_policy))
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(args.clients)]
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit(f"load generator failed: {' '.join(cmd)}")
        start, cpu = time.perf_counter(), cpu_seconds(server_pid)
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        acked = 0
        for proc in procs:
            line = proc.stdout.readline().split()
            if not line or line[0] != "done":
                raise SystemExit("a load generator failed")
            acked += int(line[1])
        elapsed = time.perf_counter() - start
        cpu = cpu_seconds(server_pid) - cpu
    finally:
        for proc in procs:
            proc.wait(30)
    total = per // args.calls * args.calls * args.clients
    meta = stub.FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(stream=stream),
                                       timeout=10).metadata
    assert acked == total and meta.newestOffset == total - 1, (acked, meta.newestOffset, total)
    channel.close()
    return total / elapsed, cpu / total * 1e6


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
    return results


def start_riverlog(args, work: str, nats_url: str, transport: str):
    """A `riverlog serve` subprocess using ``nats_url``; returns (process, gRPC address)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "riverlog", "serve", "-d", os.path.join(work, transport),
         "--nats-servers", nats_url, "--port", "0", "--stream-port", "0", "--level", "warning",
         "--durability", args.durability, "--grpc-transport", transport, "--no-metrics"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        m = BANNER.search(line)
        if m:
            return proc, m.group(1)
    proc.wait(30)
    raise SystemExit("riverlog serve did not start")


def stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--window", type=int, default=256, help="messages in flight")
    parser.add_argument("--durability", default="interval", choices=["always", "interval", "never"])
    parser.add_argument("--transports", default="grpcio,h2",
                        help="gRPC transports whose PublishAsync is measured, comma-separated")
    parser.add_argument("--load", choices=["node", "python"], default=None,
                        help="PublishAsync load generator (default: node when benchmarks/"
                             "grpc_load/node_modules is there, else python)")
    parser.add_argument("--clients", type=int, default=2, help="load generator processes")
    parser.add_argument("--calls", type=int, default=1, help="PublishAsync calls per process")
    parser.add_argument("--worker", nargs=6,
                        metavar=("ADDR", "STREAM", "N", "SIZE", "CALLS", "ACK_POLICY"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        addr, stream, n, size, calls, ack_policy = args.worker
        worker(addr, stream, int(n), int(size), int(calls), int(ack_policy))
        return
    if args.load is None:
        args.load = "node" if os.path.isdir(os.path.join(NODE_LOAD, "node_modules")) else "python"

    work = tempfile.mkdtemp(prefix="lb-bench-")
    nats_port = free_port()
    nats_proc = subprocess.Popen([find_nats_server(), "-a", "127.0.0.1", "-p", str(nats_port),
                                  "-js", "-sd", os.path.join(work, "jetstream")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    riverlog = None
    try:
        wait_port(nats_port)
        nats_url = f"nats://127.0.0.1:{nats_port}"
        results, notes = [], []
        for index, transport in enumerate(args.transports.split(",")):
            riverlog, grpc_addr = start_riverlog(args, work, nats_url, transport)
            if index == 0:
                results = asyncio.run(run(args, nats_url, grpc_addr))
            rate, cpu = bench_publish_async_load(args, grpc_addr, f"pa-{transport}",
                                                 riverlog.pid)
            results.append((f"riverlog gRPC PublishAsync, {transport} transport", rate))
            notes.append(f"{transport} transport: riverlog used {cpu:.1f} us of CPU per "
                         f"PublishAsync message")
            stop(riverlog)
            riverlog = None
    finally:
        if riverlog is not None:
            stop(riverlog)
        nats_proc.terminate()
        nats_proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    js = results[0][1]
    print(f"\n{args.messages} messages of {args.size} bytes, {args.window} in flight, "
          f"riverlog --durability {args.durability}, {os.cpu_count()} CPUs; PublishAsync load: "
          f"{args.clients} {args.load} processes x {args.calls} calls")
    print(f"{'':48} {'msgs/s':>10} {'vs JetStream':>13}")
    for name, rate in results:
        print(f"{name:48} {rate:10,.0f} {rate / js:12.2f}x")
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
