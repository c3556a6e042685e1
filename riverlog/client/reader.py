# riverlog.client.reader: the reading side of the client: a subscription that hands whole
# chunks (osiris header + data section, as the server sent them) to the caller, with credit
# given back as the caller takes them.
# Rules: no per-record work here (records are parsed by whoever asked for the chunk, e.g.
# riverlog.spark.arrow in bulk); credit counts chunks; errors (stream deleted, connection
# lost) raise ClientError from the next call.
from __future__ import annotations

import asyncio
import collections
from typing import Iterator

from ..log.chunk import ChunkHeader, HEADER_SIZE, Unreadable, iter_records, parse_header
from ..protocol.rabbitmq_stream import frames as f
from .connection import ClientError, Connection

__all__ = ["AsyncSubscription", "Chunk"]


class Chunk:
    """One delivered chunk: ``header`` (ChunkHeader) and ``raw`` (bytes: the 48-byte header
    then the data section; no trailer). ``first_offset``/``next_offset`` bound its records;
    ``records()`` yields ``(offset, record bytes)`` (slow path, per record)."""

    __slots__ = ("header", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.header: ChunkHeader = parse_header(raw)

    @property
    def first_offset(self) -> int:
        return self.header.first_offset

    @property
    def next_offset(self) -> int:
        return self.header.next_offset

    @property
    def data(self) -> memoryview:
        return memoryview(self.raw)[HEADER_SIZE:HEADER_SIZE + self.header.data_length]

    def records(self, unreadable: Unreadable | None = None) -> Iterator[tuple[int, bytes]]:
        """``(offset, record bytes)`` pairs (see ``riverlog.log.chunk.iter_records``)."""
        return iter_records(self.header, self.data, unreadable)

    def __repr__(self) -> str:
        h = self.header
        return f"Chunk(offsets {h.first_offset}..{h.next_offset - 1}, {len(self.raw)} bytes)"


class AsyncSubscription:
    """A subscription: ``await next_chunk()`` returns the next ``Chunk`` (None on timeout);
    ``await next_chunks(n)`` up to ``n`` already received ones (waiting for the first).
    Credit is given back as the caller takes chunks. Errors (stream deleted, connection
    lost) raise ClientError from the next call."""

    def __init__(self, client: Connection, subscription_id: int, stream: str,
                 credit: int) -> None:
        self.client = client
        self.id = subscription_id
        self.stream = stream
        self.credit = credit
        self._chunks: collections.deque[bytes] = collections.deque()
        self._taken = 0
        self._waiter: asyncio.Future | None = None
        self._err: ClientError | None = None

    def _deliver(self, raw: bytes) -> None:
        self._chunks.append(raw)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _error(self, err: ClientError) -> None:
        if self._err is None:
            self._err = err
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(err)

    async def next_chunks(self, max_chunks: int = 64, timeout: float | None = None) -> list[Chunk]:
        """Up to ``max_chunks`` chunks, waiting up to ``timeout`` s (None: forever) for the
        first; [] on timeout."""
        if not self._chunks:
            if self._err is not None:
                raise self._err
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._waiter, timeout)
            except asyncio.TimeoutError:
                return []
        out = []
        chunks = self._chunks
        while chunks and len(out) < max_chunks:
            out.append(Chunk(chunks.popleft()))
        self._taken += len(out)
        if self._taken * 2 >= self.credit and not self.client.closed:
            self.client._send(f.Credit(self.id, self._taken))
            self._taken = 0
        return out

    async def next_chunk(self, timeout: float | None = None) -> Chunk | None:
        chunks = await self.next_chunks(1, timeout)
        return chunks[0] if chunks else None

    async def close(self) -> None:
        """Unsubscribe (quietly when the connection is gone)."""
        if self.client._subscriptions.get(self.id) is self:
            del self.client._subscriptions[self.id]
            if not self.client.closed:
                await self.client._request(lambda c: f.Unsubscribe(c, self.id), False)

    def __aiter__(self):
        return self

    async def __anext__(self) -> Chunk:
        chunk = await self.next_chunk()
        if chunk is None:
            raise StopAsyncIteration
        return chunk
