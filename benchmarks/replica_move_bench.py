"""Replica moves (issue 21 item 5): how fast a new replica catches up, and what a move costs
the publishers. A 3-server cluster (`riverlog cluster up`'s LocalCluster, three `riverlog
serve` processes); a stream with 2 replicas (minIsr 1) on two of them is filled with
--messages messages of --size bytes through rstream (confirms); then an rstream publisher
sends batches of --batch messages, waiting for their confirms, for --seconds without a move
(the baseline), and again while `add-replica` (riverlog.cluster.reassign.add_replicas, over
a member's Raft port) puts a replica on the third server and waits until it is in the ISR.
Results in benchmarks/README.md ("replica_move_bench.py").

Reports: the catch-up time (add_replica submitted to in the ISR) and its MB/s of log copied,
and the publish rate (confirmed messages/s) during the move against the baseline.
Clients and servers share the machine's cores: compare the ratio, not the absolute numbers.

Usage: .venv/bin/python benchmarks/replica_move_bench.py [--messages 200000] [--size 250]
       [--batch 100] [--seconds 5]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

import grpc
from rstream import Producer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE]

from _proc import HOST  # noqa: E402

from riverlog.cluster.local import LocalCluster, raft_password  # noqa: E402
from riverlog.cluster.metadata import admin_at  # noqa: E402
from riverlog.cluster.reassign import add_replicas  # noqa: E402
from riverlog.protocol.liftbridge import api_pb2 as pb  # noqa: E402
from riverlog.protocol.liftbridge import api_pb2_grpc  # noqa: E402

GUEST = {"username": "guest", "password": "guest"}
STREAM = "moved"


async def publish_for(producer: Producer, payload: bytes, batch: int, seconds: float,
                      until: asyncio.Future | None = None) -> float:
    """Confirmed messages/s of batches of ``batch`` sent one after the other, each waiting
    for its confirms, for ``seconds`` (or until ``until`` is done); one batch at least."""
    confirmed = 0
    start = time.perf_counter()
    while True:  # at least one batch
        pending = asyncio.get_running_loop().create_future()
        left = batch

        def on_confirm(status, pending=pending) -> None:
            nonlocal left, confirmed
            assert status.is_confirmed, status
            confirmed += 1
            left -= 1
            if left == 0 and not pending.done():
                pending.set_result(None)
        await producer.send_batch(STREAM, [payload] * batch, on_publish_confirm=on_confirm)
        await asyncio.wait_for(pending, 60)
        if until.done() if until is not None else time.perf_counter() - start >= seconds:
            break
    return confirmed / (time.perf_counter() - start)


async def measure(local: LocalCluster, password: str, args) -> dict:
    members = local.members
    grpc_address = f"{HOST}:{members[0].ports['grpc']}"
    async with grpc.aio.insecure_channel(grpc_address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        await stub.CreateStream(pb.CreateStreamRequest(
            name=STREAM, subject=STREAM, replicationFactor=2,
            minIsr=pb.NullableInt32(value=1)), timeout=60)
    member = f"{HOST}:{members[0].ports['raft']}"
    state = await asyncio.to_thread(admin_at, member, password, "state")
    holders = state["streams"][STREAM][0]["replicas"]
    spare = next(m.id for m in members if m.id not in holders)
    payload = os.urandom(args.size)
    leader = next(m for m in members if m.id == state["streams"][STREAM][0]["leader"])
    async with Producer(HOST, leader.ports["stream"], **GUEST) as producer:
        fill_start = time.perf_counter()
        for _ in range(args.messages // args.batch // 10):
            await publish_for(producer, payload, args.batch * 10, 0)  # one batch each
        fill = args.messages / (time.perf_counter() - fill_start)
        baseline = await publish_for(producer, payload, args.batch, args.seconds)
        start = time.perf_counter()
        move = asyncio.ensure_future(asyncio.to_thread(
            add_replicas, member, password, [(STREAM, 0, spare)], 600, lambda _: None))
        during = await publish_for(producer, payload, args.batch, 0, until=move)
        await move
        catch_up = time.perf_counter() - start
    log_dir = os.path.join(local.directory, spare, "streams", STREAM, "0")
    copied = sum(os.path.getsize(os.path.join(log_dir, f)) for f in os.listdir(log_dir)
                 if f.endswith(".segment"))
    return {"fill": fill, "baseline": baseline, "during": during, "catch_up_s": catch_up,
            "copied_mb": copied / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, default in (("messages", 200_000), ("size", 250), ("batch", 100),
                          ("seconds", 5.0)):
        parser.add_argument(f"--{flag}", type=type(default), default=default)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        local = LocalCluster(directory, 3)
        local.start()
        try:
            local.wait_registered()
            result = asyncio.run(measure(local, raft_password(directory), args))
        finally:
            local.stop()
    print(f"fill: {args.messages} x {args.size} B at {result['fill']:,.0f} msg/s")
    print(f"catch-up: {result['copied_mb']:.1f} MB in {result['catch_up_s']:.2f} s "
          f"({result['copied_mb'] / result['catch_up_s']:.1f} MB/s, to in the ISR)")
    print(f"publish, confirms: {result['baseline']:,.0f} msg/s without a move, "
          f"{result['during']:,.0f} msg/s during it "
          f"(ratio {result['during'] / result['baseline']:.2f})")


if __name__ == "__main__":
    main()
