# The connection core of the RabbitMQ Stream door: one asyncio Protocol per TCP (or TLS)
# connection. Owns the socket, the frame decoder (and the choice of dialect: the current
# protocol or the 2020 draft), the dispatch table from frame type to handler, flow control
# (flow.py), the connection state machine (state.py), output, and the frames held back while a
# cluster change runs. The commands themselves are handled by one object per family:
# session.py, streams.py, publishing.py, consuming.py, single_active.py, each given the
# connection's Link (link.py), never the connection.
# Rules: frames are handled in arrival order; a bad frame closes only its own connection (a
# Close with the protocol's code); a handler's exception is a server bug that closes its
# connection with INTERNAL_ERROR and nothing else; before any command but a Publish the
# staged publishes are written, so later commands see them; a peer that does not read its
# answers is not read either once OUTPUT_PAUSE_BYTES wait for it; while a refusal waits in the
# silent close delay, what the peer sends is dropped undecoded (silent_close.py bounds how
# many wait).
from __future__ import annotations

import asyncio
import logging
import time
from contextlib import contextmanager
from typing import Awaitable, Callable, Collection, Iterator

from ...broker import Partition
from ...log import ChunkSpan
from ...metrics import RABBITMQ_STREAM, error as count_error
from ...protocol.rabbitmq_stream import (FrameDecoder, FrameError, ResponseCode, deliver_prefix,
                                         encode)
from ...protocol.rabbitmq_stream import frames as f
from ...protocol.rabbitmq_stream.constants import INITIAL_FRAME_MAX
from ...protocol.rabbitmq_stream.draft import opens_draft
from ...security.authz import CONSUME, PUBLISH
from ...vhost_names import DEFAULT
from .consuming import Consuming, Subscription
from .draft import DraftAdapter
from .flow import ALARM, CLUSTER, OUTPUT, UNCONFIRMED, FlowControl
from .link import DoorServer, Link
from .publishing import Publisher, Publishing
from .sendfile import deliver, sendfile_fd
from .session import Session
from .single_active import SingleActive
from .state import CLOSE, ConnectionState
from .streams import Streams
from .vhost_frames import NAMED, NAMED_OUT, inbound, outbound

log = logging.getLogger("riverlog.rabbitmq_stream")

OK = ResponseCode.OK
# A peer that sends requests but does not read the answers is not read either once this much
# output waits for it (benchmarks/load_bench.py, "deaf" client: unbounded before).
OUTPUT_PAUSE_BYTES = 4 * 1024 * 1024
PRE_OPEN_FRAME_MAX = max(INITIAL_FRAME_MAX, 65536)
_PUBLISH = frozenset({f.Publish, f.PublishV2})


def _dispatch_table(session: Session, streams: Streams, publishing: Publishing,
                    consuming: Consuming, single_active: SingleActive) -> dict[type, Callable]:
    """Frame type -> the handler of one connection's families."""
    return {
        f.PeerProperties: session.on_peer_properties,
        f.SaslHandshake: session.on_sasl_handshake,
        f.SaslAuthenticate: session.on_sasl_authenticate,
        f.Tune: session.on_tune,
        f.TuneResponse: session.on_tune,
        f.Open: session.on_open,
        f.Close: session.on_close,
        f.CloseResponse: session.on_close_response,
        f.Heartbeat: session.on_heartbeat,
        f.ExchangeCommandVersions: session.on_exchange_command_versions,
        f.Create: streams.on_create,
        f.Delete: streams.on_delete,
        f.Metadata: streams.on_metadata,
        f.StreamStats: streams.on_stream_stats,
        f.Partitions: streams.on_partitions,
        f.CreateSuperStream: streams.on_create_super_stream,
        f.DeleteSuperStream: streams.on_delete_super_stream,
        f.Route: streams.on_route,
        f.DeclarePublisher: publishing.on_declare_publisher,
        f.Publish: publishing.on_publish,
        f.PublishV2: publishing.on_publish,
        f.QueryPublisherSequence: publishing.on_query_publisher_sequence,
        f.DeletePublisher: publishing.on_delete_publisher,
        f.Subscribe: consuming.on_subscribe,
        f.ResolveOffsetSpec: consuming.on_resolve_offset_spec,
        f.Credit: consuming.on_credit,
        f.Unsubscribe: consuming.on_unsubscribe,
        f.StoreOffset: consuming.on_store_offset,
        f.QueryOffset: consuming.on_query_offset,
        f.ConsumerUpdateResponse: single_active.on_consumer_update_response,
    }


