"""Partition replication (riverlog/cluster/replication*.py), in one process: three Brokers,
each with its own nats-py connection and Replication engine, on one embedded nats-server,
all in one event loop (so the three servers share one CPU core: a pessimistic first number;
the multi-process cluster benchmark comes with `riverlog serve` as a cluster).

Measures, one stream of one partition, 100-byte records:
- throughput: chunks of ``--batch`` records written at the leader with at most ``--window``
  chunks not yet committed (a publisher's confirm window), records/s from the first write to
  the last commit; RF=1 is the single server (a stream that commits its own writes under the
  same durability policy), RF=3 the replicated stream (commit = high watermark of the ISR).
- commit latency with idle followers: one chunk of one record, then wait until committed,
  ``--pings`` times with a pause between (the followers wait for a PartitionNotification);
  p50/p99 in ms.

``--processes`` runs the followers b and c in processes of their own (the leader's process
then does what a real leader does; the machine's cores are still shared).

Usage: .venv/bin/python benchmarks/replication_bench.py [--records 200000] [--batch 100]
       [--processes]
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time

import nats

from riverlog.broker.broker import Broker
from riverlog.broker.placement import PartitionPlacement
from riverlog.broker.stream import StreamConfig
from riverlog.cluster.replication import Replication, ReplicationSettings
from riverlog.server.embedded_nats import EmbeddedNats

SERVERS = ("a", "b", "c")


class Unchanging:
    """ReplicationEvents that apply nothing: the ISR stays as created (a benchmark run is
    shorter than the lag time; a shrink would show in the log)."""

    async def shrink_isr(self, *args) -> None:
        logging.warning("shrink_isr%s asked during the benchmark", args)

    expand_isr = report_leader = shrink_isr


async def throughput(partition, records: int, batch: int, window: int) -> tuple[float, float]:
    """(records/s committed, this process's CPU seconds per second of the run)."""
    payload = [b"x" * 100] * batch
    pending: list = []
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(records // batch):
        last = partition.write_records(payload)[-1]
        pending.append(asyncio.ensure_future(partition.wait_committed(last)))
        if len(pending) >= window:
            await pending.pop(0)
    await asyncio.gather(*pending)
    elapsed = time.perf_counter() - start
    return records // batch * batch / elapsed, (time.process_time() - cpu) / elapsed


async def latencies(partition, pings: int) -> list[float]:
    out = []
    for _ in range(pings):
        await asyncio.sleep(0.005)
        t = time.perf_counter()
        last = partition.write_records([b"p" * 100])[-1]
        await partition.wait_committed(last)
        out.append((time.perf_counter() - t) * 1000)
    return out


async def serve(server: str, root: str, url: str, until: asyncio.Future | None) -> tuple:
    """One server: its Broker (in ``root/<server>``), NATS connection and engine, with the
    replicated stream assigned (leader a). Runs until ``until`` resolves (a follower process:
    until its stdin closes) or returns the pieces for the caller (the leader)."""
    broker = Broker(f"{root}/{server}")
    broker.open()
    nc = await nats.connect(url)
    engine = Replication(server, "bench", nc, ReplicationSettings(), Unchanging())
    await engine.start()
    part = broker.create("replicated", StreamConfig(replicated=True)).partitions[0]
    engine.assign(part, PartitionPlacement("a", SERVERS, SERVERS, 1))
    if until is None:
        return broker, nc, engine
    await until
    await engine.stop()
    await nc.close()
    await broker.close()
    return ()


async def follower_process(server: str, root: str, url: str) -> None:
    loop = asyncio.get_running_loop()
    stdin_closed = loop.run_in_executor(None, sys.stdin.read)
    await serve(server, root, url, asyncio.ensure_future(stdin_closed))


async def run(args) -> None:
    nats_server = EmbeddedNats("127.0.0.1", 0)
    await nats_server.start()
    root = tempfile.mkdtemp(prefix="replication-bench-")
    single_broker = Broker(f"{root}/single")
    servers, children = [], []
    try:
        single_broker.open()
        single = single_broker.create("single", StreamConfig()).partitions[0]
        rf1, rf1_cpu = await throughput(single, args.records, args.batch, args.window)
        rf1_lat = await latencies(single, args.pings)
        for server in SERVERS[1:]:
            if args.processes:
                children.append(await asyncio.create_subprocess_exec(
                    sys.executable, __file__, "--follower", server, root, nats_server.url,
                    stdin=asyncio.subprocess.PIPE))
            else:
                servers.append(await serve(server, root, nats_server.url, None))
        servers.insert(0, await serve("a", root, nats_server.url, None))
        leader_engine = servers[0][2]
        await _until_fetched(leader_engine)
        leader = servers[0][0].get("replicated").partitions[0]
        rf3, rf3_cpu = await throughput(leader, args.records, args.batch, args.window)
        await asyncio.sleep(0.5)
        rf3_lat = await latencies(leader, args.pings)
        where = "3 processes" if args.processes else "one process"
        print(f"records of 100 B, {args.batch} per chunk, window {args.window} chunks, "
              f"{args.records} records; latency: {args.pings} single-record chunks")
        print(f"RF=1 (single server): {rf1:,.0f} records/s committed (CPU {rf1_cpu:.0%}); "
              f"commit p50 {_pct(rf1_lat, 50):.2f} ms p99 {_pct(rf1_lat, 99):.2f} ms")
        print(f"RF=3 ({where}): {rf3:,.0f} records/s committed (leader CPU {rf3_cpu:.0%}); "
              f"commit p50 {_pct(rf3_lat, 50):.2f} ms p99 {_pct(rf3_lat, 99):.2f} ms")
        print(f"ratio RF=3 / RF=1: {rf3 / rf1:.2f}")
        print("ISR at the end:", leader_engine.stats("replicated", 0)["isr"])
    finally:
        for broker, nc, engine in servers:
            await engine.stop()
            await nc.close()
            await broker.close()
        for child in children:
            child.stdin.close()
            await child.wait()
        await single_broker.close()
        await nats_server.stop()


async def _until_fetched(engine: Replication) -> None:
    """Wait until every follower fetched once (the high watermark can move)."""
    while any(f["log_end"] is None
              for f in engine.stats("replicated", 0)["followers"].values()):
        await asyncio.sleep(0.01)


def _pct(values: list[float], p: int) -> float:
    return statistics.quantiles(values, n=100)[p - 1] if p < 100 else max(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--pings", type=int, default=500)
    parser.add_argument("--processes", action="store_true",
                        help="run the followers b and c in processes of their own")
    parser.add_argument("--follower", nargs=3, metavar=("ID", "ROOT", "NATS_URL"),
                        help=argparse.SUPPRESS)  # the child processes of --processes
    args = parser.parse_args()
    if args.follower:
        asyncio.run(follower_process(*args.follower))
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
