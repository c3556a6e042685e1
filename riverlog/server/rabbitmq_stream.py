# The RabbitMQ Stream front door: TCP connections speaking the current protocol, over the
# broker core. Owns sockets, per-connection state (handshake, publishers, subscriptions,
# heartbeats) and flow control; decodes and encodes with the sans-IO codec in
# riverlog.protocol.rabbitmq_stream and never touches files.
# Rules: a bad frame closes only its own connection (Close with the protocol's code); writes
# to the log happen in arrival order on the event loop; a confirm is sent only once the chunk
# is committed under the durability policy; credit counts chunks and is never exceeded;
# a publisher with too many unconfirmed messages stops being read until they drain.
# Wire facts: ../shared/reference/rabbitmq-stream-protocol.md.
from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import time
from typing import Callable

from .. import __version__
from ..broker import Broker, Partition, Stream, StreamConfig
from ..config import RabbitStreamConfig
from ..errors import (CorruptChunkError, InvalidArgumentError, LogClosedError, LogError,
                      OffsetOutOfRangeError, StreamExistsError, StreamNotFoundError)
from ..log.chunk import CHUNK_USER
from ..protocol.rabbitmq_stream import (FrameDecoder, FrameError, OffsetType, ResponseCode,
                                        deliver_prefix, encode)
from ..protocol.rabbitmq_stream import frames as f
from ..protocol.rabbitmq_stream.constants import INITIAL_FRAME_MAX

log = logging.getLogger("riverlog.rabbitmq_stream")

OK = ResponseCode.OK
READ_BYTES = 1024 * 1024
# A chunk built from several Publish frames stays below what a client with the default
# frame_max (1 MiB) can receive in one Deliver.
STAGE_MAX_BYTES = 1024 * 1024 - 64 * 1024
STAGE_MAX_ENTRIES = 60_000
PRE_OPEN_FRAME_MAX = max(INITIAL_FRAME_MAX, 65536)

# ExchangeCommandVersions: [key, min, max] in key order (Publish and Deliver go to 2).
SERVER_COMMAND_VERSIONS = tuple(
    f.CommandVersion(key, 1, 2 if key in (0x02, 0x08) else 1)
    for key in range(0x01, 0x20) if key not in (0x03, 0x04, 0x08, 0x10, 0x1A))

_AGE = re.compile(r"^\s*(\d+)\s*([YMDhms])\s*$")
_AGE_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000, "h": 3_600_000,
           "m": 60_000, "s": 1000}
_IGNORED_ARGUMENTS = {"initial-cluster-size", "queue-leader-locator", "x-queue-type"}


def stream_config_from_arguments(arguments: dict[str, str]) -> StreamConfig:
    """Translate Create arguments to a StreamConfig: ``max-length-bytes``, ``max-age`` (e.g.
    ``7D``, ``12h``, ``30s``; units Y M D h m s), ``stream-max-segment-size-bytes``.
    Cluster-only arguments are ignored with a log line. Raises ``InvalidArgumentError``."""
    kwargs = {}
    for key, value in arguments.items():
        try:
            if key == "max-length-bytes":
                kwargs["retention_max_bytes"] = int(value)
            elif key == "stream-max-segment-size-bytes":
                kwargs["segment_max_bytes"] = int(value)
            elif key == "max-age":
                m = _AGE.match(value)
                if not m:
                    raise ValueError(value)
                kwargs["retention_max_age_ms"] = int(m.group(1)) * _AGE_MS[m.group(2)]
            elif key in _IGNORED_ARGUMENTS or key == "stream-filter-size-bytes":
                log.info("Create: argument %s=%s has no effect on a single server", key, value)
            else:
                log.info("Create: unknown argument %s=%s ignored", key, value)
        except ValueError:
            raise InvalidArgumentError(f"bad value for {key}: {value!r}") from None
    return StreamConfig(**kwargs)


def _negotiate(ours: int, theirs: int) -> int:
    """Tune: the smaller of two limits where 0 means "no limit"."""
    return min(ours, theirs) if ours and theirs else ours or theirs


def _is_loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


class Publisher:
    __slots__ = ("id", "reference", "stream", "partition")

    def __init__(self, publisher_id: int, reference: str | None, stream: Stream) -> None:
        self.id = publisher_id
        self.reference = reference or None
        self.stream = stream
        self.partition: Partition = stream.partitions[0]


