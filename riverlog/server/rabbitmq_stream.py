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
import logging
import re
import time
from typing import Callable

from .. import __version__
from ..broker import (RESERVED_STREAMS, Broker, Notification, Partition, SingleActiveConsumers,
                      Stream, StreamConfig, SuperStreams)
from ..config import RabbitStreamConfig, SecurityConfig
from ..errors import (CorruptChunkError, InvalidArgumentError, LogClosedError, LogError,
                      OffsetOutOfRangeError, ReservedStreamError, StreamExistsError,
                      StreamNotFoundError)
from ..log.bloom import ChunkFilter, filter_from_properties
from ..log.chunk import CHUNK_USER, ChunkFormatError, check_entry
from ..metrics import CONFIRM_RABBITMQ, RABBITMQ_STREAM, counters, error as count_error
from ..protocol.rabbitmq_stream import (FrameDecoder, FrameError, OffsetType, ResponseCode,
                                        deliver_prefix, encode)
from ..protocol.rabbitmq_stream import frames as f
from ..protocol.rabbitmq_stream.constants import INITIAL_FRAME_MAX
from ..protocol.rabbitmq_stream.draft import opens_draft
from ..security.authz import CONSUME, CREATE, DELETE, PUBLISH
from ..security.guard import Guard
from .rabbitmq_draft import DraftAdapter

log = logging.getLogger("riverlog.rabbitmq_stream")

OK = ResponseCode.OK
READ_BYTES = 1024 * 1024
# A chunk built from several Publish frames stays below what a client with the default
# frame_max (1 MiB) can receive in one Deliver.
STAGE_MAX_BYTES = 1024 * 1024 - 64 * 1024
STAGE_MAX_ENTRIES = 60_000
# A peer that sends requests but does not read the answers is not read either once this much
# output waits for it (benchmarks/load_bench.py, "deaf" client: unbounded before).
OUTPUT_PAUSE_BYTES = 4 * 1024 * 1024
PRE_OPEN_FRAME_MAX = max(INITIAL_FRAME_MAX, 65536)
LOGIN_REFUSED_LINGER_S = 0.2

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


class Publisher:
    __slots__ = ("id", "reference", "stream", "partition")

    def __init__(self, publisher_id: int, reference: str | None, stream: Stream) -> None:
        self.id = publisher_id
        self.reference = reference or None
        self.stream = stream
        self.partition: Partition = stream.partitions[0]


class _Staged:
    """Entries of one publisher received in this batch of frames, not written yet."""

    __slots__ = ("pub", "entries", "ids", "last", "size", "received", "filters")

    def __init__(self, pub: Publisher) -> None:
        self.pub = pub
        self.received = time.monotonic()  # for the confirm latency metric
        self.entries: list[bytes] = []
        self.ids: list[int] = []
        self.last = pub.partition.publishers.get(pub.reference) if pub.reference else None
        self.size = 0
        self.filters: set[str | None] = set()  # filter values (None: an entry without one)


