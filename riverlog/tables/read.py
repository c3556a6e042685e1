# Reading a stream through its table on Spark: ``read_table`` plans a batch read like the
# riverlog source does, then serves each offset range from the table's Parquet files where
# they hold it (Spark's own Parquet reader: column pruning, no Python per row) and from the
# riverlog source for the rest (offsets the table has not got yet, or whose file is damaged),
# as one DataFrame with the source's schema; offsets the log no longer has but an archived
# table still holds (``streams.table.archive``) count as available, from the table;
# ``table_files`` lists a table's checked files for other readers (DuckDB, pandas, Polars);
# ``table_batches`` serves the riverlog source's ``tableDir`` option (a streaming query from
# earliest catches up from the table, then goes on from the log).
# Rules: the rows are exactly those ``spark.read.format("riverlog")`` returns for the same
# offsets (the table holds what riverlog.spark.arrow builds from the same chunks); every
# listed file is checked before use (size, footer, row count, offset statistics within its
# range): a missing or damaged file or manifest is reported (log warning) and its offsets are
# read from the log, never guessed; a file used whole gets no filter, so a full scan costs
# what reading the Parquet files costs. The table folder is a path or a URI
# (riverlog.tables.storage): checks and pyarrow reads go through pyarrow.fs, Spark reads the
# files through its own Hadoop filesystems. pyspark/pyarrow are imported in the functions.
from __future__ import annotations

import functools
import json
import logging
import posixpath
from typing import Iterable

from . import manifest as mf
from .storage import Storage

log = logging.getLogger("riverlog.tables")

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
    from ..spark import register
    from ..spark.options import read_options
    from ..spark.reader import planned_ranges
    from ..spark.schema import column_names, projected_schema, spark_schema

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


def table_files(table_dir: str, stream: str, partition: int = 0) -> list[str]:
    """Paths of the Parquet files the table of ``partition`` of ``stream`` lists now, in
    offset order, each checked as read_table checks them (the others are reported and left
    out): for DuckDB, pandas or Polars. They hold what the table has, not the newest records
    it has not got yet (see the lag in ``riverlog stream describe``). Paths in the
    filesystem of ``table_dir`` (for a URI: without its scheme, as pyarrow.fs names them)."""
    return [path for _, path, _ in TableFiles(table_dir).usable(stream, partition, 0, 1 << 63)]


