# The RabbitMQ Stream front door: TCP connections speaking the current protocol, over the
# broker core. Owns sockets, per-connection state (handshake, publishers, subscriptions,
# heartbeats) and flow control; decodes and encodes with the sans-IO codec in
# riverlog.protocol.rabbitmq_stream and never touches files.
# Rules: a bad frame closes only its own connection (Close with the protocol's code); writes
# to the log happen in arrival order on the event loop, across the publishers of a connection
# too, in chunks of at most CHUNK_MAX_ENTRIES entries; a confirm is sent only once the chunk
# is committed under the durability policy; credit counts chunks and is never exceeded;
# a publisher with too many unconfirmed messages stops being read until they drain.
# In a cluster the door asks ``Broker.placement`` only: publishers are taken and chunks
# written where this server leads the partition, consumers read any local replica (committed
# chunks only), Create and Delete go through the placement, and a leader change ends the
# publishers and subscriptions on the partition with MetadataUpdate, as RabbitMQ does when a
# stream member goes down (docs/rabbitmq-stream.md, "Cluster").
# Wire facts: ../shared/reference/rabbitmq-stream-protocol.md.
from __future__ import annotations

import asyncio
import logging
import re
import time
from contextlib import contextmanager
from functools import partial
from typing import Awaitable, Callable, Collection, Iterator

from .. import __version__
from ..broker import (RESERVED_STREAMS, Broker, Notification, Partition, SingleActiveConsumers,
                      Stream, StreamConfig, SuperStreams, check_writable)
from ..broker.placement import OffsetsUnavailable, PartitionPlacement
from ..broker.superstreams import split_member_name
from ..config import MIN_SEGMENT_MAX_BYTES, RabbitStreamConfig, SecurityConfig
from ..errors import (CorruptChunkError, InvalidArgumentError, LogClosedError, LogError,
                      OffsetOutOfRangeError, ReservedStreamError, StreamExistsError,
                      StreamNotFoundError)
from ..log import bloom
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
from ..tables import TABLE_ARGUMENT
from .rabbitmq_draft import DraftAdapter

log = logging.getLogger("riverlog.rabbitmq_stream")

OK = ResponseCode.OK
READ_BYTES = 1024 * 1024
# At most this much goes into one chunk: a chunk built from several Publish frames stays below
# what a client with the default frame_max (1 MiB) can receive in one Deliver, and holds no
# more entries than one of RabbitMQ's (osiris_writer writes one gen_batch_server batch per
# chunk, at most 8,192 messages), so `last` replays a short slice. 4,096 was measured the
# cheapest per published message among 2,048..16,384 (benchmarks/README.md).
CHUNK_MAX_BYTES = 1024 * 1024 - 64 * 1024
CHUNK_MAX_ENTRIES = 4096
# A peer that sends requests but does not read the answers is not read either once this much
# output waits for it (benchmarks/load_bench.py, "deaf" client: unbounded before).
OUTPUT_PAUSE_BYTES = 4 * 1024 * 1024
PRE_OPEN_FRAME_MAX = max(INITIAL_FRAME_MAX, 65536)
# After Open a Publish frame may exceed the negotiated frame_max, as RabbitMQ 3.9 to 4.2 allow
# (rstream's send_batch sends any batch as one frame), up to this bound on what one frame
# may make the server buffer (and decode: ~130 bytes of Python objects per message).
PUBLISH_FRAME_MAX = 16 * 1024 * 1024
LOGIN_REFUSED_LINGER_S = 0.2
# the names of this door's listeners in Placement.door (Metadata answers with the one of the
# connection's kind, as rabbit_stream_reader's advertised_host_fun/advertised_port_fun)
DOOR = "rabbitmq-stream"
TLS_DOOR = "rabbitmq-stream-tls"
NO_LEADER = 0xFFFF  # StreamMetadata leader reference when there is none
# after a client's Close, how long a Close sent behind it is still answered (unless the client
# hangs up first, as clients do once answered)
CLOSE_LINGER_S = 1.0

# ExchangeCommandVersions: [key, min, max] in key order (Publish and Deliver go to 2).
SERVER_COMMAND_VERSIONS = tuple(
    f.CommandVersion(key, 1, 2 if key in (0x02, 0x08) else 1)
    for key in range(0x01, 0x20) if key not in (0x03, 0x04, 0x08, 0x10, 0x1A))

_AGE = re.compile(r"^\s*(\d+)\s*([YMDhms])\s*$")
_AGE_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000, "h": 3_600_000,
           "m": 60_000, "s": 1000}
# Create argument limits, RabbitMQ's (rabbit_stream_manager:validate_stream_queue_arguments,
# rabbit_stream_queue:check_max_segment_size_bytes/check_filter_size): anything else is taken.
MAX_SEGMENT_SIZE_BYTES = 3_000_000_000
LEADER_LOCATORS = frozenset(("client-local", "balanced", "random", "least-leaders",
                             "min-masters"))
# arguments checked as RabbitMQ checks them, then without effect (chunk filters keep
# bloom.DEFAULT_SIZE; the initial cluster size counts in a cluster only)
_CHECKED_ONLY: dict[str, Callable[[str], bool]] = {
    "initial-cluster-size": lambda value: int(value) >= 1,
    "queue-leader-locator": lambda value: value in LEADER_LOCATORS,
    "stream-filter-size-bytes": lambda value: bloom.MIN_SIZE <= int(value) <= bloom.MAX_SIZE,
    "x-queue-type": lambda value: True,
}


