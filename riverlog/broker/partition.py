# One partition of a stream: its commit log plus its tracking state (publisher sequences for
# deduplication, stored consumer offsets, both carried by the log: broker/tracking.py). The
# only way front doors write and read data.
# Rules: writes happen synchronously on the event loop, in arrival order; "committed" is one
# event, the high watermark passing an offset, and every door's confirm or ALL ack waits for
# it through ``when_committed`` (the commit pipeline; LEADER acks wait only for the write);
# nothing here knows any wire format; the log opens lazily, on the first use of ``log``,
# ``offsets`` or ``publishers`` (a read, a write, a door's hook), and until then the offsets
# and sizes are answered from the folder's clean-close marker (log/clean_close.py) without a
# file kept open; a partition closed or deleted never opens again.
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from typing import Callable, Collection, Mapping, Sequence

from ..config import LogConfig
from ..errors import LogClosedError
from ..log import ChunkSlice, ChunkSpan, CommitLog
from ..log.bloom import build_bloom
from ..log.chunk import CHUNK_TRACKING_DELTA, encode_entries
from ..log.clean_close import LogSummary, is_clean, read_summary
from .tracking import (CLOSE_SNAPSHOT, ConsumerOffsets, PublisherSequences,
                       encode_offset_tracking, encode_writer_trailer)

log = logging.getLogger("riverlog.broker")


def entry_records(entry: bytes) -> int:
    """Records in one encoded entry: 1 for a simple entry, the sub-batch's count otherwise
    (sub-batch header: ``1|codec|0000, records u16, ...``)."""
    if entry[0] & 0x80:
        return (entry[1] << 8) | entry[2]
    return 1