class RabbitStreamConnection(asyncio.Protocol):
    """One client connection: handshake, then commands until Close or disconnect."""

    def __init__(self, server: DoorServer, tls: bool = False) -> None:
        self.server = server
        self.tls = tls
        self.decoder = FrameDecoder(max_frame_size=PRE_OPEN_FRAME_MAX)
        self.draft: DraftAdapter | None = None  # set when the first frame is the 2020 draft's
        self._head: bytearray | None = bytearray()  # first bytes, until the first key is known
        self.transport: asyncio.Transport | None = None
        self.state = ConnectionState()
        self.flow = FlowControl(self.state)
        self.link = Link(server, tls, self.flow, send=self.send, send_chunk=self.send_chunk,
                         send_span=self.send_span, fail=self.fail, refuse=self.refuse,
                         hold_for=self._hold_for,
                         hang_up=self._hang_up, abort=self._abort,
                         peer_certificate=self._peer_certificate, notify=self.notify,
                         notes_after=self._notes_after)
        self.session = Session(self.link, self.state, self.decoder)
        self.session.secret_updated = self._secret_updated
        self.publishing = Publishing(self.link)
        self.consuming = Consuming(self.link)
        self.single_active = SingleActive(self.link, self.consuming)
        self.consuming.groups = self.single_active
        self._handlers = _dispatch_table(self.session, Streams(self.link), self.publishing,
                                         self.consuming, self.single_active)
        # while a cluster change (Create, Delete) runs: the frames that came after it
        self._held: list[f.Frame] | None = None
        # while a request is handled whose response goes before the notifications it causes
        # (MetadataUpdate, ConsumerUpdate): those notifications (``notify``)
        self._notes: list[f.Frame] | None = None
        # closes the connection unless it opened a virtual host in time (connection_made)
        self._handshake_timer: asyncio.TimerHandle | None = None
        # answers a refused login or Open once the silent close delay ran out (``refuse``)
        self._silent_timer: asyncio.TimerHandle | None = None

    # -- what the server, metrics and tests read ----------------------------------------
    @property
    def peer(self) -> str:
        return self.link.peer

    @property
    def pending(self) -> set[asyncio.Future]:
        """Background work (confirms waiting for a commit, requests to a leader)."""
        return self.link.pending

    @property
    def publishers(self) -> dict[int, Publisher]:
        return self.publishing.publishers

    @property
    def subscriptions(self) -> dict[int, Subscription]:
        return self.consuming.subscriptions

    @property
    def unconfirmed(self) -> int:
        return self.publishing.unconfirmed

    @property
    def reading_paused(self) -> bool:
        """Whether too many unconfirmed publishes hold reading."""
        return self.flow.holds(UNCONFIRMED)

    # -- transport callbacks ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = self.flow.transport = transport  # type: ignore[assignment]
        if self.server.config.sendfile:
            self.link.sendfile_fd = sendfile_fd(transport, self.link.tls)
        self.link.last_received = self.link.last_sent = time.monotonic()
        peer = transport.get_extra_info("peername")
        if peer:
            self.link.peer_host = peer[0]
            self.link.peer = f"{peer[0]}:{peer[1]}"
        self.server.connections.add(self)
        timeout = self.server.config.handshake_timeout_ms
        if timeout:
            self._handshake_timer = asyncio.get_running_loop().call_later(
                timeout / 1000, self._handshake_expired)
        log.debug("connection from %s", self.peer)

    def _handshake_expired(self) -> None:
        """``handshake_timeout_ms`` after the connection was accepted: close it unless it
        opened a virtual host, without a Close frame, as rabbit_stream_reader's
        ``state_timeout`` does (close_immediately; "likely due to lack of client action")."""
        self._handshake_timer = None
        if self.state.open or self.state.closing:
            return
        self.fail(OK, f"no Open within {self.server.config.handshake_timeout_ms} ms of "
                      f"connecting (in state {self.state.state!r})", send_close=False)
        self._abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if self._silent_timer is not None:  # gone during the delay: its slot is free now
            self._silent_timer.cancel()
            self._silent_timer = None
            self.server.silent_closes.give_back()
        self.single_active.close()
        self.consuming.close()
        self.publishing.publishers.clear()
        self.session.close()
        self.flow.lost()
        log.debug("connection from %s closed", self.peer)

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()

    def data_received(self, data: bytes) -> None:
        self.link.last_received = time.monotonic()
        if self._silent_timer is not None:  # refused: read only to see a hang-up at once
            return
        if self._head is not None:  # the first frame's key tells the dialect apart
            self._head += data
            draft = opens_draft(self._head)
            if draft is None:
                return
            data, self._head = bytes(self._head), None
            if draft:
                self.draft = DraftAdapter(self.decoder, self.publishing, self.state)
                self.link.sendfile_fd = -1  # its Deliver is not the stored chunk's bytes
        try:
            frames = self.decoder.feed(data)
        except FrameError as exc:
            for frame in exc.frames:
                self._handle(frame)
            if self.publishing.staged:
                self.publishing.flush()
            self.fail(exc.code, exc.message)
            return
        if self._dispatch(frames):
            self._after_frames()

    def _dispatch(self, frames: list[f.Frame]) -> bool:
        """Handle ``frames`` in order. While a cluster change runs they wait in ``_held``;
        False when the connection is closing (then only a Close is still answered)."""
        state = self.state
        for i, frame in enumerate(frames):
            if self._held is not None:
                self._held += frames[i:]
                return True
            if state.closing and type(frame) is not f.Close:
                return False
            self._handle(frame)
        return True

    def _after_frames(self) -> None:
        """After a batch of frames: stop reading a peer that does not read, and write the
        staged publishes once this turn's reads are done."""
        if self.transport.get_write_buffer_size() > OUTPUT_PAUSE_BYTES and \
                not self.state.closing:
            self.flow.hold(OUTPUT)  # until resume_writing: the peer reads again
        self.publishing.after_frames()

    def _handle(self, frame: f.Frame) -> None:
        if self.draft is not None:  # the draft's own frames become the door's (None: answered)
            frame = self.draft.translate(frame)
            if frame is None:
                return
        kind = type(frame)
        if kind in NAMED:  # the client's names become the broker's, in its virtual host
            frame = inbound(frame, self.link.vhost)
        handler = self._handlers.get(kind)
        if self.publishing.staged and kind not in _PUBLISH:
            self.publishing.flush()  # later commands see every earlier publish written
        if handler is None:
            self.fail(ResponseCode.UNKNOWN_FRAME, f"unexpected {kind.__name__} frame")
            return
        accepts = self.state.accepts
        if accepts is not None and kind not in accepts:
            self.fail(ResponseCode.ACCESS_REFUSED, self.state.refusal(kind))
            return
        try:
            handler(frame)
        except Exception as exc:  # a server bug: this connection only
            log.exception("error handling %s from %s", kind.__name__, self.peer)
            self.fail(ResponseCode.INTERNAL_ERROR, f"internal error: {exc}")

    # -- output -------------------------------------------------------------------------
    def send(self, frame: f.Frame) -> None:
        if self.transport is not None and not self.transport.is_closing():
            kind = type(frame)
            # on `/` only a Metadata answer may hold a hidden name (one asked: vhost_frames)
            if kind in NAMED_OUT and (self.link.vhost != DEFAULT or kind is f.MetadataResponse):
                frame = outbound(frame)
            self.transport.write(encode(frame, self.decoder.dialect))
            self.link.last_sent = time.monotonic()

    def send_chunk(self, sub_id: int, partition: Partition, chunk: memoryview) -> None:
        """Deliver a stored chunk (header and data) to subscription ``sub_id`` of
        ``partition``: Deliver v2 (with the committed chunk id) once the client announced
        it, the draft's Deliver on a draft connection, else Deliver v1."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.draft is not None:
            self.transport.writelines(self.draft.deliver(sub_id, chunk))
        else:
            committed = max(partition.last_chunk_offset, 0) if self.session.deliver_v2 else None
            self.transport.writelines((deliver_prefix(sub_id, len(chunk), committed), chunk))
        self.link.last_sent = time.monotonic()

    def send_span(self, sub_id: int, partition: Partition, span: ChunkSpan) -> None:
        """``send_chunk`` for a chunk given as a span (log/spans.py) on a connection whose
        ``link.sendfile_fd`` is a socket: its data goes from the segment file by os.sendfile
        (sendfile.deliver). Raises CorruptChunkError or OSError when the file cannot be read."""
        if self.transport is None or self.transport.is_closing():
            return
        committed = max(partition.last_chunk_offset, 0) if self.session.deliver_v2 else None
        head = deliver_prefix(sub_id, span.size, committed) + span.head
        self.server.sendfile_bytes += deliver(self.transport, self.link.sendfile_fd, head, span)
        self.link.last_sent = time.monotonic()

    # -- closing ------------------------------------------------------------------------
    def fail(self, code: int, reason: str, linger: float = 0.0, send_close: bool = True) -> None:
        """Close this connection because of the peer: a Close frame with ``code`` (none
        when not ``send_close``), then the socket (after what is buffered is sent;
        ``linger`` s later when given)."""
        if self.state.closing:
            return
        log.warning("closing connection from %s: %s (code 0x%02x)", self.peer, reason, code)
        if code != OK:
            count_error(RABBITMQ_STREAM, code)
        if send_close:
            self.send(f.Close(0, code, reason[:200]))
        self.state.on(CLOSE)
        self._hang_up(linger)

    def refuse(self, response: f.Frame, reason: str, linger: float,
               silent_close: bool) -> None:
        """Answer a refused login or Open with ``response`` (a SaslAuthenticateResponse or
        OpenResponse with an error code) and close the socket ``linger`` s later, without a
        Close frame. With ``silent_close`` the answer waits the door's silent close delay
        first (RabbitStreamConfig.silent_close_delay_ms), as rabbit_stream_reader.erl
        (v4.0.0 and later: ``silent_close_delay()``, a 3 s ``timer:sleep`` before the error
        frame is sent, then the socket closed) does for a refused SaslAuthenticate and a
        refused Open (from v4.1.4 also a refused secret update); meanwhile nothing the peer
        sends is handled, nothing is delivered to its subscriptions (the sleeping reader
        delivers nothing either), no other connection waits (a timer, not a sleep), and a peer
        that hangs up frees its place at once (connection_lost). No delay when the door's bound
        of waiting connections is reached (silent_close.SilentCloses)."""
        if self.state.closing:
            return
        delay = self.server.silent_closes.take() if silent_close else 0.0
        if not delay:
            self.send(response)
            self.fail(response.response_code, reason, linger=linger, send_close=False)
            return
        log.warning("refusing connection from %s in %.3f s: %s (code 0x%02x)", self.peer,
                    delay, reason, response.response_code)
        count_error(RABBITMQ_STREAM, response.response_code)
        self.state.on(CLOSE)
        self.consuming.stop()
        if self._handshake_timer is not None:  # the delay is not the client's slowness
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self._silent_timer = asyncio.get_running_loop().call_later(
            delay, self._silent_close_ended, response, linger)

    def _silent_close_ended(self, response: f.Frame, linger: float) -> None:
        self._silent_timer = None
        self.server.silent_closes.give_back()
        self.send(response)
        self._hang_up(linger)

    def _hang_up(self, delay: float) -> None:
        """Close the socket after what is buffered is sent (``delay`` s later when given)."""
        if self.transport is not None:
            if delay:
                asyncio.get_running_loop().call_later(delay, self.transport.close)
            else:
                self.transport.close()

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _peer_certificate(self) -> dict | None:
        """The verified client certificate of a TLS connection (None: none or plain TCP)."""
        ssl_object = self.transport.get_extra_info("ssl_object") if self.tls else None
        return ssl_object.getpeercert() if ssl_object is not None else None

    def stop_reading(self) -> None:
        """Shutdown, first step: read no more frames and write the publishes already
        received (their confirms follow as usual)."""
        self.flow.stop()
        if self.publishing.staged:
            self.publishing.flush()

    def close_for_shutdown(self) -> None:
        """Shutdown, last step: end the subscriptions and close the socket once what was
        queued for it (the confirms) is written, with no Close frame, as RabbitMQ's reader
        does when its node stops (rabbit_stream_reader:close/3 shuts the socket down). A
        server Close tells clients the connection was ended on purpose: the Java client
        then never recovers its producers and consumers (ShutdownReason.SERVER_CLOSE)."""
        self.consuming.stop()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # asyncio writes the buffered frames first

    def alarm(self, blocked: bool) -> None:
        """A resource alarm was raised (``blocked``) or cleared: while it holds, a connection
        with publishers is not read, as rabbit_stream_reader stops reading a connection
        blocked by a resource alarm (open/3, ``{resource_alarm, true}``: the socket is not
        set active again), its heartbeat check paused; reading resumes once it clears."""
        if blocked:
            if self.publishers and not self.state.closing:
                self.flow.hold(ALARM)
        elif self.flow.holds(ALARM):
            self.link.last_received = time.monotonic()  # the silence was ours
            self.flow.release(ALARM)

    def notify(self, frame: f.Frame) -> None:
        """Send a notification (MetadataUpdate, ConsumerUpdate) now, or after the response
        of the request being handled (``_notes_after``, ``_hold_for``)."""
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

    def drop(self, partitions: Collection[Partition]) -> None:
        """Drop this connection's publishers and subscriptions on ``partitions`` (a stream
        deleted, a partition's leader changed) and tell the client with MetadataUpdate
        (0x06), once per name they used, as rabbit_stream_reader does when a stream member
        goes down (clean_state_after_stream_deletion_or_failure)."""
        touched = dict.fromkeys(self.consuming.drop(partitions) +
                                self.publishing.drop(partitions))
        for name in touched:
            self.notify(f.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, name))

    def _secret_updated(self) -> None:
        """After a secret update: drop the publishers on streams the user may no longer
        publish to and the subscriptions on streams it may no longer consume, with one
        MetadataUpdate (0x06) per stream, as rabbit_stream_reader's
        evaluate_state_after_secret_update does with check_write_permitted and
        check_read_permitted (the Java suite's
        AuthorisationTest.shouldReceiveMetadataUpdateAfterUpdateSecret)."""
        may = self.link.may
        refused = {pub.partition for pub in self.publishers.values()
                   if not may(pub.name, PUBLISH, (pub.stream, pub.partition))}
        refused.update(sub.partition for sub in self.subscriptions.values()
                       if not may(sub.name, CONSUME, (sub.stream, sub.partition)))
        if refused:
            self.drop(refused)

    # -- cluster changes ----------------------------------------------------------------
    def _hold_for(self, change: Awaitable[int], respond: Callable[[int], f.Frame]) -> None:
        """Run a cluster change (Create, Delete) and answer ``respond(code)`` when it ends
        (INTERNAL_ERROR when it fails unexpectedly). Meanwhile this connection reads and
        handles nothing else, as RabbitMQ's reader waits for the stream coordinator."""
        self._held = []
        if self._notes is None:
            self._notes = []  # the response goes first (``_notes_after``)
        self.flow.hold(CLUSTER)
        self.link.background(change).add_done_callback(
            lambda done: self._cluster_change_done(respond, done))

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
        self.flow.release(CLUSTER)
        if self._dispatch(held):
            self._after_frames()
