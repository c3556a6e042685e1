# A small riverlog client over the RabbitMQ Stream protocol (TCP 5552, TLS 5551), used by the
# Spark executors, the CLI, the demo jobs and the benchmarks. Owns one connection: the
# handshake (peer
# properties, SASL PLAIN, tune, open), request/response matching by correlation id,
# heartbeats, named publishers with publishing ids and confirms, and subscriptions that hand
# whole chunks (osiris header + data section, as the server sent them) to the caller.
# Rules: frames are built and parsed only by riverlog.protocol.rabbitmq_stream (sans-IO);
# the consumer does no per-record work (records are parsed by whoever asked for the chunk,
# e.g. riverlog.spark.arrow in bulk); flow control is explicit (credit counts chunks, a
# publisher keeps at most ``max_in_flight`` messages unconfirmed); every failure raises
# ClientError (with the protocol's response code when the server gave one), never hangs
# past ``timeout``.
# AsyncClient is the asyncio API; Client is the same API, blocking, over an event loop in a
# daemon thread (so heartbeats keep flowing while the caller is busy elsewhere).
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import struct
import threading
import time
from typing import Iterable, Iterator, Sequence

from . import __version__
from .errors import RiverlogError
from .log.chunk import ChunkHeader, HEADER_SIZE, Unreadable, iter_records, parse_header
from .protocol.rabbitmq_stream import (FrameError, OffsetType, ResponseCode, decode, encode,
                                       simple_entry)
from .protocol.rabbitmq_stream import frames as f
from .security.tls import ClientTLS

__all__ = ["AsyncClient", "AsyncPublisher", "AsyncSubscription", "Chunk", "Client",
           "ClientError", "OffsetType", "Publisher", "Subscription", "parse_servers",
           "read_range"]

DEFAULT_PORT = 5552
DEFAULT_TIMEOUT = 30.0
_OK = ResponseCode.OK
_PUBLISH_OVERHEAD = 8 + 1 + 4 + 16  # frame header, publisher id, count, slack
_U32 = struct.Struct(">I")


class ClientError(RiverlogError):
    """A request failed. ``code`` is the RabbitMQ Stream response code (``ResponseCode``)
    when the server answered with one, else None (connection lost, timeout, bad frame)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        if code is not None:
            try:
                name = ResponseCode(code).name
            except ValueError:
                name = "?"
            message = f"{message} (0x{code:02x} {name})"
        super().__init__(message)
        self.code = code


def parse_servers(servers: str, default_port: int = DEFAULT_PORT) -> list[tuple[str, int]]:
    """``"host[:port],host[:port]"`` -> ``[(host, port), ...]`` (IPv6 as ``[::1]:5552``).
    Raises ValueError for an empty list or a bad port."""
    out = []
    for item in servers.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port = item.rpartition(":") if item.count(":") == 1 else (item, "", "")
        out.append((host, int(port) if port else default_port))
    if not out:
        raise ValueError(f"no server in {servers!r}")
    return out


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


# -- asyncio ----------------------------------------------------------------------------------


_DELIVER = 0x0008
_MIN_READ = 256 * 1024


class _Protocol(asyncio.BufferedProtocol):
    """Receives into one growing buffer and cuts frames out of it. Deliver frames (the bulk
    of the bytes) are cut here, the chunk copied once; every other frame goes through the
    codec's ``decode``."""

    def __init__(self, client: "AsyncClient") -> None:
        self.client = client
        self.buf = bytearray(_MIN_READ * 4)
        self.start = self.end = 0
        self.frame = 0  # size of the frame waiting to complete (0: not known yet)

    def connection_made(self, transport) -> None:
        self.client._transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        # The buffer is resized only here: the transport holds a view of it while it calls
        # buffer_updated, and a bytearray with a live view cannot change size.
        pending = self.end - self.start
        want = max(sizehint, _MIN_READ, self.frame - pending)
        if len(self.buf) - self.end < want:
            if self.start:  # move the partial frame to the front
                self.buf[:pending] = self.buf[self.start:self.end]
                self.start, self.end = 0, pending
            if len(self.buf) - self.end < want:
                self.buf.extend(bytes(want - (len(self.buf) - self.end)))
        return memoryview(self.buf)[self.end:]

    def buffer_updated(self, nbytes: int) -> None:
        self.end += nbytes
        buf, pos, end = self.buf, self.start, self.end
        frames = []
        try:
            while end - pos >= 4:
                stop = pos + 4 + _U32.unpack_from(buf, pos)[0]
                if stop > end:
                    self.frame = stop - pos
                    break
                # Deliver (key 0x0008, version 1 or 2): the chunk, copied once
                if buf[pos + 4] == 0 and buf[pos + 5] == _DELIVER and buf[pos + 6] == 0 \
                        and buf[pos + 7] in (1, 2) and stop - pos >= 9 + 8 * (buf[pos + 7] - 1):
                    skip = 9 if buf[pos + 7] == 1 else 17
                    with memoryview(buf) as view:  # bytes(buf[a:b]) would copy twice
                        frames.append(f.Deliver(buf[pos + 8], bytes(view[pos + skip:stop])))
                else:
                    frames.append(decode(bytes(buf[pos:stop])))
                pos = stop
        except (FrameError, IndexError) as exc:
            self.start = pos
            for frame in frames:
                self.client._dispatch(frame)
            self.client._bad_frame(exc)
            return
        if pos == end:
            self.start = self.end = self.frame = 0
        else:
            self.start = pos
        for frame in frames:
            self.client._dispatch(frame)

    def eof_received(self):
        return None

    def connection_lost(self, exc) -> None:
        self.client._lost(exc)


