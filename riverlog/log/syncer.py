# The fsyncs of one commit log under its durability policy (riverlog.config.Durability,
# docs/durability.md): a blocking ``sync`` now, a group commit for the event loop (``flush``:
# concurrent callers share one fsync, run in a worker thread) and the INTERVAL timer that
# schedules one within ``fsync_interval_ms`` of a write. Owns what is known fsynced
# (``synced_next``) and tells the log when more is (the log commits it when it commits its
# own appends, and calls its ``on_synced``). Rules: the fsync itself runs in a worker thread,
# the bookkeeping on the log's event loop; one fsync runs at a time; a failed fsync stops the
# log taking writes (``fail``) and nothing it held is ever counted synced (one that found no
# file descriptor fails alone: its segments stay unsynced for the next); a segment the log
# deleted or replaced meanwhile is skipped, and nothing past a truncation counts synced.
from __future__ import annotations

import asyncio
import errno
import logging

from ..config import Durability
from ..errors import LogClosedError, LogFailedError, ResourceExhaustedError
from .files import OUT_OF_FILES

_log = logging.getLogger("riverlog.log")

__all__ = ["Syncer", "loop_running", "transient"]


def transient(exc: OSError) -> bool:
    """Whether ``exc`` fails only the one write or fsync that met it, not the log: a full
    disk (ENOSPC, EDQUOT) or no file descriptor for a moment (``ResourceExhaustedError``,
    EMFILE, ENFILE); nothing was lost, so the next try may succeed."""
    return (isinstance(exc, ResourceExhaustedError)
            or exc.errno in (errno.ENOSPC, errno.EDQUOT) + OUT_OF_FILES)


