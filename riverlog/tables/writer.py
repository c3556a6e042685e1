# The table writer: the worker process that mirrors committed chunks to Parquet. The server
# (riverlog.tables.service) sends it one request per tick on stdin, a JSON line naming the
# table-enabled partitions with their segments and committed offset; it brings each table up
# to date reading the segment files itself (read-only, never through the server) and answers
# with one JSON line of statuses. Rules: only committed chunks are read (the request's
# committed offset bounds every read, so a torn or unsynced tail is never touched); user
# chunks only (tracking chunks are not records a consumer sees); chunks are converted by
# riverlog.spark.arrow, so a table row is exactly what the Spark source returns; files are
# published by riverlog.tables.manifest's rules. Recent chunks of the active segment become
# small files (at most MAX_SMALL_FILES, then rewritten as one); a sealed segment becomes one
# file, rewritten when compaction changes the segment file. The table folder may be on any
# filesystem pyarrow supports (riverlog.tables.storage); the segments are local files.
# Without ``archive`` files below the log's first offset are retired. The process runs at a
# lower CPU priority than the server and exits when stdin closes (the server stopped); it
# is started as ``python -m riverlog.tables.writer SERVER_PID`` and dies with that server
# (riverlog.tables.lifeline: a SIGKILLed server's worker never commits).
from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import posixpath
import sys
import time

from ..log.chunk import ChunkFormatError
from . import lifeline
from . import manifest as mf
from .segments import SegmentRuns, segment_path
from .state import PartitionState, Status
from .storage import Storage

log = logging.getLogger("riverlog.tables")

ROW_GROUP_ROWS = 1 << 20
"""Rows per Parquet row group at most (Spark splits scans by row group)."""
MAX_SMALL_FILES = 16
"""Small files of the active segment before they are rewritten as one."""
STATISTICS = ["stream", "partition", "offset", "timestamp"]
"""Columns with min/max statistics (for offset and timestamp filters)."""
NICE = 10
EXIT_MISSING = 2
"""The worker's exit code when pyarrow or pyspark is not installed."""


