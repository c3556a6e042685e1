# Reading a stream's table (streams mirrored to Parquet, riverlog.tables): ``TableFiles``
# loads each partition's manifest and checks the files it lists; ``table_files`` lists a
# table's checked files for other readers (DuckDB, pandas, Polars); ``table_batches`` serves
# the riverlog source's ``tableDir`` option (a streaming query from earliest catches up from
# the table, then goes on from the log). Spark's ``read_table`` is riverlog.spark.table's and
# plans with these. Offsets the log no longer has but an archived table still holds
# (``streams.table.archive``) count as available, from the table.
# Rules: the rows are exactly those ``spark.read.format("riverlog")`` returns for the same
# offsets (the table holds what riverlog.spark.arrow builds from the same chunks); every
# listed file is checked before use (size, footer, row count, offset statistics within its
# range), its footer read once: a missing or damaged file or manifest is reported (log
# warning) and its offsets are read from the log, never guessed. The table folder is a path
# or a URI (riverlog.tables.storage): checks and pyarrow reads go through pyarrow.fs.
# pyarrow is imported in the functions; nothing here imports Spark.
from __future__ import annotations

import logging
import posixpath

from . import manifest as mf
from .storage import Storage

log = logging.getLogger("riverlog.tables")


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