def loop_running() -> bool:
    """Whether the calling thread runs an event loop (an async caller)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class Syncer:
    """Fsyncs of the segments with unsynced writes of ``log`` (the CommitLog that owns this;
    it reads its segments, offsets, policy, clock and hooks). ``task``: the running group fsync
    (None when none runs); ``last_ms``: when the last one ended (``log``'s clock);
    ``synced_next``: the end of what is fsynced; ``floor``: the lowest next offset the log
    was cut back to (``cut``) since the running fsync took its segments."""

    __slots__ = ("log", "task", "timer", "last_ms", "synced_next", "floor")

    def __init__(self, log, synced_next: int) -> None:
        self.log = log
        self.task: asyncio.Task | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.last_ms = log._clock_ms()
        self.synced_next = synced_next
        self.floor = synced_next

    def _dirty(self) -> list:
        return [s for s in self.log._segments if s.unsynced]

    def cut(self, next_offset: int, reset: bool = False) -> None:
        """The log was cut back to end at ``next_offset`` (truncate; ``reset``: emptied to
        continue there): nothing from it on counts fsynced, not even when an fsync running
        now ends (after a ``reset`` everything before it does)."""
        self.synced_next = next_offset if reset else min(self.synced_next, next_offset)
        self.floor = min(self.floor, next_offset)

    def sync(self, at_close: bool = False) -> None:
        """Fsync every segment with unsynced writes, now, blocking; then report them. A
        failed fsync stops the log taking writes (``fail``) and raises its failure (not
        ``at_close``: the log is closed all the same); one that found no file descriptor
        (``transient``) raises ``ResourceExhaustedError`` and leaves the log writable, its
        segments still unsynced for the next fsync."""
        if self.log.failure is not None:
            raise self.log.failure
        upto = self.log.next_offset
        segs = self._dirty()
        try:
            for seg in segs:
                seg.unsynced = False
                _flush_index(seg)
                _fsync_all([seg])
        except OSError as exc:
            if _retry_later(exc, segs) and not at_close:
                raise
            self.fail(exc)
            if at_close:
                return
            raise self.log.failure from exc
        self._synced(upto)

    def _synced(self, upto: int) -> None:
        log = self.log
        self.last_ms = log._clock_ms()
        self.synced_next = max(self.synced_next, upto)
        if log.auto_commit:
            log.commit(upto - 1)
        if log.on_synced is not None:
            log.on_synced()

    async def flush(self) -> None:
        """Wait until everything written so far is fsynced (group commit); what a
        ``truncate`` or ``reset`` removed meanwhile is no longer waited for. Raises
        LogClosedError when the log closes first."""
        log = self.log
        target = log.next_offset
        while self.synced_next < min(target, log.next_offset):
            if log._closed:
                raise LogClosedError(f"commit log {log.directory} is closed")
            if log.failure is not None:  # a failed fsync: what it held is never committed
                raise log.failure
            if self.task is None:
                self.task = asyncio.get_running_loop().create_task(self._sync_once())
            await asyncio.shield(self.task)

    async def _sync_once(self) -> None:
        segs: list = []
        try:
            upto = self.floor = self.log.next_offset
            segs = self._dirty()
            for seg in segs:
                seg.unsynced = False
                _flush_index(seg)
            await asyncio.get_running_loop().run_in_executor(None, _fsync_all, segs)
            self._synced(min(upto, self.floor))  # not past a truncation made meanwhile
        except OSError as exc:  # the page cache cannot be trusted any more: fence the log
            if _retry_later(exc, segs):
                raise  # no descriptor for a moment: this flush fails, the next retries
            self.fail(exc)
            raise self.log.failure from exc
        finally:
            self.task = None

    def fail(self, exc: OSError) -> None:
        """Stop the log taking writes after ``exc`` (an EIO on write, a failed fsync): every
        later write and flush raises its ``failure`` (LogFailedError), nothing more is
        committed; reads go on."""
        log = self.log
        if log.failure is None:
            _log.error("commit log %s stopped taking writes: %s; offsets from %d on are not "
                       "confirmed; restart the server to recover it from the disk",
                       log.directory, exc, log.committed_offset + 1)
            log.failure = LogFailedError(f"commit log {log.directory} stopped taking writes "
                                         f"after an I/O error ({exc}); restart the server")

    def after_write(self) -> None:
        """A write was made from the event loop: under INTERVAL, make sure an fsync is
        scheduled within ``fsync_interval_ms``."""
        config = self.log.config
        if (config.durability is not Durability.INTERVAL or self.timer is not None
                or not loop_running()):
            return
        self.timer = asyncio.get_running_loop().call_later(config.fsync_interval_ms / 1000,
                                                           self._interval_flush)

    def _interval_flush(self) -> None:
        self.timer = None
        if not self.log._closed and self.task is None and self._dirty():
            self.task = asyncio.get_running_loop().create_task(self._sync_once())
            self.task.add_done_callback(_seen)  # a failure is the log's (``fail``), logged

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def _seen(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


def _retry_later(exc: OSError, segs: list) -> bool:
    """Whether the failed fsync of ``segs`` found no descriptor (and nothing else went
    wrong): they are marked unsynced again so the next fsync retries them."""
    if not isinstance(exc, ResourceExhaustedError) and exc.errno not in OUT_OF_FILES:
        return False
    for seg in segs:
        if not seg.deleted:
            seg.unsynced = True
    return True


def _flush_index(seg) -> None:
    """Write a segment's buffered index entries; on a full disk or with no descriptor left
    they stay buffered for the next flush (the index is a cache of the segment, rebuilt on
    open when short)."""
    try:
        seg.index.flush()
    except OSError as exc:
        if not transient(exc):
            raise


def _fsync_all(segs: list) -> None:
    """Fsync each segment's file, but not those deleted or replaced by the log meanwhile
    (``Segment.deleted``: truncate, reset, retention, compaction); raises OSError (ENOENT)
    for one removed from its folder by anyone else (an open file outlives its name: what it
    holds would be gone after a restart)."""
    for seg in segs:
        if seg.deleted:
            continue
        try:
            seg.file.fsync()
            removed = seg.file.links() == 0
        except FileNotFoundError:  # closed for the budget, and its name gone
            if seg.deleted:
                continue
            raise
        if removed and not seg.deleted:
            raise OSError(errno.ENOENT, "the segment file was removed while open")
