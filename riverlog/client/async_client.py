# riverlog.client.async_client: AsyncClient, the asyncio API of the client: a Connection
# with the requests of the RabbitMQ Stream protocol as methods (stream administration,
# metadata and placement, offset ranges, stored offsets and publisher sequences) and the
# factories of publishers (riverlog.client.writer) and subscriptions (riverlog.client.reader).
# Rules: one request per call, its failure a ClientError with the server's response code.
from __future__ import annotations

from ..protocol.rabbitmq_stream import OffsetType, ResponseCode
from ..protocol.rabbitmq_stream import frames as f
from .connection import ClientError, Connection
from .reader import AsyncSubscription
from .writer import AsyncPublisher

__all__ = ["AsyncClient"]

_OK = ResponseCode.OK


class AsyncClient(Connection):
    """One connection to a riverlog server (or RabbitMQ) speaking the RabbitMQ Stream protocol.

    Create with ``await AsyncClient.connect(host, port, user, password)``; ``await close()``.
    Every request waits at most ``timeout`` seconds; errors raise ``ClientError``.
    """

    # -- streams ----------------------------------------------------------------------------
    async def create_stream(self, name: str, arguments: dict[str, str] | None = None, *,
                            exist_ok: bool = False) -> bool:
        """Create stream ``name`` with Create ``arguments`` (``max-length-bytes``,
        ``max-age``, ...). Returns False when it existed with the same arguments and
        ``exist_ok``; raises ClientError otherwise (code STREAM_ALREADY_EXISTS,
        PRECONDITION_FAILED for bad arguments or for other arguments than the existing
        stream's, as RabbitMQ refuses them)."""
        r = await self._request(lambda c: f.Create(c, name, dict(arguments or {})), False)
        if r.response_code == ResponseCode.STREAM_ALREADY_EXISTS and exist_ok:
            return False
        if r.response_code != _OK:
            raise ClientError(f"cannot create stream {name!r}", r.response_code)
        return True

    async def delete_stream(self, name: str, *, missing_ok: bool = False) -> bool:
        """Delete stream ``name``. Returns False when it did not exist and ``missing_ok``."""
        r = await self._request(lambda c: f.Delete(c, name), False)
        if r.response_code == ResponseCode.STREAM_DOES_NOT_EXIST and missing_ok:
            return False
        if r.response_code != _OK:
            raise ClientError(f"cannot delete stream {name!r}", r.response_code)
        return True

    async def metadata(self, *streams: str) -> dict[str, tuple[int, str | None, int | None]]:
        """``{stream: (response code, leader host, leader port)}``; host/port None when the
        stream does not exist."""
        r = await self._request(lambda c: f.Metadata(c, tuple(streams)))
        brokers = {b.reference: b for b in r.brokers}
        out = {}
        for s in r.streams:
            b = brokers.get(s.leader_reference)
            out[s.name] = (s.response_code, b.host if b else None, b.port if b else None)
        return out

    async def placement(self, name: str) -> tuple[tuple[str, int] | None,
                                                  list[tuple[str, int]]]:
        """Where stream ``name`` lives, from Metadata: ((leader host, port) or None while it
        has no leader, [(host, port) of each replica that is not the leader]). Raises
        ClientError (the stream does not exist, or is not available)."""
        r = await self._request(lambda c: f.Metadata(c, (name,)))
        brokers = {b.reference: (b.host, b.port) for b in r.brokers}
        for s in r.streams:
            if s.name == name:
                if s.response_code != _OK:
                    raise ClientError(f"no placement for stream {name!r}", s.response_code)
                return (brokers.get(s.leader_reference),
                        [brokers[ref] for ref in s.replica_references if ref in brokers])
        raise ClientError(f"Metadata did not answer for stream {name!r}")

    async def partitions(self, super_stream: str) -> list[str]:
        """The partition streams of ``super_stream`` in order (Partitions); an empty list
        when there is no such super stream."""
        r = await self._request(lambda c: f.Partitions(c, super_stream), False)
        if r.response_code == ResponseCode.STREAM_DOES_NOT_EXIST:
            return []
        if r.response_code != _OK:
            raise ClientError(f"partitions of super stream {super_stream!r}", r.response_code)
        return list(r.streams)

    async def stream_exists(self, name: str) -> bool:
        return (await self.metadata(name))[name][0] == _OK

    async def stream_stats(self, name: str) -> dict[str, int]:
        """StreamStats: ``first_chunk_id``, ``committed_chunk_id``, ``last_chunk_id``
        (offsets; -1 when the stream is empty). Raises ClientError (STREAM_DOES_NOT_EXIST)."""
        r = await self._request(lambda c: f.StreamStats(c, name), what=f"stats of {name!r}")
        return dict(r.stats)

    async def offset_range(self, name: str) -> tuple[int, int]:
        """``(first, end)``: the oldest offset kept and the offset after the newest committed
        message, so ``[first, end)`` is what a reader can get now. One StreamStats, then (when
        the stream is not empty) a one-chunk subscription at offset spec LAST, the last chunk
        of messages (stored consumer offsets after it are chunks no reader is given), to
        learn where it ends."""
        stats = await self.stream_stats(name)
        first, last = stats.get("first_chunk_id", -1), stats.get("committed_chunk_id", -1)
        if last < 0:
            return max(first, 0), max(first, 0)
        sub = await self.subscribe(name, OffsetType.LAST, None, credit=1)
        try:
            chunk = await sub.next_chunk(timeout=min(self.timeout, 5.0))
        finally:
            await sub.close()
        end = chunk.next_offset if chunk is not None else first  # none: offsets stored only
        return min(first, end), end

    async def offset_for_timestamp(self, name: str, timestamp_ms: int) -> int | None:
        """First offset of the first chunk the server stamped at or after ``timestamp_ms``
        (ms since the epoch), or None when every chunk is older."""
        first, end = await self.offset_range(name)
        if end <= first:
            return None
        sub = await self.subscribe(name, OffsetType.LAST, None, credit=1)
        try:
            last = await sub.next_chunk(timeout=min(self.timeout, 5.0))
        finally:
            await sub.close()
        if last is None or last.header.timestamp_ms < timestamp_ms:
            return None
        sub = await self.subscribe(name, OffsetType.TIMESTAMP, timestamp_ms, credit=1)
        try:
            chunk = await sub.next_chunk(timeout=self.timeout)
        finally:
            await sub.close()
        return chunk.first_offset if chunk is not None else None

    # -- offsets and publisher sequences ----------------------------------------------------
    async def store_offset(self, reference: str, stream: str, offset: int) -> None:
        """StoreOffset (no answer from the server)."""
        self._send(f.StoreOffset(reference, stream, offset))

    async def query_offset(self, reference: str, stream: str) -> int | None:
        """The offset stored for ``reference``, None when there is none."""
        r = await self._request(lambda c: f.QueryOffset(c, reference, stream), False)
        if r.response_code == ResponseCode.NO_OFFSET:
            return None
        if r.response_code != _OK:
            raise ClientError(f"cannot query offset of {reference!r}", r.response_code)
        return r.offset

    async def query_publisher_sequence(self, reference: str, stream: str) -> int:
        """The highest publishing id stored for publisher ``reference`` (0 when none)."""
        r = await self._request(lambda c: f.QueryPublisherSequence(c, reference, stream))
        return r.sequence

    # -- publishing -------------------------------------------------------------------------
    async def publisher(self, stream: str, reference: str | None = None, *,
                        max_in_flight: int = 20_000) -> "AsyncPublisher":
        """Declare a publisher on ``stream``. With ``reference`` (at most 255 bytes) the
        server deduplicates: a publishing id at or below the highest one it stored for the
        reference is confirmed and dropped."""
        pid = next(i for i in range(256) if i not in self._publishers)
        pub = AsyncPublisher(self, pid, stream, reference, max_in_flight)
        self._publishers[pid] = pub
        try:
            await self._request(lambda c: f.DeclarePublisher(c, pid, reference or "", stream),
                                what=f"cannot declare a publisher on {stream!r}")
        except BaseException:
            self._publishers.pop(pid, None)
            raise
        return pub

    # -- consuming --------------------------------------------------------------------------
    async def subscribe(self, stream: str, offset_type: int = OffsetType.FIRST,
                        offset: int | None = None, *, credit: int = 8,
                        properties: dict[str, str] | None = None) -> "AsyncSubscription":
        """Subscribe to ``stream`` from an offset specification (``OffsetType.FIRST``,
        ``LAST``, ``NEXT``, ``OFFSET`` with ``offset``, ``TIMESTAMP`` with ``offset`` in ms).
        The server sends whole chunks, the first being the one that holds the offset; the
        subscription keeps ``credit`` chunks requested ahead of the caller."""
        sid = next(i for i in range(256) if i not in self._subscriptions)
        if offset_type not in (OffsetType.OFFSET, OffsetType.TIMESTAMP):
            offset = None
        sub = AsyncSubscription(self, sid, stream, max(credit, 1))
        self._subscriptions[sid] = sub
        try:
            await self._request(lambda c: f.Subscribe(c, sid, stream, offset_type, offset,
                                                      sub.credit, properties),
                                what=f"cannot subscribe to {stream!r}")
        except BaseException:
            self._subscriptions.pop(sid, None)
            raise
        return sub
