# The commit log of one partition: a folder of segments named by base offset.
# Owns offsets (first, next, committed), appends with the durability policy, reads by offset
# and timestamp, waking readers on new data, segment roll, retention, compaction swaps,
# truncation, the leader-epoch checkpoint (epochs.py) and a follower's append of its leader's
# chunks as they are. Opening is recovery.py's, fsyncs syncer.py's, reads across segments
# reader.py's (spans.py's as spans), waiting for a commit waiters.py's, cutting tails Segment's.
# Rules: one event loop (or one thread) owns a CommitLog; blocking fsync and
# compaction run in worker threads and hand their results back to the owner; nothing here
# knows about protocols (records are opaque bytes; compaction gets a key function).
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from typing import Callable, Sequence

from ..config import Durability, LogConfig
from ..errors import (ChunkRefusedError, LogClosedError, LogError, LogFailedError,
                      OffsetOutOfRangeError, UncommittedTruncatedError)
from . import chunk as chunkfmt
from . import clean_close, reader
from .bloom import BloomCache
from .compaction import (CompactionPoint, CompactionResult, compact_segments,
                         install_compacted, load_point, save_point, unpin_all)
from .recovery import RecoveryReport, open_epochs, open_segments
from .retention import segments_to_delete
from .segment import ChunkSlice, Segment, fsync_dir
from .spans import ChunkSpan, read_spans
from .syncer import Syncer, loop_running, transient
from .waiters import CommitWaiters

log = logging.getLogger("riverlog.log")