class TableWriter:
    """Brings tables under ``table_dir`` (a path or URI: riverlog.tables.storage) up to
    date, one ``update`` per partition state; new files with the Parquet codec
    ``compression`` (riverlog.config.TABLE_CODECS)."""

    def __init__(self, table_dir: str, archive: bool = False,
                 compression: str = "zstd") -> None:
        self.table_dir = table_dir
        self._storage: Storage | None = None
        self.archive = archive
        self.compression = compression
        self._visited: set[tuple[str, int, int]] = set()
        self._segments = SegmentRuns()
        self._errors: dict[tuple[str, int], str] = {}  # the last error logged per partition
        self._schema = None

    @property
    def storage(self) -> Storage:
        """The table folder, opened on first use (so a bad URI or an unreachable store is
        an error of each pass, not of the process). Raises ValueError, OSError."""
        if self._storage is None:
            self._storage = Storage(self.table_dir)
        return self._storage

    @property
    def schema(self):
        if self._schema is None:
            from ..spark.arrow import arrow_schema
            self._schema = arrow_schema()
        return self._schema

    def update(self, state: PartitionState) -> Status:
        """One pass over ``state``'s partition. Errors (a full disk, a damaged segment) are
        returned in the status and logged when they differ from the last pass's; what was
        published before them stays."""
        m = None
        try:
            directory = mf.partition_dir(self.storage.root, state.stream, state.partition)
            m = self._open(directory, state)
            self._advance(directory, m, state)
            error = None
        except (OSError, ValueError, ChunkFormatError, mf.ManifestError) as exc:
            error = str(exc)  # ValueError: pyarrow's ArrowInvalid (a URI it cannot open)
        self._report(state.stream, state.partition, error)
        if m is None:
            return Status(state.stream, state.partition, None, None, 0, 0, error)
        return Status(state.stream, state.partition, m.first, m.end, len(m.files),
                      sum(f.size for f in m.files), error)

    def drop(self, stream: str, created_ns: int | None = None) -> None:
        """Remove ``stream``'s table (the stream was deleted; ``created_ns`` not used: this
        server's own folder); an error is logged."""
        try:
            self.storage.delete_dir(mf.stream_dir(self.storage.root, stream))
        except (OSError, ValueError) as exc:
            log.error("table of %r: cannot remove it: %s", stream, exc)

    def _report(self, stream: str, partition: int, error: str | None) -> None:
        """Log a partition's error once, not every pass, and when it is gone."""
        last = self._errors.pop((stream, partition), None)
        if error is not None:
            self._errors[(stream, partition)] = error
            if error != last:
                log.error("table of %r partition %d: %s (tried again every pass)", stream,
                          partition, error)
        elif last is not None:
            log.info("table of %r partition %d: written again", stream, partition)

    # -- manifest -----------------------------------------------------------------------
    def _open(self, directory: str, state: PartitionState) -> mf.Manifest:
        """The partition's manifest; a damaged one, or one of an earlier stream of the same
        name, or one past the log's end (the log was cut), is dropped with its files and the
        table is written again. On the first visit, leftovers of a crash are removed."""
        try:
            m = mf.load(self.storage, directory)
        except mf.ManifestError as exc:
            log.error("table of %r partition %d: %s; writing it again from the log",
                      state.stream, state.partition, exc)
            m = None
        if m is not None and (m.created_ns != state.created_ns or m.stream != state.stream
                              or (m.end or 0) > state.committed + 1):
            log.warning("table of %r partition %d does not match the log; writing it again",
                        state.stream, state.partition)
            m = None
        if m is None:
            self.storage.delete_dir(directory)
            self.storage.make_dir(directory)
            m = mf.Manifest(state.stream, state.partition, state.created_ns)
        key = (state.stream, state.partition, state.created_ns)
        if key not in self._visited:
            for name in m.orphans(self.storage.names(directory)):
                log.info("table of %r partition %d: removing leftover %s", state.stream,
                         state.partition, name)
                self.storage.delete(posixpath.join(directory, name))
            self._visited.add(key)
        return m

    def _advance(self, directory: str, m: mf.Manifest, state: PartitionState) -> None:
        now = _now_ms()
        changed = not self.archive and bool(m.drop_before(state.first, now))
        committed_end = state.committed + 1
        *sealed, (active, active_next) = state.segments
        for base, nxt in sealed:
            if nxt > committed_end:
                break  # its last chunks are not committed yet (an fsync is pending)
            if nxt <= base or (m.first is not None and nxt <= m.first):
                continue
            try:
                st = os.stat(segment_path(state.log_dir, base))
            except FileNotFoundError:  # retention removed it since the request was made
                continue
            old = m.overlapping(base, nxt)
            if len(old) == 1 and old[0].sealed and old[0].source == (st.st_ino, st.st_size):
                continue
            m.publish(self._write(directory, m, state, base, base, nxt, sealed=True), old, now)
            m.save(self.storage, directory)  # much work: kept even if a later segment fails
        start = m.end if m.end is not None and m.end >= state.first else max(state.first,
                                                                                active)
        end = min(active_next, committed_end)
        if start >= active and end > start:
            small = [f for f in m.files if f.segment == active]
            if len(small) >= MAX_SMALL_FILES:
                start = small[0].start  # rewritten as one file with the new chunks
            else:
                small = []
            m.publish(self._write(directory, m, state, active, start, end, sealed=False),
                      small, now)
            changed = True
        expired = m.expired(now)
        if changed or expired:
            m.save(self.storage, directory)
        self._delete(directory, expired)

    def _delete(self, directory: str, names: list[str]) -> None:
        for name in names:
            self.storage.delete(posixpath.join(directory, name))

    # -- Parquet ------------------------------------------------------------------------
    def _write(self, directory: str, m: mf.Manifest, state: PartitionState, base: int,
               start: int, end: int, *, sealed: bool) -> mf.TableFile:
        """Write the records ``[start, end)`` of segment ``base`` as a new Parquet file
        (not yet listed). Raises OSError (a full disk, an unreachable store: what was
        written is removed), ChunkFormatError (a chunk fails its checks)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from ..spark.arrow import chunks_to_batch

        name = mf.file_name(start, end, m.generation + 1)
        path = segment_path(state.log_dir, base)
        fd = os.open(path, os.O_RDONLY)

        def write(out) -> tuple[int, int]:
            rows, group = 0, []
            writer = pq.ParquetWriter(out, self.schema, compression=self.compression,
                                      write_statistics=STATISTICS)
            try:
                for chunks in self._segments.runs(fd, path, start, end, source.st_size):
                    group.append(chunks_to_batch(chunks, state.stream, state.partition, start,
                                                 end, self.schema))
                    if sum(b.num_rows for b in group) >= ROW_GROUP_ROWS:
                        rows += _flush(writer, group, pa)
                rows += _flush(writer, group, pa)
            finally:
                writer.close()
            return rows, out.tell()

        try:
            source = os.fstat(fd)
            rows, size = self.storage.put(posixpath.join(directory, name), write)
        finally:
            os.close(fd)
        return mf.TableFile(name, start, end, rows, size, base, sealed,
                            (source.st_ino, source.st_size) if sealed else None)

def _flush(writer, group: list, pa) -> int:
    """Write ``group`` (record batches) as one row group; empty it; returns its rows."""
    rows = sum(b.num_rows for b in group)
    if rows:
        writer.write_table(pa.Table.from_batches(group), row_group_size=ROW_GROUP_ROWS)
    group.clear()
    return rows


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def serve(stdin, stdout) -> None:
    """The worker loop: one request line in, one reply line out, until ``stdin`` closes.
    Request: ``{"table_dir", "archive", "compression", "format", "catalog", "expiry_ms",
    "partitions": [PartitionState fields], "drop": [[stream, created_ns]]}``; reply:
    ``{"statuses": [Status fields]}`` in the order of ``partitions``. ``drop`` names deleted
    streams whose tables go (an Iceberg table only when made for that ``created_ns``). ``format`` "iceberg" writes Iceberg tables (riverlog.tables.iceberg_writer),
    one snapshot per stream per request; else the Parquet mirror of this module."""
    writers: dict[tuple, object] = {}
    for line in stdin:
        request = json.loads(line)
        states = [PartitionState(**dict(p, segments=[tuple(s) for s in p["segments"]]))
                  for p in request["partitions"]]
        writer = _writer(writers, request)
        for stream, created_ns in request.get("drop", ()):
            writer.drop(stream, created_ns)
        if isinstance(writer, TableWriter):
            statuses = [writer.update(state) for state in states]
        else:
            by_stream: dict[tuple[str, int], list[PartitionState]] = {}
            for state in states:
                by_stream.setdefault((state.stream, state.created_ns), []).append(state)
            done = {(s.stream, s.partition): s for (name, created), group in by_stream.items()
                    for s in writer.update(name, created, group)}
            statuses = [done[(state.stream, state.partition)] for state in states]
        stdout.write(json.dumps({"statuses": [dataclasses.asdict(s) for s in statuses]}) + "\n")
        stdout.flush()


def _writer(writers: dict, request: dict):
    """The writer for ``request``'s settings, made on first use and kept."""
    if request.get("format", "parquet") == "iceberg":
        from .iceberg_writer import IcebergWriter
        key = ("iceberg", request["table_dir"], request.get("catalog"),
               bool(request["archive"]), request["compression"], int(request["expiry_ms"]))
        if key not in writers:
            writers[key] = IcebergWriter(*key[1:])
        return writers[key]
    key = (request["table_dir"], bool(request["archive"]), request["compression"])
    if key not in writers:
        writers[key] = TableWriter(*key)
    return writers[key]


def main() -> None:
    """``python -m riverlog.tables.writer [SERVER_PID]``: the worker loop on stdin/stdout;
    with SERVER_PID, bound to that process (riverlog.tables.lifeline)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if len(sys.argv) > 1:
        lifeline.bind(int(sys.argv[1]))
    try:
        importlib.import_module("pyarrow.parquet")
        from ..spark.arrow import arrow_schema
        arrow_schema()
    except ImportError as exc:
        log.error("tables need pyarrow and pyspark (pip install 'riverlog[spark]'): %s", exc)
        sys.exit(EXIT_MISSING)
    try:
        os.nice(NICE)  # publishers first: the table may lag, the log may not
    except OSError:
        pass
    try:
        serve(sys.stdin, sys.stdout)
    except (BrokenPipeError, KeyboardInterrupt):
        pass


if __name__ == "__main__":
    main()
