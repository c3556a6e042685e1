"""Commit-log throughput: append and read 100-byte records in chunks, per durability policy.

Measures the storage layer alone (no network, no protocol), the ceiling for every door.
Run: .venv/bin/python benchmarks/log_bench.py [--records 2000000] [--batch 100 --batch 1000]
Prints one line per case: records/s and MB/s for append (with the policy's fsyncs) and for
a full read of the log with CRC checks (read_chunks), plus the peak RSS.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import tempfile
import time

from riverlog.config import Durability, LogConfig
from riverlog.log import CommitLog


async def append_all(log: CommitLog, total: int, batch: list[bytes]) -> float:
    start = time.perf_counter()
    for _ in range(total // len(batch)):
        await log.append_async(batch)
    await log.flush()
    return time.perf_counter() - start


def read_all(log: CommitLog) -> tuple[float, int]:
    start = time.perf_counter()
    offset, records = log.first_offset, 0
    while True:
        chunks = log.read_chunks(offset, 4 * 1024 * 1024)
        if not chunks:
            break
        for ch in chunks:
            records += ch.header.num_records
        offset = chunks[-1].header.next_offset
    return time.perf_counter() - start, records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--size", type=int, default=100, help="record size in bytes")
    ap.add_argument("--batch", type=int, action="append", help="records per chunk")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp folder)")
    args = ap.parse_args()
    batches = args.batch or [100, 1000]
    root = tempfile.mkdtemp(prefix="riverlog-bench-", dir=args.dir)
    print(f"records={args.records} size={args.size}B cpu={os.cpu_count()} dir={root}")
    try:
        for policy in Durability:
            for n in batches:
                path = os.path.join(root, f"{policy.value}-{n}")
                log = CommitLog(path, LogConfig(durability=policy))
                batch = [os.urandom(args.size) for _ in range(n)]
                total = args.records if policy is not Durability.ALWAYS else args.records // 10
                secs = asyncio.run(append_all(log, total, batch))
                rsecs, count = read_all(log)
                assert count == total // n * n
                mb = count * args.size / 1e6
                print(f"{policy.value:8s} batch={n:5d} append {count / secs:12,.0f} rec/s "
                      f"{mb / secs:8.1f} MB/s | read {count / rsecs:12,.0f} rec/s "
                      f"{mb / rsecs:8.1f} MB/s")
                log.close()
                shutil.rmtree(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