def stream_config_from_arguments(arguments: dict[str, str],
                                 cluster_size: int | None = None) -> StreamConfig:
    """Translate Create arguments to a StreamConfig, validating them as RabbitMQ does:
    ``max-length-bytes``; ``max-age`` (e.g. ``7D``, ``12h``, ``30s``; units Y M D h m s);
    ``stream-max-segment-size-bytes`` up to 3,000,000,000, raised to the commit log's
    smallest segment (MIN_SEGMENT_MAX_BYTES) when below it, as RabbitMQ takes any smaller
    value; ``initial-cluster-size`` (at least 1): in a cluster of ``cluster_size`` servers
    the replication factor, at most every server and every server when not given
    (rabbit_stream_queue:initial_cluster_size, rabbit_queue_location:select_members), on a
    single server (``cluster_size`` None) checked only; ``queue-leader-locator`` (one of
    LEADER_LOCATORS) and ``stream-filter-size-bytes`` (16..255) are checked, then ignored
    with a log line, as are unknown arguments; riverlog's ``x-riverlog-table``
    (``true``/``false``: mirror the stream to Parquet). Raises ``InvalidArgumentError``."""
    kwargs = {}
    if cluster_size is not None:
        kwargs["replication_factor"] = -1  # every server
    for key, value in arguments.items():
        try:
            if key == "initial-cluster-size" and cluster_size is not None:
                if int(value) < 1:
                    raise ValueError(value)
                kwargs["replication_factor"] = min(int(value), cluster_size)
            elif key == "max-length-bytes":
                kwargs["retention_max_bytes"] = int(value)
            elif key == "stream-max-segment-size-bytes":
                size = int(value)
                if size > MAX_SEGMENT_SIZE_BYTES:
                    raise ValueError(value)
                if size < MIN_SEGMENT_MAX_BYTES:
                    log.info("Create: %s=%s raised to %d bytes, the smallest segment", key,
                             value, MIN_SEGMENT_MAX_BYTES)
                kwargs["segment_max_bytes"] = max(size, MIN_SEGMENT_MAX_BYTES)
            elif key == "max-age":
                m = _AGE.match(value)
                if not m:
                    raise ValueError(value)
                kwargs["retention_max_age_ms"] = int(m.group(1)) * _AGE_MS[m.group(2)]
            elif key == TABLE_ARGUMENT:
                kwargs["table"] = {"true": True, "false": False}[value.strip().lower()]
            elif key in _CHECKED_ONLY:
                if not _CHECKED_ONLY[key](value):
                    raise ValueError(value)
                log.info("Create: argument %s=%s has no effect here", key, value)
            else:
                log.info("Create: unknown argument %s=%s ignored", key, value)
        except (ValueError, KeyError):
            raise InvalidArgumentError(f"bad value for {key}: {value!r}") from None
    return StreamConfig(**kwargs)


def _create_refused(name: str, exc: StreamExistsError | InvalidArgumentError) -> int:
    """The Create (and CreateSuperStream) code for ``exc``: 0x05 when the stream exists, 0x11
    for bad arguments or names."""
    if isinstance(exc, StreamExistsError):
        return ResponseCode.STREAM_ALREADY_EXISTS
    log.info("creating %r refused: %s", name, exc)
    return ResponseCode.PRECONDITION_FAILED


async def _deleted(delete: Awaitable[None]) -> int:
    """The Delete (and DeleteSuperStream) code of a deletion through the cluster."""
    try:
        await delete
    except StreamNotFoundError:
        return ResponseCode.STREAM_DOES_NOT_EXIST
    return OK


def _offset_answer(respond: Callable[[int, int], f.Frame], offset: int | None) -> f.Frame:
    """The QueryOffset response for a stored ``offset`` (None: NO_OFFSET, 0x13)."""
    return respond(ResponseCode.NO_OFFSET, 0) if offset is None else respond(OK, offset)


def _negotiate(ours: int, theirs: int) -> int:
    """Tune: the smaller of two limits where 0 means "no limit"."""
    return min(ours, theirs) if ours and theirs else ours or theirs


class Publisher:
    """A declared publisher: ``name`` is the stream name the client declared it on,
    ``partition`` the partition of ``stream`` that name serves."""

    __slots__ = ("id", "reference", "stream", "partition", "name")

    def __init__(self, publisher_id: int, reference: str | None, stream: Stream,
                 partition: Partition, name: str) -> None:
        self.id = publisher_id
        self.reference = reference or None
        self.stream = stream
        self.partition = partition
        self.name = name


class _Staged:
    """Entries for one partition received in this batch of frames, in arrival order (whatever
    the publisher), not written yet: at most one chunk (``CHUNK_MAX_ENTRIES``,
    ``CHUNK_MAX_BYTES``), and the publishing ids to confirm once it is written."""

    __slots__ = ("entries", "size", "filters", "writers", "confirms", "received")

    def __init__(self) -> None:
        self.received = time.monotonic()  # for the confirm latency metric
        self.entries: list[bytes] = []
        self.size = 0
        self.filters: set[str | None] = set()  # filter values (None: an entry without one)
        self.writers: dict[str, int] = {}  # reference -> highest publishing id held here
        self.confirms: dict[int, list[int]] = {}  # publisher id -> publishing ids

    def full(self) -> bool:
        return len(self.entries) >= CHUNK_MAX_ENTRIES or self.size >= CHUNK_MAX_BYTES


def _fitting(entries: list[bytes], room: int) -> int:
    """How many of ``entries``, from the first, fit in ``room`` bytes."""
    for i, entry in enumerate(entries):
        room -= len(entry)
        if room < 0:
            return i
    return len(entries)


