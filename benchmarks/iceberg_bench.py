# Streams as Apache Iceberg tables (streams.table.format: iceberg), side by side in one run,
# against a real server process (RabbitMQ Stream door only) and the embedded SQLite catalog:
# 1. publishing: one publisher into a stream without a table and into one with an Iceberg
#    table, rounds alternating the two, best round each (target >= 0.95x); after each table
#    round, how long until the table's current snapshot held every record (target < 2 s;
#    the worker is started before the rounds, by a small table stream whose lag, the worker's
#    start included, is printed apart);
# 2. the writer (riverlog.tables.iceberg_writer.IcebergWriter, what the worker runs)
#    converting the whole stream from its segment files into a fresh catalog, in this process
#    (target >= 3x the publish rate), then the cost of one pass that commits a few records
#    (the catalog commit per pass: pyiceberg metadata files + the SQLite row) on a fresh
#    table and on one holding --snapshots snapshots (a pass per tick keeps ~2,000 an hour
#    until they expire; pyiceberg reads, copies and writes all of them on every commit);
# 3. Spark (local[2]): read_table(catalog=...) against plain Parquet of the same records,
#    count() and a groupBy (targets >= 1.0x and >= 0.9x), rounds interleaved, best each:
#    the DataFrame made for each query (read_table plans through the catalog and the
#    server, spark.read.parquet lists the folder), and both DataFrames made once and queried
#    each round (the scan alone).
# Records as spark_bench.py publishes them (key k<i % 1000>, a ~100-byte value).
#
#   .venv/bin/python benchmarks/iceberg_bench.py --records 500000 --rounds 3
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from spark_bench import load, start_server  # benchmarks/spark_bench.py
from table_bench import publish_rounds  # benchmarks/table_bench.py

from riverlog.broker.broker import folder_name


def wait_snapshot(table_dir: str, stream: str, n: int, timeout: float = 600) -> float:
    """Seconds until the current snapshot of ``stream``'s table holds offsets up to ``n``."""
    from riverlog.tables import iceberg as ice

    started = time.perf_counter()
    catalog = ice.load_catalog(table_dir)
    while True:
        table = ice.load_table(catalog, stream)
        held = ice.snapshot_offsets(table.current_snapshot()) if table is not None else {}
        if held.get(0, (0, 0))[1] >= n:
            return time.perf_counter() - started
        if time.perf_counter() - started > timeout:
            raise SystemExit(f"the table of {stream} holds {held} of {n} after {timeout} s")
        time.sleep(0.05)