class AsyncClient:
    """One connection to a riverlog server (or RabbitMQ) speaking the RabbitMQ Stream protocol.

    Create with ``await AsyncClient.connect(host, port, user, password)``; ``await close()``.
    Every request waits at most ``timeout`` seconds; errors raise ``ClientError``.
    """

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        self.frame_max = 0
        self.heartbeat = 0
        self.server_properties: dict = {}
        self._transport: asyncio.Transport | None = None
        self._correlation = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._tune: asyncio.Future | None = None
        self._publishers: dict[int, "AsyncPublisher"] = {}
        self._subscriptions: dict[int, "AsyncSubscription"] = {}
        self._closed: ClientError | None = None
        self._heartbeat_task: asyncio.Task | None = None
        self._last_sent = time.monotonic()
        self._writable = asyncio.Event()
        self._writable.set()

    # -- connection -------------------------------------------------------------------------
    @classmethod
    async def connect(cls, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                      user: str = "guest", password: str = "guest", *, vhost: str = "/",
                      connection_name: str = "riverlog-client",
                      timeout: float = DEFAULT_TIMEOUT, tls: ClientTLS | None = None,
                      mechanism: str = "PLAIN") -> "AsyncClient":
        """Open a connection and run the handshake; with ``tls``, over TLS (the door's TLS
        port, 5551 by default), verifying the server. ``mechanism``: SASL ``PLAIN`` (``user``
        and ``password``) or ``EXTERNAL`` (the user is named by the client certificate of
        ``tls``; ``user`` and ``password`` are not sent). Raises ClientError (refused
        connection, unreadable TLS files, failed TLS handshake or verification, a mechanism
        the server does not offer, failed authentication, unknown virtual host)."""
        if mechanism not in ("PLAIN", "EXTERNAL"):
            raise ClientError(f"SASL mechanism {mechanism!r}: PLAIN or EXTERNAL")
        self = cls(timeout)
        loop = asyncio.get_running_loop()
        where = f"{host}:{port}" + (" over TLS" if tls else "")
        try:
            context = tls.context() if tls else None
        except OSError as exc:  # ssl.SSLError included
            raise ClientError(f"TLS settings for {where}: {exc}") from None
        try:
            await asyncio.wait_for(loop.create_connection(
                lambda: _Protocol(self), host, port, ssl=context,
                server_hostname=(tls.server_name or host) if tls else None), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise ClientError(f"cannot connect to {where}: {exc}") from None
        self._tune = loop.create_future()
        try:
            await self._request(lambda c: f.PeerProperties(c, {
                "product": "riverlog-client", "version": __version__, "platform": "Python",
                "connection_name": connection_name}))
            offered = await self._request(f.SaslHandshake)
            if mechanism not in offered.mechanisms:
                raise ClientError(f"{where} offers SASL {', '.join(offered.mechanisms)}, not "
                                  f"{mechanism} (EXTERNAL needs TLS and a client certificate "
                                  f"the server verifies)")
            data = b"" if mechanism == "EXTERNAL" else (
                b"\0" + user.encode() + b"\0" + password.encode())
            await self._request(lambda c: f.SaslAuthenticate(c, mechanism, data))
            tune = await asyncio.wait_for(self._tune, timeout)
            self.frame_max, self.heartbeat = tune.frame_max, tune.heartbeat
            self._send(f.Tune(self.frame_max, self.heartbeat))
            opened = await self._request(lambda c: f.Open(c, vhost))
            self.server_properties = dict(opened.properties or {})
        except BaseException as exc:
            hung_up = exc is self._closed  # the server closed the connection
            if not self._tune.done():  # nobody waits for it any more
                self._tune.cancel()
            elif not self._tune.cancelled():
                self._tune.exception()  # retrieved: no "never retrieved" noise on stderr
            self._abort()
            if hung_up:
                raise ClientError(f"{where} closed the connection during the handshake "
                                  f"({exc}; a TLS port spoken to without TLS, or the "
                                  f"other way round?)") from None
            raise
        if self.heartbeat:
            self._heartbeat_task = loop.create_task(self._heartbeats())
        return self

    async def close(self) -> None:
        """Close politely (Close frame, then the socket); safe to call twice."""
        if self._closed is None and self._transport is not None:
            try:
                await asyncio.wait_for(self._request(lambda c: f.Close(c, _OK, "bye")), 2)
            except (ClientError, asyncio.TimeoutError):
                pass
        self._abort()

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def _abort(self) -> None:
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        if self._transport is not None:
            self._transport.close()
        self._lost(None)

    async def _heartbeats(self) -> None:
        period = max(self.heartbeat / 2, 0.5)
        while True:
            await asyncio.sleep(period)
            if time.monotonic() - self._last_sent >= period:
                self._send(f.Heartbeat())

    # -- frames in --------------------------------------------------------------------------
    def _bad_frame(self, exc: Exception) -> None:
        self._fail(ClientError(f"bad frame from the server: {exc}"))
        self._transport.close()

    def _dispatch(self, frame: f.Frame) -> None:
        kind = type(frame)
        if kind is f.Deliver or kind is f.DeliverV2:
            sub = self._subscriptions.get(frame.subscription_id)
            if sub is not None:
                sub._deliver(frame.chunk)
        elif kind is f.PublishConfirm:
            pub = self._publishers.get(frame.publisher_id)
            if pub is not None:
                pub._confirmed(frame.publishing_ids)
        elif kind is f.PublishError:
            pub = self._publishers.get(frame.publisher_id)
            if pub is not None:
                pub._errors(frame.errors)
        elif kind is f.Heartbeat:
            pass
        elif kind is f.Tune:
            if self._tune is not None and not self._tune.done():
                self._tune.set_result(frame)
        elif kind is f.Close:
            self._send(f.CloseResponse(frame.correlation_id, _OK))
            self._fail(ClientError(f"server closed the connection: {frame.reason}", frame.code))
            self._transport.close()
        elif kind is f.MetadataUpdate:
            err = ClientError(f"stream {frame.stream!r} is no longer available", frame.response_code)
            for sub in list(self._subscriptions.values()):
                if sub.stream == frame.stream:
                    sub._error(err)
            for pub in list(self._publishers.values()):
                if pub.stream == frame.stream:
                    pub._fail(err)
        elif kind is f.CreditResponse:
            sub = self._subscriptions.get(frame.subscription_id)
            if sub is not None:
                sub._error(ClientError("credit refused", frame.response_code))
        else:
            corr = getattr(frame, "correlation_id", None)
            fut = self._pending.pop(corr, None)
            if fut is not None and not fut.done():
                fut.set_result(frame)

    def _lost(self, exc: Exception | None) -> None:
        self._fail(ClientError(f"connection lost: {exc}" if exc else "connection closed"))

    def _fail(self, err: ClientError) -> None:
        if self._closed is not None:
            return
        self._closed = err
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()
        if self._tune is not None and not self._tune.done():
            self._tune.set_exception(err)
        for pub in list(self._publishers.values()):
            pub._fail(err)
        for sub in list(self._subscriptions.values()):
            sub._error(err)
        self._writable.set()

    # -- frames out -------------------------------------------------------------------------
    def _send(self, frame: f.Frame) -> None:
        self._send_bytes(encode(frame))

    def _send_bytes(self, data: bytes) -> None:
        if self._closed is not None:
            raise self._closed
        self._transport.write(data)
        self._last_sent = time.monotonic()

    async def _request(self, make, expect_ok: bool = True, what: str = "") -> f.Frame:
        if self._closed is not None:
            raise self._closed
        corr = next(self._correlation)
        frame = make(corr)
        fut = asyncio.get_running_loop().create_future()
        self._pending[corr] = fut
        self._send(frame)
        try:
            response = await asyncio.wait_for(fut, self.timeout)
        except asyncio.TimeoutError:
            self._pending.pop(corr, None)
            raise ClientError(f"no answer to {type(frame).__name__} in {self.timeout}s") from None
        code = getattr(response, "response_code", _OK)
        if expect_ok and code != _OK:
            raise ClientError(what or f"{type(frame).__name__} failed", code)
        return response

    # -- streams ----------------------------------------------------------------------------
    async def create_stream(self, name: str, arguments: dict[str, str] | None = None, *,
                            exist_ok: bool = False) -> bool:
        """Create stream ``name`` with Create ``arguments`` (``max-length-bytes``,
        ``max-age``, ...). Returns False when it existed and ``exist_ok`` (whatever its
        settings: the server answers PRECONDITION_FAILED for a stream that exists with other
        ones, as RabbitMQ does); raises ClientError otherwise (code STREAM_ALREADY_EXISTS,
        PRECONDITION_FAILED for bad arguments or other settings)."""
        r = await self._request(lambda c: f.Create(c, name, dict(arguments or {})), False)
        if exist_ok and (r.response_code == ResponseCode.STREAM_ALREADY_EXISTS or (
                r.response_code == ResponseCode.PRECONDITION_FAILED
                and await self.stream_exists(name))):
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

    @property
    def server_address(self) -> tuple[str, int] | None:
        """(host, port) the server advertises for this connection (its Open answer), as
        Metadata names it; None when the server does not say."""
        props = self.server_properties
        try:
            return props["advertised_host"], int(props["advertised_port"])
        except (KeyError, ValueError):
            return None

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


class AsyncPublisher:
    """A declared publisher. ``publish(records)`` sends record bytes (already in the
    record format, see ``riverlog.record.encode_record``) with publishing ids;
    ``await flush()`` waits until every one is confirmed. Not safe to use from two tasks."""

    def __init__(self, client: AsyncClient, publisher_id: int, stream: str,
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


class AsyncSubscription:
    """A subscription: ``await next_chunk()`` returns the next ``Chunk`` (None on timeout);
    ``await next_chunks(n)`` up to ``n`` already received ones (waiting for the first).
    Credit is given back as the caller takes chunks. Errors (stream deleted, connection
    lost) raise ClientError from the next call."""

    def __init__(self, client: AsyncClient, subscription_id: int, stream: str,
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


# -- blocking ---------------------------------------------------------------------------------


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
