# Reading a stream through its table on Spark: ``read_table`` (a stream, a list of them, or
# a super stream's partition streams, unioned) plans a batch read like the riverlog source
# does, then serves each offset range from the table's Parquet files where they hold it (the
# stream's Iceberg table, found through the catalog the caller or the server names: its
# current snapshot's files and the offsets its summary says it holds, riverlog.tables.iceberg;
# or the Parquet mirror's manifest) (Spark's own Parquet reader: column pruning, no Python per
# row) and from the riverlog source for the rest (offsets the table has not got yet, or whose
# file is damaged), as one DataFrame with the source's schema. Which files hold what, and
# whether they pass their checks, is riverlog.tables.read's (TableFiles). Rules: a file used
# whole gets no filter, so a full scan costs what reading the Parquet files costs; the files
# are handed to Spark by their Hadoop URI (Storage.spark_path); pyspark and the source's
# modules are imported in the function (importing riverlog.spark needs neither pyspark nor
# pyarrow).
from __future__ import annotations

import functools
import json
from typing import Iterable

from ..tables.read import TableFiles

__all__ = ["read_table"]

_PLANNING = ("stream", "streams", "startingoffsets", "endingoffsets", "startingtimestamp")


def read_table(spark, stream: str, table_dir: str | None = None, *,
               columns: Iterable[str] | None = None, catalog: str | None = None,
               **options: str):
    """A DataFrame of ``stream`` (one name, or a comma-separated list; a super stream's name
    reads its partition streams, the server's Partitions answer, as one table) with the
    riverlog source's schema (riverlog.spark.schema), or only ``columns`` of it, in that
    order. The table is either each stream's Apache Iceberg table (``streams.table.format:
    iceberg``, the default), found in the catalog ``catalog`` (``streams.table.catalog``: a
    REST catalog's http(s) URI or an SQLAlchemy URL such as
    ``sqlite:////data/tables/catalog.db``; riverlog.tables.iceberg.catalog_uri), else in the
    embedded catalog of the folder ``table_dir``, else in the catalog the server names
    (its Open answer, riverlog.client's ``table_catalog``), whose current snapshot's
    summary says which offsets it holds; or the Parquet mirror under ``table_dir``
    (``streams.table.dir``, default ``DATA/tables``) when that folder has no Iceberg
    catalog, a path or URI (riverlog.tables.storage) the driver reads with pyarrow and
    Spark's executors with their Hadoop filesystems (``s3://`` as ``s3a://``). Either way
    the table's data files are read by Spark's Parquet reader and the offsets the table
    does not hold (the newest, or those of a missing or damaged file) by the riverlog
    source. ``options``: the riverlog source's read options (``servers``,
    ``startingOffsets``, ``endingOffsets``, ``startingTimestamp``, ``failOnDataLoss``,
    ``user``, ...; docs/spark.md; offsets of a super stream are given per partition
    stream), resolved once here; "earliest" is the table's first offset when the table
    holds, without a gap, offsets older than the log's first. Raises what the source
    raises for bad options, DataLossError, ValueError (also for ``columns`` naming a column
    the schema does not have, or when there is no table folder or catalog: the server
    names none, or names one whose password it leaves out) and
    riverlog.tables.iceberg.CatalogError (the catalog cannot be reached)."""
    from ..tables.iceberg import embedded_catalog
    from .options import connection, read_options
    from .schema import column_names, spark_schema
    from .super_streams import expanded

    full = spark_schema()
    names = column_names(columns, "read_table") if columns is not None else tuple(full.names)
    with connection(options).connect("riverlog-spark-plan") as client:
        opts = read_options(expanded(dict(options, stream=stream), client))
        named = client.table_catalog
        if catalog is None and table_dir is not None:
            catalog = embedded_catalog(table_dir)
        if catalog is None and table_dir is None:
            if named is None:
                raise ValueError("read_table: the server names no Iceberg catalog (its "
                                 "tables are Parquet files): give the table folder "
                                 "(table_dir)")
            if "***" in named:
                raise ValueError(f"read_table: the server's catalog {named} needs its "
                                 "password: give it as catalog=")
            catalog = named
        if catalog is not None:
            whole, partial, from_log = _iceberg_plan(opts, table_dir, catalog, client)
        else:
            whole, partial, from_log = _parquet_plan(opts, table_dir, client)
    return _frame(spark, full, names, whole, partial, from_log, options)


def _parquet_plan(opts, table_dir: str, client):
    """``(whole files, partial pieces, ranges from the log)`` of the Parquet mirror, the
    ranges resolved through ``client`` (a connected riverlog.client.Client)."""
    from .reader import planned_ranges

    files = TableFiles(table_dir)
    storage = files.storage
    whole: list[str] = []
    partial: list[tuple[str, str, int, int, int]] = []  # path, stream, partition, lo, hi
    from_log = []
    for r in planned_ranges(opts, files.first, client):
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
    return whole, partial, from_log


def _iceberg_plan(opts, table_dir: str | None, catalog: str, client):
    """The same plan from each stream's Iceberg table: its current snapshot's files, whole
    when all their offsets are in the range asked, else filtered."""
    from ..tables.iceberg import TableSnapshot
    from ..tables.storage import spark_uri
    from .reader import planned_ranges

    snapshots = {s: TableSnapshot(table_dir or "", catalog, s) for s in opts.streams}
    whole, partial, from_log = [], [], []
    for r in planned_ranges(opts, lambda s, p, first: snapshots[s].first(p, first), client):
        lo, hi, files = snapshots[r.stream].held(r.partition, r.start, r.end)
        if lo > r.start:
            from_log.append((r.stream, r.partition, r.start, lo))
        for location, a, b in files:
            path = location if location.startswith("file:") else spark_uri(location, "")[:-1]
            if lo <= a and b < hi:
                whole.append(path)
            else:
                partial.append((path, r.stream, r.partition, lo, hi))
        if hi < r.end:
            from_log.append((r.stream, r.partition, max(hi, r.start), r.end))
    return whole, partial, from_log


def _frame(spark, full, names, whole, partial, from_log, options):
    """One DataFrame: ``whole`` Parquet files, ``partial`` pieces filtered, ``from_log``
    ranges through the riverlog source."""
    from . import register
    from .schema import projected_schema

    schema = projected_schema(names)
    every = tuple(names) == tuple(full.names)  # a projection costs py4j calls: only if asked
    frames = []
    if whole:
        df = spark.read.schema(full).parquet(*whole)
        frames.append(df if every else df.select(*names))
    if partial:
        df = _partial(spark, full, partial)
        frames.append(df if every else df.select(*names))
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