class Subscription:
    """One Subscribe: a task that sends chunks from ``offset`` on while credit lasts. With
    ``offset`` None (a single active consumer not active yet) there is no task until
    ``start``; meanwhile ``offset`` is the partition's next offset (lag 0). ``name`` is
    the stream name subscribed to, ``partition`` the partition of ``stream`` it serves."""

    __slots__ = ("conn", "id", "stream", "partition", "name", "offset", "credit",
                 "_credit_event", "_buffer", "task", "chunk_filter")

    def __init__(self, conn: "RabbitStreamConnection", sub_id: int, stream: Stream,
                 partition: Partition, name: str, offset: int | None, credit: int,
                 chunk_filter: ChunkFilter | None = None) -> None:
        self.conn = conn
        # with a filter, chunks that cannot match are skipped: not sent, no credit used
        self.chunk_filter = chunk_filter
        self.id = sub_id
        self.stream = stream
        self.partition = partition
        self.name = name
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
            conn.send(f.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, self.name))


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
        self._close_timer: asyncio.TimerHandle | None = None  # set by the client's Close
        self._pending: set[asyncio.Task] = set()
        self._staged: dict[Partition, _Staged] = {}  # publishes not written yet
        self._flush_scheduled = False
        # while a cluster change (Create, Delete) runs: the frames that came after it
        self._held: list[f.Frame] | None = None
        # while a request is handled whose response goes before the notifications it causes
        # (MetadataUpdate, ConsumerUpdate): those notifications (``notify``)
        self._notes: list[f.Frame] | None = None
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
        publishes (``reading_paused``), too much unsent output (``output_paused``), a cluster
        change under way (``_held``) or closing."""
        if self.reading_paused or self.output_paused or self.closing or self._held is not None:
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
        if self._dispatch(frames):
            self._after_frames()

    def _dispatch(self, frames: list[f.Frame]) -> bool:
        """Handle ``frames`` in order. While a cluster change runs they wait in ``_held``;
        False when the connection is closing (then only a Close is still answered)."""
        for i, frame in enumerate(frames):
            if self._held is not None:
                self._held += frames[i:]
                return True
            if self.closing and type(frame) is not f.Close:
                return False
            self._handle(frame)
        return True

    def _after_frames(self) -> None:
        """After a batch of frames: stop reading a peer that does not read, and write the
        staged publishes once this turn's reads are done."""
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

    def notify(self, frame: f.Frame) -> None:
        """Send a notification (MetadataUpdate, ConsumerUpdate) now, or after the response
        of the request being handled (``_notes_after``, ``_await_cluster``)."""
        if self._notes is not None:
            self._notes.append(frame)
        else:
            self.send(frame)

    @contextmanager
    def _notes_after(self) -> Iterator[None]:
        """Notifications for this connection raised inside the block go out when it ends,
        after the response the block sends, as rabbit_stream_reader.erl orders them
        (delete_stream and delete_super_stream call response_ok before metadata_update;
        single-active-consumer changes reach the reader as messages, after the response).
        rstream 0.20 closes a connection whose last stream got a MetadataUpdate: a response
        behind it is never read."""
        if self._notes is not None:  # nested, or a cluster change holds them already
            yield
            return
        self._notes = []
        try:
            yield
        finally:
            self._flush_notes()

    def _flush_notes(self) -> None:
        notes, self._notes = self._notes or [], None
        for frame in notes:
            self.send(frame)

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

    def fail(self, code: int, reason: str, linger: float = 0.0, send_close: bool = True) -> None:
        """Close this connection because of the peer: a Close frame with ``code`` (none
        when not ``send_close``), then the socket (after what is buffered is sent;
        ``linger`` s later when given)."""
        if self.closing:
            return
        log.warning("closing connection from %s: %s (code 0x%02x)", self.peer, reason, code)
        if code != OK:
            count_error(RABBITMQ_STREAM, code)
        if send_close:
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

    def _refuse(self, response: f.SaslAuthenticateResponse | f.OpenResponse, reason: str) -> None:
        """Answer SaslAuthenticate or Open with ``response`` (an error code) and close the
        socket a little later, without a Close frame: RabbitMQ's reader stops the connection
        there and sends nothing more (rabbit_stream_reader, handle_frame_pre_auth: steps
        ``failure``/``silent_close``), and a client that reads a Close there fails (the Node
        client cannot decode one). The delay lets a client that reads its last frames and the
        end of the stream together (rstream over TLS drops them) see the refusal, and slows
        password guessing down."""
        self.send(response)
        self.fail(response.response_code, reason, linger=LOGIN_REFUSED_LINGER_S, send_close=False)

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
                self._refuse(f.SaslAuthenticateResponse(corr, ResponseCode.AUTHENTICATION_FAILURE),
                             "no configured user for the client certificate")
            else:
                self._logged_in(corr, user, None)
        elif frame.mechanism == "PLAIN":
            parts = (frame.data or b"").split(b"\0")
            if len(parts) != 3:
                self._refuse(f.SaslAuthenticateResponse(corr, ResponseCode.SASL_ERROR),
                             "malformed PLAIN response")
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
            self._refuse(f.SaslAuthenticateResponse(corr, ResponseCode.AUTHENTICATION_FAILURE),
                         f"authentication failed for {user!r}")
        elif refused == "loopback":
            self._refuse(f.SaslAuthenticateResponse(
                corr, ResponseCode.SASL_AUTHENTICATION_FAILURE_LOOPBACK),
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
            self._refuse(f.OpenResponse(frame.correlation_id,
                                        ResponseCode.VIRTUAL_HOST_ACCESS_FAILURE),
                         f"no virtual host {frame.virtual_host!r}")
            return
        self.opened = True
        self.decoder.max_frame_size = self.frame_max
        self.decoder.max_publish_frame_size = PUBLISH_FRAME_MAX
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
        """CloseResponse; the socket closes when the client hangs up, at the latest
        CLOSE_LINGER_S after its first Close. Meanwhile other frames are ignored but a Close
        sent behind the first one is answered too: RabbitMQ 3.10 answers every Close of the
        read it closes in, and the Node client sends a second Close when a consumer closes
        during client.close() and waits for both answers (its two writes may arrive apart)."""
        self.send(f.CloseResponse(frame.correlation_id, OK))
        self.closing = True
        if self._close_timer is None:
            self._close_timer = asyncio.get_running_loop().call_later(CLOSE_LINGER_S,
                                                                      self.transport.close)

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
    def _resolve(self, name: str) -> tuple[Stream, Partition] | None:
        """The stream and partition the name ``name`` serves on this door; partition i of a
        stream with several partitions is ``<stream>-<i>`` (broker/superstreams.py)."""
        return self.server.super_streams.resolve(name)

    def _place(self, name: str, found: tuple[Stream, Partition] | None
               ) -> tuple[str, int, PartitionPlacement | None] | None:
        """The broker stream, partition index and placement the name ``name`` stands for,
        whether or not this server holds a replica: a local stream as ``_resolve`` found it
        (``found``: ``_resolve(name)``, each command resolves its stream once), else, in a
        cluster, the partition the placement knows (``<stream>-<i>`` for partition i of a
        stream with several; a real stream's name wins). None when neither knows the name;
        the placement None when it does not know a local stream."""
        placement = self.broker.placement
        if found is not None:
            stream, index = found[0].name, found[1].index
        elif not placement.clustered:
            return None
        elif placement.of(name, 0) is not None and placement.of(name, 1) is None:
            stream, index = name, 0
        else:
            member = split_member_name(name)
            if member is None or placement.of(member[0], 1) is None:
                return None
            stream, index = member
            if placement.of(stream, index) is None:
                return None
        return stream, index, placement.of(stream, index)

    def _missing(self, name: str) -> int:
        """The code for a name this server holds no replica of (``_resolve`` found none):
        STREAM_NOT_AVAILABLE when the cluster has it on other servers (RabbitMQ's code for a
        stream it cannot reach from here), STREAM_DOES_NOT_EXIST otherwise."""
        return (ResponseCode.STREAM_DOES_NOT_EXIST if self._place(name, None) is None
                else ResponseCode.STREAM_NOT_AVAILABLE)

    def _may(self, stream: str, action: str,
             found: tuple[Stream, Partition] | None) -> bool:
        """Authorization (riverlog.security.authz): False answers ACCESS_REFUSED (0x10), as
        RabbitMQ does for Create, Delete, DeclarePublisher, Subscribe and QueryOffset when the
        user lacks the configure, write or read permission. ``found``: ``_resolve(stream)``
        (each command resolves its stream once); a partition ``<stream>-<i>`` is checked as
        its stream."""
        return self.guard.allowed(self.user, found[0].name if found else stream, action)

    def on_create(self, frame: f.Create) -> None:
        """In a cluster through ``Placement.create_stream`` (``x-initial-cluster-size``: the
        replication factor), answered once this server has applied it."""
        found = self._resolve(frame.stream)
        if not self._may(frame.stream, CREATE, found):
            self.send(f.CreateResponse(frame.correlation_id, ResponseCode.ACCESS_REFUSED))
            return
        respond = partial(f.CreateResponse, frame.correlation_id)
        if frame.stream in RESERVED_STREAMS:  # as RabbitMQ answers its reserved amq.* names
            self.send(respond(ResponseCode.PRECONDITION_FAILED))
        elif self._place(frame.stream, found) is not None:  # the partitions of a stream too
            self.send(respond(ResponseCode.STREAM_ALREADY_EXISTS))
        elif self.broker.placement.clustered:
            self._await_cluster(self._create_in_cluster(
                frame.stream, frame.arguments, self.broker.placement.create_stream), respond)
        else:
            self.send(respond(self._create(frame.stream, frame.arguments,
                                           partial(self.broker.create, frame.stream))))

    @staticmethod
    def _create(name: str, arguments: dict[str, str] | None,
                create: Callable[[StreamConfig], object]) -> int:
        """Run ``create`` with the StreamConfig of Create ``arguments``; the response code
        (0x05 when it exists, 0x11 for bad arguments or names)."""
        try:
            create(stream_config_from_arguments(dict(arguments or {})))
            return OK
        except (StreamExistsError, InvalidArgumentError) as exc:
            return _create_refused(name, exc)

    async def _create_in_cluster(self, name: str, arguments: dict[str, str] | None,
                                 create: Callable[[str, StreamConfig], Awaitable[object]]) -> int:
        """``_create`` in a cluster: ``await create(name, config)``, the replication factor
        from ``initial-cluster-size`` over the cluster's servers."""
        try:
            config = stream_config_from_arguments(dict(arguments or {}),
                                                  len(self.broker.placement.servers()))
            await create(name, config)
            return OK
        except (StreamExistsError, InvalidArgumentError) as exc:
            return _create_refused(name, exc)

    def _await_cluster(self, change: Awaitable[int], respond: Callable[[int], f.Frame]) -> None:
        """Run a cluster change (Create, Delete) and answer ``respond(code)`` when it ends
        (INTERNAL_ERROR when it fails unexpectedly). Meanwhile this connection reads and
        handles nothing else, as RabbitMQ's reader waits for the stream coordinator."""
        self._held = []
        if self._notes is None:
            self._notes = []  # the response goes first (``_notes_after``)
        self.transport.pause_reading()
        self._background(change).add_done_callback(partial(self._cluster_change_done, respond))

    def _background(self, work: Awaitable[object]) -> asyncio.Future:
        """Run ``work`` as a task kept in ``_pending`` while it runs (shutdown waits for it)."""
        task = asyncio.ensure_future(work)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    def _cluster_change_done(self, respond: Callable[[int], f.Frame], done: asyncio.Future) -> None:
        if done.cancelled():
            code = ResponseCode.INTERNAL_ERROR
        elif done.exception() is not None:
            log.error("cluster change for %s failed: %s", self.peer, done.exception())
            code = ResponseCode.INTERNAL_ERROR
        else:
            code = done.result()
        self.send(respond(code))
        self._flush_notes()
        held, self._held = self._held or [], None
        if self.transport is None or self.transport.is_closing():
            return
        self._resume_reading()
        if self._dispatch(held):
            self._after_frames()

    def on_delete(self, frame: f.Delete) -> None:
        """A stream with several partitions is no stream here (0x02; DeleteSuperStream
        deletes it); one of its partitions cannot go alone (0x11). In a cluster through
        ``Placement.delete_stream``."""
        found = self._resolve(frame.stream)
        if not self._may(frame.stream, DELETE, found):
            self.send(f.DeleteResponse(frame.correlation_id, ResponseCode.ACCESS_REFUSED))
            return
        respond = partial(f.DeleteResponse, frame.correlation_id)
        placed = self._place(frame.stream, found)
        if frame.stream in RESERVED_STREAMS:  # as RabbitMQ answers its reserved amq.* names
            code = ResponseCode.PRECONDITION_FAILED
        elif placed is None:
            code = ResponseCode.STREAM_DOES_NOT_EXIST
        elif placed[0] != frame.stream:
            log.info("Delete %r refused: a partition of stream %r", frame.stream, placed[0])
            code = ResponseCode.PRECONDITION_FAILED
        elif self.broker.placement.clustered:
            self._await_cluster(_deleted(self.broker.placement.delete_stream(frame.stream)),
                                respond)
            return
        else:
            with self._notes_after():  # DeleteResponse, then MetadataUpdate
                self.broker.delete(frame.stream)
                self.send(respond(OK))
            return
        self.send(respond(code))

    def on_metadata(self, frame: f.Metadata) -> None:
        """Metadata (0x0f) as rabbit_stream_reader builds it: the brokers are the servers
        leading or following the asked streams that advertise this connection's kind of
        listener (``Placement.door``), sorted by (host, port) and numbered from 0, and this
        server, always (RabbitMQ lists no broker when no asked stream exists); a
        stream's replicas are its in-sync followers, the leader not among them (RabbitMQ
        lists the members whose replica runs); a partition without a leader is OK with
        leader 0xFFFF (clients ask again); 0x06 when the placement of a local stream is
        unknown, 0x02 for a name no server has."""
        placement = self.broker.placement
        door = TLS_DOOR if self.tls else DOOR
        endpoints: dict[str, tuple[str, int] | None] = {}

        def endpoint(server: str) -> tuple[str, int] | None:
            if server not in endpoints:
                endpoints[server] = (self.server.advertised_for(self.tls)
                                     if server == placement.server_id
                                     else placement.door(server, door))
            return endpoints[server]

        endpoint(placement.server_id)
        asked = []
        for name in frame.streams:
            placed = self._place(name, self._resolve(name))
            where = placed[2] if placed else None
            if where is None:
                asked.append((name, placed, None, ()))
                continue
            leader = endpoint(where.leader) if where.leader is not None else None
            followers = [endpoint(s) for s in where.replicas
                         if s != where.leader and s in where.isr]
            asked.append((name, placed, leader, [ep for ep in followers if ep is not None]))
        brokers = sorted({ep for ep in endpoints.values() if ep is not None})
        reference = {ep: i for i, ep in enumerate(brokers)}
        streams = []
        for name, placed, leader, followers in asked:
            if placed is None or placed[2] is None:
                code = (ResponseCode.STREAM_DOES_NOT_EXIST if placed is None
                        else ResponseCode.STREAM_NOT_AVAILABLE)
                streams.append(f.StreamMetadata(name, code, NO_LEADER, ()))
            else:
                streams.append(f.StreamMetadata(
                    name, OK, NO_LEADER if leader is None else reference[leader],
                    tuple(reference[ep] for ep in followers)))
        self.send(f.MetadataResponse(frame.correlation_id, tuple(
            f.Broker(i, host, port) for i, (host, port) in enumerate(brokers)), tuple(streams)))

    def on_stream_stats(self, frame: f.StreamStats) -> None:
        found = self._resolve(frame.stream)
        if not self._may(frame.stream, CONSUME, found):
            self.send(f.StreamStatsResponse(frame.correlation_id, ResponseCode.ACCESS_REFUSED,
                                            {}))
            return
        if found is None:
            self.send(f.StreamStatsResponse(frame.correlation_id,
                                            self._missing(frame.stream), {}))
            return
        partition = found[1]
        committed = partition.committed_offset
        stats = {
            "first_chunk_id": partition.first_offset if committed >= 0 else -1,
            "committed_chunk_id": partition.last_chunk_offset if committed >= 0 else -1,
            "last_chunk_id": partition.last_chunk_offset if committed >= 0 else -1,
        }
        self.send(f.StreamStatsResponse(frame.correlation_id, OK, stats))

    def drop(self, partitions: Collection[Partition]) -> None:
        """Drop this connection's publishers and subscriptions on ``partitions`` (a stream
        deleted, a partition's leader changed) and tell the client with MetadataUpdate
        (0x06), once per name they used, as rabbit_stream_reader does when a stream member
        goes down (clean_state_after_stream_deletion_or_failure)."""
        touched: dict[str, None] = {}
        for sub_id, sub in list(self.subscriptions.items()):
            if sub.partition in partitions:
                sub.cancel()
                del self.subscriptions[sub_id]
                self._sac_specs.pop(sub_id, None)  # the server dropped its group
                touched[sub.name] = None
        for pub_id, pub in list(self.publishers.items()):
            if pub.partition in partitions:
                del self.publishers[pub_id]
                touched[pub.name] = None
        for name in touched:
            self.notify(f.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, name))

    # -- publishing ---------------------------------------------------------------------
    def on_declare_publisher(self, frame: f.DeclarePublisher) -> None:
        code = self.declare_publisher(frame.publisher_id, frame.reference, frame.stream)
        self.send(f.DeclarePublisherResponse(frame.correlation_id, code))

    def declare_publisher(self, publisher_id: int, reference: str | None, name: str) -> int:
        """Add a publisher to this connection (also for the draft dialect's Publish); returns
        the response code: OK, STREAM_DOES_NOT_EXIST, ACCESS_REFUSED, PRECONDITION_FAILED
        (the id, or the reference on that stream, is taken; a reserved stream, as RabbitMQ
        answers Create for its reserved amq.* names) or STREAM_NOT_AVAILABLE when another
        server leads the partition (RabbitMQ's code when the leader cannot be reached:
        clients ask Metadata again and connect to the leader)."""
        try:
            check_writable(name)
        except ReservedStreamError:
            return ResponseCode.PRECONDITION_FAILED
        found = self._resolve(name)
        if found is None:
            return self._missing(name)
        stream, partition = found
        taken = publisher_id in self.publishers or (reference and any(
            p.reference == reference and p.partition is partition
            for p in self.publishers.values()))
        if not self._may(name, PUBLISH, found):
            return ResponseCode.ACCESS_REFUSED
        if taken:
            return ResponseCode.PRECONDITION_FAILED
        if not self.broker.placement.leads(stream.name, partition.index):
            return ResponseCode.STREAM_NOT_AVAILABLE
        self.publishers[publisher_id] = Publisher(publisher_id, reference, stream, partition,
                                                  name)
        return OK

    def on_publish(self, frame: f.Publish | f.PublishV2) -> None:
        """Stage the new entries after those already staged for the partition, whatever
        their publisher, so the log keeps the order the frames arrived in. The staged
        entries are written as one chunk once the frames at hand are handled (RabbitMQ too
        merges queued publish frames into one chunk), or as soon as the chunk is full: a
        frame of more entries than a chunk holds becomes several chunks. What is staged is
        written first when this frame's set of filter values (None for an entry without
        one; a Publish v1 frame has only None) is not the staged one, so frames with other
        filter values never share a chunk. The frame's ids are confirmed with the chunk
        holding its last entry."""
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
        partition = pub.partition
        if partition.readonly:  # set through Liftbridge's SetStreamReadonly
            self._publish_error(frame.publisher_id, ids, ResponseCode.ACCESS_REFUSED)
            return
        if self.config.validate_sub_batches:
            entries = self._readable(frame.publisher_id, entries)
            if not entries:
                return
            ids = [e[0] for e in entries]
        self.unconfirmed += len(ids)
        if self.unconfirmed > self.config.max_unconfirmed and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        if type(frame) is f.Publish:
            pairs, values = entries, {None}
        else:  # each chunk gets the values of the whole frame: a superset is fine
            pairs, values = [(e[0], e[2]) for e in entries], {e[1] for e in entries}
        staged = self._stage(partition)
        if staged.entries and staged.filters != values:
            # a chunk's bloom filter then names only one frame's values (issue 20 item 6):
            # a filtered consumer skips the chunks of the frames it does not want
            staged = self._restage(partition)
        new = partition.new_entries(pub.reference, pairs, staged.writers)
        start, n = 0, len(new)
        while start < n:
            if staged.full():
                staged = self._restage(partition)
            piece = new[start:start + CHUNK_MAX_ENTRIES - len(staged.entries)]
            data = [entry for _, entry in piece]
            size = sum(map(len, data))
            if staged.size + size > CHUNK_MAX_BYTES:
                cut = _fitting(data, CHUNK_MAX_BYTES - staged.size)
                if not cut and staged.entries:
                    staged = self._restage(partition)
                    continue
                cut = cut or 1  # an entry larger than a chunk's bytes: a chunk of its own
                piece, data = piece[:cut], data[:cut]
                size = sum(map(len, data))
            staged.entries += data
            staged.size += size
            staged.filters.update(values)
            if pub.reference:
                staged.writers[pub.reference] = piece[-1][0]
            start += len(piece)
        staged.confirms.setdefault(frame.publisher_id, []).extend(ids)
        if staged.full():
            self._write_staged(partition)

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
        for partition in list(self._staged):
            self._write_staged(partition)

    def _stage(self, partition: Partition) -> _Staged:
        """What is staged for ``partition`` (a new, empty stage when nothing is)."""
        staged = self._staged.get(partition)
        if staged is None:
            staged = self._staged[partition] = _Staged()
        return staged

    def _restage(self, partition: Partition) -> _Staged:
        """Write the full stage of ``partition``; returns its next, empty one."""
        self._write_staged(partition)
        return self._stage(partition)

    def _write_staged(self, partition: Partition) -> None:
        """Write what is staged for ``partition`` as one chunk, then confirm once it is
        committed (``Partition.when_committed``). Duplicates are confirmed once everything
        written before them is committed, their originals included. In a cluster, nothing
        is written unless this server leads the partition (PublishError 0x06: the leader
        moved, the MetadataUpdate of the change follows or came)."""
        staged = self._staged.pop(partition)
        placement = self.broker.placement
        if placement.clustered and not placement.leads(partition.stream, partition.index):
            self._fail_confirms(staged.confirms, ResponseCode.STREAM_NOT_AVAILABLE)
            return
        if staged.entries:
            try:
                offsets = partition.write_entries(staged.entries, writers=staged.writers,
                                                  filter_values=staged.filters)
            except (OSError, LogError) as exc:
                log.error("publish to %r failed: %s", partition.stream, exc)
                code = (ResponseCode.STREAM_DOES_NOT_EXIST if isinstance(exc, LogClosedError)
                        else ResponseCode.INTERNAL_ERROR)
                self._fail_confirms(staged.confirms, code)
                return
            counters(partition.stream, RABBITMQ_STREAM).published(len(offsets), staged.size)
        last = offsets[-1] if staged.entries else partition.next_offset - 1
        if staged.confirms:
            partition.when_committed(
                last, partial(self._confirm, staged.confirms, staged.received),
                lambda _: self._fail_confirms(staged.confirms, ResponseCode.INTERNAL_ERROR),
                self._pending)

    def _confirm(self, confirms: dict[int, list[int]], received: float) -> None:
        """Send a PublishConfirm per publisher (``confirms``: publisher id -> publishing ids);
        ``received`` (time.monotonic()) is when the first Publish frame of these ids came."""
        n = 0
        latency = time.monotonic() - received
        for publisher_id, ids in confirms.items():
            self.send(f.PublishConfirm(publisher_id, tuple(ids)))
            CONFIRM_RABBITMQ.observe(latency)  # one per frame (docs/operations.md)
            n += len(ids)
        self._unconfirmed_done(n)

    def _fail_confirms(self, confirms: dict[int, list[int]], code: int) -> None:
        """PublishError with ``code`` instead of the confirms ``confirms``."""
        for publisher_id, ids in confirms.items():
            self._publish_error(publisher_id, ids, code)
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
        found = self._resolve(frame.stream)
        if not self._may(frame.stream, PUBLISH, found):
            self.send(f.QueryPublisherSequenceResponse(
                frame.correlation_id, ResponseCode.ACCESS_REFUSED, 0))
            return
        if found is None:
            self.send(f.QueryPublisherSequenceResponse(
                frame.correlation_id, self._missing(frame.stream), 0))
            return
        sequence = found[1].publishers.get(frame.reference)
        self.send(f.QueryPublisherSequenceResponse(
            frame.correlation_id, OK, 0 if sequence is None else sequence))

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
        found = self._resolve(frame.stream)
        if not self._may(frame.stream, CONSUME, found):
            self.send(f.SubscribeResponse(frame.correlation_id, ResponseCode.ACCESS_REFUSED))
            return
        if found is None:
            self.send(f.SubscribeResponse(frame.correlation_id,
                                          self._missing(frame.stream)))
            return
        stream, partition = found
        offset = resolve_offset(partition, frame.offset_type, frame.offset)
        properties = frame.properties or {}
        # single active consumer (as RabbitMQ's reader): the `name` property is required
        sac = properties.get("single-active-consumer") == "true"
        group = properties.get("name") if sac else None
        index = self.server.super_streams.partition_index(
            properties.get("super-stream", ""), frame.stream) if sac else -1
        if offset is None or sac and (group is None or self.server.sac.conflicts(
                frame.stream, group, index)):
            self.send(f.SubscribeResponse(frame.correlation_id,
                                          ResponseCode.PRECONDITION_FAILED))
            return
        self.send(f.SubscribeResponse(frame.correlation_id, OK))
        self.subscriptions[frame.subscription_id] = Subscription(
            self, frame.subscription_id, stream, partition, frame.stream,
            None if sac else offset, frame.credit, filter_from_properties(frame.properties))
        if sac:
            self._join_group(frame, group, index)

    def on_resolve_offset_spec(self, frame: f.ResolveOffsetSpec) -> None:
        """ResolveOffsetSpec (0x1f): the offset a Subscribe with this offset spec would start
        at, answered as type OFFSET (as RabbitMQ does). Properties are accepted; filter
        properties do not move the answer (a filtered subscription skips chunks itself)."""
        code, offset = OK, 0
        found = self._resolve(frame.stream)
        if not self._may(frame.stream, CONSUME, found):
            code = ResponseCode.ACCESS_REFUSED
        elif found is None:
            code = self._missing(frame.stream)
        else:
            resolved = resolve_offset(found[1], frame.offset_type, frame.offset)
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
            self.send(f.UnsubscribeResponse(frame.correlation_id,
                                            ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST))
            return
        sub.cancel()
        with self._notes_after():  # UnsubscribeResponse, then a ConsumerUpdate it causes
            self._leave_group(frame.subscription_id)
            self.send(f.UnsubscribeResponse(frame.correlation_id, OK))

    def on_store_offset(self, frame: f.StoreOffset) -> None:
        """Stored by the partition's leader (a tracking chunk of its log, replicated with
        the data); a server that does not lead it passes it to the leader, as RabbitMQ's
        reader does. No response (RabbitMQ's is a cast); a refused one is logged."""
        found = self._resolve(frame.stream)
        place = self._place(frame.stream, found)
        if place is None or not frame.reference or not self._may(frame.stream, CONSUME, found):
            return
        name, index, _ = place
        placement = self.broker.placement
        if found is None or not placement.leads(name, index):
            self._forward(placement.store_offset_at_leader(name, index, frame.reference,
                                                           frame.offset), frame.stream)
            return
        try:
            found[1].store_offset(frame.reference, frame.offset)
        except (ValueError, LogError) as exc:  # RabbitMQ logs a reference too long
            log.warning("StoreOffset %r on %r not stored: %s", frame.reference, frame.stream,
                        exc)

    def _forward(self, request: Awaitable[object], stream: str) -> None:
        """Run a request to a partition's leader in the background; its failure is logged."""
        async def run() -> None:
            try:
                await request
            except OffsetsUnavailable as exc:
                log.warning("StoreOffset on %r: the leader could not take it: %s", stream, exc)
        self._background(run())

    def on_query_offset(self, frame: f.QueryOffset) -> None:
        """Answered from the partition's leader, as RabbitMQ's reader reads the leader's
        tracking: here when this server leads it, else asked of the leader
        (STREAM_NOT_AVAILABLE when it cannot be)."""
        found = self._resolve(frame.stream)
        respond = partial(f.QueryOffsetResponse, frame.correlation_id)
        if not self._may(frame.stream, CONSUME, found):
            self.send(respond(ResponseCode.ACCESS_REFUSED, 0))
            return
        place = self._place(frame.stream, found)
        if place is None:
            self.send(respond(self._missing(frame.stream), 0))
            return
        name, index, _ = place
        placement = self.broker.placement
        if found is not None and placement.leads(name, index):
            self.send(_offset_answer(respond, found[1].offsets.query(frame.reference)))
            return

        async def ask() -> None:
            try:
                offset = await placement.query_offset_at_leader(name, index, frame.reference)
            except OffsetsUnavailable as exc:
                log.info("QueryOffset on %r: %s", frame.stream, exc)
                self.send(respond(ResponseCode.STREAM_NOT_AVAILABLE, 0))
                return
            self.send(_offset_answer(respond, offset))
        self._background(ask())

    # -- single active consumer (sans-IO groups in broker/sac.py) --------------------------
    def _join_group(self, frame: f.Subscribe, group: str, index: int) -> None:
        """After SubscribeResponse, as RabbitMQ: register in the group; a ConsumerUpdate
        follows when the member is active at once. ``index``: the stream's position in
        the super stream named by the `super-stream` property, else -1."""
        self._sac_specs[frame.subscription_id] = (frame.offset_type, frame.offset)
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
        self.notify(f.ConsumerUpdate(self._last_request, subscription_id, active))

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
        """Partitions are ordinary streams made with the Create arguments (in a cluster each
        through ``Placement.create_stream``); 0x05 when the super stream or a partition
        exists, 0x11 for a bad list (reference doc)."""
        respond = partial(f.CreateSuperStreamResponse, frame.correlation_id)
        super_streams = self.server.super_streams
        if not all(self._may(name, CREATE, self._resolve(name))
                   for name in (frame.name, *frame.partitions)):
            self.send(respond(ResponseCode.ACCESS_REFUSED))
        elif self.broker.placement.clustered:
            self._await_cluster(self._create_in_cluster(
                frame.name, frame.arguments, lambda name, config: super_streams.create_in_cluster(
                    name, frame.partitions, frame.binding_keys, config)), respond)
        else:
            self.send(respond(self._create(frame.name, frame.arguments, lambda config: (
                super_streams.create(frame.name, frame.partitions, frame.binding_keys,
                                     config)))))

    def on_delete_super_stream(self, frame: f.DeleteSuperStream) -> None:
        super_streams = self.server.super_streams
        found = super_streams.find(frame.name)
        if found is None:
            code = ResponseCode.STREAM_DOES_NOT_EXIST
        elif not all(self._may(name, DELETE, self._resolve(name))
                     for name in (frame.name, *found.partitions)):
            code = ResponseCode.ACCESS_REFUSED
        elif self.broker.placement.clustered:
            self._await_cluster(_deleted(super_streams.delete_in_cluster(frame.name)),
                                partial(f.DeleteSuperStreamResponse, frame.correlation_id))
            return
        else:
            with self._notes_after():  # the response, then MetadataUpdate per partition
                super_streams.delete(frame.name)
                self.send(f.DeleteSuperStreamResponse(frame.correlation_id, OK))
            return
        self.send(f.DeleteSuperStreamResponse(frame.correlation_id, code))

    def on_partitions(self, frame: f.Partitions) -> None:
        """Partitions of a super stream; a stream with several partitions answers
        ``<stream>-0`` .. ``<stream>-<n-1>``."""
        found = self.server.super_streams.find(frame.super_stream)
        self.send(f.PartitionsResponse(
            frame.correlation_id, OK if found else ResponseCode.STREAM_DOES_NOT_EXIST,
            found.partitions if found else ()))

    def on_route(self, frame: f.Route) -> None:
        """Streams bound with the routing key; OK with none when nothing matches (partition
        i of a stream with several partitions is bound with key "i")."""
        found = self.server.super_streams.find(frame.super_stream)
        self.send(f.RouteResponse(
            frame.correlation_id, OK if found else ResponseCode.STREAM_DOES_NOT_EXIST,
            tuple(found.route(frame.routing_key)) if found else ()))