def writer_rates(log_dir: str, stream: str, work: str,
                 snapshots: int) -> tuple[int, float, list[float], list[float]]:
    """Convert the partition in ``log_dir`` (its server stopped) into a fresh catalog with
    IcebergWriter (a warm-up conversion first), then time 10 small passes into a new catalog
    (the commit cost of a fresh table), then go on until the table has ``snapshots``
    snapshots and time 10 more (the commit cost of a table that keeps a snapshot per pass
    until they expire). Returns (records, seconds of the conversion, seconds per small pass
    on the fresh table, the same with ``snapshots`` snapshots)."""
    from riverlog.log import CommitLog
    from riverlog.tables.iceberg_writer import IcebergWriter
    from riverlog.tables.state import PartitionState

    with CommitLog(log_dir) as log:
        segments = [(s.base_offset, s.next_offset) for s in log.segments]
        first, committed = log.first_offset, log.committed_offset
    state = PartitionState(stream, 0, 0, log_dir, segments, first, committed)
    for name in ("warm-up", "timed"):
        writer = IcebergWriter(os.path.join(work, name), None)
        started = time.perf_counter()
        [status] = writer.update(stream, 0, [state])
        took = time.perf_counter() - started
    if status.error or status.end != committed + 1:
        raise SystemExit(f"the table writer stopped: {status}")
    passes = []
    writer = IcebergWriter(os.path.join(work, "passes"), None)
    step = max(min((committed + 1) // 1000, (committed + 1) // (snapshots + 20)), 1)
    for i in range(1, snapshots + 21):  # each pass: `step` more records, one snapshot
        part = PartitionState(stream, 0, 0, log_dir, segments, first, i * step - 1)
        started = time.perf_counter()
        [status] = writer.update(stream, 0, [part])
        passes.append(time.perf_counter() - started)
        if status.error:
            raise SystemExit(f"a pass failed: {status}")
    return committed + 1 - first, took, passes[1:11], passes[-10:]


def spark_reads(servers: str, stream: str, table_dir: str, work: str, n: int,
                repeat: int) -> dict:
    """Seconds (best of ``repeat``) of count() and a groupBy through read_table(catalog=)
    and through plain Parquet files of the same records."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import riverlog.spark
    from riverlog.tables.iceberg import catalog_uri

    spark = (SparkSession.builder.master("local[2]").appName("riverlog iceberg bench")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    riverlog.spark.register(spark)
    uri = catalog_uri(table_dir, None)

    def table():
        return riverlog.spark.read_table(spark, stream, catalog=uri, servers=servers)

    path = os.path.join(work, "plain.parquet")
    table().write.mode("overwrite").parquet(path)

    def plain():  # as read_table, the DataFrame is made for each query (Parquet: listed)
        return spark.read.parquet(path)

    group = lambda df: df.groupBy("key").agg(  # noqa: E731
        F.count(F.lit(1)), F.sum(F.length("value"))).collect()
    once = {"parquet": plain(), "read_table": table()}
    runs = [("parquet", "count", lambda: plain().count()),
            ("parquet", "groupby", lambda: group(plain())),
            ("read_table", "count", lambda: table().count()),
            ("read_table", "groupby", lambda: group(table())),
            ("parquet, made once", "count", lambda: once["parquet"].count()),
            ("parquet, made once", "groupby", lambda: group(once["parquet"])),
            ("read_table, made once", "count", lambda: once["read_table"].count()),
            ("read_table, made once", "groupby", lambda: group(once["read_table"]))]
    best = {(a, b): float("inf") for a, b, _ in runs}
    for r in range(repeat):
        for name, query, action in runs:
            t = time.perf_counter()
            action()
            took = time.perf_counter() - t
            best[(name, query)] = min(best[(name, query)], took)
            print(f"  round {r + 1} {name:<21} {query:<8} {took:.3f} s", file=sys.stderr)
    assert table().count() == plain().count() == n
    spark.stop()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=500_000, help="per stream and round")
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--snapshots", type=int, default=500,
                    help="snapshots of the table whose small passes are timed last")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="riverlog-iceberg-bench-")
    data = os.path.join(work, "data")
    table_dir = os.path.join(data, "tables")
    proc, servers = start_server(data, table_format="iceberg")
    try:  # the worker starts with the first table stream, once per server: not in a round
        load(servers, "warm-up", 1000, args.value_size, {"x-riverlog-table": "true"})
        cold = wait_snapshot(table_dir, "warm-up", 1000)
        rates, lag = publish_rounds(servers, args,
                                    lambda stream: wait_snapshot(table_dir, stream, args.records))
        stream = f"with-table-{args.rounds - 1}"
        reads = spark_reads(servers, stream, table_dir, work, args.records, args.rounds)
    finally:
        proc.terminate()
        proc.join(30)
    try:
        log_dir = os.path.join(data, "streams", folder_name(stream), "0")
        n, took, passes, later = writer_rates(log_dir, stream, work, args.snapshots)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    publish, write_rate = rates["without table"], n / took
    passes.sort()
    later.sort()
    print(f"\n{args.records:,} records per stream and round, value ~{args.value_size} B, "
          f"best of {args.rounds}")
    print(f"publish, no table:       {publish:>12,.0f} records/s")
    print(f"publish, Iceberg table:  {rates['with table']:>12,.0f} records/s "
          f"({rates['with table'] / publish:.2f}x)")
    print(f"table held all records {min(lag):.2f}-{max(lag):.2f} s after the last confirm "
          f"(the first table stream's {cold:.2f} s, the worker's start included)")
    print(f"table writing:           {write_rate:>12,.0f} records/s ({write_rate / publish:.2f}x "
          f"the publish rate; {n:,} records in {took:.2f} s)")
    print(f"one small pass (append + catalog commit): median {passes[len(passes) // 2] * 1000:.0f}"
          f" ms, max {passes[-1] * 1000:.0f} ms; with {args.snapshots} snapshots: median "
          f"{later[len(later) // 2] * 1000:.0f} ms, max {later[-1] * 1000:.0f} ms")
    for made in ("", ", made once"):
        for query in ("count", "groupby"):
            p, t = reads[("parquet" + made, query)], reads[("read_table" + made, query)]
            print(f"spark {query:<8} parquet {p:.3f} s, read_table {t:.3f} s ({p / t:.2f}x)"
                  f"{' (DataFrames made once, queried each round)' if made else ''}")
    print(json.dumps({"records": args.records, "publish_no_table": round(publish),
                      "publish_with_table": round(rates["with table"]),
                      "lag_s": [round(x, 2) for x in lag], "cold_lag_s": round(cold, 2),
                      "table_write": round(write_rate),
                      "pass_ms": [round(x * 1000) for x in passes],
                      f"pass_ms_at_{args.snapshots}": [round(x * 1000) for x in later],
                      "reads_s": {f"{a} {b}": round(v, 3) for (a, b), v in reads.items()}}))


if __name__ == "__main__":
    main()