DEFAULT_READ_BYTES = 1024 * 1024


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class CommitLog:
    """An append-only sequence of chunks with contiguous offsets, stored in ``directory``.

    Offsets: ``first_offset`` (oldest kept), ``next_offset`` (assigned to the next record),
    ``last_offset`` (= next - 1, -1 when empty) and ``committed_offset`` (the high watermark:
    the last offset readers may see; -1 when none). With ``auto_commit`` (single server)
    a chunk is committed once it is durable under ``config.durability``; replication will
    turn it off and call ``commit``.

    Leader epochs: ``epoch`` is stamped on every chunk this log writes (1 for a new log, as
    RabbitMQ's first epoch; on open, the latest epoch of the checkpoint); ``epochs`` is the
    partition's leader-epoch checkpoint, kept up to date by appends, truncation and retention.
    A follower's log (``auto_commit=False``) takes a leader's chunks with ``append_chunks``.

    Opening recovers the folder (see ``recovery.py``); ``report`` tells what was cut.
    Raises ``OSError`` only for I/O errors (permissions, full disk), never for bad bytes.
    """

    def __init__(self, directory: str | os.PathLike, config: LogConfig | None = None, *,
                 auto_commit: bool = True, clock_ms: Callable[[], int] = _now_ms) -> None:
        self.directory = os.fspath(directory)
        self.config = config or LogConfig()
        self.auto_commit = auto_commit
        self._clock_ms = clock_ms
        self._closed = False
        self._waiters = CommitWaiters()  # readers and writes waiting for a commit
        self._compacting: asyncio.Event | None = None  # set once the running compaction ends
        self._blooms = BloomCache()
        self.failure: LogFailedError | None = None  # once writes stopped (Syncer.fail)
        self.on_roll: Callable[[int], None] | None = None  # with a new segment's base offset
        self.on_written: Callable[[], None] | None = None
        """Called after each chunk this log writes itself (not ``append_chunks``)."""
        self.on_synced: Callable[[], None] | None = None  # after each fsync of new data
        self.compaction_point: CompactionPoint | None = None
        """The point of the latest compaction of this log, or of its leader's it applied
        (None before any); saved in the folder with it (``compaction-point``) and read back
        on open, so a restarted leader sends it to its followers at once."""
        self.follows_compaction = False
        """True while this log is a replica its server does not lead (a follower's, or one
        whose leader is unknown yet): it then compacts only by its leader's compaction point
        (``compact(key_of, point)``), never on its own. Set by replication's assign."""
        os.makedirs(self.directory, exist_ok=True)
        self.report = RecoveryReport()
        self._segments: list[Segment] = open_segments(
            self.directory, self.config.verify_on_open, self.report, clock_ms())
        self._bases = [s.base_offset for s in self._segments]
        self._last_ts = max(s.last_timestamp_ms for s in self._segments)
        self._syncer = Syncer(self, self.next_offset)  # fsyncs under the durability policy
        self.committed_offset = self.next_offset - 1 if auto_commit else -1
        self.epochs = open_epochs(self.directory, self._segments, self.report)
        self.compaction_point, problem = load_point(self.directory)
        if problem is not None:
            self.report.problems.append(problem)
        self.epoch = max(1, self.epochs.latest_epoch)
        """The leader epoch of the chunks this log writes; the replication layer raises it
        when this server becomes the partition's leader (never lowers it); ``append_chunks``
        keeps it at the newest epoch of the leader's chunks."""
        if not self.report.clean:
            for problem in self.report.problems:
                log.warning("recovery of %s: %s", self.directory, problem)
            log.warning("recovery of %s: dropped %d bytes and %d whole segments; log now ends "
                        "at offset %d", self.directory, self.report.truncated_bytes,
                        len(self.report.dropped_segments), self.next_offset - 1)

    # -- leader epochs ------------------------------------------------------------------
    def end_offset_for(self, epoch: int) -> int:
        """The end offset of leader ``epoch`` in this log, as the answer to a
        LeaderEpochOffsetRequest (``LeaderEpochCache.end_offset_for`` with this log's next
        offset as the log end): a follower truncates to it. -1 when undefined."""
        return self.epochs.end_offset_for(epoch, self.next_offset)

    # -- offsets ------------------------------------------------------------------------
    @property
    def first_offset(self) -> int:
        """Offset of the oldest record kept (== next_offset when the log is empty)."""
        for seg in self._segments:
            if len(seg.index):
                return seg.first_offset
        return self._segments[-1].next_offset

    @property
    def start_offset(self) -> int:
        """The log start: the base offset of the oldest segment (retention moves it,
        compaction does not; ``first_offset`` is the first record kept, which compaction may
        have removed from before). Reads from any offset at or above it are served."""
        return self._segments[0].base_offset

    @property
    def next_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def last_offset(self) -> int:
        """Offset of the newest record, -1 when nothing was ever written."""
        return self.next_offset - 1

    @property
    def last_chunk_offset(self) -> int:
        """First offset of the newest committed chunk (RabbitMQ's offset spec "last"),
        or ``next_offset`` when no chunk is committed."""
        found = reader.last_chunk(self._segments, self.committed_offset)
        return self.next_offset if found is None else found[0].index.offsets[found[1]]

    @property
    def last_user_chunk_offset(self) -> int:
        """First offset of the newest committed user chunk, tracking chunks (stored consumer
        offsets) passed over, as osiris' offset spec "last" (last_user_chunk_location), or
        ``next_offset`` when there is none."""
        found = reader.last_chunk(self._segments, self.committed_offset, user_only=True)
        return self.next_offset if found is None else found[0].index.offsets[found[1]]

    @property
    def last_message_offset(self) -> int:
        """Offset of the newest committed message: the last record of the newest committed
        user chunk (tracking chunks passed over); -1 when there is none."""
        found = reader.last_chunk(self._segments, self.committed_offset, user_only=True)
        if found is None:
            return -1
        idx, i = found[0].index, found[1]
        return min(idx.offsets[i] + idx.records[i] - 1, self.committed_offset)

    @property
    def size_bytes(self) -> int:
        """Bytes on disk in segment files (indexes excluded)."""
        return sum(s.size for s in self._segments)

    def bytes_from(self, offset: int) -> int:
        """Bytes on disk of the chunks from the one holding ``offset`` to the end (0 when
        ``offset`` is at or past the end): how far, in bytes, a follower at ``offset`` lags."""
        return reader.bytes_from(self._segments, offset)

    @property
    def segments(self) -> list[Segment]:
        """The segments, oldest first (read-only view for inspection and tests)."""
        return list(self._segments)

    # -- appends ------------------------------------------------------------------------
    def append(self, records: Sequence[bytes], *, timestamp_ms: int | None = None) -> range:
        """Append ``records`` (opaque bytes) as one chunk of simple entries.

        Returns the offsets assigned, as ``range(first, last + 1)``. Under
        ``Durability.ALWAYS`` this blocks on fsync; from async code use ``append_async``.
        """
        return self.append_entries(chunkfmt.encode_entries(records), len(records),
                                   len(records), timestamp_ms=timestamp_ms)

    def append_entries(self, data: bytes, num_entries: int, num_records: int, *,
                       timestamp_ms: int | None = None, chunk_type: int = chunkfmt.CHUNK_USER,
                       trailer: bytes = b"", bloom_size: int = 0) -> range:
        """Append already-encoded entries (simple entries or sub-batches, kept as given)
        as one chunk. ``num_records`` counts the records inside sub-batches.
        Blocking variant: see ``append``. Raises ``ValueError`` for bad counts."""
        offsets = self._write(data, num_entries, num_records, timestamp_ms, chunk_type,
                              trailer, bloom_size)
        policy = self.config.durability
        if policy is Durability.ALWAYS or (
                policy is Durability.INTERVAL and not loop_running()
                and self._clock_ms() - self._syncer.last_ms >= self.config.fsync_interval_ms):
            self.sync()
        else:
            self._syncer.after_write()
            if self.auto_commit:
                self.commit(offsets[-1])
        return offsets

    async def append_async(self, records: Sequence[bytes], *,
                           timestamp_ms: int | None = None) -> range:
        """``append`` for the event loop: the chunk is written at once; under
        ``Durability.ALWAYS`` it returns after a (group-committed) fsync done in a thread."""
        return await self.append_entries_async(chunkfmt.encode_entries(records), len(records),
                                               len(records), timestamp_ms=timestamp_ms)

    async def append_entries_async(self, data: bytes, num_entries: int, num_records: int, *,
                                   timestamp_ms: int | None = None,
                                   chunk_type: int = chunkfmt.CHUNK_USER,
                                   trailer: bytes = b"", bloom_size: int = 0) -> range:
        """``append_entries`` for the event loop (see ``append_async``)."""
        offsets = self.write_entries(data, num_entries, num_records, timestamp_ms=timestamp_ms,
                                     chunk_type=chunk_type, trailer=trailer,
                                     bloom_size=bloom_size)
        if self.needs_flush:
            await self.flush()
        return offsets

    def write_entries(self, data: bytes, num_entries: int, num_records: int, *,
                      timestamp_ms: int | None = None, chunk_type: int = chunkfmt.CHUNK_USER,
                      trailer: bytes = b"", bloom_size: int = 0) -> range:
        """Write a chunk now, without waiting for fsync (for callers on the event loop that
        must keep arrival order). Under ``Durability.ALWAYS`` the chunk is committed only
        after ``await flush()`` (check ``needs_flush``); under the other policies it is
        committed at once and an interval fsync is scheduled."""
        offsets = self._write(data, num_entries, num_records, timestamp_ms, chunk_type,
                              trailer, bloom_size)
        if not self.needs_flush:
            self._syncer.after_write()
            if self.auto_commit:
                self.commit(offsets[-1])
        return offsets

    @property
    def needs_flush(self) -> bool:
        """True when appends are committed only by ``flush`` (``Durability.ALWAYS``)."""
        return self.config.durability is Durability.ALWAYS

    def _write(self, data: bytes, num_entries: int, num_records: int,
               timestamp_ms: int | None, chunk_type: int, trailer: bytes,
               bloom_size: int) -> range:
        if self._closed:
            raise LogClosedError(f"commit log {self.directory} is closed")
        if self.failure is not None:
            raise self.failure
        now = self._clock_ms()
        ts = max(now if timestamp_ms is None else timestamp_ms, self._last_ts)
        first = self.next_offset
        raw = chunkfmt.encode_chunk(data, num_entries, num_records, first_offset=first,
                                    timestamp_ms=ts, epoch=self.epoch, chunk_type=chunk_type,
                                    trailer=trailer, bloom_size=bloom_size)
        if self.epoch != self.epochs.latest_epoch:
            self.epochs.assign(self.epoch, first)  # ValueError for an epoch gone backwards
        self._place(raw, first, num_records, ts, self.epoch, trailer[:bloom_size], now)
        if self.on_written is not None:
            self.on_written()
        return range(first, first + num_records)

    def _place(self, raw: bytes, first: int, num_records: int, ts: int, epoch: int,
               bloom: bytes, now_ms: int) -> None:
        """Write the whole chunk ``raw`` at the end of the active segment, rolling first when
        it is full or old."""
        seg = self._segments[-1]
        if seg.size and (seg.size + len(raw) > self.config.segment_max_bytes or (
                self.config.segment_max_age_ms
                and now_ms - seg.created_ms >= self.config.segment_max_age_ms)):
            seg = self._roll(now_ms)
        if first != seg.next_offset and not seg.compacted:  # a gap (append_chunks)
            seg.allow_gaps()
        try:
            seg.append(raw, first, num_records, ts, epoch)
        except OSError as exc:  # nothing counted written; a full disk, or no descriptor for
            if not transient(exc):  # a moment, fails this write alone
                self._syncer.fail(exc)
            raise
        self._blooms.appended(seg, bloom)
        self._last_ts = max(self._last_ts, ts)

    def append_chunks(self, raw: bytes | memoryview) -> range:
        """Append one or more whole chunks exactly as the partition's leader sent them
        (replication's follower side): same offsets, bytes, CRCs and epochs, so the replicas
        hold the same chunks. Returns the offsets appended, ``range(first, next)``.

        Every chunk is checked before anything is written: its header and data CRC-32, its
        first offset not below the log's next offset (then the previous chunk's end; above it
        when the leader's compaction removed the records between: the gap is kept, as Kafka's
        and Liftbridge's followers keep it, and the segment is marked as holding gaps) and its
        epoch not older than the latest leader epoch of the log; one failure raises
        ``ChunkRefusedError`` and appends nothing, so the follower fetches again from
        ``next_offset`` (truncating first, after a leader change). Each epoch change is
        recorded in ``epochs``, and ``epoch`` follows the newest. An epoch whose first chunk
        follows a gap is recorded from the gap's start: its leader's start lies somewhere in
        the gap, and a start put too late would let a peer truncating by this log's epochs
        keep a stale tail there (one put too early only cuts records this log lacks
        anyway). The high watermark (``committed_offset``) is left alone: the leader's says
        what is committed (``commit``); hence ``LogError`` when the log was opened with
        ``auto_commit=True``. Durability: as ``write_entries`` (under ``Durability.ALWAYS``
        call ``await flush()``).
        """
        if self._closed:
            raise LogClosedError(f"commit log {self.directory} is closed")
        if self.failure is not None:
            raise self.failure
        if self.auto_commit:
            raise LogError(f"commit log {self.directory} commits its own appends "
                           "(auto_commit); a follower's log is opened with auto_commit=False")
        view = memoryview(raw)
        try:
            headers = chunkfmt.check_chunks(view, self.next_offset, self.epochs.latest_epoch)
        except chunkfmt.ChunkFormatError as exc:
            raise ChunkRefusedError(self.directory, self.next_offset, str(exc)) from None
        first = self.next_offset
        now = self._clock_ms()
        for pos, gap_start, h, size in headers:
            if h.epoch != self.epochs.latest_epoch:
                self.epochs.assign(h.epoch, gap_start)
            chunk = view[pos:pos + size]  # written as is: no copy
            self._place(chunk, h.first_offset, h.num_records, h.timestamp_ms, h.epoch,
                        bytes(chunkfmt.bloom_of(h, chunk)), now)
        self.epoch = max(self.epoch, self.epochs.latest_epoch)
        if headers and not self.needs_flush:
            self._syncer.after_write()
        return range(first, self.next_offset)

    def _roll(self, now_ms: int) -> Segment:
        old = self._segments[-1]
        old.index.flush()
        if self.on_roll is not None:
            self.on_roll(old.next_offset)
        seg = Segment(self.directory, old.next_offset)
        seg.created_ms = now_ms
        self._segments.append(seg)
        self._bases.append(seg.base_offset)
        self.enforce_retention()
        return seg

    # -- durability ---------------------------------------------------------------------
    def sync(self) -> None:
        """Fsync every segment with unsynced writes, now, blocking; then commit them."""
        self._syncer.sync()

    @property
    def durable_next_offset(self) -> int:
        """The end of what the durability policy counts as written: ``next_offset``, or under
        ``Durability.ALWAYS`` the end of what is fsynced (what a leader of a replicated
        partition counts as its own log end for the high watermark)."""
        next_offset = self.next_offset
        return min(self._syncer.synced_next, next_offset) if self.needs_flush else next_offset

    async def flush(self) -> None:
        """Wait until everything written so far is fsynced (group commit: concurrent
        callers share one fsync, run in a worker thread)."""
        await self._syncer.flush()

    def commit(self, offset: int) -> None:
        """Advance the high watermark to ``offset`` (never backwards, never past the last
        offset) and wake readers waiting for it."""
        offset = min(offset, self.last_offset)
        if offset <= self.committed_offset:
            return
        self.committed_offset = offset
        self._waiters.release(offset)

    async def wait_for(self, offset: int, *, written: bool = False) -> None:
        """Return once ``offset`` is committed (readable). Raises ``LogClosedError`` if the
        log closes first. No polling: the commit that reaches ``offset`` wakes the waiter.
        ``written``: the waiter is a write waiting for its own record's commit (a confirm,
        an ALL ack): ``truncate`` removing the record raises ``UncommittedTruncatedError``,
        so a record written later at that offset is not taken for it."""
        while self.committed_offset < offset:
            if self._closed:
                raise LogClosedError(f"commit log {self.directory} is closed")
            await self._waiters.wait(offset, written)

    # -- reads --------------------------------------------------------------------------
    def read_chunks(self, offset: int, max_bytes: int = DEFAULT_READ_BYTES, *,
                    max_chunks: int = 0, committed_only: bool = True,
                    buffer: bytearray | None = None) -> list[ChunkSlice]:
        """Chunks from the one holding ``offset`` on (reader.run: at most ``max_bytes``, but one
        chunk always, and ``max_chunks``, 0: no limit), read into ``buffer`` when it is large
        enough (``Segment.read_chunks``); empty when ``offset`` is past the end (or the
        committed offset). Raises ``OffsetOutOfRangeError`` when ``offset < start_offset``
        (retention removed it), ``CorruptChunkError`` when a chunk fails its checks."""
        run = reader.run(self._segments, self._bases, offset,
                         self._readable(offset, committed_only), max_bytes, max_chunks)
        return [] if run is None else run[0].read_chunks(*run[1:], self.config.verify_reads,
                                                          buffer)

    def read_spans(self, offset: int, max_bytes: int = DEFAULT_READ_BYTES, *, max_chunks: int = 0,
                   min_bytes: int = 0, buffer: bytearray | None = None
                   ) -> list[ChunkSpan] | list[ChunkSlice]:
        """``read_chunks`` (committed), as spans where chunks may be (spans.read_spans)."""
        run = reader.run(self._segments, self._bases, offset, self._readable(offset, True),
                         max_bytes, max_chunks)
        return [] if run is None else read_spans(*run, self.config.verify_reads, min_bytes, buffer)

    def _readable(self, offset: int, committed_only: bool) -> int:
        """The last offset a read from ``offset`` may return (raises as read_chunks)."""
        if self._closed:
            raise LogClosedError(f"commit log {self.directory} is closed")
        if offset < self.start_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is before the log start offset {self.start_offset}")
        return self.committed_offset if committed_only else self.last_offset

    def read_matching_chunks(self, offset: int, matches: Callable[[bytes], bool],
                             max_bytes: int = DEFAULT_READ_BYTES, *, max_chunks: int = 0,
                             buffer: bytearray | None = None, max_skip: int = 4096
                             ) -> tuple[list[ChunkSlice], int]:
        """``read_chunks`` for a filtered reader: committed chunks from the one holding
        ``offset`` on whose bloom filter ``matches`` (called with the filter bytes, ``b""``
        for a chunk without one) accepts, skipping the others without reading their data
        (at most ``max_skip`` of them per call). The chunks returned are consecutive ones
        (``max_chunks`` counts only them). Returns ``(chunks, resume)``: the offset to read
        from next, past every chunk looked at. Raises as ``read_chunks`` does."""
        return reader.read_matching(self._segments, self._bases, offset,
                                    self._readable(offset, True), self._blooms, matches,
                                    max_bytes, max_chunks, self.config.verify_reads, buffer,
                                    max_skip)

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """First offset of the first chunk whose timestamp is >= ``timestamp_ms`` (ms since
        the epoch); ``next_offset`` when every chunk is older."""
        return reader.offset_for_timestamp(self._segments, timestamp_ms, self.next_offset)

    # -- housekeeping -------------------------------------------------------------------
    def enforce_retention(self) -> int:
        """Delete the oldest whole segments over the retention limits; returns how many.
        Skipped while a compaction or an fsync is in flight."""
        if self._compacting is not None or self._syncer.task is not None:
            return 0
        n = segments_to_delete(self._segments, self.config, self._clock_ms())
        for seg in self._segments[:n]:
            log.info("retention: deleting %s (offsets %d..%d)", seg.path, seg.first_offset,
                     seg.next_offset - 1)
            seg.delete()
            self._blooms.forget(seg.base_offset)
        if n:
            del self._segments[:n]
            del self._bases[:n]
            self.epochs.truncate_from_start(self.first_offset)
        return n

    async def compact(self, key_of: Callable[[bytes], bytes | None],
                      point: CompactionPoint | None = None) -> CompactionResult:
        """Keep only the newest record per key among committed records, in every segment but
        the active one (records without a key are kept; sub-batches are kept whole).
        ``key_of`` maps a record to its key (or None). The rewrite runs in a worker thread;
        the swap happens here; ``compaction_point`` becomes the result's point.

        With ``point`` (a follower applying its leader's compaction point): the records below
        ``point.end`` whose key has a newer record at or below ``point.upto`` are removed,
        whatever this log's segment boundaries, so this log then holds the leader's records.
        The active segment is rolled first when it holds records below ``point.end``;
        nothing is done (the result's point is None) until everything up to the end of the
        segments concerned is committed here. Raises ``LogError`` if a compaction is already
        running, ``LogClosedError`` once the log is closed."""
        if self._closed:
            raise LogClosedError(f"commit log {self.directory} is closed")
        if self._compacting is not None:
            raise LogError("a compaction is already running")
        if point is not None and self.committed_offset >= point.upto:
            active = self._segments[-1]
            if len(active.index) and active.base_offset < point.end:
                self._roll(self._clock_ms())
        self._compacting, pinned = asyncio.Event(), []  # pinned: see compact_segments
        try:
            for seg in self._segments:
                seg.index.flush()
            result = await asyncio.get_running_loop().run_in_executor(
                None, compact_segments, list(self._segments), self.committed_offset, key_of,
                point, pinned)
            if self._closed:
                return result
            self._segments = install_compacted(self._segments, result)
            self._blooms.forget()
            self._bases = [s.base_offset for s in self._segments]
            if result.point is not None:
                self.compaction_point = result.point
            return result
        finally:
            unpin_all(pinned)  # the old files, kept for reads until the swap
            self._compacting.set()
            self._compacting = None

    @property
    def compacting(self) -> bool:
        """Whether a compaction is running (``truncate`` and ``reset`` refuse meanwhile)."""
        return self._compacting is not None

    async def compaction_finished(self) -> None:
        """Return once no compaction runs (at once when none does)."""
        while self._compacting is not None:
            await self._compacting.wait()

    def truncate(self, offset: int) -> None:
        """Remove every record at ``offset`` and after (replication's follower truncation).

        The committed offset drops to ``offset - 1`` if it was higher. When ``offset`` falls
        inside a chunk, that chunk is rewritten with its leading records; raises ``LogError``
        if that would split a sub-batch entry. Writes waiting for the commit of a removed
        record fail (``UncommittedTruncatedError``). Fsyncs before returning.
        """
        if self._closed:
            raise LogClosedError(f"commit log {self.directory} is closed")
        if self._compacting is not None:
            raise LogError("cannot truncate while a compaction is running")
        if offset >= self.next_offset:
            return
        offset = max(offset, self.first_offset)
        self._blooms.forget()
        while len(self._segments) > 1 and self._segments[-1].first_offset >= offset:
            self._segments.pop().delete()
            self._bases.pop()
        seg = self._segments[-1]
        seg.truncate_at(offset)
        self._last_ts = seg.last_timestamp_ms if len(seg.index) else self._last_ts
        self._syncer.cut(self.next_offset)
        self.committed_offset = min(self.committed_offset, self.next_offset - 1)
        self.epochs.truncate_from_end(self.next_offset)
        self._fail_removed_writes(offset)

    def _fail_removed_writes(self, offset: int) -> None:
        """Fail the writes waiting for the commit of a record at ``offset`` or after (just
        truncated): ``UncommittedTruncatedError``."""
        self._waiters.fail_writes_from(offset, UncommittedTruncatedError(
            f"commit log {self.directory}: records from offset {offset} on were truncated "
            f"before their commit"))

    def reset(self, offset: int) -> None:
        """Remove every record and continue at ``offset`` (a follower whose leader no longer
        holds the follower's next offset: retention removed it there). The log is then empty
        with ``first_offset == next_offset == offset``, nothing committed below it matters
        (``committed_offset`` = ``offset - 1``), the leader-epoch checkpoint is empty (the
        leader's chunks bring their epochs) and so is ``compaction_point``; writes waiting
        for their commit fail (``UncommittedTruncatedError``). Fsyncs before returning."""
        if self._closed:
            raise LogClosedError(f"commit log {self.directory} is closed")
        if self._compacting is not None:
            raise LogError("cannot reset while a compaction is running")
        self._blooms.forget()
        for seg in self._segments:
            seg.delete()
        seg = Segment(self.directory, offset)
        seg.created_ms = self._clock_ms()
        self._segments, self._bases = [seg], [offset]
        fsync_dir(self.directory)
        self._syncer.cut(offset, reset=True)
        self.committed_offset = offset - 1
        self.epochs.replace([])
        save_point(self.directory, None)  # it described records that are gone
        self.compaction_point = None
        self._fail_removed_writes(0)  # every record is gone

    # -- lifecycle ----------------------------------------------------------------------
    def close(self, *, mark: bool = True) -> None:
        """Fsync (unless the policy is NEVER), close the files and, with ``mark``, write the
        clean-close marker (clean_close.py). Waiting readers get ``LogClosedError``."""
        if self._closed:
            return
        self._syncer.stop_timer()
        if self.config.durability is not Durability.NEVER and self.failure is None:
            self._syncer.sync(at_close=True)  # a failure is logged; the files close anyway
        summary = (clean_close.summary_of(self) if mark and self.failure is None
                   and self._compacting is None else None)
        self._closed = True
        for seg in self._segments:
            seg.close()
        self._waiters.wake_all()
        # after the index files' last flush; with no summary a stale marker is removed
        clean_close.write_marker(self.directory, self._segments, summary)

    async def aclose(self) -> None:
        """Wait for an in-flight fsync, then ``close``."""
        if self._syncer.task is not None:
            await asyncio.wait([self._syncer.task])  # its failure is ``failure``
        self.close()

    def delete(self) -> None:  # close and remove the folder with every file in it
        self.close(mark=False)
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> "CommitLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"CommitLog({self.directory!r}, first={self.first_offset}, "
                f"next={self.next_offset}, committed={self.committed_offset})")

