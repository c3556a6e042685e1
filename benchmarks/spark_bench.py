# Spark read benchmark: records/s of a batch read of a riverlog stream into Spark (count()
# and a groupBy) next to reading the same records from Parquet, in the same run and the
# same SparkSession, as a ratio (target: riverlog >= 0.5x Parquet). Also measured: the same
# reads with a projection (a user schema naming only the columns the query uses), the
# ceiling of any PySpark Python data source on this machine (an in-memory source yielding
# the same Arrow batches again and again), and the stream read through its table
# (riverlog.spark.read_table: the stream is created with x-riverlog-table, and read once
# the table holds every record; target >= 0.9x Parquet).
# Rules: a real server (a riverlog server process with only its RabbitMQ Stream door, on a
# free port, unless --servers is given), real Spark (local[*] unless --master); the data is
# loaded once and reused when the stream already holds it (--workdir keeps it between runs);
# every query runs --repeat times, in rounds that interleave the readers, and the best time
# counts (Spark warms up); the CPU seconds the JVM, the Python workers and the server spent
# in that best round are read from /proc (Linux); results print as a table and as one JSON
# line for benchmarks/README.md.
#
#   .venv/bin/python benchmarks/spark_bench.py                 # 5M records, local[*]
#   .venv/bin/python benchmarks/spark_bench.py --records 1000000 --repeat 2
#   .venv/bin/python benchmarks/spark_bench.py --table-compression snappy
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time


def _serve(data_dir: str, port_pipe, compression: str, table_format: str = "parquet") -> None:
    """Child process: a riverlog with only its RabbitMQ Stream door, on a free port; tables
    in ``table_format`` (streams.table.format), Parquet files with ``compression``."""
    import asyncio
    import signal

    from riverlog.config import RabbitStreamConfig, ServerConfig, TableConfig
    from riverlog.server.app import App

    async def serve() -> None:
        app = App(ServerConfig(data_dir=data_dir, rabbitmq_stream=RabbitStreamConfig(port=0),
                               tables=TableConfig(compression=compression,
                                                  format=table_format)))
        await app.start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        port_pipe.send(app.rabbitmq_stream.port)
        await stop.wait()
        await app.stop()

    try:
        import uvloop
        uvloop.run(serve())
    except ImportError:
        asyncio.run(serve())


def start_server(data_dir: str, compression: str = "zstd", table_format: str = "parquet"):
    """A riverlog server process (RabbitMQ Stream door only; tables in ``table_format``,
    files in ``compression``); returns (process, servers)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(data_dir, child, compression, table_format),
                       daemon=True)
    proc.start()
    if not parent.poll(30):
        proc.kill()
        raise SystemExit("the riverlog server did not start")
    return proc, f"127.0.0.1:{parent.recv()}"


def load(servers: str, stream: str, n: int, value_size: int,
         arguments: dict[str, str] | None = None, random_values: bool = False) -> float:
    """Publish ``n`` records (key ``k<i % 1000>``, a JSON-ish value of about ``value_size``
    bytes, padded with x, or with random hex digits with ``random_values``) unless the stream
    already holds them (creating it with the Create ``arguments``); returns seconds spent."""
    from riverlog.record import Record, encode_record
    from riverlog.spark.options import connection

    started = time.perf_counter()
    with connection({"servers": servers}).connect("spark-bench-load") as client:
        client.create_stream(stream, arguments, exist_ok=True)
        have = client.offset_range(stream)[1]
        if have >= n:
            return 0.0
        width = max(value_size - 60, 0)

        def pad() -> str:
            return os.urandom(width // 2 + 1).hex()[:width] if random_values else "x" * width

        with client.publisher(stream, "spark-bench-loader") as pub:
            step = 20_000
            now = time.time_ns()
            for i in range(have, n, step):
                m = min(step, n - i)
                records = [encode_record(Record(
                    value=f'{{"id":{j},"group":{j % 97},"payload":"{pad()}"}}'.encode(),
                    key=b"k%d" % (j % 1000), timestamp_ns=now + j)) for j in range(i, i + m)]
                pub.publish(records, range(i + 1, i + 1 + m))
    return time.perf_counter() - started


def wait_table(table_dir: str, stream: str, n: int, timeout: float = 600) -> float:
    """Seconds until the table of ``stream`` holds its first ``n`` records."""
    from riverlog.tables import manifest
    from riverlog.tables.storage import Storage

    started = time.perf_counter()
    storage = Storage(table_dir)
    directory = manifest.partition_dir(storage.root, stream, 0)
    while True:
        m = manifest.load(storage, directory)
        if m is not None and (m.end or 0) >= n:
            return time.perf_counter() - started
        if time.perf_counter() - started > timeout:
            raise SystemExit(f"the table of {stream} holds {m and m.end} of {n} records "
                             f"after {timeout} s")
        time.sleep(0.2)


def cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) used so far by this process's descendants, by kind:
    ``jvm`` (Spark), ``python workers`` (pyspark.daemon and its forks, where read() runs),
    ``server`` (the riverlog process); from /proc, so Linux only ({} elsewhere)."""
    if not os.path.isdir("/proc/self"):
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    procs = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        procs[int(pid)] = (int(stat[1]), (int(stat[11]) + int(stat[12])) / tick, cmd)
    out: dict[str, float] = {}
    for pid, (ppid, cpu, cmd) in procs.items():
        while ppid not in (os.getpid(), 0, 1) and ppid in procs:  # a descendant of ours?
            ppid = procs[ppid][0]
        if ppid != os.getpid():
            continue
        kind = ("jvm" if b"java" in cmd else "python workers" if b"pyspark.daemon" in cmd
                else "server" if b"multiprocessing" in cmd else None)
        if kind:
            out[kind] = out.get(kind, 0.0) + cpu
    return out


