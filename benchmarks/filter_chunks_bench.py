"""Filtered chunks: what writing a chunk per run of same-filter-value Publish frames does to a
filtered consumer and to publish cost (issue 20 item 6), riverlog only.

A publisher sends --frames Publish v2 frames of --per-frame messages of --size bytes,
pipelined (at most --window messages unconfirmed, so frames queue up and the door may merge
them into one chunk), with one filter value per frame, in three patterns:
  alternating  frame i carries "v{i % every}"            (values change every frame)
  runs         frame i carries "v{(i // run) % every}"  (--run frames in a row share a value)
  same         every frame carries "v0"                 (nothing to split: the cost control)
Measured per pattern: publish messages/s (first write to last PublishConfirm) and the
server's CPU ns per message (/proc); chunks written (an unfiltered read from `first`); and a
consumer with Subscribe property filter.0=v0 reading from `first` until the server has been
quiet for 1 s: chunks and records it received. Its *ratio* is records received / records
carrying "v0" (1.0: it gets only what it needs; 10: it gets everything when 1 frame in 10
is "v0"). Records are counted from chunk headers; nothing is decoded.

Run (the server code of the worktree is what is measured):
  .venv/bin/python benchmarks/filter_chunks_bench.py
Options: --frames 4000 --per-frame 100 --size 100 --every 10 --run 10 --window 20000
  --repeat 3 --riverlog-arg=--durability=always
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid

from rabbitmq_stream_bench import (Riverlog, connect, measure_publish, message_entry,
                                   with_admin)
from riverlog.protocol.rabbitmq_stream import encode
from riverlog.protocol.rabbitmq_stream import frames as f

PATTERNS = ("alternating", "runs", "same")


def value_of(pattern: str, i: int, every: int, run: int) -> str:
    if pattern == "alternating":
        return f"v{i % every}"
    if pattern == "runs":
        return f"v{(i // run) % every}"
    return "v0"


def frames_for(pattern: str, args) -> tuple[list[bytes], int]:
    """The encoded frames and how many of their messages carry "v0"."""
    entry, pid, frames, wanted = message_entry(args.size), 1, [], 0
    for i in range(args.frames):
        value = value_of(pattern, i, args.every, args.run)
        frames.append(encode(f.PublishV2(1, tuple((pid + k, value, entry)
                                                  for k in range(args.per_frame)))))
        pid += args.per_frame
        wanted += args.per_frame if value == "v0" else 0
    return frames, wanted


async def read_all(port: int, stream: str, properties: dict[str, str] | None,
                   quiet: float = 1.0) -> tuple[int, int]:
    """(chunks, records) a subscription from `first` gets until ``quiet`` s without any."""
    conn = await connect(port)
    conn.credit_frame = encode(f.Credit(0, 1))
    last = [time.monotonic()]
    conn.on_progress = lambda: last.__setitem__(0, time.monotonic())
    conn.fast = True
    conn.transport.write(encode(f.Subscribe(conn.next_corr(), 0, stream, 1, None, 16,
                                            properties)))
    try:
        while time.monotonic() - last[0] < quiet:
            if conn.done.done():
                conn.done.result()
            await asyncio.sleep(0.05)
    finally:
        conn.transport.close()
    return conn.chunks, conn.records


async def one_run(server, pattern: str, args) -> dict:
    stream = f"bench-fchunks-{uuid.uuid4().hex[:8]}"
    frames, wanted = frames_for(pattern, args)
    total = args.frames * args.per_frame
    r = await with_admin(server.port, lambda c: c.request(f.Create(c.next_corr(), stream, {})))
    assert r.response_code == 1, r
    try:
        cpu0, t0 = server.cpu_seconds(), time.perf_counter()
        rate, _ = await measure_publish(server.port, stream, frames, args.per_frame, args.window)
        cpu_ns = 1e9 * (server.cpu_seconds() - cpu0) / total
        elapsed = time.perf_counter() - t0
        chunks, records = await read_all(server.port, stream, None)
        assert records == total, (records, total)
        got_chunks, got = await read_all(server.port, stream, {"filter.0": "v0"})
    finally:
        await with_admin(server.port, lambda c: c.request(f.Delete(c.next_corr(), stream)))
    return {"publish": rate, "cpu_ns": cpu_ns, "seconds": elapsed, "chunks": chunks,
            "got_chunks": got_chunks, "got": got, "wanted": wanted,
            "ratio": got / wanted}


async def bench(server, args) -> None:
    print(f"{'pattern':12} {'publish msg/s':>14} {'server ns/msg':>14} {'chunks':>7} "
          f"{'msgs/chunk':>10} {'v0 chunks got':>14} {'v0 msgs got':>12} {'wanted':>8} "
          f"{'ratio':>6}", flush=True)
    for pattern in PATTERNS:
        runs = [await one_run(server, pattern, args) for _ in range(args.repeat)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{pattern:12} {med['publish']:14,.0f} {med['cpu_ns']:14,.0f} "
              f"{med['chunks']:7,.0f} {args.frames * args.per_frame / med['chunks']:10,.0f} "
              f"{med['got_chunks']:14,.0f} {med['got']:12,.0f} {med['wanted']:8,.0f} "
              f"{med['ratio']:6.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=4000)
    ap.add_argument("--per-frame", type=int, default=100)
    ap.add_argument("--size", type=int, default=100, help="message bytes")
    ap.add_argument("--every", type=int, default=10, help="number of filter values")
    ap.add_argument("--run", type=int, default=10, help="frames in a row per value (runs)")
    ap.add_argument("--window", type=int, default=20_000, help="max unconfirmed messages")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--riverlog-arg", action="append", default=[],
                    help="extra `riverlog serve` flag")
    args = ap.parse_args()
    print(f"{args.frames:,} frames of {args.per_frame} x {args.size} B, {args.every} values, "
          f"runs of {args.run}, window {args.window:,}, median of {args.repeat}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
    with Riverlog(args.riverlog_arg) as server:
        print(server.describe, flush=True)
        asyncio.run(bench(server, args))


if __name__ == "__main__":
    main()
