# riverlog.client.blocking: the blocking client: the same API as AsyncClient (arguments,
# results, errors) over an event loop in a daemon thread, so heartbeats keep flowing while the
# caller is busy elsewhere; ``read_range`` reads a range of offsets as chunks.
# Rules: every call waits for its coroutine on that loop; the loop stops with ``close()``.
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Iterable, Iterator, Sequence

from ..protocol.rabbitmq_stream import OffsetType
from ..security.tls import ClientTLS
from .async_client import AsyncClient
from .connection import DEFAULT_PORT, DEFAULT_TIMEOUT, ClientError
from .reader import AsyncSubscription, Chunk
from .writer import AsyncPublisher

__all__ = ["Client", "Publisher", "Subscription", "read_range"]


class _LoopThread:
    """An event loop running in a daemon thread; ``run(coro)`` blocks for its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="riverlog-client",
                                       daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float | None = None):
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ClientError(f"no result in {timeout}s") from None

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
        if not self.loop.is_running():
            self.loop.close()


class Client:
    """The blocking client: ``Client(host, port, user, password)`` connects at once; use as a
    context manager or call ``close()``. Methods mirror ``AsyncClient`` (same arguments,
    results and errors); ``publisher()`` and ``subscribe()`` return blocking wrappers."""

    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, user: str = "guest",
                 password: str = "guest", *, vhost: str = "/",
                 connection_name: str = "riverlog-client",
                 timeout: float = DEFAULT_TIMEOUT, tls: ClientTLS | None = None,
                 mechanism: str = "PLAIN") -> None:
        self._thread = _LoopThread()
        try:
            self._async: AsyncClient = self._thread.run(AsyncClient.connect(
                host, port, user, password, vhost=vhost, connection_name=connection_name,
                timeout=timeout, tls=tls, mechanism=mechanism))
        except BaseException:
            self._thread.stop()
            raise
        self.host, self.port = host, port

    def _run(self, coro):
        return self._thread.run(coro)

    def close(self) -> None:
        if self._thread.loop.is_closed():
            return
        try:
            self._run(self._async.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def frame_max(self) -> int:
        return self._async.frame_max

    def create_stream(self, name: str, arguments: dict[str, str] | None = None, *,
                      exist_ok: bool = False) -> bool:
        return self._run(self._async.create_stream(name, arguments, exist_ok=exist_ok))

    def delete_stream(self, name: str, *, missing_ok: bool = False) -> bool:
        return self._run(self._async.delete_stream(name, missing_ok=missing_ok))

    def metadata(self, *streams: str) -> dict:
        return self._run(self._async.metadata(*streams))

    def placement(self, name: str) -> tuple[tuple[str, int] | None, list[tuple[str, int]]]:
        return self._run(self._async.placement(name))

    @property
    def server_address(self) -> tuple[str, int] | None:
        return self._async.server_address

    @property
    def table_catalog(self) -> str | None:
        return self._async.table_catalog

    def partitions(self, super_stream: str) -> list[str]:
        return self._run(self._async.partitions(super_stream))

    def stream_exists(self, name: str) -> bool:
        return self._run(self._async.stream_exists(name))

    def stream_stats(self, name: str) -> dict[str, int]:
        return self._run(self._async.stream_stats(name))

    def offset_range(self, name: str) -> tuple[int, int]:
        return self._run(self._async.offset_range(name))

    def offset_for_timestamp(self, name: str, timestamp_ms: int) -> int | None:
        return self._run(self._async.offset_for_timestamp(name, timestamp_ms))

    def store_offset(self, reference: str, stream: str, offset: int) -> None:
        self._run(self._async.store_offset(reference, stream, offset))

    def query_offset(self, reference: str, stream: str) -> int | None:
        return self._run(self._async.query_offset(reference, stream))

    def query_publisher_sequence(self, reference: str, stream: str) -> int:
        return self._run(self._async.query_publisher_sequence(reference, stream))

    def publisher(self, stream: str, reference: str | None = None, *,
                  max_in_flight: int = 20_000) -> "Publisher":
        return Publisher(self, self._run(self._async.publisher(
            stream, reference, max_in_flight=max_in_flight)))

    def subscribe(self, stream: str, offset_type: int = OffsetType.FIRST,
                  offset: int | None = None, *, credit: int = 8,
                  properties: dict[str, str] | None = None) -> "Subscription":
        return Subscription(self, self._run(self._async.subscribe(
            stream, offset_type, offset, credit=credit, properties=properties)))


class Publisher:
    """Blocking wrapper of ``AsyncPublisher`` (same methods)."""

    def __init__(self, client: Client, pub: AsyncPublisher) -> None:
        self._client, self._pub = client, pub
        self.stream, self.reference = pub.stream, pub.reference

    @property
    def next_id(self) -> int:
        return self._pub.next_id

    @property
    def confirmed(self) -> int:
        return self._pub.confirmed

    def publish(self, records: Sequence[bytes], ids: Sequence[int] | None = None) -> None:
        self._client._run(self._pub.publish(records, ids))

    def flush(self, timeout: float | None = None) -> None:
        self._client._run(self._pub.flush(timeout))

    def close(self) -> None:
        self._client._run(self._pub.close())

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()


class Subscription:
    """Blocking wrapper of ``AsyncSubscription``; iterating yields chunks forever."""

    def __init__(self, client: Client, sub: AsyncSubscription) -> None:
        self._client, self._sub = client, sub
        self.stream = sub.stream

    def next_chunks(self, max_chunks: int = 64, timeout: float | None = None) -> list[Chunk]:
        return self._client._run(self._sub.next_chunks(max_chunks, timeout))

    def next_chunk(self, timeout: float | None = None) -> Chunk | None:
        return self._client._run(self._sub.next_chunk(timeout))

    def close(self) -> None:
        self._client._run(self._sub.close())

    def __iter__(self) -> Iterator[Chunk]:
        while True:
            yield from self.next_chunks()

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_range(client: Client, stream: str, start: int, end: int, *, credit: int = 16,
               timeout: float = DEFAULT_TIMEOUT) -> Iterable[Chunk]:
    """Yield the chunks that hold offsets ``[start, end)`` of ``stream`` (the first and last
    may hold records outside it: trim by offset). Raises ClientError when nothing arrives
    for ``timeout`` seconds before ``end`` is reached."""
    if end <= start:
        return
    with client.subscribe(stream, OffsetType.OFFSET, start, credit=credit) as sub:
        while True:
            chunks = sub.next_chunks(credit, timeout)
            if not chunks:
                raise ClientError(f"{stream!r}: no data for {timeout}s before offset {end}")
            for chunk in chunks:
                yield chunk
                if chunk.next_offset >= end:
                    return
