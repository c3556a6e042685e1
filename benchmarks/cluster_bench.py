"""Replication through the doors: a 3-server cluster (`riverlog cluster up`'s LocalCluster,
three `riverlog serve` processes) with RF=3 streams against one plain `riverlog serve`, same
run, same machine, same clients, default settings on both sides. Results in
benchmarks/README.md ("cluster_bench.py").

Measures, 100-byte messages (--size), --messages per case:
- RabbitMQ Stream door, confirms: rstream's Producer, send_batch of --batch messages, every
  confirm received (a cluster confirms once the chunk is committed, the high watermark of the
  ISR, as RabbitMQ confirms after a quorum); rstream publishes to the leader it reads in
  Metadata. Stream created with RabbitMQ's initial-cluster-size 3.
- Liftbridge gRPC, PublishAsync with ALL acks (after commit) and with LEADER acks (after the
  leader's append): --clients grpcio load generator processes (liftbridge_bench.py's), one
  PublishAsync call each to the leader's gRPC door, --grpc-messages in all, every
  PublishResponse received and every message stored.
- ALL-ack latency with idle followers: --pings unary Publish calls with ALL acks, one at a
  time, 5 ms apart (the followers wait for a PartitionNotification); p50/p99 in ms.

Clients and servers share the machine's cores: compare the ratios, not the absolute numbers.

Usage: .venv/bin/python benchmarks/cluster_bench.py [--messages 500000] [--size 100]
       [--batch 100] [--grpc-messages 30000] [--clients 2] [--pings 200]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

import grpc
from rstream import Producer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE]

import liftbridge_bench  # noqa: E402
import rabbitmq_stream_bench as rsb  # noqa: E402
from _proc import HOST, free_port  # noqa: E402

from riverlog.cluster.local import LocalCluster  # noqa: E402
from riverlog.protocol.liftbridge import api_pb2 as pb  # noqa: E402
from riverlog.protocol.liftbridge import api_pb2_grpc  # noqa: E402

GUEST = {"username": "guest", "password": "guest"}
PING_GAP_S = 0.005


async def confirms_rate(stream_port: int, stream: str, replicas: int, n: int, payload: bytes,
                        batch: int) -> float:
    """Messages/s of rstream publishing ``n`` messages in batches of ``batch`` to a new
    ``stream`` (initial-cluster-size ``replicas``, created through ``stream_port``), from
    the first send to the last confirm. Raises AssertionError on a refused message."""
    confirmed = 0
    done = asyncio.Event()

    def on_confirm(status) -> None:
        nonlocal confirmed
        assert status.is_confirmed, status
        confirmed += 1
        if confirmed == n:
            done.set()

    async with Producer(HOST, stream_port, **GUEST) as producer:
        await producer.create_stream(stream, arguments={"initial-cluster-size": replicas})
        messages = [payload] * batch
        start = time.perf_counter()
        for _ in range(n // batch):
            await producer.send_batch(stream, messages, on_publish_confirm=on_confirm)
        await asyncio.wait_for(done.wait(), 600)
        return n / (time.perf_counter() - start)


async def leader_address(grpc_address: str, stream: str, replicas: int) -> str:
    """Create ``stream`` (``replicas`` replicas) through ``grpc_address``; the address of its
    partition leader's gRPC door, found in FetchMetadata."""
    async with grpc.aio.insecure_channel(grpc_address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        await stub.CreateStream(pb.CreateStreamRequest(
            name=stream, subject=stream, replicationFactor=replicas), timeout=60)
        meta = await stub.FetchMetadata(pb.FetchMetadataRequest(streams=[stream]), timeout=10)
    leader = meta.streamMetadata[0].partitions[0].leader
    (broker,) = [b for b in meta.brokers if b.id == leader]
    return f"{broker.host}:{broker.port}"


async def all_ack_latency(stub, stream: str, pings: int) -> tuple[float, float]:
    """(p50, p99) in ms of ``pings`` unary ALL-ack Publish calls, PING_GAP_S apart."""
    times = []
    for i in range(pings):
        start = time.perf_counter()
        await stub.Publish(pb.PublishRequest(stream=stream, value=b"ping %d" % i,
                                             ackPolicy=pb.AckPolicy.ALL), timeout=10)
        times.append((time.perf_counter() - start) * 1000)
        await asyncio.sleep(PING_GAP_S)
    cuts = statistics.quantiles(times, n=100)
    return cuts[49], cuts[98]


async def measure(stream_port: int, grpc_address: str, replicas: int, pid_of, args) -> dict:
    """Every figure against one server (``replicas`` 1) or the cluster (``replicas`` 3);
    ``pid_of(gRPC address)`` is the process id of the server listening there."""
    result = {"confirms": await confirms_rate(stream_port, "confirms", replicas,
                                              args.messages, os.urandom(args.size),
                                              args.batch)}
    load = argparse.Namespace(messages=args.grpc_messages, clients=args.clients, calls=1,
                              size=args.size, load="python")
    for name, policy in (("ALL", pb.AckPolicy.ALL), ("LEADER", pb.AckPolicy.LEADER)):
        leader = await leader_address(grpc_address, name.lower(), replicas)
        result[name], _ = await asyncio.to_thread(
            liftbridge_bench.bench_publish_async_load, load, leader, name.lower(),
            pid_of(leader), policy, create=False)
    leader = await leader_address(grpc_address, "ping", replicas)
    async with grpc.aio.insecure_channel(leader) as channel:
        result["p50"], result["p99"] = await all_ack_latency(
            api_pb2_grpc.APIStub(channel), "ping", args.pings)
    return result


def single(args) -> dict:
    grpc_port = free_port()
    with rsb.Riverlog(["--port", str(grpc_port), "--nats-port", "0", "--no-metrics"]) as server:
        deadline = time.monotonic() + 30
        while not rsb.listening(grpc_port):
            assert time.monotonic() < deadline, "no gRPC door"
            time.sleep(0.05)
        return asyncio.run(measure(server.port, f"{HOST}:{grpc_port}", 1,
                                   lambda _: server.proc.pid, args))


def cluster(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="riverlog-cluster-bench-") as directory:
        local = LocalCluster(directory, 3)
        local.start()
        try:
            local.wait_registered()
            pids = {f"{m.advertised}:{m.ports['grpc']}": p.pid
                    for m, p in zip(local.members, local.procs)}
            ports = local.members[0].ports
            return asyncio.run(measure(ports["stream"], f"{HOST}:{ports['grpc']}", 3,
                                       pids.__getitem__, args))
        finally:
            local.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=500_000,
                        help="messages per RabbitMQ door case")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--grpc-messages", type=int, default=30_000,
                        help="messages per gRPC case, in all")
    parser.add_argument("--clients", type=int, default=2, help="gRPC load generators")
    parser.add_argument("--pings", type=int, default=200)
    args = parser.parse_args()
    one, three = single(args), cluster(args)
    print(f"{args.messages} (RabbitMQ door) / {args.grpc_messages} (gRPC) messages of "
          f"{args.size} bytes; load average {os.getloadavg()[0]:.1f}")
    print("| figure | single server | RF=3 | ratio |")
    print("|---|---|---|---|")
    for key, label in (("confirms", "RabbitMQ door, confirms (msgs/s)"),
                       ("ALL", "gRPC PublishAsync, ALL acks (msgs/s)"),
                       ("LEADER", "gRPC PublishAsync, LEADER acks (msgs/s)")):
        print(f"| {label} | {one[key]:,.0f} | {three[key]:,.0f} | {three[key] / one[key]:.2f} |")
    print(f"| ALL-ack latency p50 / p99, idle followers (ms) | {one['p50']:.2f} / "
          f"{one['p99']:.2f} | {three['p50']:.2f} / {three['p99']:.2f} | |")


if __name__ == "__main__":
    main()
