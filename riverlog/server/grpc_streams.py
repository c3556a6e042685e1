# The two streaming RPCs of the Liftbridge gRPC door: Subscribe (server streaming) and
# PublishAsync (bidirectional). Requests arrive as raw bytes and answers leave as raw bytes
# (the handlers parse and serialize themselves, so a malformed request gets InvalidArgument).
# Rules (reference/liftbridge.md "Behaviour clients rely on"; liftbridge server/api.go and
# partition.go): Subscribe sends an empty Message first, then committed messages only, with the
# headers "subject"/"reply"; it ends with ResourceExhausted at a stop offset, at the end of a
# read-only partition, or for STOP_LATEST on an empty partition; a newer group member takes a
# partition over from an older one. PublishAsync answers every message whose ack policy is not
# NONE, errors as {correlationId, ack: Ack{}, asyncError}; after the client half-closes it waits
# up to 5 s for outstanding acks.
from __future__ import annotations

import asyncio
import collections
import logging

import grpc
from google.protobuf.message import DecodeError

from ..broker import Partition
from ..errors import CorruptChunkError, LogClosedError, OffsetOutOfRangeError
from ..log.chunk import CHUNK_USER, ChunkFormatError
from ..metrics import GRPC, counters
from ..protocol.liftbridge import api_pb2 as pb
from ..record import decode_record
from .liftbridge import ACK_OK, NONE, Liftbridge, LiftbridgeError, partition_subject

log = logging.getLogger("riverlog.grpc")

WAIT_FOR_NEW = -1
ASYNC_ACK_TIMEOUT_S = 5.0
READ_BYTES = 1024 * 1024
_SP = pb.StartPosition
_STOP = pb.StopPosition
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


# ---------------------------------------------------------------------------------------------
# Subscribe
# ---------------------------------------------------------------------------------------------

def _record_timestamps(partition: Partition, offset: int):
    """Yield (offset, timestamp ns) of committed records from ``offset`` on."""
    while True:
        try:
            chunks = partition.read_chunks(offset, READ_BYTES)
        except OffsetOutOfRangeError:
            offset = partition.first_offset
            continue
        if not chunks:
            return
        for chunk in chunks:
            if chunk.header.chunk_type != CHUNK_USER:
                offset = chunk.header.next_offset
                continue
            default_ns = chunk.header.timestamp_ms * 1_000_000
            for rec_offset, raw in chunk.records():
                if rec_offset >= offset:
                    yield rec_offset, decode_record(raw, default_ns).timestamp_ns
            offset = chunk.header.next_offset


def first_offset_at(partition: Partition, ts_ns: int) -> int:
    """First offset whose timestamp is >= ``ts_ns``; the next offset when there is none."""
    start = partition.offset_for_timestamp(ts_ns // 1_000_000)
    for offset, ts in _record_timestamps(partition, max(start, partition.first_offset)):
        if ts >= ts_ns:
            return offset
    return partition.next_offset


def last_offset_before(partition: Partition, ts_ns: int) -> int:
    """Latest offset whose timestamp is <= ``ts_ns``; -1 when there is none."""
    start = max(partition.offset_for_timestamp(ts_ns // 1_000_000), partition.first_offset)
    last = start - 1
    for offset, ts in _record_timestamps(partition, start):
        if ts > ts_ns:
            return last
        last = offset
    return last if last >= partition.first_offset else -1


async def subscribe(service: Liftbridge, raw: bytes, context: grpc.aio.ServicerContext):
    """The Subscribe RPC (async generator of serialized Message bytes)."""
    try:
        req = pb.SubscribeRequest.FromString(raw)
    except DecodeError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed SubscribeRequest: {exc}")
    group = req.consumer.groupId if req.HasField("consumer") else ""
    consumer = req.consumer.consumerId if req.HasField("consumer") else ""
    epoch = req.consumer.groupEpoch if req.HasField("consumer") else 0
    if group and not consumer:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            "Consumer id cannot be empty when group id is provided")
    partition = service.partition(req.stream, req.partition)
    if partition is None:
        await context.abort(grpc.StatusCode.NOT_FOUND, "No such partition")
    stream = service.broker.streams[req.stream]
    if req.resume and partition.paused:
        service.resume(stream, [partition])
    elif partition.paused:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                            "partition is paused (subscribe with resume, or publish to it)")
    previous = None
    if group:
        previous = service.group_subscribers.get(id(partition), {}).get(group)
        if previous is not None and previous[1] > epoch:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "Consumer is not currently assigned this partition")
    start, stop = await _positions(partition, req, context)
    if stop != WAIT_FOR_NEW and stop < start:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"Stop offset is before start offset: {stop} < {start}")

    stopped = asyncio.get_running_loop().create_future()

    def stop_me() -> None:
        if not stopped.done():
            stopped.set_result(None)

    if group:
        if previous is not None:
            previous[2]()  # the older member's subscription ends
        service.group_subscribers.setdefault(id(partition), {})[group] = (consumer, epoch, stop_me)
    key = id(partition)
    service.subscribers[key] = service.subscribers.get(key, 0) + 1
    try:
        yield b""  # the empty Message: "subscription created"
        async for message in _messages(service, stream, partition, start, stop, stopped, context):
            yield message
    finally:
        service.subscribers[key] = service.subscribers.get(key, 1) - 1
        if service.subscribers[key] <= 0:
            service.subscribers.pop(key, None)
        if group:
            members = service.group_subscribers.get(key)
            if members is not None and members.get(group, (None,))[0] == consumer:
                del members[group]
                if not members:
                    del service.group_subscribers[key]