class _Staged:
    """Entries of one publisher received in this batch of frames, not written yet."""

    __slots__ = ("pub", "entries", "ids", "last", "size")

    def __init__(self, pub: Publisher) -> None:
        self.pub = pub
        self.entries: list[bytes] = []
        self.ids: list[int] = []
        self.last = pub.partition.publishers.get(pub.reference) if pub.reference else None
        self.size = 0


class Subscription:
    """One Subscribe: a task that sends chunks from ``offset`` on while credit lasts."""

    __slots__ = ("conn", "id", "stream", "partition", "offset", "credit", "_credit_event",
                 "_buffer", "task")

    def __init__(self, conn: "RabbitStreamConnection", sub_id: int, stream: Stream,
                 offset: int, credit: int) -> None:
        self.conn = conn
        self.id = sub_id
        self.stream = stream
        self.partition: Partition = stream.partitions[0]
        self.offset = offset
        self.credit = credit
        self._credit_event = asyncio.Event()
        self._buffer = bytearray(READ_BYTES)
        self.task = asyncio.get_running_loop().create_task(self._run())

    def add_credit(self, credit: int) -> None:
        self.credit += credit
        self._credit_event.set()

    def cancel(self) -> None:
        self.task.cancel()

    async def _run(self) -> None:
        partition = self.partition
        conn = self.conn
        try:
            while True:
                if self.credit <= 0:
                    self._credit_event.clear()
                    await self._credit_event.wait()
                    continue
                await conn.writable()
                # reuse the read buffer only once the socket took every byte sent from it
                buffer = self._buffer if conn.transport_idle() else None
                try:
                    chunks = partition.read_chunks(self.offset, READ_BYTES, self.credit,
                                                   buffer)
                except OffsetOutOfRangeError:  # retention removed it: go on from the oldest
                    self.offset = partition.first_offset
                    continue
                if not chunks:
                    await partition.wait_for(self.offset)
                    continue
                read = sum(len(c.raw) for c in chunks)
                if read > len(self._buffer):  # it came as new bytes: grow for next time
                    self._buffer = bytearray(read)
                for chunk in chunks:
                    if self.credit <= 0:
                        break
                    self.offset = chunk.header.next_offset
                    if chunk.header.chunk_type != CHUNK_USER:
                        continue
                    conn.send_chunk(self.id, chunk.header_and_data)
                    self.credit -= 1
        except LogClosedError:  # stream deleted or server stopping
            return
        except CorruptChunkError as exc:
            log.error("subscription %d on %r stopped: %s", self.id, self.stream.name, exc)
            conn.send(f.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, self.stream.name))


