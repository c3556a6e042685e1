"""What the metrics cost: the per-chunk calls the RabbitMQ Stream door makes on its hot paths
(riverlog.metrics), and how long a Prometheus scrape holds the event loop (the state gauges
are computed on it) for a server with many streams and stored offsets.

Run:
  .venv/bin/python benchmarks/metrics_bench.py [--streams 1000] [--consumers 5]
Prints microseconds per call (median of 5 runs of 200,000 calls) and milliseconds per scrape
(median of 20 scrapes over HTTP, of which the part spent on the event loop).
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import timeit
import urllib.request

from riverlog.config import MetricsConfig, RabbitStreamConfig, ServerConfig
from riverlog.metrics import CONFIRM_RABBITMQ, RABBITMQ_STREAM, counters
from riverlog.server.app import App
from riverlog.server.metrics_http import StateCollector

CALLS = 200_000


def per_call_us(fn) -> float:
    return statistics.median(timeit.repeat(fn, number=CALLS, repeat=5)) / CALLS * 1e6


def hot_paths() -> None:
    """The calls one Publish batch (published, observe, time.monotonic) and one batch of
    chunks sent (delivered) make."""
    delivered = counters("bench", RABBITMQ_STREAM)
    publish = per_call_us(lambda: counters("bench", RABBITMQ_STREAM).published(8800, 880_000))
    observe = per_call_us(lambda: CONFIRM_RABBITMQ.observe(time.monotonic() - 0.0004))
    deliver = per_call_us(lambda: delivered.delivered(8800, 890_000))
    print(f"per Publish batch: published {publish:.2f} us + confirm latency {observe:.2f} us; "
          f"per batch of chunks sent: delivered {deliver:.2f} us")


async def scrapes(streams: int, consumers: int) -> None:
    with tempfile.TemporaryDirectory() as data:
        app = App(ServerConfig(data_dir=data, rabbitmq_stream=RabbitStreamConfig(port=0),
                               metrics=MetricsConfig(port=0)))
        await app.start()
        try:
            for i in range(streams):
                partition = app.broker.create(f"s{i}").partitions[0]
                partition.write_records([b"x" * 100] * 10)
                for c in range(consumers):
                    partition.store_offset(f"c{c}", 5)
                counters(f"s{i}", RABBITMQ_STREAM).published(10, 1000)
            collector_ms = []  # the part of a scrape that runs on the event loop
            state = StateCollector(app, asyncio.get_running_loop())
            for _ in range(20):
                start = time.perf_counter()
                state.families()
                collector_ms.append((time.perf_counter() - start) * 1000)

            def scrape() -> int:
                with urllib.request.urlopen(app.metrics.url, timeout=30) as resp:
                    return len(resp.read())
            total_ms, size = [], 0
            for _ in range(20):
                start = time.perf_counter()
                size = await asyncio.to_thread(scrape)
                total_ms.append((time.perf_counter() - start) * 1000)
            print(f"{streams} streams x {consumers} stored offsets: scrape "
                  f"{statistics.median(total_ms):.1f} ms ({size / 1024:.0f} KiB), of which on "
                  f"the event loop {statistics.median(collector_ms):.1f} ms")
        finally:
            await app.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--consumers", type=int, default=5)
    args = ap.parse_args()
    hot_paths()
    asyncio.run(scrapes(args.streams, args.consumers))


if __name__ == "__main__":
    main()
