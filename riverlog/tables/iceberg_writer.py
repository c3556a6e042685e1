# The Iceberg table writer: brings a stream's Apache Iceberg table (riverlog.tables.iceberg)
# up to date with its partitions' committed chunks, in the table worker process
# (riverlog.tables.writer's loop, for ``streams.table.format: iceberg``). Rules: one pass
# commits at most one snapshot per stream (an append, merging manifests as Iceberg's
# commit.manifest.min-count-to-merge says, so planning stays cheap; or an overwrite when files
# are replaced or removed) whose summary records each partition's committed offsets; data
# files are written by pyiceberg from the segment files (riverlog.tables.segments: only
# committed user chunks, converted by riverlog.spark.arrow, so a row is what the Spark source
# returns), one segment at a time, so no data file holds records of two segments. A sealed
# segment is written again whole, replacing its pieces, once it is sealed and when compaction
# changes it; more than MAX_SMALL_FILES pieces of the active segment are written again as one.
# Without ``archive`` data files below the log's first offset are removed. A crash before the
# commit leaves files no snapshot lists: on the first visit of a table (and after snapshots
# expire) the data files no snapshot lists are deleted, in the partitions this writer leads
# and has claimed only (another writer's files in flight are left alone). A table whose
# offsets run past the log's end, or of an earlier stream of the same name, is written again
# from the log. Several writers share a table (a cluster's partition leaders): commits and
# fencing are riverlog.tables.iceberg_commit's; a partition whose table has a newer leader
# epoch than the request's is not written (its status says why).
from __future__ import annotations

import itertools
import logging
import os
import time

from ..log.chunk import ChunkFormatError
from . import convert
from . import iceberg as ice
from . import iceberg_commit as shared
from . import iceberg_expiry as expiry
from .segments import SegmentRuns, segment_path
from .state import Status
from .storage import Storage

log = logging.getLogger("riverlog.tables")

MAX_SMALL_FILES = 16
"""Data files of the active segment before they are written again as one."""
FILE_ROWS = 1 << 20
"""Records written at a time (held in memory, then one data file per day partition)."""
CLEANUP_INTERVAL_S = 60.0
"""Seconds between snapshot expiries (and the removal of the files they free)."""


