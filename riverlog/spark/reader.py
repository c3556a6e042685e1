# The batch reader of the riverlog Spark source, and the executor-side read that the
# streaming reader shares. Owns RangePartition (one Spark task: one offset range of one
# partition), Tables (which part of a task the stream's table serves: options tableDir and
# catalog) and read_partition (one connection per task, chunks in, Arrow batches out).
# Rules: partitions are small frozen dataclasses (they are pickled to executors); the driver
# client is opened for planning and never pickled; executors import pyarrow/numpy only inside
# read(); a range is read exactly, [start, end), whatever chunk boundaries say, and a lost
# connection reads on where it stopped (on whichever replica serves the stream now); a range
# whose start is gone is an error under failOnDataLoss (else skipped to what is there); a
# start in a gap compaction left is not loss (the stream keeps records before it).
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Iterator

from pyspark.sql.datasource import DataSourceReader, InputPartition

from . import offsets as plan
from .options import Connection, ReadOptions

log = logging.getLogger("riverlog.spark")

_MAX_PENDING_BYTES = 64 * 1024 * 1024
_CREDIT = 16
_RECONNECTS = 5
"""Tries in a row, without a record read between, to read on after a lost connection."""
_RECONNECT_PAUSE_S = 0.5
"""Pause before the n-th try in a row: n times this (a leader failover takes ~2 s)."""


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One task: records ``[start, end)`` of ``partition`` of ``stream``, read through
    ``connection``; batches of at most ``batch_rows`` rows."""

    stream: str
    partition: int
    start: int
    end: int
    connection: Connection
    fail_on_data_loss: bool = True
    batch_rows: int = 65_536
    columns: tuple[str, ...] | None = None  # a projection (user schema); None: all columns
    table_dir: str | None = None  # the offsets the stream's table holds are read from it
    # or, from an Iceberg table: its data files holding [start, table_end) (location, lowest
    # offset, highest offset), as the driver found them in the current snapshot
    table_files: tuple[tuple[str, int, int], ...] = ()
    table_end: int = 0
    files_dir: str | None = None  # the table folder whose filesystem opens table_files


class Tables:
    """The driver's view of the streams' tables a read uses: the Iceberg tables in the
    catalog of option ``catalog`` (or the one in the folder of ``tableDir``: its embedded
    SQLite catalog, riverlog.tables.iceberg.embedded_catalog), else the Parquet mirror
    under ``tableDir`` (riverlog.tables.read). Each stream's snapshot is loaded once. With
    ``catalog`` and ``tableDir`` a URI (``s3://KEY:SECRET@bucket/prefix?...``), the Iceberg
    table's files are checked and read on that folder's filesystem (its credentials)."""

    def __init__(self, opts: ReadOptions) -> None:
        from ..tables.iceberg import embedded_catalog
        self.opts = opts
        self.catalog = opts.catalog or (embedded_catalog(opts.table_dir)
                                        if opts.table_dir is not None else None)
        self._snapshots: dict = {}
        self._files = None
        if self.catalog is None:
            from ..tables.read import TableFiles
            self._files = TableFiles(opts.table_dir)

    def snapshot(self, stream: str):
        """riverlog.tables.iceberg.TableSnapshot of ``stream`` (Iceberg only)."""
        if stream not in self._snapshots:
            from ..tables.iceberg import TableSnapshot
            self._snapshots[stream] = TableSnapshot(self.opts.table_dir or "", self.catalog,
                                                    stream)
        return self._snapshots[stream]

    def first(self, stream: str, partition: int, log_first: int) -> int:
        """offsets.available's ``held``: the table's first offset when it holds, without a
        gap, offsets the log no longer has (``streams.table.archive``), else ``log_first``."""
        if self._files is not None:
            return self._files.first(stream, partition, log_first)
        return self.snapshot(stream).first(partition, log_first)

    def partition(self, r: plan.Range, columns: tuple[str, ...] | None) -> RangePartition:
        """The task of ``r``: what the table holds from its start read from the table."""
        opts = self.opts
        part = RangePartition(r.stream, r.partition, r.start, r.end, opts.connection,
                              opts.fail_on_data_loss, opts.max_records_per_batch, columns,
                              opts.table_dir if self._files is not None else None)
        if self._files is not None or r.end <= r.start:
            return part
        lo, hi, files = self.snapshot(r.stream).held(r.partition, r.start, r.end)
        if lo != r.start or hi <= lo:
            return part  # the table does not hold the range's start: all from the log
        return dataclasses.replace(part, table_files=tuple(files), table_end=hi,
                                   files_dir=opts.table_dir)


def tables_of(opts: ReadOptions) -> Tables | None:
    """The tables a read with ``opts`` uses (options ``tableDir``/``catalog``); None."""
    return Tables(opts) if opts.table_dir is not None or opts.catalog is not None else None


def to_partitions(rs: list[plan.Range], opts: ReadOptions,
                  columns: tuple[str, ...] | None = None,
                  tables: Tables | None = None) -> list[RangePartition]:
    """One task per range; with the read's ``tables`` (tables_of), each reads what the
    table holds from the start of its range from the table."""
    tables = tables if tables is not None else tables_of(opts)
    if tables is not None:
        return [tables.partition(r, columns) for r in rs]
    return [RangePartition(r.stream, r.partition, r.start, r.end, opts.connection,
                           opts.fail_on_data_loss, opts.max_records_per_batch, columns)
            for r in rs]


def read_partition(part: RangePartition) -> Iterator:
    """Yield ``pyarrow.RecordBatch``es (riverlog.spark.schema) with every record of
    ``part``, in offset order: with ``table_dir``, those the stream's table holds from the
    start of the range on from its Parquet files (riverlog.tables.read.table_batches), the
    rest from the server over one connection, opened here and closed at the end. A lost
    connection (a server stopped, a cluster's leader failing over) is opened again where
    the stream lives (``Connection.connect_for``) and the range read on from the offset
    after the last record handed out: offsets are the same on every replica, so nothing is
    repeated or skipped. Raises DataLossError (failOnDataLoss) when the first records of
    the range are gone (retention; a gap compaction left is skipped, ``_compacted_away``),
    ClientError when the server refuses (a response code) or no server serves the stream
    for ``_RECONNECTS`` tries in a row."""
    if part.end <= part.start:
        return
    from ..client import ClientError
    from .arrow import arrow_schema

    schema = arrow_schema(part.columns)
    start, end = part.start, part.end
    if part.table_files:
        from ..tables.iceberg import snapshot_batches
        yield from snapshot_batches(part.table_files, start, part.table_end, schema,
                                    part.batch_rows, part.files_dir)
        start = part.table_end
        if start >= end:
            return
    elif part.table_dir is not None:
        from ..tables.read import table_batches
        start = yield from table_batches(part.table_dir, part.stream, part.partition, start,
                                         end, schema, part.batch_rows)
        if start >= end:
            return
    failures = 0
    check_loss = True
    while True:
        reached = [start]
        try:
            yield from _read_from_server(part, schema, reached, check_loss)
            return
        except ClientError as exc:
            if exc.code is not None or failures >= _RECONNECTS:
                raise
            if reached[0] > start:  # read on from a chunk's end: what follows may be a gap
                failures, start, check_loss = 0, reached[0], False
            else:
                failures += 1
            log.warning("%r/%d: %s; reading on from offset %d on another connection",
                        part.stream, part.partition, exc, start)
            time.sleep(_RECONNECT_PAUSE_S * failures)


def _read_from_server(part: RangePartition, schema, reached: list[int],
                      check_loss: bool) -> Iterator:
    """``read_partition``'s read over one connection, from ``reached[0]`` to the end of the
    range; ``reached[0]`` follows the offset after the last record yielded. ``check_loss``:
    a first chunk starting after ``reached[0]`` is data loss (``_lost``), else a gap."""
    from ..client import ClientError, OffsetType
    from .arrow import chunks_to_batch

    start, end = reached[0], part.end
    address = plan.address(part.stream, part.partition)
    client = part.connection.connect_for(address, write=False, name="riverlog-spark-read")
    try:
        sub = client.subscribe(address, OffsetType.OFFSET, start, credit=_CREDIT)
        pending: list = []
        rows = size = 0
        first = check_loss
        while True:
            chunks = sub.next_chunks(_CREDIT, part.connection.timeout)
            if not chunks:
                raise ClientError(f"{part.stream!r}/{part.partition}: no data for "
                                  f"{part.connection.timeout}s while reading {start}..{end}")
            if first:
                first = False
                head = chunks[0].first_offset
                if head > start and not _compacted_away(client, address, start):
                    _lost(part, start, head)
                    start = reached[0] = head
            done = False
            for chunk in chunks:
                h = chunk.header
                if h.next_offset <= start:
                    continue
                pending.append(chunk)
                rows += min(h.next_offset, end) - max(h.first_offset, start)
                size += len(chunk.raw)
                if h.next_offset >= end:
                    done = True
                    break
            if pending and (done or rows >= part.batch_rows or size >= _MAX_PENDING_BYTES):
                batch = chunks_to_batch(pending, part.stream, part.partition, start, end, schema)
                start = reached[0] = pending[-1].next_offset
                pending, rows, size = [], 0, 0
                if batch.num_rows:
                    yield batch
            if done or start >= end:
                return
    finally:
        client.close()


def table_held(opts: ReadOptions, tables: Tables | None = None) -> plan.Held | None:
    """With ``tableDir`` or ``catalog``: the offsets the stream's table holds that the log
    no longer has count as available (offsets.available's ``held``); else None."""
    tables = tables if tables is not None else tables_of(opts)
    return tables.first if tables is not None else None


def _compacted_away(client, address: str, offset: int) -> bool:
    """Whether ``offset``, which a read found missing, is a gap compaction left rather than
    data loss: the stream still keeps a record at or before it (its StreamStats
    ``first_chunk_id``, asked after the read: retention only moves it up). Spark's Kafka
    source decides the same way (KafkaDataConsumer.fetchRecord: a record past the offset
    asked, with the earliest available offset not above it, is a skip, not loss). A gap
    that compaction left at the very start of the stream, before its first record kept,
    cannot be told from retention this way and counts as loss."""
    first = client.stream_stats(address).get("first_chunk_id", -1)
    return 0 <= first <= offset


def _lost(part: RangePartition, start: int, head: int) -> None:
    if part.fail_on_data_loss:
        raise plan.DataLossError(
            f"stream {part.stream!r} partition {part.partition}: offsets {start}..{head - 1} "
            "are no longer available (removed by retention); set failOnDataLoss=false to "
            "skip them")
    log.warning("stream %r partition %d: offsets %d..%d are gone, skipped", part.stream,
                part.partition, start, head - 1)


def planned_ranges(opts: ReadOptions, held: plan.Held | None = None,
                   client=None) -> list[plan.Range]:
    """The ranges a batch read with ``opts`` covers, one per partition (possibly empty):
    ``startingOffsets`` (default earliest) / ``startingTimestamp`` to ``endingOffsets``
    (default latest), resolved now against the server (through ``client``, a connected
    riverlog.client.Client, or a connection of its own), and the stream's table with
    ``held`` (see offsets.available) or ``tableDir``. Raises DataLossError (see
    check_loss), ValueError for an ``endingOffsets`` past the last committed offset."""
    if held is None:
        held = table_held(opts)
    if client is None:
        with opts.connection.connect("riverlog-spark-plan") as client:
            return planned_ranges(opts, held, client)
    first, end = plan.available(client, opts.streams, held)
    start = plan.resolve(client, opts.starting, "earliest", first, end,
                         opts.starting_timestamp)
    stop = plan.resolve(client, opts.ending, "latest", first, end)
    start = plan.check_loss(start, first, end, opts.fail_on_data_loss)
    for stream, parts in stop.items():
        for p, hi in parts.items():
            if hi > end[stream][p]:
                raise ValueError(f"option endingOffsets: {stream!r}/{p} ends at {hi}, past "
                                 f"the last committed offset {end[stream][p] - 1}")
    return plan.ranges(start, stop)


class RiverlogReader(DataSourceReader):
    """Batch read: ``startingOffsets`` (default earliest) / ``startingTimestamp`` to
    ``endingOffsets`` (default latest), resolved once when Spark plans the query; one task
    per partition, or more with ``minPartitions``. ``columns``: a projection (None: all)."""

    def __init__(self, opts: ReadOptions, columns: tuple[str, ...] | None = None) -> None:
        self.opts = opts
        self.columns = columns

    def partitions(self) -> list[RangePartition]:
        tables = tables_of(self.opts)
        rs = planned_ranges(self.opts, table_held(self.opts, tables))
        return to_partitions(plan.split(rs, self.opts.min_partitions), self.opts,
                             self.columns, tables)

    def read(self, partition: RangePartition) -> Iterator:
        if not isinstance(partition, RangePartition):  # Spark's stand-in when there is
            return iter(())                            # nothing to read
        return read_partition(partition)