class RabbitStreamConnection(asyncio.Protocol):
    """One client connection: handshake, then commands until Close or disconnect."""

    def __init__(self, server: "RabbitStreamServer") -> None:
        self.server = server
        self.broker = server.broker
        self.config = server.config
        self.decoder = FrameDecoder(max_frame_size=PRE_OPEN_FRAME_MAX)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.peer_host: str | None = None
        self.user: str | None = None
        self.authenticated = False
        self.opened = False
        self.closing = False
        self.frame_max = self.config.frame_max
        self.heartbeat_s = self.config.heartbeat_s
        self.deliver_v2 = False
        self.publishers: dict[int, Publisher] = {}
        self.subscriptions: dict[int, Subscription] = {}
        self.unconfirmed = 0
        self.reading_paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._last_received = self._last_sent = time.monotonic()
        self._heartbeat_task: asyncio.Task | None = None
        self._pending: set[asyncio.Task] = set()
        self._staged: dict[int, _Staged] = {}
        self._flush_scheduled = False

    # -- transport callbacks ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer_host = peer[0]
            self.peer = f"{peer[0]}:{peer[1]}"
        self.server.connections.add(self)
        log.debug("connection from %s", self.peer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        for sub in self.subscriptions.values():
            sub.cancel()
        self.subscriptions.clear()
        self.publishers.clear()
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        self._writable.set()
        log.debug("connection from %s closed", self.peer)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def transport_idle(self) -> bool:
        """True when the socket has taken every byte written so far (nothing buffered)."""
        return self.transport is not None and self.transport.get_write_buffer_size() == 0

    async def writable(self) -> None:
        """Wait while the socket's send buffer is over its high-water mark."""
        if not self._writable.is_set():
            await self._writable.wait()

    def data_received(self, data: bytes) -> None:
        self._last_received = time.monotonic()
        try:
            frames = self.decoder.feed(data)
        except FrameError as exc:
            for frame in exc.frames:
                self._handle(frame)
            if self._staged:
                self._flush_publishes()
            self.fail(exc.code, exc.message)
            return
        for frame in frames:
            if self.closing:
                return
            self._handle(frame)
        if self._staged and not self._flush_scheduled:
            # after this turn's reads: the event loop may hand us more of the socket's
            # bytes first (libuv reads up to 32 times per readiness), making bigger chunks
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_publishes)

    # -- output -------------------------------------------------------------------------
    def send(self, frame: f.Frame) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(encode(frame))
            self._last_sent = time.monotonic()

    def send_chunk(self, sub_id: int, chunk: memoryview) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        committed = None
        if self.deliver_v2:
            sub = self.subscriptions.get(sub_id)
            committed = max(sub.partition.last_chunk_offset, 0) if sub else 0
        self.transport.writelines((deliver_prefix(sub_id, len(chunk), committed), chunk))
        self._last_sent = time.monotonic()

    def fail(self, code: int, reason: str) -> None:
        """Close this connection because of the peer: a Close frame with ``code``, then
        the socket (after what is buffered is sent)."""
        if self.closing:
            return
        log.warning("closing connection from %s: %s (code 0x%02x)", self.peer, reason, code)
        self.send(f.Close(0, code, reason[:200]))
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    # -- dispatch -----------------------------------------------------------------------
    def _handle(self, frame: f.Frame) -> None:
        handler = _HANDLERS.get(type(frame))
        if self._staged and handler is not _on_publish:
            self._flush_publishes()  # later commands see every earlier publish written
        if handler is None:
            self.fail(ResponseCode.UNKNOWN_FRAME, f"unexpected {type(frame).__name__} frame")
            return
        needs_open = type(frame) not in _BEFORE_OPEN
        if needs_open and not self.opened:
            self.fail(ResponseCode.ACCESS_REFUSED,
                      f"{type(frame).__name__} before the connection was opened")
            return
        try:
            handler(self, frame)
        except Exception as exc:  # a server bug: this connection only
            log.exception("error handling %s from %s", type(frame).__name__, self.peer)
            self.fail(ResponseCode.INTERNAL_ERROR, f"internal error: {exc}")

    # -- handshake ----------------------------------------------------------------------
    def on_peer_properties(self, frame: f.PeerProperties) -> None:
        self.send(f.PeerPropertiesResponse(frame.correlation_id, OK, {
            "product": "riverlog", "version": "3.13.0", "riverlog_version": __version__,
            "cluster_name": "riverlog", "platform": "Python",
            "copyright": "riverlog contributors", "information": "https://riverlog.invalid/",
        }))

    def on_sasl_handshake(self, frame: f.SaslHandshake) -> None:
        self.send(f.SaslHandshakeResponse(frame.correlation_id, OK, ("PLAIN",)))

    def on_sasl_authenticate(self, frame: f.SaslAuthenticate) -> None:
        if frame.mechanism != "PLAIN":
            self.send(f.SaslAuthenticateResponse(frame.correlation_id,
                                                 ResponseCode.SASL_MECHANISM_NOT_SUPPORTED))
            return
        parts = (frame.data or b"").split(b"\0")
        if len(parts) != 3:
            self.send(f.SaslAuthenticateResponse(frame.correlation_id, ResponseCode.SASL_ERROR))
            self.fail(ResponseCode.SASL_ERROR, "malformed PLAIN response")
            return
        user, password = parts[1].decode(errors="replace"), parts[2].decode(errors="replace")
        users = dict(self.config.users)
        if users.get(user) != password:
            self.send(f.SaslAuthenticateResponse(frame.correlation_id,
                                                 ResponseCode.AUTHENTICATION_FAILURE))
            self.fail(ResponseCode.AUTHENTICATION_FAILURE, f"authentication failed for {user!r}")
            return
        if user in self.config.loopback_users and not _is_loopback(self.peer_host):
            self.send(f.SaslAuthenticateResponse(
                frame.correlation_id, ResponseCode.SASL_AUTHENTICATION_FAILURE_LOOPBACK))
            self.fail(ResponseCode.SASL_AUTHENTICATION_FAILURE_LOOPBACK,
                      f"user {user!r} may only connect from loopback")
            return
        self.user = user
        self.authenticated = True
        self.send(f.SaslAuthenticateResponse(frame.correlation_id, OK))
        self.send(f.Tune(self.config.frame_max, self.config.heartbeat_s))

    def on_tune(self, frame: f.Tune | f.TuneResponse) -> None:
        if not self.authenticated:
            self.fail(ResponseCode.ACCESS_REFUSED, "Tune before authentication")
            return
        self.frame_max = _negotiate(self.config.frame_max, frame.frame_max)
        self.heartbeat_s = _negotiate(self.config.heartbeat_s, frame.heartbeat)

    def on_open(self, frame: f.Open) -> None:
        if not self.authenticated:
            self.fail(ResponseCode.ACCESS_REFUSED, "Open before authentication")
            return
        if frame.virtual_host not in ("/", ""):
            self.send(f.OpenResponse(frame.correlation_id,
                                     ResponseCode.VIRTUAL_HOST_ACCESS_FAILURE))
            self.fail(ResponseCode.VIRTUAL_HOST_ACCESS_FAILURE,
                      f"no virtual host {frame.virtual_host!r}")
            return
        self.opened = True
        self.decoder.max_frame_size = self.frame_max
        host, port = self.server.advertised
        self.send(f.OpenResponse(frame.correlation_id, OK, {
            "advertised_host": host, "advertised_port": str(port)}))
        if self.heartbeat_s:
            self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeats())

    def on_exchange_command_versions(self, frame: f.ExchangeCommandVersions) -> None:
        for version in frame.versions:
            if version.key == 0x08 and version.max_version >= 2:
                self.deliver_v2 = True
        self.send(f.ExchangeCommandVersionsResponse(frame.correlation_id, OK,
                                                    SERVER_COMMAND_VERSIONS))

    def on_heartbeat(self, frame: f.Heartbeat) -> None:
        pass  # receiving it already refreshed _last_received

    def on_close(self, frame: f.Close) -> None:
        self.send(f.CloseResponse(frame.correlation_id, OK))
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def on_close_response(self, frame: f.CloseResponse) -> None:
        if self.transport is not None:
            self.transport.close()

    async def _heartbeats(self) -> None:
        period = self.heartbeat_s
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            # timers may fire a little early or late: judge with a quarter period of slack
            if now - self._last_received > 2.25 * period:
                self.fail(ResponseCode.OK, "missed heartbeats: the peer is gone")
                if self.transport is not None:
                    self.transport.abort()
                return
            if now - self._last_sent >= 0.75 * period:
                self.send(f.Heartbeat())

    # -- streams ------------------------------------------------------------------------
    def on_create(self, frame: f.Create) -> None:
        try:
            config = stream_config_from_arguments(dict(frame.arguments or {}))
            self.broker.create(frame.stream, config)
            code = OK
        except StreamExistsError:
            code = ResponseCode.STREAM_ALREADY_EXISTS
        except InvalidArgumentError as exc:
            log.info("Create %r refused: %s", frame.stream, exc)
            code = ResponseCode.PRECONDITION_FAILED
        self.send(f.CreateResponse(frame.correlation_id, code))

    def on_delete(self, frame: f.Delete) -> None:
        try:
            self.broker.delete(frame.stream)
            code = OK
        except StreamNotFoundError:
            code = ResponseCode.STREAM_DOES_NOT_EXIST
        self.send(f.DeleteResponse(frame.correlation_id, code))

    def on_metadata(self, frame: f.Metadata) -> None:
        host, port = self.server.advertised
        streams = []
        for name in frame.streams:
            if name in self.broker.streams:
                streams.append(f.StreamMetadata(name, OK, 0, ()))
            else:
                streams.append(f.StreamMetadata(name, ResponseCode.STREAM_DOES_NOT_EXIST,
                                                0xFFFF, ()))
        self.send(f.MetadataResponse(frame.correlation_id, (f.Broker(0, host, port),),
                                     tuple(streams)))

    def on_stream_stats(self, frame: f.StreamStats) -> None:
        try:
            partition = self.broker.get(frame.stream).partitions[0]
        except StreamNotFoundError:
            self.send(f.StreamStatsResponse(frame.correlation_id,
                                            ResponseCode.STREAM_DOES_NOT_EXIST, {}))
            return
        committed = partition.committed_offset
        stats = {
            "first_chunk_id": partition.first_offset if committed >= 0 else -1,
            "committed_chunk_id": partition.last_chunk_offset if committed >= 0 else -1,
            "last_chunk_id": partition.last_chunk_offset if committed >= 0 else -1,
        }
        self.send(f.StreamStatsResponse(frame.correlation_id, OK, stats))

    def stream_deleted(self, stream: Stream) -> None:
        """Broker callback: drop this connection's publishers and subscriptions on a deleted
        stream and tell the client with MetadataUpdate (0x06), once."""
        touched = False
        for sub_id, sub in list(self.subscriptions.items()):
            if sub.stream is stream:
                sub.cancel()
                del self.subscriptions[sub_id]
                touched = True
        for pub_id, pub in list(self.publishers.items()):
            if pub.stream is stream:
                del self.publishers[pub_id]
                touched = True
        if touched:
            self.send(f.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, stream.name))

    # -- publishing ---------------------------------------------------------------------
    def on_declare_publisher(self, frame: f.DeclarePublisher) -> None:
        code = OK
        try:
            stream = self.broker.get(frame.stream)
        except StreamNotFoundError:
            code = ResponseCode.STREAM_DOES_NOT_EXIST
        else:
            taken = frame.publisher_id in self.publishers or (frame.reference and any(
                p.reference == frame.reference and p.stream is stream
                for p in self.publishers.values()))
            if taken:
                code = ResponseCode.PRECONDITION_FAILED
            else:
                self.publishers[frame.publisher_id] = Publisher(frame.publisher_id,
                                                                frame.reference, stream)
        self.send(f.DeclarePublisherResponse(frame.correlation_id, code))

    def on_publish(self, frame: f.Publish | f.PublishV2) -> None:
        """Stage the new entries; ``_flush_publishes`` writes each publisher's staged entries
        as one chunk once the frames at hand are handled (RabbitMQ too merges queued publish
        frames into one chunk), then confirms."""
        entries = frame.entries
        if not entries:
            return
        pub = self.publishers.get(frame.publisher_id)
        ids = [e[0] for e in entries]
        if pub is None or self.broker.streams.get(pub.stream.name) is not pub.stream:
            code = (ResponseCode.PUBLISHER_DOES_NOT_EXIST if pub is None
                    else ResponseCode.STREAM_DOES_NOT_EXIST)
            self.send(f.PublishError(frame.publisher_id, tuple((i, code) for i in ids)))
            return
        if pub.partition.readonly:  # set through Liftbridge's SetStreamReadonly
            self.send(f.PublishError(frame.publisher_id, tuple(
                (i, ResponseCode.ACCESS_REFUSED) for i in ids)))
            return
        staged = self._staged.get(frame.publisher_id)
        if staged is None:
            staged = self._staged[frame.publisher_id] = _Staged(pub)
        pairs = entries if type(frame) is f.Publish else [(e[0], e[2]) for e in entries]
        new = pub.partition.new_entries(pub.reference, pairs, staged.last)
        staged.ids += ids
        if new:
            staged.last = new[-1][0]
            for _, entry in new:
                staged.entries.append(entry)
                staged.size += len(entry)
        self.unconfirmed += len(ids)
        if self.unconfirmed > self.config.max_unconfirmed and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        if staged.size >= STAGE_MAX_BYTES or len(staged.entries) >= STAGE_MAX_ENTRIES:
            self._flush_staged(frame.publisher_id)

    def _flush_publishes(self) -> None:
        self._flush_scheduled = False
        for publisher_id in list(self._staged):
            self._flush_staged(publisher_id)

    def _flush_staged(self, publisher_id: int) -> None:
        staged = self._staged.pop(publisher_id)
        partition = staged.pub.partition
        if staged.entries:
            try:
                partition.write_entries(staged.entries, reference=staged.pub.reference,
                                        sequence=staged.last)
            except (OSError, LogError) as exc:
                log.error("publish to %r failed: %s", staged.pub.stream.name, exc)
                code = (ResponseCode.STREAM_DOES_NOT_EXIST if isinstance(exc, LogClosedError)
                        else ResponseCode.INTERNAL_ERROR)
                self.send(f.PublishError(publisher_id, tuple((i, code) for i in staged.ids)))
                self._unconfirmed_done(len(staged.ids))
                return
        if staged.entries and partition.needs_flush:
            task = asyncio.get_running_loop().create_task(
                self._confirm_after_flush(partition, publisher_id, staged.ids))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        else:
            self._confirm(publisher_id, staged.ids)

    async def _confirm_after_flush(self, partition: Partition, publisher_id: int,
                                   ids: list[int]) -> None:
        try:
            await partition.flush()
        except Exception as exc:
            log.error("fsync failed, publish not confirmed: %s", exc)
            self.send(f.PublishError(publisher_id, tuple(
                (i, ResponseCode.INTERNAL_ERROR) for i in ids)))
            self._unconfirmed_done(len(ids))
            return
        self._confirm(publisher_id, ids)

    def _confirm(self, publisher_id: int, ids: list[int]) -> None:
        self.send(f.PublishConfirm(publisher_id, tuple(ids)))
        self._unconfirmed_done(len(ids))

    def _unconfirmed_done(self, n: int) -> None:
        self.unconfirmed -= n
        if self.reading_paused and self.unconfirmed <= self.config.resume_unconfirmed:
            self.reading_paused = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    def on_query_publisher_sequence(self, frame: f.QueryPublisherSequence) -> None:
        try:
            partition = self.broker.get(frame.stream).partitions[0]
        except StreamNotFoundError:
            self.send(f.QueryPublisherSequenceResponse(
                frame.correlation_id, ResponseCode.STREAM_DOES_NOT_EXIST, 0))
            return
        self.send(f.QueryPublisherSequenceResponse(
            frame.correlation_id, OK, partition.publishers.get(frame.reference)))

    def on_delete_publisher(self, frame: f.DeletePublisher) -> None:
        code = OK if self.publishers.pop(frame.publisher_id, None) else \
            ResponseCode.PUBLISHER_DOES_NOT_EXIST
        self.send(f.DeletePublisherResponse(frame.correlation_id, code))

    # -- consuming ----------------------------------------------------------------------
    def on_subscribe(self, frame: f.Subscribe) -> None:
        if frame.subscription_id in self.subscriptions:
            self.send(f.SubscribeResponse(frame.correlation_id,
                                          ResponseCode.SUBSCRIPTION_ID_ALREADY_EXISTS))
            return
        try:
            stream = self.broker.get(frame.stream)
        except StreamNotFoundError:
            self.send(f.SubscribeResponse(frame.correlation_id,
                                          ResponseCode.STREAM_DOES_NOT_EXIST))
            return
        partition = stream.partitions[0]
        kind, value = frame.offset_type, frame.offset
        if kind == OffsetType.FIRST:
            offset = partition.first_offset
        elif kind == OffsetType.LAST:
            offset = partition.last_chunk_offset
        elif kind == OffsetType.NEXT:
            offset = partition.next_offset
        elif kind == OffsetType.OFFSET:
            offset = min(max(value or 0, partition.first_offset), partition.next_offset)
        elif kind == OffsetType.TIMESTAMP:
            offset = partition.offset_for_timestamp(value or 0)
        else:
            self.send(f.SubscribeResponse(frame.correlation_id,
                                          ResponseCode.PRECONDITION_FAILED))
            return
        self.send(f.SubscribeResponse(frame.correlation_id, OK))
        self.subscriptions[frame.subscription_id] = Subscription(
            self, frame.subscription_id, stream, offset, frame.credit)

    def on_credit(self, frame: f.Credit) -> None:
        sub = self.subscriptions.get(frame.subscription_id)
        if sub is None:
            self.send(f.CreditResponse(ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST,
                                       frame.subscription_id))
            return
        sub.add_credit(frame.credit)

    def on_unsubscribe(self, frame: f.Unsubscribe) -> None:
        sub = self.subscriptions.pop(frame.subscription_id, None)
        if sub is None:
            code = ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST
        else:
            sub.cancel()
            code = OK
        self.send(f.UnsubscribeResponse(frame.correlation_id, code))

    def on_store_offset(self, frame: f.StoreOffset) -> None:
        stream = self.broker.streams.get(frame.stream)
        if stream is not None and frame.reference:
            stream.partitions[0].offsets.store(frame.reference, frame.offset)

    def on_query_offset(self, frame: f.QueryOffset) -> None:
        try:
            partition = self.broker.get(frame.stream).partitions[0]
        except StreamNotFoundError:
            self.send(f.QueryOffsetResponse(frame.correlation_id,
                                            ResponseCode.STREAM_DOES_NOT_EXIST, 0))
            return
        offset = partition.offsets.query(frame.reference)
        if offset is None:
            self.send(f.QueryOffsetResponse(frame.correlation_id, ResponseCode.NO_OFFSET, 0))
        else:
            self.send(f.QueryOffsetResponse(frame.correlation_id, OK, offset))

    # -- not yet served (super streams, single active consumer: see issue 6) -------------
    def on_partitions(self, frame: f.Partitions) -> None:
        self.send(f.PartitionsResponse(frame.correlation_id,
                                       ResponseCode.STREAM_DOES_NOT_EXIST, ()))

    def on_route(self, frame: f.Route) -> None:
        self.send(f.RouteResponse(frame.correlation_id, ResponseCode.STREAM_DOES_NOT_EXIST, ()))

    def on_consumer_update_response(self, frame: f.ConsumerUpdateResponse) -> None:
        pass  # no single-active-consumer groups yet, so no ConsumerUpdate was asked