class Subscription:
    """One Subscribe: a task that sends chunks from ``offset`` on while credit lasts. With
    ``offset`` None (a single active consumer not active yet) there is no task until
    ``start``; meanwhile ``offset`` is the partition's next offset (lag 0)."""

    __slots__ = ("conn", "id", "stream", "partition", "offset", "credit", "_credit_event",
                 "_buffer", "task", "chunk_filter")

    def __init__(self, conn: "RabbitStreamConnection", sub_id: int, stream: Stream,
                 offset: int | None, credit: int,
                 chunk_filter: ChunkFilter | None = None) -> None:
        self.conn = conn
        # with a filter, chunks that cannot match are skipped: not sent, no credit used
        self.chunk_filter = chunk_filter
        self.id = sub_id
        self.stream = stream
        self.partition: Partition = stream.partitions[0]
        self.offset = self.partition.next_offset if offset is None else offset
        self.credit = credit
        self._credit_event = asyncio.Event()
        # grows to the largest read (below): 1 MiB up front per subscription was 500 MiB for
        # 500 tailing consumers (benchmarks/load_bench.py)
        self._buffer = bytearray()
        self.task: asyncio.Task | None = None
        if offset is not None:
            self.start(offset)

    def start(self, offset: int) -> None:
        """(Re)start delivering from ``offset``."""
        self.cancel()
        self.offset = offset
        self.task = asyncio.get_running_loop().create_task(self._run())

    def add_credit(self, credit: int) -> None:
        self.credit += credit
        self._credit_event.set()

    def cancel(self) -> None:
        """Stop delivering (``start`` resumes)."""
        if self.task is not None:
            self.task.cancel()
            self.task = None

    async def _run(self) -> None:
        partition = self.partition
        conn = self.conn
        counted = counters(self.stream.name, RABBITMQ_STREAM)
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
                    if self.chunk_filter is None:
                        chunks = partition.read_chunks(self.offset, READ_BYTES, self.credit,
                                                       buffer)
                    else:  # skips what cannot match; the offset moves past what it skipped
                        chunks, self.offset = partition.read_matching_chunks(
                            self.offset, self.chunk_filter.matches, READ_BYTES, self.credit,
                            buffer)
                except OffsetOutOfRangeError:  # retention removed it: go on from the oldest
                    self.offset = partition.first_offset
                    continue
                if not chunks:
                    await partition.wait_for(self.offset)
                    await asyncio.sleep(0)  # after a run of skipped chunks, let others run
                    continue
                read = sum(len(c.raw) for c in chunks)
                if read > len(self._buffer):  # it came as new bytes: grow for next time
                    self._buffer = bytearray(read)
                messages = sent = 0
                for chunk in chunks:
                    if self.credit <= 0:
                        break
                    self.offset = chunk.header.next_offset
                    if chunk.header.chunk_type != CHUNK_USER:
                        continue
                    data = chunk.header_and_data
                    conn.send_chunk(self.id, data)
                    self.credit -= 1
                    messages += chunk.header.num_records
                    sent += len(data)
                if messages:
                    counted.delivered(messages, sent)
        except LogClosedError:  # stream deleted or server stopping
            return
        except CorruptChunkError as exc:
            log.error("subscription %d on %r stopped: %s", self.id, self.stream.name, exc)
            conn.send(f.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, self.stream.name))