def resolve_offset(partition: Partition, kind: int, value: int | None) -> int | None:
    """The offset an offset spec (Subscribe, ConsumerUpdateResponse) starts at in
    ``partition``; None for a type that names no position."""
    if kind == OffsetType.FIRST:
        return partition.first_offset
    if kind == OffsetType.LAST:  # osiris: the last chunk of messages, not of tracking
        return partition.last_user_chunk_offset
    if kind == OffsetType.NEXT:
        return partition.next_offset
    if kind == OffsetType.OFFSET:
        return min(max(value or 0, partition.first_offset), partition.next_offset)
    if kind == OffsetType.TIMESTAMP:
        return partition.offset_for_timestamp(value or 0)
    return None


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
        broker.leader_listeners.append(self._leader_changed)

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
        for name in self.super_streams.door_names(stream):
            self.sac.drop_stream(name)  # its subscriptions end with MetadataUpdate
        for conn in list(self.connections):
            conn.drop(stream.partitions)

    def _leader_changed(self, stream: str, index: int) -> None:
        """Placement callback: the publishers and subscriptions on the partition end with
        MetadataUpdate (0x06), as RabbitMQ's do when a new leader restarts the stream's
        members; clients ask Metadata and come back (publishers to the new leader)."""
        found = self.broker.streams.get(stream)
        if found is None or not 0 <= index < len(found.partitions):
            return  # no replica here: nobody publishes or reads it on this server
        self.sac.drop_stream(self.super_streams.door_names(found)[index])
        partition = (found.partitions[index],)
        for conn in list(self.connections):
            conn.drop(partition)

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