async def _positions(partition: Partition, req, context) -> tuple[int, int]:
    newest = partition.next_offset - 1
    sp = req.startPosition
    if sp == _SP.OFFSET:
        start = req.startOffset
    elif sp == _SP.TIMESTAMP:
        start = first_offset_at(partition, req.startTimestamp)
    elif sp == _SP.EARLIEST:
        start = partition.first_offset
    elif sp == _SP.LATEST:
        start = newest
    elif sp == _SP.NEW_ONLY:
        start = newest + 1
    else:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Unknown StartPosition {sp}")
    start = max(start, 0)
    st = req.stopPosition
    if st == _STOP.STOP_ON_CANCEL:
        stop = newest if partition.readonly and newest >= 0 else WAIT_FOR_NEW
    elif st == _STOP.STOP_OFFSET:
        stop = req.stopOffset
    elif st == _STOP.STOP_TIMESTAMP:
        stop = last_offset_before(partition, req.stopTimestamp)
    elif st == _STOP.STOP_LATEST:
        stop = newest
        if stop == -1:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stream is empty")
    else:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Unknown StopPosition {st}")
    return start, stop


async def _messages(service: Liftbridge, stream, partition: Partition, offset: int, stop: int,
                    stopped: asyncio.Future, context):
    name, index = stream.name, partition.index
    Message = pb.Message
    counted = counters(name, GRPC)
    while True:
        if stopped.done():
            return
        try:
            chunks = partition.read_chunks(max(offset, partition.first_offset), READ_BYTES)
        except OffsetOutOfRangeError:
            offset = partition.first_offset
            continue
        except LogClosedError:
            await _closed(service, stream, partition, context)
            return
        except CorruptChunkError as exc:
            log.error("subscription to %s/%d stopped: %s", name, index, exc)
            await context.abort(grpc.StatusCode.DATA_LOSS, str(exc))
        if not chunks:
            if partition.readonly:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "End of readonly partition")
            if partition.paused:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "partition was paused")
            interrupt = service.interrupt_future(partition)
            waiter = asyncio.ensure_future(partition.wait_for(offset))
            try:
                await asyncio.wait((waiter, interrupt, stopped),
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                service.forget_interrupt(partition, interrupt)
                if not waiter.done():
                    waiter.cancel()
            if waiter.done() and not waiter.cancelled() and waiter.exception() is not None:
                if isinstance(waiter.exception(), LogClosedError):
                    await _closed(service, stream, partition, context)
                    return
            continue
        for chunk in chunks:
            header = chunk.header
            if header.chunk_type != CHUNK_USER:
                offset = header.next_offset
                continue
            default_ns = header.timestamp_ms * 1_000_000
            sent = nbytes = 0  # counted once per chunk (and before leaving mid-chunk)
            try:
                for rec_offset, raw in chunk.records():
                    if rec_offset < offset:
                        continue
                    record = decode_record(raw, default_ns)
                    headers = record.headers
                    subject = headers.get("subject")
                    reply = headers.get("reply")
                    msg = Message(
                        offset=rec_offset, key=record.key or b"", value=record.value,
                        timestamp=record.timestamp_ns, stream=name, partition=index,
                        subject=subject.decode("utf-8", "replace") if subject is not None
                        else (record.subject or ""),
                        replySubject=reply.decode("utf-8", "replace") if reply is not None
                        else (record.reply or ""),
                        headers=headers)
                    yield msg.SerializeToString()
                    sent += 1
                    nbytes += len(record.value)
                    if rec_offset == stop or stopped.done():
                        counted.delivered(sent, nbytes)
                        if rec_offset == stop:
                            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                "Stop offset reached")
                        return
            except ChunkFormatError as exc:  # e.g. a sub-batch body its codec cannot undo
                counted.delivered(sent, nbytes)
                log.error("subscription to %s/%d stopped at chunk %d: %s", name, index,
                          header.first_offset, exc)
                await context.abort(grpc.StatusCode.DATA_LOSS, f"records of chunk "
                                    f"{header.first_offset} cannot be decoded: {exc}")
            if sent:
                counted.delivered(sent, nbytes)
            offset = header.next_offset