class RabbitStreamConnection(asyncio.Protocol):
    """One client connection: handshake, then commands until Close or disconnect."""

    def __init__(self, server: "RabbitStreamServer", tls: bool = False) -> None:
        self.server = server
        self.broker = server.broker
        self.config = server.config
        self.guard = server.guard
        self.tls = tls
        self.decoder = FrameDecoder(max_frame_size=PRE_OPEN_FRAME_MAX)
        self.draft: DraftAdapter | None = None  # set when the first frame is the 2020 draft's
        self._head: bytearray | None = bytearray()  # first bytes, until the first key is known
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
        self.output_paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._last_received = self._last_sent = time.monotonic()
        self._heartbeat_task: asyncio.Task | None = None
        self._pending: set[asyncio.Task] = set()
        self._staged: dict[int, _Staged] = {}
        self._flush_scheduled = False
        # single active consumer: ConsumerUpdate requests awaiting an answer (correlation
        # id -> subscription id, active) and each member's Subscribe offset spec
        self._last_request = 0
        self._consumer_updates: dict[int, tuple[int, bool]] = {}
        self._sac_specs: dict[int, tuple[int, int | None]] = {}

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
        _notify(self.server.sac.unregister_owner(self))
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
        if self.output_paused:
            self.output_paused = False
            self._resume_reading()

    def _resume_reading(self) -> None:
        """Read the socket again, unless something still holds it: too many unconfirmed
        publishes (``reading_paused``), too much unsent output (``output_paused``) or closing."""
        if self.reading_paused or self.output_paused or self.closing:
            return
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def transport_idle(self) -> bool:
        """True when the socket has taken every byte written so far (nothing buffered)."""
        return self.transport is not None and self.transport.get_write_buffer_size() == 0

    async def writable(self) -> None:
        """Wait while the socket's send buffer is over its high-water mark."""
        if not self._writable.is_set():
            await self._writable.wait()

    def data_received(self, data: bytes) -> None:
        self._last_received = time.monotonic()
        if self._head is not None:  # the first frame's key tells the dialect apart
            self._head += data
            draft = opens_draft(self._head)
            if draft is None:
                return
            data, self._head = bytes(self._head), None
            if draft:
                self.draft = DraftAdapter(self)
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
        if self.transport.get_write_buffer_size() > OUTPUT_PAUSE_BYTES and not self.closing:
            self.output_paused = True  # until resume_writing: the peer reads again
            self.transport.pause_reading()
        if self._staged and not self._flush_scheduled:
            # after this turn's reads: the event loop may hand us more of the socket's
            # bytes first (libuv reads up to 32 times per readiness), making bigger chunks
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_publishes)

    # -- output -------------------------------------------------------------------------
    def send(self, frame: f.Frame) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(encode(frame, self.decoder.dialect))
            self._last_sent = time.monotonic()

    def send_chunk(self, sub_id: int, chunk: memoryview) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if self.draft is not None:
            self.transport.writelines(self.draft.deliver(sub_id, chunk))
            self._last_sent = time.monotonic()
            return
        committed = None
        if self.deliver_v2:
            sub = self.subscriptions.get(sub_id)
            committed = max(sub.partition.last_chunk_offset, 0) if sub else 0
        self.transport.writelines((deliver_prefix(sub_id, len(chunk), committed), chunk))
        self._last_sent = time.monotonic()

    def fail(self, code: int, reason: str, linger: float = 0.0) -> None:
        """Close this connection because of the peer: a Close frame with ``code``, then
        the socket (after what is buffered is sent; ``linger`` s later when given)."""
        if self.closing:
            return
        log.warning("closing connection from %s: %s (code 0x%02x)", self.peer, reason, code)
        if code != OK:
            count_error(RABBITMQ_STREAM, code)
        self.send(f.Close(0, code, reason[:200]))
        self.closing = True
        if self.transport is not None:
            if linger:
                asyncio.get_running_loop().call_later(linger, self.transport.close)
            else:
                self.transport.close()

    def stop_reading(self) -> None:
        """Shutdown, first step: read no more frames and write the publishes already
        received (their confirms follow as usual)."""
        self.closing = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        if self._staged:
            self._flush_publishes()

    def close_for_shutdown(self) -> None:
        """Shutdown, last step: end the subscriptions and ask the client to close. Reading
        resumes only to see the client hang up; frames that come are ignored."""
        for sub in self.subscriptions.values():
            sub.cancel()
        self.send(f.Close(0, OK, "server shutting down"))
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # -- dispatch -----------------------------------------------------------------------
    def _handle(self, frame: f.Frame) -> None:
        if self.draft is not None:  # the draft's own frames become the door's (None: answered)
            frame = self.draft.translate(frame)
            if frame is None:
                return
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

    def _peer_certificate(self) -> dict | None:
        """The verified client certificate of a TLS connection (None: none or plain TCP)."""
        ssl_object = self.transport.get_extra_info("ssl_object") if self.tls else None
        return ssl_object.getpeercert() if ssl_object is not None else None

    def on_sasl_handshake(self, frame: f.SaslHandshake) -> None:
        mechanisms = ("PLAIN", "EXTERNAL") if self._peer_certificate() else ("PLAIN",)
        self.send(f.SaslHandshakeResponse(frame.correlation_id, OK, mechanisms))

    def _refuse_login(self, correlation_id: int, code: int, reason: str) -> None:
        """Answer SaslAuthenticate with ``code`` and close a little later: a client that
        reads its last frames and the end of the stream together (rstream over TLS drops
        them) sees the refusal, and password guessing slows down."""
        self.send(f.SaslAuthenticateResponse(correlation_id, code))
        self.fail(code, reason, linger=LOGIN_REFUSED_LINGER_S)

    def on_sasl_authenticate(self, frame: f.SaslAuthenticate) -> None:
        """PLAIN (NUL user NUL password, checked against the bcrypt hashes) or, on a TLS
        connection with a verified client certificate, EXTERNAL: the user is the certificate
        subject's CN and must be configured (its password is not checked); RabbitMQ's
        rabbitmq_auth_mechanism_ssl with ``ssl_cert_login_from = common_name``. A password
        not checked before runs bcrypt in a worker thread (Guard.login_async), this
        connection's reading paused meanwhile, so other connections are not held up."""
        corr = frame.correlation_id
        certificate = self._peer_certificate() if frame.mechanism == "EXTERNAL" else None
        if certificate:
            user = self.guard.certificate_user(certificate)
            if user is None:
                self._refuse_login(corr, ResponseCode.AUTHENTICATION_FAILURE,
                                   "no configured user for the client certificate")
            else:
                self._logged_in(corr, user, None)
        elif frame.mechanism == "PLAIN":
            parts = (frame.data or b"").split(b"\0")
            if len(parts) != 3:
                self._refuse_login(corr, ResponseCode.SASL_ERROR, "malformed PLAIN response")
                return
            user, password = parts[1].decode(errors="replace"), parts[2].decode(errors="replace")
            self.transport.pause_reading()
            checked = asyncio.ensure_future(self.guard.login_async(user, password,
                                                                   self.peer_host))
            checked.add_done_callback(lambda done: self._logged_in(corr, user, done.result()))
        else:
            self.send(f.SaslAuthenticateResponse(corr, ResponseCode.SASL_MECHANISM_NOT_SUPPORTED))

    def _logged_in(self, corr: int, user: str, refused: str | None) -> None:
        """Finish SaslAuthenticate: ``refused`` is None (then Tune follows), "password" or
        "loopback" (riverlog.security.guard.Guard.login)."""
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.resume_reading()
        if refused == "password":
            self._refuse_login(corr, ResponseCode.AUTHENTICATION_FAILURE,
                               f"authentication failed for {user!r}")
        elif refused == "loopback":
            self._refuse_login(corr, ResponseCode.SASL_AUTHENTICATION_FAILURE_LOOPBACK,
                               f"user {user!r} may only connect from loopback")
        else:
            self.user = user
            self.authenticated = True
            self.send(f.SaslAuthenticateResponse(corr, OK))
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
        host, port = self.server.advertised_for(self.tls)
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
    def _may(self, stream: str, action: str) -> bool:
        """Authorization (riverlog.security.authz): False answers ACCESS_REFUSED (0x10), as
        RabbitMQ does for Create, Delete, DeclarePublisher, Subscribe and QueryOffset when the
        user lacks the configure, write or read permission."""
        return self.guard.allowed(self.user, stream, action)

    def on_create(self, frame: f.Create) -> None:
        if not self._may(frame.stream, CREATE):
            self.send(f.CreateResponse(frame.correlation_id, ResponseCode.ACCESS_REFUSED))
            return
        code = self._create(frame.stream, frame.arguments,
                            lambda config: self.broker.create(frame.stream, config))
        self.send(f.CreateResponse(frame.correlation_id, code))

    @staticmethod
    def _create(name: str, arguments: dict[str, str] | None,
                create: Callable[[StreamConfig], object]) -> int:
        """Run ``create`` with the StreamConfig of Create ``arguments``; the response code
        (0x05 when it exists, 0x11 for bad arguments or names)."""
        try:
            create(stream_config_from_arguments(dict(arguments or {})))
            return OK
        except StreamExistsError:
            return ResponseCode.STREAM_ALREADY_EXISTS
        except InvalidArgumentError as exc:
            log.info("creating %r refused: %s", name, exc)
            return ResponseCode.PRECONDITION_FAILED

    def on_delete(self, frame: f.Delete) -> None:
        if not self._may(frame.stream, DELETE):
            self.send(f.DeleteResponse(frame.correlation_id, ResponseCode.ACCESS_REFUSED))
            return
        try:
            self.broker.delete(frame.stream)
            code = OK
        except StreamNotFoundError:
            code = ResponseCode.STREAM_DOES_NOT_EXIST
        except ReservedStreamError:  # RabbitMQ's answer to a reserved (amq.*) name
            code = ResponseCode.PRECONDITION_FAILED
        self.send(f.DeleteResponse(frame.correlation_id, code))

    def on_metadata(self, frame: f.Metadata) -> None:
        host, port = self.server.advertised_for(self.tls)
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
        if not self._may(frame.stream, CONSUME):
            self.send(f.StreamStatsResponse(frame.correlation_id, ResponseCode.ACCESS_REFUSED,
                                            {}))
            return
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
                self._sac_specs.pop(sub_id, None)  # the server dropped its group
                touched = True
        for pub_id, pub in list(self.publishers.items()):
            if pub.stream is stream:
                del self.publishers[pub_id]
                touched = True
        if touched:
            self.send(f.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, stream.name))

    # -- publishing ---------------------------------------------------------------------
    def on_declare_publisher(self, frame: f.DeclarePublisher) -> None:
        code = self.declare_publisher(frame.publisher_id, frame.reference, frame.stream)
        self.send(f.DeclarePublisherResponse(frame.correlation_id, code))

    def declare_publisher(self, publisher_id: int, reference: str | None, name: str) -> int:
        """Add a publisher to this connection (also for the draft dialect's Publish); returns
        the response code: OK, STREAM_DOES_NOT_EXIST, ACCESS_REFUSED or PRECONDITION_FAILED
        (the id, or the reference on that stream, is taken; a reserved stream, as RabbitMQ
        answers Create for its reserved amq.* names)."""
        if name in RESERVED_STREAMS:
            return ResponseCode.PRECONDITION_FAILED
        try:
            stream = self.broker.get(name)
        except StreamNotFoundError:
            return ResponseCode.STREAM_DOES_NOT_EXIST
        taken = publisher_id in self.publishers or (reference and any(
            p.reference == reference and p.stream is stream for p in self.publishers.values()))
        if not self._may(name, PUBLISH):
            return ResponseCode.ACCESS_REFUSED
        if taken:
            return ResponseCode.PRECONDITION_FAILED
        self.publishers[publisher_id] = Publisher(publisher_id, reference, stream)
        return OK

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
            self._publish_error(frame.publisher_id, ids, code)
            return
        if pub.partition.readonly:  # set through Liftbridge's SetStreamReadonly
            self._publish_error(frame.publisher_id, ids, ResponseCode.ACCESS_REFUSED)
            return
        if self.config.validate_sub_batches:
            entries = self._readable(frame.publisher_id, entries)
            if not entries:
                return
            ids = [e[0] for e in entries]
        staged = self._staged.get(frame.publisher_id)
        if staged is None:
            staged = self._staged[frame.publisher_id] = _Staged(pub)
        if type(frame) is f.Publish:
            pairs = entries
            staged.filters.add(None)
        else:
            pairs = [(e[0], e[2]) for e in entries]
            staged.filters.update([e[1] for e in entries])
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

    def _readable(self, publisher_id: int, entries: tuple) -> tuple:
        """The entries (publishing id first, entry bytes last) that can be read to their last
        record; the others are refused with 0x11 (riverlog.stream.validate.sub.batches)."""
        readable, refused = [], []
        for entry in entries:
            try:
                check_entry(entry[-1])
                readable.append(entry)
            except ChunkFormatError as exc:
                log.warning("publisher %d: entry %d refused: %s", publisher_id, entry[0], exc)
                refused.append(entry[0])
        if refused:
            self._publish_error(publisher_id, refused, ResponseCode.PRECONDITION_FAILED)
        return tuple(readable)

    def _flush_publishes(self) -> None:
        self._flush_scheduled = False
        for publisher_id in list(self._staged):
            self._flush_staged(publisher_id)

    def _flush_staged(self, publisher_id: int) -> None:
        staged = self._staged.pop(publisher_id)
        partition = staged.pub.partition
        if staged.entries:
            try:
                offsets = partition.write_entries(staged.entries, reference=staged.pub.reference,
                                                  sequence=staged.last,
                                                  filter_values=staged.filters)
            except (OSError, LogError) as exc:
                log.error("publish to %r failed: %s", staged.pub.stream.name, exc)
                code = (ResponseCode.STREAM_DOES_NOT_EXIST if isinstance(exc, LogClosedError)
                        else ResponseCode.INTERNAL_ERROR)
                self._publish_error(publisher_id, staged.ids, code)
                self._unconfirmed_done(len(staged.ids))
                return
            counters(staged.pub.stream.name, RABBITMQ_STREAM).published(len(offsets), staged.size)
        if staged.entries and partition.needs_flush:
            task = asyncio.get_running_loop().create_task(
                self._confirm_after_flush(partition, publisher_id, staged.ids, staged.received))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        else:
            self._confirm(publisher_id, staged.ids, staged.received)

    async def _confirm_after_flush(self, partition: Partition, publisher_id: int,
                                   ids: list[int], received: float) -> None:
        try:
            await partition.flush()
        except Exception as exc:
            log.error("fsync failed, publish not confirmed: %s", exc)
            self._publish_error(publisher_id, ids, ResponseCode.INTERNAL_ERROR)
            self._unconfirmed_done(len(ids))
            return
        self._confirm(publisher_id, ids, received)

    def _confirm(self, publisher_id: int, ids: list[int], received: float) -> None:
        """Send PublishConfirm; ``received`` (time.monotonic()) is when the first Publish
        frame of these ids arrived."""
        self.send(f.PublishConfirm(publisher_id, tuple(ids)))
        CONFIRM_RABBITMQ.observe(time.monotonic() - received)
        self._unconfirmed_done(len(ids))

    def _publish_error(self, publisher_id: int, ids: list[int], code: int) -> None:
        """PublishError (0x04) with ``code`` for every id, counted as one error."""
        self.send(f.PublishError(publisher_id, tuple((i, code) for i in ids)))
        count_error(RABBITMQ_STREAM, code)

    def _unconfirmed_done(self, n: int) -> None:
        self.unconfirmed -= n
        if self.reading_paused and self.unconfirmed <= self.config.resume_unconfirmed:
            self.reading_paused = False
            self._resume_reading()

    def on_query_publisher_sequence(self, frame: f.QueryPublisherSequence) -> None:
        if not self._may(frame.stream, PUBLISH):
            self.send(f.QueryPublisherSequenceResponse(
                frame.correlation_id, ResponseCode.ACCESS_REFUSED, 0))
            return
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
        if not self._may(frame.stream, CONSUME):
            self.send(f.SubscribeResponse(frame.correlation_id, ResponseCode.ACCESS_REFUSED))
            return
        try:
            stream = self.broker.get(frame.stream)
        except StreamNotFoundError:
            self.send(f.SubscribeResponse(frame.correlation_id,
                                          ResponseCode.STREAM_DOES_NOT_EXIST))
            return
        offset = resolve_offset(stream.partitions[0], frame.offset_type, frame.offset)
        group = _sac_group(frame.properties)
        if offset is None or group == "":
            self.send(f.SubscribeResponse(frame.correlation_id,
                                          ResponseCode.PRECONDITION_FAILED))
            return
        self.send(f.SubscribeResponse(frame.correlation_id, OK))
        self.subscriptions[frame.subscription_id] = Subscription(
            self, frame.subscription_id, stream, None if group else offset, frame.credit,
            filter_from_properties(frame.properties))
        if group:
            self._join_group(frame, group)

    def on_resolve_offset_spec(self, frame: f.ResolveOffsetSpec) -> None:
        """ResolveOffsetSpec (0x1f): the offset a Subscribe with this offset spec would start
        at, answered as type OFFSET (as RabbitMQ does). Properties are accepted; filter
        properties do not move the answer (a filtered subscription skips chunks itself)."""
        code, offset = OK, 0
        if not self._may(frame.stream, CONSUME):
            code = ResponseCode.ACCESS_REFUSED
        elif frame.stream not in self.broker.streams:
            code = ResponseCode.STREAM_DOES_NOT_EXIST
        else:
            resolved = resolve_offset(self.broker.streams[frame.stream].partitions[0],
                                      frame.offset_type, frame.offset)
            if resolved is None:
                code = ResponseCode.NO_OFFSET
            else:
                offset = resolved
        self.send(f.ResolveOffsetSpecResponse(frame.correlation_id, code, OffsetType.OFFSET,
                                              offset))

    def on_credit(self, frame: f.Credit) -> None:
        sub = self.subscriptions.get(frame.subscription_id)
        if sub is None:
            self.send(f.CreditResponse(ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST,
                                       frame.subscription_id))
            return
        sub.add_credit(frame.credit)
        if sub.task is None:  # an inactive single active consumer: kept, and said (RabbitMQ)
            self.send(f.CreditResponse(ResponseCode.PRECONDITION_FAILED, frame.subscription_id))

    def on_unsubscribe(self, frame: f.Unsubscribe) -> None:
        sub = self.subscriptions.pop(frame.subscription_id, None)
        if sub is None:
            code = ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST
        else:
            sub.cancel()
            self._leave_group(frame.subscription_id)
            code = OK
        self.send(f.UnsubscribeResponse(frame.correlation_id, code))

    def on_store_offset(self, frame: f.StoreOffset) -> None:
        stream = self.broker.streams.get(frame.stream)
        if stream is not None and frame.reference and self._may(frame.stream, CONSUME):
            stream.partitions[0].offsets.store(frame.reference, frame.offset)

    def on_query_offset(self, frame: f.QueryOffset) -> None:
        if not self._may(frame.stream, CONSUME):
            self.send(f.QueryOffsetResponse(frame.correlation_id, ResponseCode.ACCESS_REFUSED,
                                            0))
            return
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

    # -- single active consumer (sans-IO groups in broker/sac.py) --------------------------
    def _join_group(self, frame: f.Subscribe, group: str) -> None:
        self._sac_specs[frame.subscription_id] = (frame.offset_type, frame.offset)
        index = self.server.super_streams.partition_index(
            (frame.properties or {}).get("super-stream", ""), frame.stream)
        _notify(self.server.sac.register(frame.stream, group, index, self,
                                         frame.subscription_id))

    def _leave_group(self, subscription_id: int) -> None:
        if self._sac_specs.pop(subscription_id, None) is not None:
            _notify(self.server.sac.unregister(self, subscription_id))

    def consumer_update(self, subscription_id: int, active: bool) -> None:
        """Send ConsumerUpdate (0x1a). Delivery stops at once on deactivation and starts
        when the client answers an activation, from the offset spec of its answer."""
        sub = self.subscriptions[subscription_id]
        if not active:
            sub.cancel()
        self._last_request = self._last_request % 0xFFFFFFFF + 1
        self._consumer_updates[self._last_request] = (subscription_id, active)
        self.send(f.ConsumerUpdate(self._last_request, subscription_id, active))

    def on_consumer_update_response(self, frame: f.ConsumerUpdateResponse) -> None:
        request = self._consumer_updates.pop(frame.correlation_id, None)
        if request is None or request[0] not in self.subscriptions:
            log.info("ConsumerUpdateResponse %d from %s: no such request or subscription",
                     frame.correlation_id, self.peer)
            return
        if frame.response_code != OK:  # RabbitMQ too only notes it
            log.info("ConsumerUpdateResponse from %s with code 0x%02x", self.peer,
                     frame.response_code)
        sub_id, active = request
        sac = self.server.sac
        if active and sac.is_active(self, sub_id):
            kind, value = frame.offset_type, frame.offset
            if kind == OffsetType.NONE:  # the Subscribe's spec
                kind, value = self._sac_specs[sub_id]
            sub = self.subscriptions[sub_id]
            sub.start(resolve_offset(sub.partition, kind, value))
        elif not active:
            _notify(sac.stepped_down(self, sub_id))

    # -- super streams (registry and routing in broker/superstreams.py) -------------------
    def on_create_super_stream(self, frame: f.CreateSuperStream) -> None:
        """Partitions are ordinary streams made with the Create arguments; 0x05 when the
        super stream or a partition exists, 0x11 for a bad list (reference doc)."""
        if not all(self._may(name, CREATE) for name in (frame.name, *frame.partitions)):
            code = ResponseCode.ACCESS_REFUSED
        else:
            code = self._create(frame.name, frame.arguments, lambda config: (
                self.server.super_streams.create(frame.name, frame.partitions,
                                                 frame.binding_keys, config)))
        self.send(f.CreateSuperStreamResponse(frame.correlation_id, code))

    def on_delete_super_stream(self, frame: f.DeleteSuperStream) -> None:
        super_streams = self.server.super_streams
        found = super_streams.super_streams.get(frame.name)
        if found is None:
            code = ResponseCode.STREAM_DOES_NOT_EXIST
        elif not all(self._may(name, DELETE) for name in (frame.name, *found.partitions)):
            code = ResponseCode.ACCESS_REFUSED
        else:
            super_streams.delete(frame.name)
            code = OK
        self.send(f.DeleteSuperStreamResponse(frame.correlation_id, code))

    def on_partitions(self, frame: f.Partitions) -> None:
        found = self.server.super_streams.super_streams.get(frame.super_stream)
        self.send(f.PartitionsResponse(
            frame.correlation_id, OK if found else ResponseCode.STREAM_DOES_NOT_EXIST,
            found.partitions if found else ()))

    def on_route(self, frame: f.Route) -> None:
        """Streams bound with the routing key; OK with none when nothing matches."""
        found = self.server.super_streams.super_streams.get(frame.super_stream)
        self.send(f.RouteResponse(
            frame.correlation_id, OK if found else ResponseCode.STREAM_DOES_NOT_EXIST,
            tuple(found.route(frame.routing_key)) if found else ()))


