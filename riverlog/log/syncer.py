# The fsyncs of one commit log under its durability policy (riverlog.config.Durability,
# docs/durability.md): a blocking ``sync`` now, a group commit for the event loop (``flush``:
# concurrent callers share one fsync, run in a worker thread) and the INTERVAL timer that
# schedules one within ``fsync_interval_ms`` of a write. Owns what is known fsynced
# (``synced_next``) and tells the log when more is (the log commits it when it commits its
# own appends, and calls its ``on_synced``). Rules: the fsync itself runs in a worker thread,
# the bookkeeping on the log's event loop; one fsync runs at a time.
from __future__ import annotations

import asyncio

from ..config import Durability
from ..errors import LogClosedError

__all__ = ["Syncer", "loop_running"]


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
    ``synced_next``: the end of what is fsynced."""

    __slots__ = ("log", "task", "timer", "last_ms", "synced_next")

    def __init__(self, log, synced_next: int) -> None:
        self.log = log
        self.task: asyncio.Task | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.last_ms = log._clock_ms()
        self.synced_next = synced_next

    def _dirty(self) -> list:
        return [s for s in self.log._segments if s.unsynced]

    def sync(self) -> None:
        """Fsync every segment with unsynced writes, now, blocking; then report them."""
        upto = self.log.next_offset
        for seg in self._dirty():
            seg.unsynced = False
            seg.sync()
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
        """Wait until everything written so far is fsynced (group commit). Raises
        LogClosedError when the log closes first."""
        log = self.log
        target = log.next_offset
        while self.synced_next < target:
            if log._closed:
                raise LogClosedError(f"commit log {log.directory} is closed")
            if self.task is None:
                self.task = asyncio.get_running_loop().create_task(self._sync_once())
            await asyncio.shield(self.task)

    async def _sync_once(self) -> None:
        try:
            upto = self.log.next_offset
            segs = self._dirty()
            for seg in segs:
                seg.unsynced = False
                seg.index.flush()
            await asyncio.get_running_loop().run_in_executor(None, _fsync_all, segs)
            self._synced(upto)
        finally:
            self.task = None

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

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def _fsync_all(segs: list) -> None:
    for seg in segs:
        seg.file.fsync()
