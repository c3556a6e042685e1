# Liftbridge's activity stream: the internal stream `__activity` (when
# ``activity.stream.enabled``) that records stream and consumer-group administration as
# ActivityStreamEvent messages (create, delete, pause, resume, set read-only, join and leave
# a consumer group), as Liftbridge's server/activity.go does. Owns the queue of events and
# the task that appends them. Rules: ``emit`` never blocks nor fails the request that caused
# the event (events of one loop turn are appended together, after it); each event's id is
# unique and increasing across restarts (the offset its record gets, + 1); a failed append is
# logged, never raised into a request.
from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from ..broker import Broker
from ..broker.appender import Appenders
from ..broker.broker import ACTIVITY_STREAM
from ..protocol.liftbridge import api_pb2 as pb
from ..record import Record, encode_record

log = logging.getLogger("riverlog.liftbridge")

__all__ = ["ActivityStream"]


class ActivityStream:
    """Events for ``__activity`` of ``broker``, appended through ``appenders``; a no-op when
    not ``enabled``. ``start()`` on the event loop, ``await close()`` (appends what is
    queued)."""

    def __init__(self, broker: Broker, appenders: Appenders, enabled: bool) -> None:
        self.broker = broker
        self.appenders = appenders
        self.enabled = enabled
        self._queue: list[pb.ActivityStreamEvent] = []
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    def emit(self, event: pb.ActivityStreamEvent) -> None:
        """Queue an activity event for ``__activity`` (no-op unless the stream is on)."""
        if not self.enabled:
            return
        self._queue.append(event)
        if self._wakeup is not None:
            self._wakeup.set()

    def start(self) -> None:
        if self.enabled:
            self._wakeup = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._queue:
            self._append_now()

    async def _loop(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                self._append_now()
            except Exception:
                log.exception("publishing to the activity stream failed")

    def _append_now(self) -> None:
        stream = self.broker.streams.get(ACTIVITY_STREAM)
        events, self._queue = self._queue, []
        if stream is None:
            return
        partition = stream.partitions[0]
        appender = self.appenders.get(partition)
        subject = stream.config.subject or ""
        for event in events:
            event.id = appender.next_offset + 1  # unique, increasing, survives restarts
            record = encode_record(Record(
                value=event.SerializeToString(), headers={"subject": subject.encode(),
                                                          "reply": b""},
                timestamp_ns=time.time_ns(), subject=subject or None))
            appender.append(record)