def resolve_offset(partition: Partition, kind: int, value: int | None) -> int | None:
    """The offset an offset spec (Subscribe, ConsumerUpdateResponse) starts at in
    ``partition``; None for a type that names no position."""
    if kind == OffsetType.FIRST:
        return partition.first_offset
    if kind == OffsetType.LAST:
        return partition.last_chunk_offset
    if kind == OffsetType.NEXT:
        return partition.next_offset
    if kind == OffsetType.OFFSET:
        return min(max(value or 0, partition.first_offset), partition.next_offset)
    if kind == OffsetType.TIMESTAMP:
        return partition.offset_for_timestamp(value or 0)
    return None


def _sac_group(properties: dict[str, str] | None) -> str | None:
    """The group of a single-active-consumer Subscribe (``single-active-consumer=true``,
    ``name``): None when not one, "" when it has no valid name (RabbitMQ: 0x11)."""
    if not properties or properties.get("single-active-consumer") != "true":
        return None
    name = properties.get("name") or ""
    return name if len(name.encode()) <= 255 else ""


def _notify(notes: list[Notification]) -> None:
    """Send each single-active-consumer change to its subscription's connection."""
    for note in notes:
        note.owner.consumer_update(note.subscription_id, note.active)


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
    f.ResolveOffsetSpec: C.on_resolve_offset_spec,
    f.Credit: C.on_credit,
    f.Unsubscribe: C.on_unsubscribe,
    f.StoreOffset: C.on_store_offset,
    f.QueryOffset: C.on_query_offset,
    f.Partitions: C.on_partitions,
    f.CreateSuperStream: C.on_create_super_stream,
    f.DeleteSuperStream: C.on_delete_super_stream,
    f.Route: C.on_route,
    f.ConsumerUpdateResponse: C.on_consumer_update_response,
}
_on_publish = C.on_publish
del C


