# The PublishAsync RPC of the Liftbridge gRPC door (bidirectional), and the answers the door
# shares with Publish: Liftbridge's ack errors as PublishAsyncError codes and the NATS message
# size a publish is checked against. Requests arrive as raw bytes and answers leave as raw
# bytes (a malformed request gets InvalidArgument).
# Rules (reference/liftbridge.md "Behaviour clients rely on"; liftbridge server/api.go):
# PublishAsync answers every message whose ack policy is not NONE, errors as
# {correlationId, ack: Ack{}, asyncError}; after the client half-closes it waits up to 5 s for
# outstanding acks. It handles the requests of one loop turn together: runs of them to one
# partition with one ack policy are encoded in one pass, appended at once and answered from
# template bytes (AckTemplate), counted once per run; what one-by-one publishing would answer
# and store stays exactly the same (tests: test_lb_publish_batch.py). In a cluster, the
# requests of one loop turn for partitions another server leads go to that leader as ONE NATS
# message (riverlog.protocol.forward_batch, on the servers-only `<namespace>.forward.<leader>`),
# which stores them with this same batch code (riverlog.server.forward_leader) and answers
# every request's PublishResponse in one message, passed on as it is: a client answered
# through a forwarding server gets what it would get from the leader itself, in the same
# order (tests/cluster/test_forward_batch.py). A call's answer inbox is subscribed on the
# data connection, the one its forwards leave on, so nats-server has it before the first
# forward; a batch nats-server finds no server for ("no responders": its leader stopped
# taking batches, nothing was stored) goes to the partitions' next leader once the placement
# names one. While a server of riverlog before batches is in the cluster
# (cluster.features.FORWARD_BATCH inactive), each goes enveloped to its partition's subject
# instead, as before (forward_older.py).
from __future__ import annotations

import asyncio
import logging
import time

import grpc
from google.protobuf.message import DecodeError

from ..cluster.features import FORWARD_BATCH
from ..metrics import GRPC, counters
from ..protocol.forward_batch import (ANSWER_MAGIC, MAGIC, MAX_ITEMS_DIVISOR, ForwardError,
                                      decode_failed, decode_items, encode_items, forward_subject,
                                      framed_size)
from ..protocol.liftbridge import api_pb2 as pb
from ..protocol.liftbridge import envelope
from ..protocol.liftbridge.envelope import varint
from ..record import Record, encode_records
from .ack_sinks import RunSink
from .forward_older import ENVELOPED_TOKEN, on_enveloped_ack, send_enveloped
from .liftbridge import ACK_OK, NONE, Liftbridge, LiftbridgeError, partition_subject
from .server_id import new_id

log = logging.getLogger("riverlog.grpc")

ASYNC_ACK_TIMEOUT_S = 5.0
RESEND_WAIT_S = 5.0  # how long a batch no server took waits for its partitions' next leader
RESEND_POLL_S = 0.05
_ENVELOPED = "." + ENVELOPED_TOKEN
_NO_RESPONDERS = b"NATS/1.0 503"  # nats-server's status when no subscription takes a request
_ASYNC = pb.PublishAsyncError.Code


def ack_error_to_async(error: int) -> tuple[int, str] | None:
    """Liftbridge's convertAckError: None for OK, else (PublishAsyncError code, message)."""
    if error == ACK_OK:  # the module constant: a lookup through pb costs ~0.8 us per message
        return None
    if error == pb.Ack.Error.INCORRECT_OFFSET:
        return _ASYNC.INCORRECT_OFFSET, "incorrect expected offset"
    if error == pb.Ack.Error.TOO_LARGE:
        return _ASYNC.BAD_REQUEST, "message exceeds max replication size"
    if error == pb.Ack.Error.ENCRYPTION:
        return _ASYNC.ENCRYPTION_FAILED, "encryption failed on partition"
    return _ASYNC.UNKNOWN, "unknown error"


def nats_size(req, subject: str) -> int:
    """The size of the NATS message Liftbridge would have built for a gRPC publish (envelope
    header + Message protobuf), which it compares with clustering.replication.max.bytes.
    Exact when it matters: a cheap over-estimate first, the real protobuf size near the limit."""
    estimate = (len(req.value) + len(req.key) + len(req.stream) + len(subject)
                + len(req.ackInbox) + len(req.correlationId) + 64)
    headers = req.headers
    if headers:
        for name, value in headers.items():
            estimate += len(name) + len(value) + 24
    return estimate


