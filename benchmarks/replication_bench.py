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

Usage: .venv/bin/python benchmarks/replication_bench.py [--records 200000] [--batch 100]
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
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


async def run(args) -> None:
    nats_server = EmbeddedNats("127.0.0.1", 0)
    await nats_server.start()
    root = tempfile.mkdtemp(prefix="replication-bench-")
    brokers = {s: Broker(f"{root}/{s}") for s in SERVERS}
    conns, engines = [], []
    try:
        for broker in brokers.values():
            broker.open()
        single = brokers["a"].create("single", StreamConfig()).partitions[0]
        rf1, rf1_cpu = await throughput(single, args.records, args.batch, args.window)
        rf1_lat = await latencies(single, args.pings)
        settings = ReplicationSettings()
        placement = PartitionPlacement("a", SERVERS, SERVERS, 1)
        for server, broker in brokers.items():
            nc = await nats.connect(nats_server.url)
            conns.append(nc)
            engine = Replication(server, "bench", nc, settings, Unchanging())
            await engine.start()
            engines.append(engine)
            part = broker.create("replicated", StreamConfig(replicated=True)).partitions[0]
            engine.assign(part, placement)
        leader = brokers["a"].get("replicated").partitions[0]
        rf3, rf3_cpu = await throughput(leader, args.records, args.batch, args.window)
        await asyncio.sleep(0.5)
        rf3_lat = await latencies(leader, args.pings)
        print(f"records of 100 B, {args.batch} per chunk, window {args.window} chunks, "
              f"{args.records} records; latency: {args.pings} single-record chunks")
        print(f"RF=1 (single server): {rf1:,.0f} records/s committed (CPU {rf1_cpu:.0%}); "
              f"commit p50 {_pct(rf1_lat, 50):.2f} ms p99 {_pct(rf1_lat, 99):.2f} ms")
        print(f"RF=3 (in-process):    {rf3:,.0f} records/s committed (CPU {rf3_cpu:.0%}); "
              f"commit p50 {_pct(rf3_lat, 50):.2f} ms p99 {_pct(rf3_lat, 99):.2f} ms")
        print(f"ratio RF=3 / RF=1: {rf3 / rf1:.2f}")
        print("ISR at the end:", engines[0].stats("replicated", 0)["isr"])
    finally:
        for engine in engines:
            await engine.stop()
        for nc in conns:
            await nc.close()
        for broker in brokers.values():
            await broker.close()
        await nats_server.stop()


def _pct(values: list[float], p: int) -> float:
    return statistics.quantiles(values, n=100)[p - 1] if p < 100 else max(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--pings", type=int, default=500)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
