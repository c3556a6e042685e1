# The NATS front door of Liftbridge: makes NATS subjects durable. Owns one queue subscription
# per partition of every stream attached to a subject, and the acks published back to ack
# inboxes, both on riverlog's own data connection (nats_data.py: a read's messages parsed in
# one pass, no nats-py machinery per message); the control connection (and the embedded
# nats-server) is the shared NatsLink's.
# Rules: partition N of a stream listens on `subject` (N = 0) or `subject.N`, in the stream's
# queue group; a stream whose subject or group NATS cannot take (stored by an older version)
# is logged and left detached; a payload that is a valid Publish envelope is stored with its
# key, value and headers and acked per its ack policy, anything else (including a broken
# envelope) is stored as a plain message (value = the payload, no key, no ack); an envelope
# naming an ack inbox riverlog does not send to (``ack_inbox_error``; with authorization on the
# embedded server names the publishing user, and acks go only to that user's own inboxes) is
# not stored, counted and logged; paused partitions and streams left detached are not
# subscribed; read-only partitions drop what arrives, and so does every partition while a
# resource alarm holds (riverlog.alarms; counted in riverlog_dropped_messages); only a
# partition's leader (Broker.placement) subscribes it, and a new leader subscribes when it
# takes over (on one server: every partition).
# A replaced data connection (the server closed it) subscribes every partition again itself.
# The messages a partition gets in one event-loop turn (at most TURN_MESSAGES, fewer with
# followers; the rest in the next turns, and past PENDING_BYTES_LIMIT waiting ones dropped
# as a slow consumer's, never acked) are stored together, in order: runs of
# them (same subject, same ack mode) encoded in one pass and appended at once, acks built from
# template bytes; what one-by-one ingest would store and ack stays exactly the same (tests:
# test_lb_envelope_batch.py). The publishes (acks) queued during one turn go out as one write
# of PUB commands. Wire facts:
# reference/liftbridge.md "Envelope and NATS subjects"; the envelope codec is
# riverlog.protocol.liftbridge.envelope; PUB from the NATS client protocol (docs.nats.io).
from __future__ import annotations

import asyncio
import logging
import time

from nats.aio.client import Client as NatsClient

from ..broker import RESERVED_STREAMS, Partition, Stream
from ..metrics import DROPPED, NATS, counters, error as count_error
from ..protocol.liftbridge import api_pb2 as pb
from ..protocol.liftbridge.envelope import (ACK_HEADER, MAGIC, AckTemplate,
                                            decode_publish, encode_ack)
from ..protocol.nats_subject import has_wildcard, matches, subject_problem
from ..record import Record, encode_records
from ..protocol.nats_wire import parse_headers
from ..security.nats_auth import (INBOX_PREFIX, SENDER_HEADER, NatsAuth, connect_options,
                                  own_inboxes, sender_of)
from .ack_sinks import RunSink
from .embedded_nats import EmbeddedNats
from .liftbridge import (ALL, LEADER, NONE, Liftbridge, LiftbridgeError, nats_problem,
                         partition_subject)
from .nats_data import NatsDataLink
from .nats_link import NatsLink, settle

log = logging.getLogger("riverlog.nats")

REFUSAL_LOG_INTERVAL_S = 1.0  # refused NATS messages: one log line at most this often
TURN_MESSAGES = 4096  # a partition's NATS messages stored per loop turn, at most...
TURN_MESSAGES_REPLICATED = 512  # ...and with followers, whose fetches wait for the turn's end
PENDING_BYTES_LIMIT = 512 * 1024 * 1024  # per partition, waiting to be stored; more: dropped
STOP_TIMEOUT_S = 5.0


def _shown(text: str) -> str:  # for a log line or an error message: the first 64 characters
    return repr(text if len(text) <= 64 else text[:64] + "...")


