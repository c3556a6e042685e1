# Reading a stream through its table on Spark: ``read_table`` plans a batch read like the
# riverlog source does, then serves each offset range from the table's Parquet files where
# they hold it (Spark's own Parquet reader: column pruning, no Python per row) and from the
# riverlog source for the rest (offsets the table has not got yet, or whose file is damaged),
# as one DataFrame with the source's schema. Which files hold what, and whether they pass
# their checks, is riverlog.tables.read's (TableFiles).
# Rules: a file used whole gets no filter, so a full scan costs what reading the Parquet files
# costs; the files are handed to Spark by their Hadoop URI (Storage.spark_path); pyspark and
# the source's modules are imported in the function (importing riverlog.spark needs neither
# pyspark nor pyarrow).
from __future__ import annotations

import functools
import json
from typing import Iterable

from ..tables.read import TableFiles

__all__ = ["read_table"]

_PLANNING = ("stream", "streams", "startingoffsets", "endingoffsets", "startingtimestamp")


def read_table(spark, stream: str, table_dir: str, *, columns: Iterable[str] | None = None,
               **options: str):
    """A DataFrame of ``stream`` (one name, or a comma-separated list) with the riverlog
    source's schema (riverlog.spark.schema), or only ``columns`` of it, in that order.
    ``table_dir``: where the server writes tables (``streams.table.dir``, default
    ``DATA/tables``), a path or URI (riverlog.tables.storage) the driver reads with
    pyarrow and Spark's executors with their Hadoop filesystems (``s3://`` as ``s3a://``).
    ``options``: the riverlog source's read options (``servers``, ``startingOffsets``,
    ``endingOffsets``, ``startingTimestamp``, ``failOnDataLoss``, ``user``, ...;
    docs/spark.md), resolved once here; "earliest" is the table's first offset when the
    table holds, without a gap, offsets older than the log's first (TableFiles.first).
    Raises what the source raises for bad options, DataLossError, and ValueError (also
    for ``columns`` naming a column the schema does not have)."""
    from . import register
    from .options import read_options
    from .reader import planned_ranges
    from .schema import column_names, projected_schema, spark_schema

    full = spark_schema()
    names = column_names(columns, "read_table") if columns is not None else tuple(full.names)
    opts = read_options(dict(options, stream=stream))
    files = TableFiles(table_dir)
    storage = files.storage
    schema = projected_schema(names)
    whole: list[str] = []
    partial: list[tuple[str, str, int, int, int]] = []  # path, stream, partition, lo, hi
    from_log = []
    for r in planned_ranges(opts, files.first):
        pos = r.start
        for f, path, _ in files.usable(r.stream, r.partition, r.start, r.end):
            lo, hi = max(f.start, r.start), min(f.end, r.end)
            if lo > pos:
                from_log.append((r.stream, r.partition, pos, lo))
            if (lo, hi) == (f.start, f.end):
                whole.append(storage.spark_path(path))
            else:
                partial.append((storage.spark_path(path), r.stream, r.partition, lo, hi))
            pos = hi
        if pos < r.end:
            from_log.append((r.stream, r.partition, pos, r.end))
    frames = []
    if whole:
        frames.append(spark.read.schema(full).parquet(*whole).select(*names))
    if partial:
        frames.append(_partial(spark, full, partial).select(*names))
    if from_log:
        register(spark)
        source = {k: v for k, v in options.items() if k.lower() not in _PLANNING}
        for s, p, lo, hi in from_log:
            frames.append(spark.read.format("riverlog").schema(schema).options(**source)
                          .option("stream", s)
                          .option("startingOffsets", json.dumps({s: {str(p): lo}}))
                          .option("endingOffsets", json.dumps({s: {str(p): hi}})).load())
    if not frames:
        return spark.createDataFrame([], schema)
    return functools.reduce(lambda a, b: a.unionByName(b), frames)


def _partial(spark, schema, pieces):
    """The Parquet files of ``pieces`` with only the offsets asked of each (the offset
    statistics let Spark skip row groups outside them)."""
    from pyspark.sql import functions as F

    keep = functools.reduce(lambda a, b: a | b, [
        (F.col("stream") == s) & (F.col("partition") == p) & (F.col("offset") >= lo)
        & (F.col("offset") < hi) for _, s, p, lo, hi in pieces])
    return spark.read.schema(schema).parquet(*[piece[0] for piece in pieces]).where(keep)
