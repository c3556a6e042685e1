# riverlog.client.writer: the writing side of the client: a declared publisher that sends
# record bytes with publishing ids and waits for their confirms.
# Rules: flow control is explicit (at most ``max_in_flight`` messages unconfirmed, and the
# connection's write buffer drained before more is sent); frames are cut at the connection's
# frame_max; a PublishError or a lost connection raises ClientError from the next call.
from __future__ import annotations

import asyncio
from typing import Sequence

from ..protocol.rabbitmq_stream import frames as f
from ..protocol.rabbitmq_stream import simple_entry
from .connection import ClientError, Connection

__all__ = ["AsyncPublisher"]

_PUBLISH_OVERHEAD = 8 + 1 + 4 + 16  # frame header, publisher id, count, slack


class AsyncPublisher:
    """A declared publisher. ``publish(records)`` sends record bytes (already in the
    record format, see ``riverlog.record.encode_record``) with publishing ids;
    ``await flush()`` waits until every one is confirmed. Not safe to use from two tasks."""

    def __init__(self, client: Connection, publisher_id: int, stream: str,
                 reference: str | None, max_in_flight: int) -> None:
        self.client = client
        self.id = publisher_id
        self.stream = stream
        self.reference = reference
        self.max_in_flight = max_in_flight
        self.next_id = 1
        self.confirmed = 0
        self._in_flight = 0
        self._error: ClientError | None = None
        self._progress: asyncio.Future | None = None

    async def publish(self, records: Sequence[bytes], ids: Sequence[int] | None = None) -> None:
        """Send ``records`` (bytes each). Publishing ids are ``ids`` when given (strictly
        increasing for deduplication to keep them), else ``next_id`` onwards. Frames are cut
        at the connection's frame_max; waits while ``max_in_flight`` are unconfirmed. Raises
        ClientError for an earlier PublishError or a lost connection."""
        if ids is None:
            ids = range(self.next_id, self.next_id + len(records))
        elif len(ids) != len(records):
            raise ValueError("records and ids differ in length")
        if len(ids):
            self.next_id = max(self.next_id, ids[-1] + 1)
        limit = (self.client.frame_max or 1 << 20) - _PUBLISH_OVERHEAD
        batch: list[tuple[int, bytes]] = []
        size = 0
        for pid, record in zip(ids, records):
            entry = simple_entry(record)
            n = 8 + len(entry)
            if batch and (size + n > limit or len(batch) >= 0xFFFF):
                await self._send(batch)
                batch, size = [], 0
            batch.append((pid, entry))
            size += n
        if batch:
            await self._send(batch)

    async def _send(self, batch: list[tuple[int, bytes]]) -> None:
        while self._error is None and self._in_flight + len(batch) > self.max_in_flight \
                and self._in_flight:
            await self._wait_progress()
        self._check()
        self._in_flight += len(batch)
        self.client._send(f.Publish(self.id, tuple(batch)))
        if not self.client._writable.is_set():
            await self.client._writable.wait()

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until everything published is confirmed. Raises ClientError on a
        PublishError, a lost connection, or no progress for ``timeout`` (default: the
        client's) seconds."""
        while self._in_flight and self._error is None:
            await self._wait_progress(timeout)
        self._check()

    async def close(self) -> None:
        """Flush, then DeletePublisher."""
        try:
            await self.flush()
        finally:
            if self.client._publishers.get(self.id) is self and not self.client.closed:
                del self.client._publishers[self.id]
                await self.client._request(lambda c: f.DeletePublisher(c, self.id), False)

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    async def _wait_progress(self, timeout: float | None = None) -> None:
        if self._progress is None or self._progress.done():
            self._progress = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._progress), timeout or self.client.timeout)
        except asyncio.TimeoutError:
            raise ClientError(f"publisher on {self.stream!r}: no confirm for "
                              f"{timeout or self.client.timeout}s") from None

    def _wake(self) -> None:
        if self._progress is not None and not self._progress.done():
            self._progress.set_result(None)

    def _confirmed(self, ids: Sequence[int]) -> None:
        self._in_flight -= len(ids)
        self.confirmed += len(ids)
        self._wake()

    def _errors(self, errors: Sequence[tuple[int, int]]) -> None:
        self._in_flight -= len(errors)
        pid, code = errors[0]
        self._fail(ClientError(f"publishing id {pid} on {self.stream!r} refused", code))

    def _fail(self, err: ClientError) -> None:
        if self._error is None:
            self._error = err
        self._wake()