def table_batches(table_dir: str, stream: str, partition: int, start: int, end: int,
                  schema, batch_rows: int):
    """Yield the records ``[start, t)`` of the partition's table as ``pyarrow.RecordBatch``es
    of ``schema`` (riverlog.spark.arrow.arrow_schema, or a projection of it) and at most
    ``batch_rows`` rows, in offset order; ``t`` (returned) is where the table stops holding
    the range without a gap (``start`` when it holds none of it), ``end`` at most. Row
    groups outside the range are skipped by their offset statistics. For the riverlog
    source's ``tableDir`` option (executor side: pyarrow, no Spark)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    files = TableFiles(table_dir)
    pos = start
    for f, path, meta in files.usable(stream, partition, start, end):
        if f.start > pos:
            break  # a gap: the rest comes from the log
        hi = min(f.end, end)
        pf = pq.ParquetFile(path, metadata=meta, filesystem=files.storage.fs)
        columns = list(dict.fromkeys(schema.names + ["offset"]))
        at = _offset_column(meta)  # TableFiles.usable checked it is there, with statistics
        for i in range(meta.num_row_groups):
            stats = meta.row_group(i).column(at).statistics
            if stats.max < pos or stats.min >= hi:
                continue
            table = pf.read_row_group(i, columns=columns)
            offsets = table.column("offset")
            table = table.filter(pc.and_(pc.greater_equal(offsets, pos), pc.less(offsets, hi)))
            for batch in table.select(schema.names).to_batches(max_chunksize=batch_rows):
                yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)
        pos = hi
        if pos >= end:
            break
    return pos


def _partial(spark, schema, pieces):
    """The Parquet files of ``pieces`` with only the offsets asked of each (the offset
    statistics let Spark skip row groups outside them)."""
    from pyspark.sql import functions as F

    keep = functools.reduce(lambda a, b: a | b, [
        (F.col("stream") == s) & (F.col("partition") == p) & (F.col("offset") >= lo)
        & (F.col("offset") < hi) for _, s, p, lo, hi in pieces])
    return spark.read.schema(schema).parquet(*[piece[0] for piece in pieces]).where(keep)


class TableFiles:
    """The files of the tables under ``table_dir`` (a path or URI) for one read: each
    partition's manifest is loaded once; listed files are checked (riverlog.tables.read's
    rules) when asked for; a missing or damaged file or manifest is reported and left
    out."""

    def __init__(self, table_dir: str) -> None:
        self.storage = Storage(table_dir)
        self._manifests: dict[tuple[str, int], mf.Manifest | None] = {}

    def usable(self, stream: str, partition: int, start: int,
               end: int) -> list[tuple[mf.TableFile, str, object]]:
        """The listed files of the table holding offsets of ``[start, end)`` that pass
        their checks, with their paths and Parquet metadata, in offset order."""
        directory = mf.partition_dir(self.storage.root, stream, partition)
        m = self._manifest(stream, partition, directory)
        out = []
        for f in m.overlapping(start, end) if m is not None else ():
            path = posixpath.join(directory, f.name)
            meta, problem = _check(self.storage, path, f)
            if problem is None:
                out.append((f, path, meta))
            else:
                log.warning("table of %r partition %d: %s %s; offsets %d..%d read from the "
                            "log", stream, partition, path, problem, f.start, f.end - 1)
        return out

    def first(self, stream: str, partition: int, log_first: int) -> int:
        """The first offset from which the table and the log together hold the partition
        without a gap: ``log_first`` (the log's oldest offset), or the start of the run of
        listed files below it that reaches it (an archived table keeps what retention
        removed from the log: ``streams.table.archive``). Only the manifest is read (a
        streaming query asks at every trigger): a file of the run that fails its checks
        when it is read leaves offsets neither the table nor the log has, which the
        source reports as data loss."""
        m = self._manifest(stream, partition,
                           mf.partition_dir(self.storage.root, stream, partition))
        first = log_first
        for f in reversed(m.overlapping(0, log_first) if m is not None else ()):
            if f.end < first:
                break  # a gap: what is older cannot be read in one piece with the log
            first = f.start
        return first

    def _manifest(self, stream: str, partition: int, directory: str) -> mf.Manifest | None:
        key = (stream, partition)
        if key not in self._manifests:
            try:
                self._manifests[key] = mf.load(self.storage, directory)
            except (mf.ManifestError, OSError) as exc:
                log.warning("table of %r partition %d: %s; reading it from the log", stream,
                            partition, exc)
                self._manifests[key] = None
        return self._manifests[key]


def _check(storage: Storage, path: str, f: mf.TableFile) -> tuple[object, str | None]:
    """``(footer metadata, None)`` when the file at ``path`` is what the manifest lists,
    else ``(None, what is wrong)``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        size = storage.size(path)
        if size is None:
            return None, "is missing"
        if size != f.size:
            return None, f"is {size} bytes, the manifest says {f.size}"
        meta = pq.read_metadata(path, filesystem=storage.fs)
    except FileNotFoundError:
        return None, "is missing"
    except (OSError, pa.ArrowException) as exc:
        return None, f"cannot be read ({exc})"
    if meta.num_rows != f.rows:
        return None, f"holds {meta.num_rows} rows, the manifest says {f.rows}"
    at = _offset_column(meta)
    if at is None:
        return None, "has no offset column"
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(at).statistics
        if stats is None or not stats.has_min_max or stats.min < f.start \
                or stats.max >= f.end:
            return None, f"has offsets outside {f.start}..{f.end - 1}"
    return meta, None


def _offset_column(meta) -> int | None:
    """The index of the ``offset`` column among a Parquet file's leaf columns (what
    ``row_group(i).column(j)`` counts), None when it has none."""
    paths = [meta.schema.column(i).path for i in range(meta.num_columns)]
    return paths.index("offset") if "offset" in paths else None