class Partition:
    """Partition ``index`` of stream ``stream``, stored in ``directory``. ``auto_commit``
    False: a replicated partition, whose high watermark replication advances
    (``CommitLog.commit``) instead of the local durability policy."""

    def __init__(self, stream: str, index: int, directory: str, config: LogConfig, *,
                 auto_commit: bool = True) -> None:
        self.stream = stream
        self.index = index
        self.directory = directory
        self.config = config
        self.auto_commit = auto_commit
        self._log: CommitLog | None = None
        self._offsets: ConsumerOffsets | None = None
        self._publishers: PublisherSequences | None = None
        self._summary: LogSummary | None = None  # read from the marker while not open
        self._ended = False  # closed or deleted before it was ever opened
        # Liftbridge partition flags, saved in the stream's metadata (Stream.save_metadata):
        # a paused partition takes no NATS messages until resumed; a read-only one takes no
        # writes from the Liftbridge doors. ``events`` maps "pause"/"readonly"/"received" to
        # [first, latest] change times in ns ("received" is kept in memory only).
        self.paused = False
        self.readonly = False
        self.events: dict[str, list[int]] = {}

    # -- opening ------------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        """Whether the log was opened (it stays so until the partition closes)."""
        return self._log is not None

    @property
    def log(self) -> CommitLog:
        """The commit log, opened now if it was not (recovered unless its clean-close
        marker is valid). Raises ``LogClosedError`` once the partition was closed or deleted
        unopened, ``OSError`` (``ResourceExhaustedError``) when its files cannot be opened."""
        return self._log if self._log is not None else self.open()

    @property
    def offsets(self) -> ConsumerOffsets:
        """The stored consumer offsets (opens the log as ``log``)."""
        if self._offsets is None:
            self.open()
        return self._offsets

    @property
    def publishers(self) -> PublisherSequences:
        """The publisher sequences (opens the log as ``log``)."""
        if self._publishers is None:
            self.open()
        return self._publishers

    def open(self) -> CommitLog:
        """Open the log and its tracking state (see ``log``); returns the log."""
        if self._log is not None:
            return self._log
        if self._ended:
            raise LogClosedError(f"{self!r} is closed")
        log_ = CommitLog(self.directory, self.config, auto_commit=self.auto_commit)
        try:
            self._offsets = ConsumerOffsets(self.directory)
            self._publishers = PublisherSequences(log_, self._offsets)
        except BaseException:
            log_.close(mark=False)
            raise
        self._log, self._summary = log_, None
        return log_

    def check(self) -> bool:
        """At a start after a crash, before any door holds the log: open the log when its
        folder has no valid clean-close marker (the recovery scan), then close it again,
        which leaves the marker. Returns whether it was checked."""
        if (self._log is not None or not os.path.isdir(self.directory)
                or is_clean(self.directory)):
            return False
        # the tracking close snapshot predates what is checked: the next open scans
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.directory, CLOSE_SNAPSHOT))
        log_ = CommitLog(self.directory, self.config, auto_commit=self.auto_commit)
        checked = not log_.report.trusted
        log_.close()
        self._summary = None
        return checked

    def _closed_summary(self) -> LogSummary | None:
        """The summary to answer from while the log is not open; None when it is open or
        the folder has no marker (the caller then opens the log)."""
        if self._log is not None:
            return None
        if self._summary is None:
            if os.path.isdir(self.directory):
                self._summary = read_summary(self.directory)
            else:  # never written: the empty log an open would make
                self._summary = LogSummary(0, 0, -1, -1, 0, 1)
        return self._summary

    def summary_at_stop(self) -> list[int] | None:
        """Once closed: the summary its clean-close marker holds, as a list of LogSummary's
        fields in order (None when the close was not clean or the folder has no marker)."""
        if self._log is not None:
            summary = read_summary(self.directory) if self._log.failure is None else None
        else:
            summary = self._closed_summary()  # known, or read once from the marker
        return None if summary is None else list(summary)

    def preset_summary(self, data: list[int] | None) -> None:
        """Take ``summary_at_stop``'s answer of the last clean stop (the folder's marker
        then holds the same; a malformed one is ignored)."""
        if isinstance(data, list) and self._log is None:
            try:
                self._summary = LogSummary(*data)
            except TypeError:
                pass

    def _answer(self, name: str) -> int:
        """Field ``name`` of the summary while the log is not open, else the log's."""
        summary = self._closed_summary()
        if summary is None:
            return getattr(self.log, name)
        if not self.auto_commit and name in ("committed_offset", "last_message_offset"):
            return -1  # as an open replicated log until replication (which opens it) commits
        return getattr(summary, name)

    # -- writing ------------------------------------------------------------------------
    def new_entries(self, reference: str | None, entries: Sequence[tuple[int, bytes]],
                    held: Mapping[str, int] | None = None) -> list[tuple[int, bytes]]:
        """The entries of a publish to store, in order: all of them without a reference; with
        a named publisher, those whose publishing id is above its highest one so far and
        above earlier ids in ``entries``. "So far" is ``held[reference]`` when the caller
        holds entries of it not written yet (``held``: reference -> highest id held), else
        the highest stored id; with neither, every id is new, 0 included (as osiris). The
        others are duplicates: confirm them, store nothing."""
        if not reference:
            return list(entries)
        last = held.get(reference) if held else None
        if last is None:
            last = self.publishers.get(reference)
        if last is None:
            last = -1
        out = []
        for publishing_id, entry in entries:
            if publishing_id > last:
                out.append((publishing_id, entry))
                last = publishing_id
        return out

    def write_entries(self, entries: Sequence[bytes], *,
                      writers: Mapping[str, int] | None = None,
                      timestamp_ms: int | None = None,
                      filter_values: Collection[str | None] = ()) -> range:
        """Write encoded entries (simple or sub-batch, kept as given) as one chunk, now.
        ``writers`` (reference -> highest publishing id among these entries) are recorded
        with the chunk as those publishers' sequences. ``filter_values`` are the entries'
        filter values (None for an entry without one; a superset is fine): the chunk's bloom
        filter is built from them. Returns the offsets; confirm them once the last one is
        committed (``when_committed``)."""
        records = sum(entry_records(e) for e in entries)
        bloom = build_bloom(filter_values) if filter_values else b""
        trailer = encode_writer_trailer(writers.items()) if writers else b""
        offsets = self.log.write_entries(b"".join(entries), len(entries), records,
                                         timestamp_ms=timestamp_ms, trailer=bloom + trailer,
                                         bloom_size=len(bloom))
        if writers:  # only once written: a failed write must not make its ids duplicates
            self.publishers.record(writers)
        return offsets

    def write_records(self, records: Sequence[bytes], *,
                      timestamp_ms: int | None = None) -> range:
        """Write records (already in the record format) as one chunk of simple entries."""
        return self.log.write_entries(encode_entries(records), len(records), len(records),
                                      timestamp_ms=timestamp_ms)

    def store_offset(self, reference: str, offset: int) -> range:
        """Store consumer ``reference``'s ``offset`` (RabbitMQ StoreOffset) as osiris does: a
        tracking delta chunk written now, one offset of the log that no consumer is given,
        replicated and committed like any chunk; QueryOffset answers it at once
        (``offsets``). Only the partition's leader stores. Raises ``ValueError`` for a
        reference over 255 bytes or a negative offset, ``LogClosedError``."""
        body = encode_offset_tracking([(reference, offset)])
        offsets = self.log.write_entries(encode_entries([body]), 1, 1,
                                         chunk_type=CHUNK_TRACKING_DELTA)
        self.offsets.apply(reference, offset)
        return offsets

    # -- replication (a follower's side) ------------------------------------------------
    def append_replicated(self, raw: bytes | memoryview) -> range:
        """Append whole chunks as the partition's leader sent them (``CommitLog.append_chunks``:
        raises ``ChunkRefusedError``, appending nothing, when one fails its checks) and note
        the publisher sequences and stored offsets they carry. Returns the offsets appended."""
        self.publishers.appending(raw)
        try:
            offsets = self.log.append_chunks(raw)
        except BaseException:
            self.publishers.appending(None)
            raise
        self.publishers.appended()
        return offsets

    def truncate(self, offset: int) -> None:
        """Remove every record from ``offset`` on (``CommitLog.truncate``: a follower's
        divergent tail) and forget the publisher sequences only they carried."""
        self.log.truncate(offset)
        self.publishers.reload()

    # -- the commit pipeline ------------------------------------------------------------
    def is_committed(self, offset: int) -> bool:
        """Whether the record at ``offset`` is committed (at or below the high watermark,
        ``committed_offset``)."""
        return offset <= self.log.committed_offset

    async def wait_committed(self, offset: int) -> None:
        """Return once the high watermark reaches ``offset``: under ``Durability.ALWAYS``
        this joins (or starts) the group fsync that commits it; otherwise writes commit at
        once. Raises ``LogClosedError`` when the partition closes or is deleted first,
        ``UncommittedTruncatedError`` when a truncation removes the record first (a deposed
        leader's tail), ``OSError`` when the fsync fails."""
        if self.is_committed(offset):
            return
        if self.log.needs_flush:
            await self.log.flush()
        await self.log.wait_for(offset, written=True)

    def when_committed(self, offset: int, committed: Callable[[], None],
                       failed: Callable[[BaseException], None],
                       pending: set[asyncio.Task]) -> None:
        """Call ``committed()`` once the high watermark reaches ``offset``: at once when it
        has, else from a task awaiting ``wait_committed``, kept in ``pending`` while it runs
        (so shutdown can wait for it). When the offset cannot be committed (the partition
        closed or was deleted, a truncation removed it, the fsync failed) ``failed(error)`` is
        called instead, and the error logged."""
        if self.is_committed(offset):
            committed()
            return
        task = asyncio.get_running_loop().create_task(
            self._call_when_committed(offset, committed, failed))
        pending.add(task)
        task.add_done_callback(pending.discard)

    async def _call_when_committed(self, offset: int, committed: Callable[[], None],
                                   failed: Callable[[BaseException], None]) -> None:
        try:
            await self.wait_committed(offset)
        except Exception as exc:
            self._log_uncommitted(offset, exc)
            failed(exc)
            return
        committed()

    # class defaults: an idle partition pays nothing for them
    _uncommitted_unlogged = 0  # failures counted since the last line, logged in a summary
    _uncommitted_logged_at = -2.0  # monotonic s of the last line

    def _log_uncommitted(self, offset: int, exc: BaseException) -> None:
        """Log a write that cannot be committed; more of them within a second (a closing or
        deposed leader fails every pending write at once) are counted and logged as one
        line a second later."""
        now = time.monotonic()
        if now - self._uncommitted_logged_at >= 1.0:
            self._uncommitted_logged_at = now
            log.error("%r: offset %d not committed: %s", self, offset, exc)
            return
        if not self._uncommitted_unlogged:
            asyncio.get_running_loop().call_later(1.0, self._log_uncommitted_count, exc)
        self._uncommitted_unlogged += 1

    def _log_uncommitted_count(self, exc: BaseException) -> None:
        count, self._uncommitted_unlogged = self._uncommitted_unlogged, 0
        self._uncommitted_logged_at = time.monotonic()
        log.error("%r: %d more writes not committed (the first: %s)", self, count, exc)

    # -- reading ------------------------------------------------------------------------
    def read_chunks(self, offset: int, max_bytes: int = 1024 * 1024, max_chunks: int = 0,
                    buffer: bytearray | None = None) -> list[ChunkSlice]:
        """Committed chunks from the one holding ``offset`` (see ``CommitLog.read_chunks``)."""
        return self.log.read_chunks(offset, max_bytes, max_chunks=max_chunks, buffer=buffer)

    def read_spans(self, offset: int, max_bytes: int = 1024 * 1024, max_chunks: int = 0,
                   min_bytes: int = 0, buffer: bytearray | None = None
                   ) -> list[ChunkSpan] | list[ChunkSlice]:
        """Committed chunks from the one holding ``offset``, as spans (their data left in the
        segment file for os.sendfile) where they may be (see ``CommitLog.read_spans``)."""
        return self.log.read_spans(offset, max_bytes, max_chunks=max_chunks,
                                   min_bytes=min_bytes, buffer=buffer)

    def read_matching_chunks(self, offset: int, matches: Callable[[bytes], bool],
                             max_bytes: int = 1024 * 1024, max_chunks: int = 0,
                             buffer: bytearray | None = None) -> tuple[list[ChunkSlice], int]:
        """Committed chunks whose bloom filter ``matches`` accepts, and the offset to read
        on from (see ``CommitLog.read_matching_chunks``)."""
        return self.log.read_matching_chunks(offset, matches, max_bytes, max_chunks=max_chunks,
                                             buffer=buffer)

    async def wait_for(self, offset: int) -> None:
        """Return once ``offset`` is committed; raises ``LogClosedError`` on close/delete."""
        await self.log.wait_for(offset)

    @property
    def first_offset(self) -> int:
        return self._answer("first_offset")

    @property
    def next_offset(self) -> int:
        return self._answer("next_offset")

    @property
    def size_bytes(self) -> int:
        """Bytes in the segment files (``CommitLog.size_bytes``)."""
        return self._answer("size_bytes")

    @property
    def segment_count(self) -> int:
        """Segment files of the log."""
        summary = self._closed_summary()
        return len(self.log.segments) if summary is None else summary.segments

    @property
    def committed_offset(self) -> int:
        """The high watermark: offset of the newest committed record (-1: none), what readers
        may see and what confirms and ALL acks wait for. On one server it follows the
        durability policy (docs/durability.md); a replicated partition will advance it as its
        ISR catches up."""
        return self._answer("committed_offset")

    @property
    def last_chunk_offset(self) -> int:
        return self.log.last_chunk_offset

    @property
    def last_message_offset(self) -> int:
        """Offset of the newest committed message, stored-offset chunks passed over (-1:
        none; see ``CommitLog.last_message_offset``)."""
        return self._answer("last_message_offset")

    @property
    def last_user_chunk_offset(self) -> int:
        """The newest committed chunk of messages (RabbitMQ's offset spec "last"; see
        ``CommitLog.last_user_chunk_offset``)."""
        return self.log.last_user_chunk_offset

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        return self.log.offset_for_timestamp(timestamp_ms)

    # -- Liftbridge flags ---------------------------------------------------------------
    def note_event(self, kind: str, now_ns: int) -> None:
        """Record that event ``kind`` ("pause", "readonly", "received") happened at ``now_ns``."""
        times = self.events.get(kind)
        if times is None:
            self.events[kind] = [now_ns, now_ns]
        else:
            times[1] = now_ns

    def state(self) -> dict:
        """The flags to save in the stream's metadata file."""
        return {"paused": self.paused, "readonly": self.readonly,
                "events": {k: v for k, v in self.events.items() if k != "received"}}

    def load_state(self, state: dict) -> None:
        """Restore what ``state()`` returned; unknown or malformed entries are ignored."""
        if not isinstance(state, dict):
            return
        self.paused = bool(state.get("paused", False))
        self.readonly = bool(state.get("readonly", False))
        events = state.get("events")
        if isinstance(events, dict):
            self.events = {str(k): [int(v[0]), int(v[1])] for k, v in events.items()
                           if isinstance(v, list) and len(v) == 2}

    def set_config(self, config: LogConfig) -> None:
        """Use ``config`` from now on (a policy's retention and segment size: Stream.
        apply_policy), on the open log too."""
        self.config = config
        if self._log is not None:
            self._log.config = config

    # -- lifecycle ----------------------------------------------------------------------
    def housekeeping(self) -> None:
        """Periodic work: apply retention (an open log's only: one not open has not
        changed since it was last open, and it is applied at its next open)."""
        if self._log is not None:
            self._log.enforce_retention()

    async def close(self) -> None:
        """Close the log (writing its clean-close marker) if it was opened; it never opens
        again."""
        self._ended = True
        if self._log is not None:
            if self._publishers is not None and self._log.failure is None:
                self._publishers.save_at_close()
            await self._log.aclose()

    def delete(self) -> None:
        """Close the log and remove its folder."""
        self._ended = True
        if self._log is not None:
            self._log.delete()
        else:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __repr__(self) -> str:
        return f"Partition({self.stream!r}, {self.index}, {self._log or 'not open'!r})"