_BEFORE_OPEN = {f.PeerProperties, f.SaslHandshake, f.SaslAuthenticate, f.Tune, f.TuneResponse,
                f.Open, f.Close, f.CloseResponse, f.Heartbeat}

C = RabbitStreamConnection
_HANDLERS: dict[type, Callable] = {
    f.PeerProperties: C.on_peer_properties,
    f.SaslHandshake: C.on_sasl_handshake,
    f.SaslAuthenticate: C.on_sasl_authenticate,
    f.Tune: C.on_tune,
    f.TuneResponse: C.on_tune,
    f.Open: C.on_open,
    f.Close: C.on_close,
    f.CloseResponse: C.on_close_response,
    f.Heartbeat: C.on_heartbeat,
    f.ExchangeCommandVersions: C.on_exchange_command_versions,
    f.Create: C.on_create,
    f.Delete: C.on_delete,
    f.Metadata: C.on_metadata,
    f.StreamStats: C.on_stream_stats,
    f.DeclarePublisher: C.on_declare_publisher,
    f.Publish: C.on_publish,
    f.PublishV2: C.on_publish,
    f.QueryPublisherSequence: C.on_query_publisher_sequence,
    f.DeletePublisher: C.on_delete_publisher,
    f.Subscribe: C.on_subscribe,
    f.Credit: C.on_credit,
    f.Unsubscribe: C.on_unsubscribe,
    f.StoreOffset: C.on_store_offset,
    f.QueryOffset: C.on_query_offset,
    f.Partitions: C.on_partitions,
    f.Route: C.on_route,
    f.ConsumerUpdateResponse: C.on_consumer_update_response,
}
_on_publish = C.on_publish
del C


