# Batched appends to one partition: the ingest hot path of the Liftbridge doors (NATS and
# gRPC). Records handed in during one event-loop turn are written as one chunk (at most
# ``max_batch`` records per chunk) right after the turn, then each record's sink hears of it.
# Rules: arrival order is kept; an expected offset (optimistic concurrency) is checked against
# the offset the record will get, at hand-in time, so a rejected record never takes an offset;
# "written" means appended to the log (Liftbridge's ack policy LEADER), "committed" means at
# or below the high watermark, so readable and durable under the durability policy (ALL);
# a failed write fails every record of its batch. Nothing here knows a wire format.
from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import Protocol

from ..errors import LogClosedError
from .partition import Partition

log = logging.getLogger("riverlog.broker")


class Sink(Protocol):
    """Told what became of one appended record. Calls come from the event loop."""

    def written(self, offset: int) -> None:
        """The record is in the log at ``offset`` (not necessarily committed yet)."""

    def committed(self, offset: int) -> None:
        """The record at ``offset`` is committed (readable, durable per the policy)."""

    def failed(self, error: BaseException) -> None:
        """The record could not be written; ``error`` says why."""


class Appender:
    """Batches appends to ``partition`` per event-loop turn. Use ``append``."""

    __slots__ = ("partition", "max_batch", "_records", "_sinks", "_scheduled", "_loop",
                 "_flushing", "closed")

    def __init__(self, partition: Partition, max_batch: int = 1024) -> None:
        self.partition = partition
        self.max_batch = max_batch
        self._records: list[bytes] = []
        self._sinks: list[Sink | None] = []
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flushing: set[asyncio.Task] = set()
        self.closed = False

    @property
    def next_offset(self) -> int:
        """The offset the next handed-in record will get."""
        return self.partition.next_offset + len(self._records)

    @property
    def pending(self) -> int:
        """Records handed in and not yet written."""
        return len(self._records)

    def append(self, record: bytes, sink: Sink | None = None,
               expected_offset: int | None = None) -> bool:
        """Hand in one encoded record (see ``riverlog.record.encode_record``). It is written
        after the current event-loop turn and ``sink`` (if any) is told. With
        ``expected_offset`` (not None), the record is taken only if it would get exactly that
        offset; returns False otherwise (nothing is written, the sink is not called).
        Raises ``LogClosedError`` once the appender is closed."""
        if expected_offset is not None and expected_offset != self.next_offset:
            return False
        if self.closed:
            raise LogClosedError(f"{self.partition!r} is closed")
        self._records.append(record)
        self._sinks.append(sink)
        if not self._scheduled:
            self._schedule()
        return True

    def extend(self, records: list[bytes], sink: Sink | None = None) -> None:
        """Hand in several encoded records at once, like ``append`` for each without an
        expected offset; ``sink`` (shared by all of them) hears of each record in order.
        Raises ``LogClosedError`` once the appender is closed."""
        if self.closed:
            raise LogClosedError(f"{self.partition!r} is closed")
        self._records += records
        self._sinks += [sink] * len(records)
        if not self._scheduled:
            self._schedule()

    def _schedule(self) -> None:
        self._scheduled = True
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        partition = self.partition
        while self._records:
            n = self.max_batch
            records, self._records = self._records[:n], self._records[n:]
            sinks, self._sinks = self._sinks[:n], self._sinks[n:]
            try:
                offsets = partition.write_records(records)
            except Exception as exc:  # OSError, LogClosedError: the batch is lost, say so
                log.error("append to %r failed: %s", partition, exc)
                _failed(sinks, exc)
                continue
            partition.note_event("received", time.time_ns())
            first = offsets.start
            wanted = False
            for i, sink in enumerate(sinks):
                if sink is not None:
                    sink.written(first + i)
                    wanted = True
            if not wanted:
                continue
            partition.when_committed(offsets[-1], partial(_committed, first, sinks),
                                     partial(_failed, sinks), self._flushing)

    async def drain(self, timeout: float = 5.0) -> None:
        """Write what is pending now and wait (up to ``timeout`` s) for pending commits."""
        if self._records:
            self._flush()
        if self._flushing:
            await asyncio.wait(list(self._flushing), timeout=timeout)

    def close(self) -> None:
        """Refuse further appends (what is pending is still written)."""
        self.closed = True


def _committed(first: int, sinks: list[Sink | None]) -> None:
    for i, sink in enumerate(sinks):
        if sink is not None:
            sink.committed(first + i)


def _failed(sinks: list[Sink | None], error: BaseException) -> None:
    for sink in sinks:
        if sink is not None:
            sink.failed(error)


class Appenders:
    """One Appender per partition, shared by every user of the partition (so expected offsets
    and arrival order hold across them)."""

    def __init__(self, max_batch: int = 1024) -> None:
        self.max_batch = max_batch
        self._by_id: dict[int, Appender] = {}

    def get(self, partition: Partition) -> Appender:
        """The appender of ``partition`` (created on first use)."""
        appender = self._by_id.get(id(partition))
        if appender is None or appender.partition is not partition:
            appender = self._by_id[id(partition)] = Appender(partition, self.max_batch)
        return appender

    def forget(self, partition: Partition) -> None:
        """Drop (and close) the appender of a deleted partition."""
        appender = self._by_id.get(id(partition))
        if appender is not None and appender.partition is partition:
            appender.close()
            del self._by_id[id(partition)]

    async def drain(self, timeout: float = 5.0) -> None:
        """Write everything pending and wait for pending commits (shutdown)."""
        for appender in list(self._by_id.values()):
            await appender.drain(timeout)