async def _closed(service: Liftbridge, stream, partition: Partition, context) -> None:
    if service.broker.streams.get(stream.name) is not stream:
        await context.abort(grpc.StatusCode.NOT_FOUND, "stream was deleted")
    if partition.paused:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "partition was paused")
    await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")


# ---------------------------------------------------------------------------------------------
# PublishAsync
# ---------------------------------------------------------------------------------------------

class _AsyncSession:
    """State of one PublishAsync call: responses waiting to be written, acks outstanding."""

    __slots__ = ("out", "wake", "inflight", "reading", "error")

    def __init__(self) -> None:
        self.out: collections.deque[bytes] = collections.deque()
        self.wake = asyncio.Event()
        self.inflight = 0
        self.reading = True
        self.error: tuple[grpc.StatusCode, str] | None = None

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


async def publish_async(service: Liftbridge, requests, context: grpc.aio.ServicerContext):
    """The PublishAsync RPC (async generator of serialized PublishResponse bytes)."""
    session = _AsyncSession()
    reader = asyncio.get_running_loop().create_task(_publish_loop(service, requests, session))
    try:
        while True:
            out = session.out
            while out:
                yield out.popleft()
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


async def _publish_loop(service: Liftbridge, requests, session: _AsyncSession) -> None:
    parse = pb.PublishRequest.FromString
    check = service.check_publish
    ingest = service.ingest
    limit = service.config.replication_max_bytes
    deliver = session.deliver
    try:
        async for raw in requests:
            try:
                req = parse(raw)
            except DecodeError as exc:
                session.error = (grpc.StatusCode.INVALID_ARGUMENT, f"malformed PublishRequest: {exc}")
                return
            corr = req.correlationId
            try:
                stream, partition = check(req.stream, req.partition, req.ackPolicy)
            except LiftbridgeError as exc:
                session.send_error(corr, getattr(_ASYNC, exc.code, _ASYNC.UNKNOWN), exc.message)
                continue
            if service.needs_resume(stream, partition):
                service.resume_for_publish(stream, partition)
            subject = partition_subject(stream.config.subject or "", partition.index)
            size = nats_size(req, subject)
            if size > limit:
                size = exact_nats_size(req, subject)
            policy = req.ackPolicy
            wants = policy != NONE
            if wants:
                session.inflight += 1
            try:
                ingest(stream, partition, value=req.value, key=req.key or None,
                       headers=req.headers, msg_subject=subject, reply="",
                       ack_inbox="", correlation_id=corr, ack_policy=policy,
                       expected_offset=None if req.expectedOffset == -1 else req.expectedOffset,
                       size=size,
                       deliver=deliver if wants else None,
                       fail=(lambda exc, c=corr: _failed(session, c, exc)) if wants else None,
                       door=GRPC)
            except Exception as exc:  # the partition went away under us
                if wants:
                    session.inflight -= 1
                session.send_error(corr, _ASYNC.INTERNAL, str(exc))
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the client went away: nothing to answer
        log.debug("PublishAsync reader ended: %s", exc)
    finally:
        session.reading = False
        session.wake.set()


def _failed(session: _AsyncSession, correlation_id: str, exc: BaseException) -> None:
    session.inflight -= 1
    session.send_error(correlation_id, _ASYNC.INTERNAL, f"write failed: {exc}")

