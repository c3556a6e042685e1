# The waiters of one commit log: futures of readers and writes waiting for an offset to be
# committed (the high watermark to reach it). Owns the heap they wait in and how they end:
# woken by the commit that reaches their offset, all woken when the log closes, failed when a
# truncation removes the record a write waits for. Rules: a commit wakes only the waiters it
# reaches (a heap by offset, not a scan of every waiter per commit); cancelled waiters are
# dropped once they are most of the heap; one event loop owns it (no locks).
from __future__ import annotations

import asyncio
import heapq

__all__ = ["CommitWaiters"]


class CommitWaiters:
    """A heap of ``(offset, n, future, written)``: ``written`` marks a write waiting for its
    own record's commit (a confirm, an ALL ack), which ``fail_writes_from`` fails. ``len()``
    counts the waiters in the heap (cancelled ones included until they are dropped)."""

    __slots__ = ("_heap", "_count", "_abandoned")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, asyncio.Future, bool]] = []
        self._count = 0
        self._abandoned = 0  # cancelled waiters still in the heap

    def __len__(self) -> int:
        return len(self._heap)

    async def wait(self, offset: int, written: bool) -> None:
        """Wait once: return when a ``release`` reaches ``offset`` or ``wake_all`` is called
        (the caller checks again); raise what ``fail_writes_from`` sets; on cancellation the
        waiter is left for a later clean-up."""
        future = asyncio.get_running_loop().create_future()
        self._count += 1
        heapq.heappush(self._heap, (offset, self._count, future, written))
        try:
            await future
        except asyncio.CancelledError:
            self._abandon()
            raise

    def release(self, offset: int) -> None:
        """Wake every waiter for an offset at or below ``offset`` (just committed)."""
        heap = self._heap
        while heap and heap[0][0] <= offset:
            future = heapq.heappop(heap)[2]
            if not future.done():
                future.set_result(None)

    def wake_all(self) -> None:
        """Wake every waiter (the log closed: each finds out by checking again)."""
        waiters, self._heap = self._heap, []
        self._abandoned = 0
        for _, _, future, _ in waiters:
            if not future.done():
                future.set_result(None)

    def fail_writes_from(self, offset: int, error: BaseException) -> None:
        """Fail with ``error`` the writes waiting for the commit of a record at ``offset``
        or after (just removed by a truncation); readers stay."""
        removed = [w for w in self._heap if w[3] and w[0] >= offset]
        if not removed:
            return
        self._heap = [w for w in self._heap if not (w[3] and w[0] >= offset)]
        heapq.heapify(self._heap)
        for _, _, future, _ in removed:
            if not future.done():
                future.set_exception(error)

    def _abandon(self) -> None:
        """A waiter was cancelled: drop the cancelled ones once they are most of the heap
        (readers that wait with a timeout on an idle log would pile up)."""
        self._abandoned += 1
        if self._abandoned > 32 and self._abandoned * 2 > len(self._heap):
            self._heap = [w for w in self._heap if not w[2].done()]
            heapq.heapify(self._heap)
            self._abandoned = 0