def exact_nats_size(req, subject: str) -> int:
    msg = pb.Message(key=req.key, value=req.value, stream=req.stream, subject=subject,
                     headers=dict(req.headers), ackInbox=req.ackInbox,
                     correlationId=req.correlationId, ackPolicy=req.ackPolicy,
                     offset=getattr(req, "expectedOffset", 0))
    return 8 + msg.ByteSize()


class AckTemplate(envelope.AckTemplate):
    """Serialized PublishResponse{ack: Ack{...}, correlationId} of successful publishes to one
    partition with one ack policy: ``response(offset, correlation_id, commit_ns)`` returns the
    bytes ``pb.PublishResponse(correlationId=c, ack=pb.Ack(...)).SerializeToString()`` gives
    (api.proto: PublishResponse ack = 1, correlationId = 3; the Ack from the envelope module's
    AckTemplate, without ackInbox)."""

    __slots__ = ()

    def response(self, offset: int, correlation_id: str, commit_ns: int) -> bytes:
        corr = correlation_id.encode()
        ack = self.ack(offset, b"", corr, commit_ns)
        if not corr:
            return b"\x0a" + varint(len(ack)) + ack
        return b"".join((b"\x0a", varint(len(ack)), ack, b"\x1a", varint(len(corr)), corr))


class _RunSink(RunSink):
    """The RunSink of a PublishAsync run: answers go to the call's session, in the order of
    the run's correlation ids."""

    __slots__ = ("session", "correlation_ids")

    def __init__(self, session: _AsyncSession, template: AckTemplate,
                 correlation_ids: list[str]) -> None:
        super().__init__(template, GRPC)
        self.session = session
        self.correlation_ids = correlation_ids

    def answer(self, i: int, offset: int, commit_ns: int) -> None:
        session = self.session
        session.inflight -= 1
        session.send(self.template.response(offset, self.correlation_ids[i], commit_ns))

    def fail(self, i: int, error: BaseException) -> None:
        _failed(self.session, self.correlation_ids[i], error)