class NatsBridge:
    """The NATS side of the Liftbridge doors. ``await start()``, ``await stop()``."""

    def __init__(self, service: Liftbridge, link: NatsLink) -> None:
        self.service = service
        self.link = link
        self.config = link.config
        self.guard = link.guard
        self._reload_task: asyncio.Task | None = None
        self._permissions_dirty = False
        self._subs: dict[int, int] = {}  # id(partition) -> sid on the data connection
        self._arrived: dict[int, _Arrived] = {}  # id(partition) -> its subscription's
        self._closing = False  # quiesce(): nothing is subscribed again
        self.data: NatsDataLink | None = None
        # the streams NATS serves, by name, and their partition subjects (literal, wildcard)
        self._attached: dict[str, Stream] = {}
        self._literal: dict[str, int] = {}
        self._wildcard: dict[str, int] = {}
        # ack_inbox_error's answers, by (inbox, sender)
        self._inbox_errors: dict[tuple[str, str | None], LiftbridgeError | None] = {}
        self._inboxes_only = link.guard.config.authz
        # NATS names the user who published each message (NatsAuth.names_senders)
        self._senders = link.auth is not None and link.auth.names_senders
        self._sender_names: dict[str, str] = {}  # SENDER_HEADER value -> user
        self._own = f"{service.namespace}."  # riverlog's own subjects
        self._acks = f"{service.namespace}.ack."  # its own ack inboxes (no NATS user's)
        self._next_refusal_log = 0.0
        self._pending: set[asyncio.Task] = set()
        self._out: list[tuple[bytes, bytes]] = []  # (subject UTF-8, payload)
        self._pub_lines: dict[tuple[bytes, int], bytes] = {}  # (subject, size) -> PUB line
        service.bridge = self
        service.broker.placement.add_leader_listener(self._leader_changed)

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def nc(self) -> NatsClient | None:
        """The shared NATS connection (NatsLink.nc)."""
        return self.link.nc

    @property
    def auth(self) -> NatsAuth | None:
        return self.link.auth

    @property
    def embedded(self) -> EmbeddedNats | None:
        return self.link.embedded

    url = property(lambda self: self.link.url)  # the NATS address clients use (the first server)

    async def start(self) -> None:
        """Note the streams with a subject NATS takes (the embedded server's permissions start
        with them), start the NATS link, subscribe their partitions. Raises ``OSError``."""
        for stream in list(self.service.broker.streams.values()):
            if self._index(stream) and self.auth is not None:
                self.auth.add(stream)
        await self.link.start()
        options = connect_options(self.config, self.guard, self.auth)
        self.data = NatsDataLink(self.link.servers, options.get("user"),
                                 options.get("password"), options.get("tls"))
        await self.data.start()
        for stream in list(self._attached.values()):
            self._subscribe_all(stream)
        await self.sync()
        log.info("NATS bridge connected to %s", ", ".join(self.link.servers))

    async def quiesce(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Take no more messages (every partition unsubscribed, none again) and store what
        arrived already (up to ``timeout`` s). App.stop then waits for those writes to commit
        (Appenders.drain) before ``stop`` sends their acks."""
        self._closing = True
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=timeout)
        for sid in self._subs.values():
            if self.data is not None:
                self.data.unsubscribe(sid)
        self._subs.clear()
        deadline = asyncio.get_running_loop().time() + timeout
        while any(a.messages for a in self._arrived.values()) and \
                asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.001)  # the partitions' ingest turns run meanwhile

    async def stop(self) -> None:
        """``quiesce``, send the acks still queued and close the data connection (the App
        closes the link after)."""
        if self.data is not None:
            await self.quiesce()
            self._send_out()
            await self.data.stop()

    # -- subscriptions ------------------------------------------------------------------
    def _task(self, coro) -> asyncio.Task:
        """A task ``sync()`` waits for."""
        task = asyncio.get_running_loop().create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("NATS subscription change failed: %s", task.exception())

    async def sync(self) -> None:
        """Wait until subscription changes made so far are in effect at the NATS server."""
        while self._pending:
            await asyncio.wait(list(self._pending))
        if self.data is not None and self.data.connected:
            await self.data.flush(5)
        if self.nc is not None and self.nc.is_connected:
            await settle(self.nc)

    def attach(self, stream: Stream) -> None:
        """Subscribe every unpaused partition of a stream that has a subject."""
        if self._index(stream):
            self._subscribe_all(stream)
            if self.auth is not None:
                self.auth.add(stream)
                self.permissions_changed()

    def _subscribe_all(self, stream: Stream) -> None:
        for partition in stream.partitions:
            if not partition.paused:
                self._task(self._subscribe(stream, partition))

    def detach(self, stream: Stream) -> None:
        for partition in stream.partitions:
            self.pause(stream, partition)
        if self._attached.get(stream.name) is stream:
            del self._attached[stream.name]
            self._count_subjects(stream, -1)
            if self.auth is not None:
                self.auth.remove(stream)
                self.permissions_changed()

    def _index(self, stream: Stream) -> bool:
        """Count ``stream`` as attached (its partition subjects are what ack inboxes must not
        be) when it has a subject NATS can take; a stream whose subject or group NATS cannot
        take (stored before riverlog checked them) is logged, counted and left out: False."""
        if not stream.config.subject:
            return False
        problem = nats_problem(stream.config.subject, stream.config.group or "")
        if problem is not None:
            log.error("stream %r is not attached to NATS: %s (subject %s; Liftbridge clients "
                      "can still use it over gRPC; delete it and create it again with a valid "
                      "subject)", stream.name, problem, _shown(stream.config.subject))
            count_error(NATS, "INVALID_SUBJECT")
            return False
        self._attached[stream.name] = stream
        self._count_subjects(stream, 1)
        return True

    def _count_subjects(self, stream: Stream, step: int) -> None:
        self._inbox_errors.clear()
        index = self._wildcard if has_wildcard(stream.config.subject or "") else self._literal
        for partition in stream.partitions:
            subject = partition_subject(stream.config.subject or "", partition.index)
            count = index.get(subject, 0) + step
            if count > 0:
                index[subject] = count
            else:
                index.pop(subject, None)

    def ack_inbox_error(self, inbox: str, sender: str | None = None) -> LiftbridgeError | None:
        """Why riverlog sends no ack to ``inbox`` (None: it does): INVALID_ARGUMENT when it is
        no literal NATS subject of at most MAX_SUBJECT_BYTES (riverlog.protocol.nats_subject);
        PERMISSION_DENIED when a stream listens on it (an ack would be stored there), when it
        is one of riverlog's own subjects (``<namespace>.>``; only riverlog itself, ``sender``
        None, may name ``<namespace>.ack.>``, the inboxes riverlog waits on, which no NATS user
        may subscribe) or, with authorization on, when it is not the publisher's: ``sender``,
        the NATS user who published the envelope (known when the embedded server names it:
        ``_sender``), gets acks only on its own inboxes (nats_auth.own_inboxes). None:
        riverlog's own publish (PublishToSubject, a publish forwarded to a partition's leader)
        or a gRPC caller (the gRPC door checks its caller's own inboxes), or, when NATS does
        not name senders, anyone: then anywhere under INBOX_PREFIX or riverlog's own.
        Answers are kept until the streams' subjects change."""
        key = (inbox, sender)
        errors = self._inbox_errors
        if key in errors:
            return errors[key]
        error = None
        problem = subject_problem(inbox)
        if sender is not None:
            allowed = own_inboxes(sender)
        else:
            allowed = "" if self._senders else INBOX_PREFIX
        own_ack = sender is None and inbox.startswith(self._acks)  # riverlog's own ack inbox
        if problem is not None:
            error = LiftbridgeError("INVALID_ARGUMENT", f"ack inbox {_shown(inbox)} {problem}")
        elif inbox.startswith(self._own) and not own_ack:
            error = LiftbridgeError("PERMISSION_DENIED", f"ack inbox {_shown(inbox)} is one of "
                                                         f"riverlog's own subjects")
        elif self._inboxes_only and not own_ack and \
                (allowed is None or not inbox.startswith(allowed)):
            owner = "" if sender is None else f" of user {sender!r}"
            error = LiftbridgeError("PERMISSION_DENIED", f"ack inbox {_shown(inbox)} is not an "
                                    f"inbox{owner} ({allowed or 'it has none'}>)")
        elif inbox in self._literal or any(matches(p, inbox) for p in self._wildcard):
            error = LiftbridgeError("PERMISSION_DENIED",
                                    f"ack inbox {_shown(inbox)} is a stream's subject")
        if len(errors) >= 4096:
            errors.clear()
        errors[key] = error
        return error

    def _sender(self, header_block: bytes | None) -> str | None:
        """The NATS user who published a message, from the header the embedded server sets
        (nats_auth.sender_of, each header value parsed once; ``header_block``: the message's
        raw NATS headers); None: riverlog's own publish."""
        header = parse_headers(header_block).get(SENDER_HEADER) if header_block else None
        if header is None:
            return None
        names = self._sender_names
        name = names.get(header)
        if name is None:
            if len(names) >= 4096:
                names.clear()
            name = names[header] = sender_of(header)
        return name

    def _refuse(self, subject: str, error: LiftbridgeError) -> None:
        """A NATS message is not stored: counted, and logged at most once a second."""
        count_error(NATS, error.code)
        now = time.monotonic()
        if now >= self._next_refusal_log:
            self._next_refusal_log = now + REFUSAL_LOG_INTERVAL_S
            log.warning("a message on %s is not stored: %s (refused messages are counted in "
                        "riverlog_errors{door=\"nats\"})", _shown(subject), error.message)

    def permissions_changed(self, users: bool = False) -> None:
        """A stream's subjects came or went, or (``users``) runtime users or permissions
        changed: the embedded server's users and permissions follow (in effect once ``sync()``
        returns). One reload runs at a time; changes made while it runs get one more."""
        if self.auth is None or not self.auth.users_on:
            return
        if users:
            self.auth.access_changed(list(self._attached.values()))
        self._permissions_dirty = True
        if self._reload_task is None:
            self._reload_task = self._task(self._reload())

    async def _reload(self) -> None:
        try:
            while self._permissions_dirty:
                await asyncio.sleep(0)  # one reload for every change made in this turn
                self._permissions_dirty = False
                await self.link.reload()
        finally:
            self._reload_task = None

    def pause(self, stream: Stream, partition: Partition) -> None:
        self._arrived.pop(id(partition), None)  # what waits there, its ingest turn drops
        sid = self._subs.pop(id(partition), None)
        if sid is not None:
            self.data.unsubscribe(sid)

    def resume(self, stream: Stream, partition: Partition) -> None:
        if id(partition) not in self._subs:
            self._task(self._subscribe(stream, partition))

    def _leader_changed(self, name: str, index: int) -> None:
        """A partition's leader changed (Placement listener): its new leader listens on its
        subject, any other server stops."""
        stream = self._attached.get(name)
        if stream is None or not 0 <= index < len(stream.partitions):
            return
        partition = stream.partitions[index]
        if self.service.broker.placement.leads(name, index):
            if not partition.paused:
                self.resume(stream, partition)
        else:
            self.pause(stream, partition)

    async def _subscribe(self, stream: Stream, partition: Partition) -> None:
        """Subscribe ``partition`` when its stream is attached (``_index``: a stream NATS
        refused at start stays unsubscribed, resumed or not), not reserved (written by the
        server itself, never from NATS) and this server leads it (only a partition's leader
        ingests its subject)."""
        placement = self.service.broker.placement
        if self.data is None or self._closing or id(partition) in self._subs or partition.paused \
                or stream.name in RESERVED_STREAMS \
                or self._attached.get(stream.name) is not stream \
                or self.service.broker.streams.get(stream.name) is not stream \
                or not placement.leads(stream.name, partition.index):
            return
        subject = partition_subject(stream.config.subject or "", partition.index)
        self._subs[id(partition)] = self.data.subscribe(subject, stream.config.group or "",
                                                        self._handler(stream, partition))
        log.debug("partition %s/%d listens on %s (queue group %r)", stream.name,
                  partition.index, subject, stream.config.group or "")

    def _handler(self, stream: Stream, partition: Partition):
        arrived = self._arrived[id(partition)] = _Arrived()
        ingest_turn = self._ingest_turn
        alarms = self.service.broker.alarms
        dropped = DROPPED.labels(NATS, "alarm")
        too_many = DROPPED.labels(NATS, "slow_consumer")

        def on_messages(messages: list) -> None:
            if partition.readonly or partition.paused:
                return
            if alarms.blocked:  # a resource alarm: NATS cannot be told to wait, so dropped
                dropped.inc(len(messages))
                return
            size = sum(len(m[4]) for m in messages)
            if arrived.nbytes + size > PENDING_BYTES_LIMIT:
                too_many.inc(len(messages))  # never stored, never acked
                self._refuse(messages[0][1], LiftbridgeError(
                    "RESOURCE_EXHAUSTED", f"over {PENDING_BYTES_LIMIT} bytes wait to be stored "
                                          f"on {partition}: dropped (slow consumer)"))
                return
            if not arrived.messages:
                asyncio.get_running_loop().call_soon(ingest_turn, stream, partition, arrived)
            arrived.messages += messages
            arrived.nbytes += size

        return on_messages

    def _ingest_turn(self, stream: Stream, partition: Partition, arrived: "_Arrived") -> None:
        """Store the NATS messages that arrived for ``partition`` (``(sid, subject, reply,
        headers, payload)``, nats_data.Handler), at most TURN_MESSAGES of them in this loop
        turn, TURN_MESSAGES_REPLICATED with followers (the rest wait: a burst must not keep
        the loop from answering followers' fetches and the other doors for long; with 4096,
        a three-server lift-bench left its followers behind and out of the ISR). Those still
        waiting when the partition is paused, made read-only or led elsewhere are dropped,
        never acked (riverlog_dropped_messages{reason="not_stored_here"}). In arrival order,
        runs of the same subject and ack mode are encoded in one pass and appended at once,
        acks built from one AckTemplate; a message needing a check of its own (over the size
        limit, an expected offset with optimistic concurrency) goes through
        ``Liftbridge.ingest`` alone, in its place (test_lb_envelope_batch.py)."""
        placed = self.service.broker.placement.of(stream.name, partition.index)
        if partition.readonly or partition.paused or placed is None or \
                placed.leader != self.service.broker.placement.server_id:
            DROPPED.labels(NATS, "not_stored_here").inc(len(arrived.messages))
            arrived.messages.clear()
            arrived.nbytes = 0
            return
        turn = TURN_MESSAGES if len(placed.replicas) == 1 else TURN_MESSAGES_REPLICATED
        msgs = arrived.messages[:turn]
        del arrived.messages[:turn]
        arrived.nbytes -= sum(len(m[4]) for m in msgs)
        if arrived.messages:
            asyncio.get_running_loop().call_soon(self._ingest_turn, stream, partition, arrived)
        limit = self.service.config.replication_max_bytes
        concurrency = stream.config.optimistic_concurrency
        now = time.time_ns()
        records: list[Record] = []
        acks: list[tuple[bytes, bytes]] = []
        run_key = None
        nbytes = 0
        last_sr = plain = None  # (subject, reply) -> the headers of a message that has none
        last_inbox = inbox_b = None  # the last ack inbox, UTF-8 (one bytes object per inbox)
        inbox_ok = ""  # the last ack inbox ack_inbox_error allowed, and for whom
        sender = sender_ok = None
        senders = self._senders
        for msg in msgs:
            _, subject, reply, header_block, data = msg
            envelope = decode_publish(data) if data[:4] == MAGIC else None
            if envelope is not None:
                inbox = envelope.ackInbox
                if inbox:
                    if senders:
                        sender = self._sender(header_block)
                    if inbox != inbox_ok or sender != sender_ok:
                        error = self.ack_inbox_error(inbox, sender)
                        if error is not None:
                            self._refuse(subject, error)
                            continue
                        inbox_ok, sender_ok = inbox, sender
            if len(data) > limit or (envelope is not None and concurrency
                                     and envelope.offset != -1):
                if records:
                    self._append_run(stream, partition, run_key, records, acks, nbytes, now)
                    records, acks, nbytes = [], [], 0
                self._ingest_one(stream, partition, msg, envelope)
                continue
            if (subject, reply) != last_sr:
                last_sr = (subject, reply)
                plain = {"subject": subject.encode(), "reply": reply.encode()}
                record_subject, record_reply = subject or None, reply or None
            headers = plain
            ack = None
            if envelope is None:
                key = (subject, None)
                value = data
                record = Record(value, None, headers, now, record_subject, record_reply)
            else:
                policy = envelope.ackPolicy
                if not inbox or (policy != LEADER and policy != ALL):
                    policy = None  # no ack (ingest's AckSink never answers other policies)
                key = (subject, policy)
                value = envelope.value
                if envelope.headers:
                    headers = dict(envelope.headers, **headers)
                correlation_id = envelope.correlationId
                record = Record(value, envelope.key or None, headers, now, record_subject,
                                record_reply, correlation_id or None, inbox or None)
                if policy is not None:
                    if inbox != last_inbox:
                        last_inbox = inbox
                        inbox_b = inbox.encode()
                    ack = (inbox_b, correlation_id.encode())
            if key != run_key and records:
                self._append_run(stream, partition, run_key, records, acks, nbytes, now)
                records, acks, nbytes = [], [], 0
            run_key = key
            records.append(record)
            nbytes += len(value)
            if ack is not None:
                acks.append(ack)
        if records:
            self._append_run(stream, partition, run_key, records, acks, nbytes, now)

    def _append_run(self, stream: Stream, partition: Partition, run_key: tuple,
                    records: list[Record], acks: list[tuple[bytes, bytes]], nbytes: int,
                    now: int) -> None:
        subject, policy = run_key
        sink = None
        if policy is not None:
            sink = _AckRun(self, AckTemplate(stream.name, stream.config.subject or "", subject,
                                             policy, now, ACK_HEADER), acks)
        try:
            self.service.appenders.get(partition).extend(encode_records(records), sink)
        except Exception as exc:  # a closed/deleted partition: the messages are not stored
            log.error("%d messages on %s not stored: %s", len(records), subject, exc)
            count_error(NATS, type(exc).__name__)
            return
        counters(stream.name, NATS).published(len(records), nbytes)

    def _ingest_one(self, stream: Stream, partition: Partition, msg, envelope) -> None:
        _, subject, reply, _, data = msg
        try:
            if envelope is None:
                self.service.ingest(
                    stream, partition, value=data, key=None, headers=None,
                    msg_subject=subject, reply=reply, ack_inbox="", correlation_id="",
                    ack_policy=NONE, expected_offset=None, size=len(data), deliver=None,
                    door=NATS)
            else:
                offset = envelope.offset
                inbox = envelope.ackInbox
                self.service.ingest(
                    stream, partition, value=envelope.value, key=envelope.key or None,
                    headers=envelope.headers, msg_subject=subject, reply=reply,
                    ack_inbox=inbox, correlation_id=envelope.correlationId,
                    ack_policy=envelope.ackPolicy,
                    expected_offset=None if offset == -1 else offset, size=len(data),
                    deliver=self.send_ack if inbox else None, door=NATS)
        except Exception as exc:  # a closed/deleted partition: the message is not stored
            log.error("message on %s not stored: %s", subject, exc)
            count_error(NATS, type(exc).__name__)

    # -- publishing ---------------------------------------------------------------------
    def send_ack(self, ack: pb.Ack) -> None:
        """Queue an enveloped Ack for its ack inbox."""
        if ack.ackInbox:
            self.queue_publish(ack.ackInbox.encode(), encode_ack(ack))

    def queue_publish(self, subject: bytes, data: bytes) -> None:
        """Queue a NATS publish (``subject`` UTF-8 encoded, a subject NATS takes: an ack
        inbox ``ack_inbox_error`` allowed, or the subject of a partition led elsewhere, checked
        by CreateStream; it may carry a reply subject after a space); everything queued in
        one loop turn is sent together, on the data connection."""
        if not self._out:
            asyncio.get_running_loop().call_soon(self._send_out)
        self._out.append((subject, data))

    def _send_out(self) -> None:
        """Send the queued publishes as one write of PUB commands (docs.nats.io "Client
        Protocol"), subjects as queued (checked where they entered). A payload over
        max_payload, or any while the data connection is down, is not sent, and logged."""
        out, self._out = self._out, []
        data_link = self.data
        if not out or data_link is None:
            return
        max_payload = data_link.max_payload
        lines = self._pub_lines
        parts = []
        for subject, data in out:
            size = len(data)
            if size > max_payload:
                log.error("NATS publish to %r not sent: %d bytes exceed max_payload (%d)",
                          subject, size, max_payload)
                continue
            line = lines.get((subject, size))
            if line is None:
                if len(lines) >= 4096:
                    lines.clear()
                line = lines[(subject, size)] = b"PUB %b %d\r\n" % (subject, size)
            parts += (line, data, b"\r\n")
        if parts and not data_link.publish(b"".join(parts)):
            log.error("%d NATS publishes not sent: the data connection is down", len(parts) // 3)


class _Arrived:
    """A partition's NATS messages read and not stored yet, and their payloads' bytes."""

    __slots__ = ("messages", "nbytes")

    def __init__(self) -> None:
        self.messages: list = []
        self.nbytes = 0


class _AckRun(RunSink):
    """The RunSink of a run of enveloped NATS publishes: each record's Ack envelope (the
    AckTemplate's bytes with the ACK_HEADER prefix: encode_ack's bytes) goes to its ack inbox."""

    __slots__ = ("bridge", "acks")

    def __init__(self, bridge: NatsBridge, template: AckTemplate,
                 acks: list[tuple[bytes, bytes]]) -> None:
        super().__init__(template, NATS)
        self.bridge = bridge
        self.acks = acks  # (ack inbox, correlation id) per record, UTF-8

    def answer(self, i: int, offset: int, commit_ns: int) -> None:
        inbox, correlation_id = self.acks[i]
        self.bridge.queue_publish(inbox, self.template.ack(offset, inbox, correlation_id,
                                                           commit_ns))

    def fail(self, i: int, error: BaseException) -> None:
        """No ack: the publisher's ack times out, as with one-by-one ingest (AckSink)."""