def ceiling_source(servers: str, stream: str):
    """A Python data source that reads one Arrow batch of real records from riverlog per
    task, then yields it again and again (``n`` rows over ``tasks`` tasks): what Spark does
    with a Python source's rows when the source costs nothing. It bounds any Python source,
    riverlog's included."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class CeilingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "riverlog_ceiling"

        def schema(self):
            from riverlog.spark.schema import spark_schema
            return spark_schema()

        def reader(self, schema):
            from riverlog.spark.schema import projection
            return CeilingReader(int(self.options["n"]), int(self.options["tasks"]),
                                 projection(schema))

    class CeilingReader(DataSourceReader):
        def __init__(self, n: int, tasks: int, columns) -> None:
            self.n, self.tasks, self.columns = n, tasks, columns

        def partitions(self):
            return [InputPartition(i) for i in range(self.tasks)]

        def read(self, partition):
            from riverlog.spark.options import connection
            from riverlog.spark.reader import RangePartition, read_partition

            conn = connection({"servers": servers})
            part = RangePartition(stream, 0, 0, 65_536, conn, columns=self.columns)
            batch = next(read_partition(part))
            left = self.n // self.tasks
            while left > 0:
                yield batch.slice(0, min(left, batch.num_rows))
                left -= batch.num_rows

    return CeilingSource


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=5_000_000)
    ap.add_argument("--value-size", type=int, default=100, help="bytes per value (about)")
    ap.add_argument("--servers", default=None, help="an existing riverlog (host:port)")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--min-partitions", type=int, default=None,
                    help="riverlog read tasks (default: Spark's default parallelism)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", default=None, help="keeps data between runs when given")
    ap.add_argument("--table-compression", default="zstd", choices=("zstd", "snappy"),
                    help="Parquet codec of the table (streams.table.compression)")
    ap.add_argument("--table-dir", default=None,
                    help="the server's table directory, with --servers (default: the one of "
                         "the server started here)")
    args = ap.parse_args()

    work = args.workdir or tempfile.mkdtemp(prefix="riverlog-spark-bench-")
    os.makedirs(work, exist_ok=True)
    proc = None
    servers = args.servers
    if servers is None:
        proc, servers = start_server(os.path.join(work, "data"), args.table_compression)
    stream = f"bench-{args.records}-{args.value_size}"
    table_dir = args.table_dir or os.path.join(work, "data", "tables")
    try:
        load_s = load(servers, stream, args.records, args.value_size,
                      {"x-riverlog-table": "true"})
        if load_s:
            print(f"loaded {args.records:,} records in {load_s:.1f} s "
                  f"({args.records / load_s:,.0f} records/s)", file=sys.stderr)
        table_s = wait_table(table_dir, stream, args.records)
        print(f"the table held every record {table_s:.1f} s after the last confirm",
              file=sys.stderr)

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        import riverlog.spark
        from riverlog.tables import manifest
        from riverlog.tables.storage import Storage

        spark = (SparkSession.builder.master(args.master).appName("riverlog spark bench")
                 .config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "4")
                 .config("spark.driver.memory", "4g")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("WARN")
        riverlog.spark.register(spark)
        tasks = args.min_partitions or spark.sparkContext.defaultParallelism
        n = args.records

        def riverlog_df(schema=None):
            r = spark.read.format("riverlog").option("servers", servers).option("stream", stream)
            if schema:
                r = r.schema(schema)
            return r.option("minPartitions", str(tasks)).load()

        def ceiling_df(schema=None):
            r = spark.read.format("riverlog_ceiling").option("n", str(n)).option("tasks", str(tasks))
            return (r.schema(schema) if schema else r).load()

        def table_df():
            return riverlog.spark.read_table(spark, stream, table_dir, servers=servers)

        spark.dataSource.register(ceiling_source(servers, stream))
        parquet_path = os.path.join(work, f"{stream}.parquet")
        if not os.path.isdir(parquet_path):
            riverlog_df().write.mode("overwrite").parquet(parquet_path)
        pq = spark.read.parquet(parquet_path)

        def count(df):
            return df.count

        def group(df):
            return lambda: df.groupBy("key").agg(F.count(F.lit(1)), F.sum(F.length("value"))).collect()

        # (name, source, query); a projected read names only the columns the query uses
        runs = [
            ("parquet", "count", count(pq)), ("parquet", "groupby", group(pq)),
            ("riverlog", "count", count(riverlog_df())),
            ("riverlog", "groupby", group(riverlog_df())),
            ("riverlog projected", "count", count(riverlog_df("offset long"))),
            ("riverlog projected", "groupby", group(riverlog_df("key binary, value binary"))),
            ("python-source ceiling", "count", count(ceiling_df())),
            ("python-source ceiling", "groupby", group(ceiling_df())),
            ("table", "count", count(table_df())), ("table", "groupby", group(table_df())),
        ]
        # rounds interleave the readers, so load from elsewhere on a shared machine falls on
        # all of them alike; the best round counts
        seconds = {(name, query): float("inf") for name, query, _ in runs}
        cpu = {}  # CPU seconds by process kind, in the best round
        for round_ in range(args.repeat):
            for name, query, action in runs:
                before, t = cpu_seconds(), time.perf_counter()
                action()
                took = time.perf_counter() - t
                if took < seconds[(name, query)]:
                    seconds[(name, query)] = took
                    cpu[(name, query)] = {k: v - before.get(k, 0.0)
                                          for k, v in cpu_seconds().items()}
                print(f"  round {round_ + 1} {name:<22} {query:<8} {took:.3f} s", file=sys.stderr)
        assert riverlog_df().count() == pq.count() == table_df().count() == n

        print(f"\n{n:,} records, value ~{args.value_size} B, master {args.master}, "
              f"{tasks} read tasks, best of {args.repeat}; records/s (ratio to Parquet)")
        names = ["parquet", "riverlog", "riverlog projected", "python-source ceiling", "table"]
        print(f"{'query':<9}" + "".join(f"{name:>26}" for name in names))
        summary = {"records": n, "value_size": args.value_size, "master": args.master,
                   "tasks": tasks}
        for q in ("count", "groupby"):
            base = seconds[("parquet", q)]
            cells = []
            summary[q] = {}
            for name in names:
                t = seconds[(name, q)]
                cells.append(f"{n / t:>14,.0f} ({base / t:.2f}x)")
                summary[q][name] = {"records_per_s": round(n / t), "seconds": round(t, 3),
                                    "ratio_to_parquet": round(base / t, 3)}
            print(f"{q:<9}" + "".join(f"{c:>26}" for c in cells))
        print("\nCPU seconds in the best round (JVM / Python workers / riverlog server):")
        for (name, q), used in cpu.items():
            cells = [used.get(k, 0.0) for k in ("jvm", "python workers", "server")]
            print(f"  {name:<22} {q:<8} " + " / ".join(f"{c:.2f}" for c in cells))
            summary[q][name]["cpu_s"] = {k: round(v, 2) for k, v in used.items()}
        log_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(
            os.path.join(work, "data", "streams")) for f in files if f.endswith(".segment"))
        m = manifest.load(Storage(table_dir), manifest.partition_dir(table_dir, stream, 0))
        table_bytes = sum(f.size for f in m.files)  # retired files left out
        if args.servers is None:
            print(f"\ndisk: log {log_bytes:,} B, table {table_bytes:,} B "
                  f"({table_bytes / log_bytes:.2f} Parquet bytes per log byte)")
            summary["disk"] = {"log_bytes": log_bytes, "table_bytes": table_bytes}
        print(json.dumps(summary))
        spark.stop()
    finally:
        if proc is not None:
            proc.terminate()
            proc.join(15)
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