class IcebergWriter:
    """Tables of streams in the Iceberg ``catalog`` (riverlog.tables.iceberg.catalog_uri)
    with data under ``table_dir``; snapshots older than ``expire_ms`` expire. ``update``
    takes one stream's partition states (riverlog.tables.state.PartitionState) and returns
    their riverlog.tables.state.Status."""

    def __init__(self, table_dir: str, catalog: str | None, archive: bool = False,
                 compression: str = "zstd", expire_ms: int = 3_600_000) -> None:
        self.table_dir, self.catalog_name, self.archive = table_dir, catalog, archive
        self.compression, self.expire_ms = compression, expire_ms
        self._catalog = None
        self._segments = SegmentRuns()
        self._cleaned: dict[str, float] = {}  # stream -> time.monotonic() of its last cleanup
        self._converting: list[tuple[str, int]] = []  # partitions new in this pass
        self._planned: dict[str, tuple[int | None, dict]] = {}  # stream -> (snapshot, files)
        self._listings: dict[str, expiry.Listings] = {}  # stream -> what its snapshots list
        self._errors: dict[str, str] = {}

    @property
    def catalog(self):
        if self._catalog is None:
            self._catalog = ice.load_catalog(self.table_dir, self.catalog_name)
        return self._catalog

    def update(self, stream: str, created_ns: int, states: list) -> list:
        """One pass over ``stream``'s partitions ``states``. An error (the catalog cannot be
        reached, a full disk, a damaged segment, a commit conflict) is in every status and
        logged when it differs from the last pass's; nothing of the pass is visible then."""
        table, refused, all_states = None, {}, states
        try:
            table = self._table(stream, created_ns)
            refused = shared.fenced(table.current_snapshot(),
                                    {s.partition: s.leader_epoch for s in states})
            states = [s for s in states if s.partition not in refused]
            epochs = {s.partition: s.leader_epoch for s in states}
            table = shared.claim(table, stream, epochs)
            self._converting = []
            table = self._advance(table, stream, states, epochs)
            for name, partition in self._converting:  # the Iceberg table holds them now
                if convert.remove_old(self.table_dir, name, partition):
                    log.info("table of %r partition %d: the old Parquet table is converted "
                             "and removed", name, partition)
            table = self._cleanup(table, stream, epochs)
            error = None
        except (OSError, ValueError, ChunkFormatError, ice.CatalogError, shared.Fenced,
                shared.Conflict) as exc:
            error = str(exc)
            self._catalog = None if isinstance(exc, ice.CatalogError) else self._catalog
        except Exception as exc:  # pyiceberg's CommitFailedException, sqlalchemy errors, ...
            error = f"{type(exc).__name__}: {exc}"
            self._catalog = None
        if error is not None:
            self._cleaned.pop(stream, None)  # files a failed commit wrote go next pass
        self._report(stream, error)
        held = ice.snapshot_offsets(table.current_snapshot()) if table is not None else {}
        sizes = self._files(stream, table) if table is not None else {}
        out = []
        for s in all_states:
            first, end = held.get(s.partition, (None, None))
            files = sizes.get(s.partition, [])
            out.append(Status(stream, s.partition, first, end, len(files),
                              sum(f.file_size_in_bytes for f, _, _ in files),
                              refused.get(s.partition, error)))
        return out

    def drop(self, stream: str, created_ns: int | None = None) -> None:
        """Drop ``stream``'s table and its files (the stream was deleted); errors logged.
        With ``created_ns``, only a table made for the stream created then: in a cluster a
        server's drop can come after the name's new stream has its table (another leader's)."""
        try:
            table = ice.load_table(self.catalog, stream)
            if table is not None and created_ns is not None and \
                    table.properties.get(ice.CREATED_PROPERTY) != str(created_ns):
                log.info("table of %r: made for a newer stream of that name; kept", stream)
            elif table is not None:
                self.catalog.drop_table(ice.identifier(stream))
                storage = Storage(self.table_dir)
                storage.delete_dir(storage.fs.normalize_path(ice.fs_path(table.location())))
        except Exception as exc:  # as in update: the catalog's errors are of many types
            log.error("table of %r: cannot remove it: %s", stream, exc)
        self._cleaned.pop(stream, None)
        self._planned.pop(stream, None)
        self._listings.pop(stream, None)

    def _files(self, stream: str, table) -> dict[int, list]:
        """riverlog.tables.iceberg.data_files of ``table``, planned once per snapshot (a
        snapshot never changes)."""
        snapshot = table.current_snapshot()
        sid = snapshot.snapshot_id if snapshot is not None else None
        cached = self._planned.get(stream)
        if cached is None or cached[0] != sid:
            cached = self._planned[stream] = (sid, ice.data_files(table))
        return cached[1]

    def _report(self, stream: str, error: str | None) -> None:
        last = self._errors.pop(stream, None)
        if error is not None:
            self._errors[stream] = error
            if error != last:
                log.error("table of %r: %s (tried again every pass)", stream, error)
        elif last is not None:
            log.info("table of %r: written again", stream)

    # -- the table ------------------------------------------------------------------------
    def _table(self, stream: str, created_ns: int):
        try:
            table = ice.load_table(self.catalog, stream)
        except ValueError as exc:  # pydantic's and json's errors: damaged metadata
            log.error("table of %r: its metadata cannot be read (%s); writing it again from "
                      "the log", stream, exc)
            self.catalog.drop_table(ice.identifier(stream))
            table = None
        if table is not None and table.properties.get(ice.CREATED_PROPERTY) != str(created_ns):
            log.warning("table of %r belongs to an earlier stream of that name; writing it "
                        "again", stream)
            self.drop(stream)
            table = None
        if table is None:
            table = ice.create_table(self.catalog, self.table_dir, stream, created_ns,
                                     self.compression)
        return ice.without_retries(table)

    def _advance(self, table, stream: str, states: list, epochs: dict[int, int]):
        snapshot = table.current_snapshot()
        held = ice.snapshot_offsets(snapshot)
        whole = ice.snapshot_segments(snapshot)
        files = self._files(stream, table)
        removed, written = [], []  # DataFiles to delete; (partition, segment, start, end)
        for s in states:
            mine = files.get(s.partition, [])
            first, end = held.get(s.partition, (None, None))
            segs = whole.get(s.partition, {})
            committed_end = s.committed + 1
            log_end = s.segments[-1][1] if s.segments else s.first
            if end is not None and committed_end < end <= log_end:
                # the log holds them, this server does not know them committed yet: a new
                # leader learns the high watermark with its next fetch answer (rewriting
                # would lose what only an archive table holds): the next pass goes on
                continue
            if end is not None and end > committed_end:
                log.warning("table of %r partition %d runs past the log (%d > %d); writing "
                            "it again", stream, s.partition, end, committed_end)
                removed += [f for f, _, _ in mine]
                mine, first, end, segs = [], None, None, {}
            if not self.archive:
                gone = [f for f, _, hi in mine if hi < s.first]
                removed += gone
                mine = [m for m in mine if m[0] not in gone]
                if first is not None and first < s.first:
                    first = min((lo for _, lo, _ in mine), default=None)
                    first = None if first is None else max(first, s.first)
                    end = None if first is None else end
            segs = {b: v for b, v in segs.items() if any(b == base for base, _ in s.segments)}
            start = end if end is not None and end >= s.first else s.first
            if first is None:  # a new table: what only an old Parquet-mirror table holds
                old_first, rows = (convert.archived_rows(self.table_dir, stream, s.partition,
                                                         s.first)
                                   if self.archive else (s.first, []))
                written += [(s, None, table, None) for table in rows]
                first = old_first if rows else None
                end = s.first if rows else None
                self._converting.append((stream, s.partition))
            *sealed, (active, _) = s.segments
            for base, nxt in sealed:
                if nxt > committed_end or nxt <= base or first is None or base < first \
                        or nxt > start:
                    continue  # not committed whole, or not (all) in the table
                source = _source(s.log_dir, base)
                if source is None or segs.get(base) == source:
                    continue
                removed += [f for f, lo, hi in mine if lo >= base and hi < nxt]
                written.append((s, base, base, nxt))
                segs[base] = source
            pieces = [f for f, lo, _ in mine if lo >= active]
            if len(pieces) >= MAX_SMALL_FILES and start > active:
                removed += pieces
                start = max(active, first if first is not None else active)
            for base, nxt in s.segments:
                lo, hi = max(start, base), min(nxt, committed_end)
                if hi > lo:
                    written.append((s, base, lo, hi))
                    if (base, nxt) != s.segments[-1] and lo == base and hi == nxt:
                        source = _source(s.log_dir, base)
                        if source is not None:
                            segs[base] = source
            if start < committed_end:
                first = start if first is None else first
                end = committed_end
            if first is not None:
                held[s.partition] = (first, end)
            else:
                held.pop(s.partition, None)
            whole[s.partition] = segs
        if not removed and not written and held == ice.snapshot_offsets(snapshot):
            return table
        added = self._write(table, stream, written)
        try:
            return shared.commit(table, stream, snapshot, epochs, held, whole, removed,
                                 added)[0]
        except Exception as exc:
            from pyiceberg.exceptions import CommitFailedException
            if isinstance(exc, (shared.Fenced, shared.Conflict, CommitFailedException)):
                for f in added:  # the commit did not land: nothing lists them
                    table.io.delete(f.file_path)
            raise

    def _write(self, table, stream: str, written: list) -> list:
        """The data files of ``written`` ranges, written now from the segments (or
        ``(state, None, rows, None)``: Arrow rows converted from an old table); pyiceberg
        DataFiles, one write uuid per pass."""
        import uuid

        from pyiceberg.io.pyarrow import _dataframe_to_data_files

        from ..spark.arrow import arrow_schema, chunks_to_batch

        schema = arrow_schema()
        tasks = itertools.count()  # data file names: one write uuid per pass, a task each
        write_uuid = uuid.uuid4()
        added = []
        for s, base, lo, hi in written:
            if base is None:  # rows converted from an old table (riverlog.tables.convert)
                added += _dataframe_to_data_files(
                    table_metadata=table.metadata, df=lo.cast(schema), io=table.io,
                    write_uuid=write_uuid, counter=tasks)
                continue
            path = segment_path(s.log_dir, base)
            fd = os.open(path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                batches = (chunks_to_batch(chunks, stream, s.partition, lo, hi, schema)
                           for chunks in self._segments.runs(fd, path, lo, hi, size))
                for rows in _tables(batches, schema):
                    added += _dataframe_to_data_files(
                        table_metadata=table.metadata, df=rows, io=table.io,
                        write_uuid=write_uuid, counter=tasks)
            finally:
                os.close(fd)
        return added

    # -- expiry and orphans ---------------------------------------------------------------
    def _cleanup(self, table, stream: str, epochs: dict[int, int]):
        """Expire snapshots older than ``expire_ms`` (at most every CLEANUP_INTERVAL_S; on
        the first visit too) and delete the files no remaining snapshot references: the
        manifest lists, manifests and data files the expired ones freed
        (riverlog.tables.iceberg_expiry), and data files leftovers of a crash before a commit in the partitions
        of ``epochs`` (partition -> leader epoch) this writer has claimed in the table (so
        never another writer's files in flight: a new leader claims before it writes, and a
        claimed partition's former leader can no longer commit)."""
        now = time.monotonic()
        last = self._cleaned.get(stream)
        if last is not None and now - last < CLEANUP_INTERVAL_S:
            return table
        self._cleaned[stream] = now
        listings = self._listings.setdefault(stream, expiry.Listings())
        storage = Storage(self.table_dir)
        cutoff_ms = time.time_ns() // 1_000_000 - self.expire_ms
        if expiry.expirable(table, cutoff_ms):
            from pyiceberg.exceptions import CommitFailedException
            try:
                table = expiry.expire(table, cutoff_ms, listings, storage, stream)
            except CommitFailedException:  # another writer committed: again next pass
                self._cleaned.pop(stream, None)
                return table.refresh()
        listed = listings.reachable(table)[2]
        held = ice.snapshot_epochs(table.current_snapshot())
        claimed = {p for p, e in epochs.items() if held.get(p) == e}
        from pyarrow import fs
        data = ice.fs_path(table.location().rstrip("/") + "/data")
        infos = storage.fs.get_file_info(fs.FileSelector(data, recursive=True,
                                                         allow_not_found=True))
        for info in infos:
            if info.type == fs.FileType.File and info.path not in listed \
                    and _partition_of(data, info.path) in claimed:
                log.info("table of %r: removing %s (no snapshot lists it)", stream, info.path)
                storage.delete(info.path)
        return table


def _tables(batches, schema):
    """``batches`` as Arrow tables of about FILE_ROWS rows (pyiceberg writes a partitioned
    table from a whole pa.Table only, not from a stream of batches)."""
    import pyarrow as pa

    group, rows = [], 0
    for batch in batches:
        group.append(batch)
        rows += batch.num_rows
        if rows >= FILE_ROWS:
            yield pa.Table.from_batches(group, schema)
            group, rows = [], 0
    if rows:
        yield pa.Table.from_batches(group, schema)


def _source(log_dir: str, base: int) -> tuple[int, int] | None:
    """The segment file's (inode, size); None when retention removed it."""
    try:
        st = os.stat(segment_path(log_dir, base))
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size)


def _partition_of(data: str, path: str) -> int | None:
    """The stream partition of the data file at ``path`` under the table's ``data`` folder
    (pyiceberg's layout: ``data/partition=<n>/timestamp_day=<day>/<file>``); None when the
    path does not say."""
    first = path[len(data):].lstrip("/").split("/", 1)[0]
    name, _, value = first.partition("=")
    return int(value) if name == "partition" and value.isdigit() else None