class RabbitStreamServer:
    """The listening socket and its connections. ``await start()``, ``await stop()``."""

    def __init__(self, broker: Broker, config: RabbitStreamConfig) -> None:
        self.broker = broker
        self.config = config
        self.connections: set[RabbitStreamConnection] = set()
        self._server: asyncio.AbstractServer | None = None
        self.port = config.port
        broker.deletion_listeners.append(self._stream_deleted)

    @property
    def advertised(self) -> tuple[str, int]:
        host = self.config.advertised_host or (
            "localhost" if self.config.host in ("0.0.0.0", "::", "") else self.config.host)
        return host, self.config.advertised_port or self.port

    async def start(self) -> None:
        """Listen. Raises ``OSError`` with a clear message when the port is taken."""
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: RabbitStreamConnection(self), self.config.host, self.config.port,
                reuse_address=True)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen for RabbitMQ Stream clients on "
                                     f"{self.config.host}:{self.config.port}: {exc.strerror}") from None
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("RabbitMQ Stream door listening on %s:%d", self.config.host, self.port)

    def _stream_deleted(self, stream: Stream) -> None:
        for conn in list(self.connections):
            conn.stream_deleted(stream)

    async def stop(self) -> None:
        """Stop accepting, let in-flight confirms finish, close every connection."""
        if self._server is not None:
            self._server.close()
        pending = [t for c in self.connections for t in c._pending]
        if pending:
            await asyncio.wait(pending, timeout=5)
        for conn in list(self.connections):
            for sub in conn.subscriptions.values():
                sub.cancel()
            if conn.transport is not None:
                conn.transport.close()
        if self._server is not None:
            await self._server.wait_closed()