class _AsyncSession:
    """State of one PublishAsync call: requests of this loop turn, responses waiting to be
    written, acks outstanding."""

    __slots__ = ("batch", "out", "wake", "inflight", "reading", "error", "inbox", "acks",
                 "gate", "forwards", "batches", "next_batch", "enveloped", "service",
                 "resends", "closed")

    def __init__(self) -> None:
        self.batch: list[bytes] = []
        self.out: list[bytes] = []
        self.wake = asyncio.Event()
        self.inflight = 0
        self.reading = True
        self.error: tuple[grpc.StatusCode, str] | None = None
        self.inbox = ""  # the answer inboxes' prefix of publishes sent on to other leaders
        self.acks: asyncio.Future | None = None  # done: (data link, sid) of the inbox
        self.gate: asyncio.Future | None = None  # forwards wait for it: ``acks`` and resumes
        self.forwards: dict[str, list] = {}  # leader -> (request, its bytes, resuming) this turn
        self.batches: dict[int, list] = {}  # batch number -> its requests, answer awaited
        self.next_batch = 0
        self.enveloped = False  # forwarded the older way once: stays so (forward_older.py)
        self.service: Liftbridge | None = None  # set by send_forwards (resends need it)
        self.resends: set[asyncio.Task] = set()  # batches no server took, waiting to go again
        self.closed = False

    def forward(self, service: Liftbridge, req: pb.PublishRequest, raw: bytes,
                resuming: asyncio.Future | None = None) -> list | None:
        """Queue ``req`` (``raw``: its bytes) for its partition's leader, another server:
        ``send_forwards`` sends what one loop turn queued for one leader as one batch.
        Returns that leader's queue (later requests of the turn to the partition join it),
        None when ``req`` got an error.
        ``resuming``: the partition's resume (Liftbridge's resumeStream) this request and
        every later one wait for, so they keep their order; when it fails, this request gets
        its INTERNAL error and is not sent. No leader known: a NOT_FOUND error."""
        placed = service.broker.placement.of(req.stream, req.partition)
        if placed is None or not placed.leader:
            self.send_error(req.correlationId, _ASYNC.NOT_FOUND, f"no leader of partition "
                            f"{req.partition} of stream {req.stream} is known here")
            return None
        items = self.forwards.setdefault(placed.leader, [])
        items.append((req, raw, resuming))
        return items

    def send_forwards(self, service: Liftbridge) -> None:
        """Send the requests ``forward`` queued, one NATS message per leader (split to stay
        within NATS's max_payload: forward_batch.MAX_ITEMS_DIVISOR) on its
        ``<namespace>.forward.<leader>`` subject, answered on this call's
        ``<namespace>.ack.<id>.<batch>`` (subscribed first); the leader stores them as its own
        PublishAsync does and answers every request's PublishResponse at once. Without NATS:
        UNKNOWN errors."""
        forwards, self.forwards = self.forwards, {}
        if not forwards:
            return
        self.service = service
        bridge = service.bridge
        data_link = None if bridge is None else bridge.data
        if data_link is None or bridge.nc is None:
            for items in forwards.values():
                for req, _, _ in items:
                    self.send_error(req.correlationId, _ASYNC.UNKNOWN, "NATS is not connected: "
                                    "cannot reach the partition leader")
            return
        if self.acks is None:
            # on the data connection, the one the forwards leave on: nats-server has the
            # subscription before any forward (and passed it to its routes first), and its
            # "no responders" answer to a forward comes back here
            self.inbox = f"{service.namespace}.ack.{new_id()}"
            self.acks = asyncio.get_running_loop().create_future()
            self.acks.set_result((data_link, data_link.subscribe(
                self.inbox + ".*", "", self._on_answers)))
        if self.enveloped or not service.broker.placement.has_feature(FORWARD_BATCH):
            # an older server is in (or was when this call began: a batch sent after the
            # enveloped requests still travelling could be stored before them)
            self.enveloped = True
            send_enveloped(self, service, bridge, forwards, _after)
            return
        max_payload = bridge.nc.max_payload
        max_items = max(1, max_payload // MAX_ITEMS_DIVISOR)
        max_bytes = max_payload // 2
        for leader, items in forwards.items():
            subject = forward_subject(service.namespace, leader).encode()
            batch: list = []
            size = len(MAGIC)
            for item in items:
                framed = framed_size(item[1])
                if batch and (len(batch) >= max_items or size + framed > max_bytes):
                    self._send_batch(bridge, leader, subject, batch, max_payload)
                    batch, size = [], len(MAGIC)
                batch.append(item)
                size += framed
            self._send_batch(bridge, leader, subject, batch, max_payload)

    def _send_batch(self, bridge, leader: str, subject: bytes, batch: list,
                    max_payload: int) -> None:
        gate = self.gate or self.acks
        for resuming in {id(r): r for _, _, r in batch if r is not None}.values():
            gate = self.gate = asyncio.ensure_future(_after(resuming, gate))
        number = self.next_batch
        self.next_batch += 1
        self.inflight += sum(req.ackPolicy != NONE for req, _, _ in batch)

        def send(subscribing: asyncio.Future) -> None:  # once the answer inbox listens
            sent = []
            for req, raw, resuming in batch:
                if resuming is not None and not resuming.cancelled() and \
                        resuming.exception() is not None:
                    self._answer_failed([req], _ASYNC.INTERNAL,
                                        f"failed to resume stream: {resuming.exception()}")
                else:
                    sent.append((req, raw))
            if not sent:
                return
            reqs = [req for req, _ in sent]
            if subscribing.cancelled() or subscribing.exception() is not None:
                self._answer_failed(reqs, _ASYNC.UNKNOWN,
                                    "cannot listen for the partition leader's ack")
                return
            data = encode_items(MAGIC, [raw for _, raw in sent])
            if len(data) > max_payload:  # one request alone over NATS's limit
                self._answer_failed(reqs, _ASYNC.BAD_REQUEST,
                                    "message exceeds max replication size")
                return
            self.batches[number] = (leader, reqs)
            bridge.queue_publish(b"%b %b.%d" % (subject, self.inbox.encode(), number), data)
        gate.add_done_callback(send)

    def _answer_failed(self, reqs: list, code: int, message: str) -> None:
        """Every request of ``reqs`` gets the error; the acked ones are no longer awaited."""
        for req in reqs:
            if req.ackPolicy != NONE:
                self.inflight -= 1
            self.send_error(req.correlationId, code, message)

    def _on_answers(self, messages: list) -> None:
        """The data connection's messages on this call's inboxes (NatsDataLink handler)."""
        for _, subject, _, headers, data in messages:
            self._on_answer(subject, headers, data)

    def _on_answer(self, subject: str, headers: bytes | None, data: bytes) -> None:
        """A leader's answer to batch ``<inbox>.<n>``: its PublishResponses go to the client
        as they are; a failed batch or a malformed answer: every acked request gets an error;
        nats-server's "no responders" status (no server listens: the leader stopped taking
        batches): sent on (``_resend``). On ``<inbox>.e``: an enveloped ack of
        forward_older's fallback."""
        if subject.endswith(_ENVELOPED):
            on_enveloped_ack(self, data)
            return
        try:
            sent = self.batches.pop(int(subject.rsplit(".", 1)[1]), None)
        except ValueError:
            sent = None
        if sent is None:
            log.error("answer on %s: no forwarded batch of this call waits for it", subject)
            return
        leader, reqs = sent
        if not data and headers and headers.startswith(_NO_RESPONDERS):
            # no server took it (its leader stopped taking batches): nothing of it is stored,
            # so it goes to the partitions' next leader; their acks stay awaited meanwhile
            task = asyncio.get_running_loop().create_task(self._resend(leader, reqs))
            self.resends.add(task)
            task.add_done_callback(self.resends.discard)
            return
        self.inflight -= sum(req.ackPolicy != NONE for req in reqs)  # answered or given up
        self.wake.set()
        reason = decode_failed(data)
        if reason is None:
            try:
                answers = decode_items(data, ANSWER_MAGIC, len(reqs))
            except ForwardError as exc:
                log.error("malformed answer of a partition leader on %s: %s", subject, exc)
                reason = f"malformed answer of the partition leader: {exc}"
        if reason is not None:
            for req in reqs:
                if req.ackPolicy != NONE:
                    self.send_error(req.correlationId, _ASYNC.UNKNOWN, reason)
            return
        self.out += answers

    async def _resend(self, leader: str, reqs: list) -> None:
        """Send ``reqs`` (a batch no server took from ``leader``'s subject) on to their
        partitions' next leader once the placement names one other than ``leader`` (polled
        every RESEND_POLL_S, for RESEND_WAIT_S at most, while the call lasts); what is still
        waiting then stays unanswered, as Liftbridge leaves a publish to a partition subject
        nobody takes (the client's ack times out). A request resent may be stored after
        later ones of the call that went to the new leader at once."""
        service = self.service
        placement = service.broker.placement
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RESEND_WAIT_S
        waiting = list(reqs)
        while waiting and not self.closed and loop.time() < deadline:
            await asyncio.sleep(RESEND_POLL_S)
            ready = []
            for req in waiting:
                placed = placement.of(req.stream, req.partition)
                if placed is not None and placed.leader and placed.leader != leader:
                    ready.append(req)
            if not ready:
                continue
            taken = {id(req) for req in ready}
            waiting = [req for req in waiting if id(req) not in taken]
            self.inflight -= sum(req.ackPolicy != NONE for req in ready)
            # as if the client had sent them now: stored here if this server leads now
            self.batch += [req.SerializeToString() for req in ready]
            _publish_batch(service, self)
        if waiting:
            self.inflight -= sum(req.ackPolicy != NONE for req in waiting)
            self.wake.set()
            if not self.closed:  # a call that ended waits for nothing
                log.warning("%d forwarded publishes unanswered: no server takes them and no "
                            "other leader was named within %.0f s", len(waiting), RESEND_WAIT_S)

    def close(self) -> None:
        """Stop listening for forwarded acks."""
        self.closed = True
        for task in list(self.resends):
            task.cancel()
        if self.acks is not None:
            data_link, sid = self.acks.result()
            data_link.unsubscribe(sid)

    def send(self, data: bytes) -> None:
        self.out.append(data)
        self.wake.set()

    def send_error(self, correlation_id: str, code: int, message: str) -> None:
        self.send(pb.PublishResponse(
            correlationId=correlation_id, ack=pb.Ack(),
            asyncError=pb.PublishAsyncError(code=code, message=message)).SerializeToString())

    def deliver(self, ack: pb.Ack) -> None:
        self.inflight -= 1
        problem = ack_error_to_async(ack.ackError)
        if problem is not None:
            self.send_error(ack.correlationId, *problem)
        else:
            self.send(pb.PublishResponse(correlationId=ack.correlationId,
                                         ack=ack).SerializeToString())


async def _after(first: asyncio.Future, then: asyncio.Future):
    """``then``'s result, once ``first`` is done too (whatever its outcome)."""
    await asyncio.wait((first,))
    return await then


def _resume_failed(resuming: asyncio.Future) -> None:
    if not resuming.cancelled() and resuming.exception() is not None:
        log.error("resuming a partition a publish reached failed: %s", resuming.exception())


async def publish_async(service: Liftbridge, requests, context: grpc.aio.ServicerContext):
    """The PublishAsync RPC (async generator of serialized PublishResponse bytes; on a
    transport whose context has ``takes_lists`` true, of lists of them: the responses ready
    in one loop turn)."""
    session = _AsyncSession()
    reader = asyncio.get_running_loop().create_task(_publish_loop(service, requests, session))
    lists = getattr(context, "takes_lists", False)
    try:
        while True:
            out = session.out
            if out:
                session.out = []
                if lists:
                    yield out
                else:
                    for data in out:
                        yield data
                continue
            if session.error is not None:
                await context.abort(*session.error)
            if not session.reading:
                if session.inflight <= 0:
                    return
                try:
                    session.wake.clear()
                    await asyncio.wait_for(session.wake.wait(), ASYNC_ACK_TIMEOUT_S)
                except asyncio.TimeoutError:
                    log.warning("PublishAsync ended with %d acks outstanding", session.inflight)
                    return
                continue
            session.wake.clear()
            await session.wake.wait()
    finally:
        if not reader.done():
            reader.cancel()
        session.close()


async def _publish_loop(service: Liftbridge, requests, session: _AsyncSession) -> None:
    """Collects the requests of each loop turn; ``_publish_batch`` handles them after it."""
    call_soon = asyncio.get_running_loop().call_soon
    try:
        async for raw in requests:
            if session.error is not None:
                return
            if not session.batch:
                call_soon(_publish_batch, service, session)
            session.batch.append(raw)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the client went away: nothing to answer
        log.debug("PublishAsync reader ended: %s", exc)
    finally:
        _publish_batch(service, session)  # what the last turn brought
        session.reading = False
        session.wake.set()


def _publish_batch(service: Liftbridge, session: _AsyncSession) -> None:
    """Store the requests of one loop turn: runs of consecutive ones to the same partition
    with the same ack policy are encoded and appended together (one AckTemplate, one sink,
    counted once); a request needing a per-message check (optimistic concurrency, near the
    size limit) goes through ``Liftbridge.ingest`` alone, in its place."""
    raws, session.batch = session.batch, []
    if not raws or session.error is not None:
        return
    parse = pb.PublishRequest.FromString
    check = service.check_publish
    limit = service.config.replication_max_bytes
    now = time.time_ns()
    run: list = []
    run_key = None
    forwarded: dict = {}  # (stream, partition) -> (its leader's forwards, resuming) this turn
    for raw in raws:
        try:
            req = parse(raw)
        except DecodeError as exc:
            session.error = (grpc.StatusCode.INVALID_ARGUMENT, f"malformed PublishRequest: {exc}")
            break
        key = (req.stream, req.partition, req.ackPolicy)
        target = forwarded.get(key[:2]) if forwarded else None
        if target is not None:  # this turn sends its partition on already: checked then
            target[0].append((req, raw, target[1]))
            continue
        elsewhere = service.led_elsewhere(req.stream, req.partition)
        if elsewhere is not None:  # another server leads it: to it through NATS
            if run:
                _append_run(service, session, run, now)
                run = []
            run_key = None
            try:
                service.refuse_read_only(req.stream, req.partition)
            except LiftbridgeError as exc:
                session.send_error(req.correlationId, _ASYNC.READONLY, exc.message)
                continue
            resuming = service.resume_for_publish(req.stream, req.partition)
            items = session.forward(service, req, raw, resuming)
            if items is not None:
                forwarded[key[:2]] = (items, resuming)
            continue
        if key != run_key:
            if run:
                _append_run(service, session, run, now)
                run = []
            run_key = None
            try:
                stream, partition = check(req.stream, req.partition, req.ackPolicy)
            except LiftbridgeError as exc:
                session.send_error(req.correlationId, getattr(_ASYNC, exc.code, _ASYNC.UNKNOWN),
                                   exc.message)
                continue

            resuming = service.resume_for_publish(req.stream, req.partition)
            if resuming is not None:  # the writes go on meanwhile: they are this server's
                resuming.add_done_callback(_resume_failed)
            subject = partition_subject(stream.config.subject or "", partition.index)
            concurrency = stream.config.optimistic_concurrency
            run_key = key
        size = nats_size(req, subject)
        if size > limit or (concurrency and req.expectedOffset != -1):
            if run:
                _append_run(service, session, run, now)
                run = []
            _publish_one(service, session, req, stream, partition, subject,
                         size if size <= limit else exact_nats_size(req, subject))
            continue
        if not run:
            run.append((stream, partition, subject))
        run.append(req)
    if run:
        _append_run(service, session, run, now)
    session.send_forwards(service)


def _append_run(service: Liftbridge, session: _AsyncSession, run: list, now: int) -> None:
    (stream, partition, subject), reqs = run[0], run[1:]
    policy = reqs[0].ackPolicy
    subject_b = subject.encode()
    msg_subject = subject or None
    plain = {"subject": subject_b, "reply": b""}  # the headers of a request that has none
    records = []
    nbytes = 0
    for req in reqs:
        headers = req.headers
        hdrs = plain
        if headers:
            hdrs = dict(headers)
            hdrs["subject"] = subject_b
            hdrs["reply"] = b""
        value = req.value
        nbytes += len(value)
        records.append(Record(value=value, key=req.key or None, headers=hdrs, timestamp_ns=now,
                              subject=msg_subject, correlation_id=req.correlationId or None))
    sink = None
    if policy != NONE:
        sink = _RunSink(session, AckTemplate(stream.name, stream.config.subject or "", subject,
                                             policy, now), [req.correlationId for req in reqs])
    try:
        service.appenders.get(partition).extend(encode_records(records), sink)
    except Exception as exc:  # the partition went away under us
        for req in reqs:
            session.send_error(req.correlationId, _ASYNC.INTERNAL, str(exc))
        return
    if sink is not None:
        session.inflight += len(reqs)
    counters(stream.name, GRPC).published(len(reqs), nbytes)


def _publish_one(service: Liftbridge, session: _AsyncSession, req, stream, partition,
                 subject: str, size: int) -> None:
    corr = req.correlationId
    policy = req.ackPolicy
    wants = policy != NONE
    if wants:
        session.inflight += 1
    try:
        service.ingest(stream, partition, value=req.value, key=req.key or None,
                       headers=req.headers, msg_subject=subject, reply="",
                       ack_inbox="", correlation_id=corr, ack_policy=policy,
                       expected_offset=None if req.expectedOffset == -1 else req.expectedOffset,
                       size=size, deliver=session.deliver if wants else None,
                       fail=(lambda exc: _failed(session, corr, exc)) if wants else None,
                       door=GRPC)
    except Exception as exc:  # the partition went away under us
        if wants:
            session.inflight -= 1
        session.send_error(corr, _ASYNC.INTERNAL, str(exc))


def _failed(session: _AsyncSession, correlation_id: str, exc: BaseException) -> None:
    session.inflight -= 1
    session.send_error(correlation_id, _ASYNC.INTERNAL, f"write failed: {exc}")