class RabbitStreamServer:
    """The listening socket and its connections. ``await start()``, ``await stop()``."""

    def __init__(self, broker: Broker, config: RabbitStreamConfig,
                 guard: Guard | None = None) -> None:
        self.broker = broker
        self.config = config
        self.guard = guard or Guard(SecurityConfig())
        self.connections: set[RabbitStreamConnection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._tls_server: asyncio.AbstractServer | None = None
        self.port = config.port
        self.tls_port = config.tls_port
        self.super_streams = SuperStreams(broker)
        self.sac = SingleActiveConsumers()
        broker.deletion_listeners.append(self._stream_deleted)

    @property
    def advertised(self) -> tuple[str, int]:
        host = self.config.advertised_host or (
            "localhost" if self.config.host in ("0.0.0.0", "::", "") else self.config.host)
        return host, self.config.advertised_port or self.port

    def advertised_for(self, tls: bool) -> tuple[str, int]:
        """What Open and Metadata tell a client: the TLS listener's port on TLS connections."""
        host, port = self.advertised
        return (host, self.tls_port) if tls else (host, port)

    async def start(self) -> None:
        """Listen (and for TLS on ``tls_port`` when TLS is configured). Raises ``OSError``
        with a clear message when a port is taken."""
        self._server = await self._listen(self.config.port, None)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("RabbitMQ Stream door listening on %s:%d", self.config.host, self.port)
        context = self.guard.ssl_context()
        if context is not None:
            try:
                self._tls_server = await self._listen(self.config.tls_port, context)
            except OSError:
                self._server.close()
                raise
            self.tls_port = self._tls_server.sockets[0].getsockname()[1]
            log.info("RabbitMQ Stream door listening for TLS on %s:%d", self.config.host,
                     self.tls_port)

    async def _listen(self, port: int, context) -> asyncio.AbstractServer:
        try:
            return await asyncio.get_running_loop().create_server(
                lambda: RabbitStreamConnection(self, tls=context is not None), self.config.host,
                port, reuse_address=True, ssl=context)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen for RabbitMQ Stream clients on "
                                     f"{self.config.host}:{port}: {exc.strerror}") from None

    def _stream_deleted(self, stream: Stream) -> None:
        self.sac.drop_stream(stream.name)  # its subscriptions end with MetadataUpdate
        for conn in list(self.connections):
            conn.stream_deleted(stream)

    async def stop(self, grace: float = 1.0) -> None:
        """Stop accepting; stop reading, write what was received and send its confirms
        (waiting up to 5 s for fsyncs); end subscriptions; send every client Close (code OK,
        "server shutting down") and give them ``grace`` seconds to hang up before the
        sockets are closed."""
        for server in (self._server, self._tls_server):
            if server is not None:
                server.close()
        connections = list(self.connections)
        for conn in connections:
            conn.stop_reading()
        pending = [t for c in connections for t in c._pending]
        if pending:
            await asyncio.wait(pending, timeout=5)
        for conn in connections:
            conn.close_for_shutdown()
        deadline = time.monotonic() + grace
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        for server in (self._server, self._tls_server):
            if server is not None:
                await server.wait_closed()
