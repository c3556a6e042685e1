# Streams as tables, the writing side: what a table costs publishers and whether the writer
# keeps up. In one run, against a real server process (RabbitMQ Stream door only):
# 1. publish throughput of one publisher into a stream without a table and into one with a
#    table (x-riverlog-table; the worker process converts while the publisher runs), in
#    rounds that alternate the two, best round each (target: with >= 0.9x without); after
#    each table round, how long until the table held every record;
# 2. table writing throughput: the writer (riverlog.tables.writer.TableWriter, what the
#    worker process runs) converting the whole table stream from its segment files into a
#    fresh table directory, at full speed in this process (target: >= 2x the publish rate);
# 3. disk: Parquet bytes per log byte.
# Records as spark_bench.py publishes them (key k<i % 1000>, a ~100-byte JSON value).
#
#   .venv/bin/python benchmarks/table_bench.py --records 1000000 --rounds 3
#   .venv/bin/python benchmarks/table_bench.py --records 1000000 --rounds 1 --random-values
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from spark_bench import load, start_server, wait_table  # benchmarks/spark_bench.py

from riverlog.broker.broker import folder_name


def write_throughput(log_dir: str, stream: str, work: str) -> tuple[int, float, int]:
    """Convert the partition in ``log_dir`` (its server stopped) into a table under
    ``work`` with TableWriter, twice: the first pass warms up (imports, as the long-lived
    worker does once; page cache), the second is timed. Returns (records, seconds, table
    bytes)."""
    from riverlog.log import CommitLog
    from riverlog.tables.writer import PartitionState, TableWriter

    with CommitLog(log_dir) as log:
        state = PartitionState(stream, 0, 0, log_dir,
                               [(s.base_offset, s.next_offset) for s in log.segments],
                               log.first_offset, log.committed_offset)
    for table_dir in ("warm-up", "timed"):
        writer = TableWriter(os.path.join(work, table_dir))
        started = time.perf_counter()
        status = writer.update(state)
        took = time.perf_counter() - started
    if status.error or status.end != state.committed + 1:
        raise SystemExit(f"the table writer stopped: {status}")
    return status.end - status.first, took, status.bytes


def publish_rounds(servers: str, args, wait) -> tuple[dict[str, float], list[float]]:
    """``args.rounds`` rounds of publishing ``args.records`` into a stream without a table
    and into one with a table (x-riverlog-table); returns the best rate of each (records/s)
    and, per table round, ``wait(stream)``: the seconds until the table held them all."""
    rates: dict[str, float] = {"without table": 0.0, "with table": 0.0}
    catch_up = []
    for r in range(args.rounds):
        for kind, arguments in (("without table", None),
                                ("with table", {"x-riverlog-table": "true"})):
            stream = f"{kind.replace(' ', '-')}-{r}"
            took = load(servers, stream, args.records, args.value_size, arguments,
                        getattr(args, "random_values", False))
            rates[kind] = max(rates[kind], args.records / took)
            print(f"  round {r + 1} {kind:<14} {args.records / took:>12,.0f} records/s",
                  file=sys.stderr)
            if arguments:
                catch_up.append(wait(stream))
    return rates, catch_up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=1_000_000, help="per stream and round")
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--random-values", action="store_true",
                    help="values padded with random hex digits, not x (for the disk ratio)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="riverlog-table-bench-")
    data = os.path.join(work, "data")
    proc, servers = start_server(data)
    try:
        rates, catch_up = publish_rounds(servers, args, lambda stream: wait_table(
            os.path.join(data, "tables"), stream, args.records))
    finally:
        proc.terminate()
        proc.join(30)
    try:
        stream = f"with-table-{args.rounds - 1}"
        log_dir = os.path.join(data, "streams", folder_name(stream), "0")
        n, took, table_bytes = write_throughput(log_dir, stream, work)
        log_bytes = sum(os.path.getsize(os.path.join(log_dir, f)) for f in os.listdir(log_dir)
                        if f.endswith(".segment"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_rate = n / took
    publish = rates["without table"]
    print(f"\n{args.records:,} records per stream and round, value ~{args.value_size} B, "
          f"best of {args.rounds}")
    print(f"publish, no table:    {publish:>12,.0f} records/s")
    print(f"publish, with table:  {rates['with table']:>12,.0f} records/s "
          f"({rates['with table'] / publish:.2f}x)")
    print(f"table held all records {min(catch_up):.1f}-{max(catch_up):.1f} s after the last "
          f"confirm")
    print(f"table writing:        {write_rate:>12,.0f} records/s ({write_rate / publish:.2f}x "
          f"the publish rate; {n:,} records in {took:.2f} s)")
    print(f"disk: {table_bytes / log_bytes:.3f} Parquet bytes per log byte "
          f"({table_bytes:,} / {log_bytes:,})")
    print(json.dumps({"records": args.records, "publish_no_table": round(publish),
                      "publish_with_table": round(rates["with table"]),
                      "table_catch_up_s": [round(c, 2) for c in catch_up],
                      "table_write": round(write_rate), "table_bytes": table_bytes,
                      "log_bytes": log_bytes}))


if __name__ == "__main__":
    main()
