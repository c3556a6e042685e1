# The Subscribe RPC of the Liftbridge gRPC door (server streaming). The request arrives as raw
# bytes and messages leave as raw bytes (a malformed request gets InvalidArgument).
# Rules (reference/liftbridge.md "Behaviour clients rely on"; liftbridge server/api.go and
# partition.go): Subscribe sends an empty Message first, then committed messages only, with the
# headers "subject"/"reply"; it ends with ResourceExhausted at a stop offset, at the end of a
# read-only partition, or for STOP_LATEST on an empty partition; a newer group member takes a
# partition over from an older one; the records of a sub-batch that cannot be read are skipped
# (logged, counted in riverlog_errors as UNREADABLE_SUB_BATCH), as compaction leaves gaps, and
# the subscription goes on after them.
# In a cluster, Subscribe off the partition's leader is FailedPrecondition unless
# readISRReplica; a running Subscribe whose server loses the partition's leadership ends with
# Unavailable "Server not partition leader" (unless readISRReplica and this server is still in
# the ISR; such a one also ends when this server leaves the ISR under the same leader), so the
# client resubscribes at the new leader.
from __future__ import annotations

import asyncio
import logging

import grpc
from google.protobuf.message import DecodeError

from ..broker import Partition
from ..errors import CorruptChunkError, LogClosedError, OffsetOutOfRangeError
from ..log.chunk import CHUNK_USER, ChunkFormatError, ignore_unreadable, log_unreadable
from ..metrics import GRPC, counters, error as count_error
from ..protocol.liftbridge import api_pb2 as pb
from ..protocol.liftbridge.messages import MessageEncoder
from ..record import decode_record
from .liftbridge import Liftbridge, LiftbridgeError
from .memory import release_soon

log = logging.getLogger("riverlog.grpc")

WAIT_FOR_NEW = -1
READ_BYTES = 1024 * 1024
SUBSCRIBER_READ_BYTES = 64 * 1024
"""What a Subscribe reads ahead (at least one chunk): a slow subscriber holds that much."""
_SP = pb.StartPosition
_STOP = pb.StopPosition
DEPOSED = (grpc.StatusCode.UNAVAILABLE, "Server not partition leader")
"""How a running Subscribe ends when its server stops leading the partition. Liftbridge
(50ac358) has no such end: its deposed leader keeps serving from its now follower log, and a
leader failover reaches a client as the leader's connection lost, Unavailable. That code is the
one on which go-liftbridge's dispatchStream resubscribes to the partition's leader from the
last offset + 1 (FailedPrecondition it reports as a paused partition); gufo-liftbridge
resubscribes on it too. The message is Liftbridge's refusal of a Subscribe off the leader."""


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
            for rec_offset, raw in chunk.records(ignore_unreadable):
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
    if not service.broker.placement.leads(req.stream, req.partition):  # Liftbridge's api.go
        if not req.readISRReplica:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "Server not partition leader")
        if group:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "Consumer groups not compatible with ReadISRReplica")
    stream = service.broker.streams[req.stream]
    if req.resume and partition.paused:
        try:
            await service.resume(req.stream, [req.partition])
        except LiftbridgeError as exc:
            await context.abort(getattr(grpc.StatusCode, exc.code), exc.message)
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

    def stop_me(status: tuple[grpc.StatusCode, str] | None = None) -> None:
        """End the subscription: quietly (None), or with gRPC ``status``."""
        if not stopped.done():
            stopped.set_result(status)

    placement = service.broker.placement

    def leader_changed(name: str, index: int) -> None:
        if (name, index) != (req.stream, req.partition) or placement.leads(name, index):
            return
        placed = placement.of(name, index)
        if not (req.readISRReplica and placed is not None and placement.server_id in placed.isr):
            stop_me(DEPOSED)

    if group:
        if previous is not None:
            previous[2]()  # the older member's subscription ends
        service.group_subscribers.setdefault(id(partition), {})[group] = (consumer, epoch, stop_me)
    key = id(partition)
    service.subscribers[key] = service.subscribers.get(key, 0) + 1
    unlisten = placement.add_leader_listener(leader_changed, isr=True) \
        if placement.clustered else None
    try:
        yield b""  # the empty Message: "subscription created"
        async for message in _messages(service, stream, partition, start, stop, stopped, context):
            yield message
        if stopped.done() and stopped.result() is not None:
            await context.abort(*stopped.result())
    finally:
        if unlisten is not None:
            unlisten()
        release_soon()  # what this subscription held goes back to the OS, not only to malloc
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
    counted = counters(name, GRPC)
    lists = getattr(context, "takes_lists", False)  # the h2 transport takes lists
    logged = log_unreadable(log, f"subscription to {name}/{index}")
    encoder = MessageEncoder(name, index)

    def unreadable(first: int, records: int, error: ChunkFormatError) -> None:
        if first + records > offset:
            logged(first, records, error)
            count_error(GRPC, "UNREADABLE_SUB_BATCH")

    while True:
        if stopped.done():
            return
        try:
            chunks = partition.read_chunks(max(offset, partition.first_offset),
                                           SUBSCRIBER_READ_BYTES)
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
        batch, nbytes, offset, problem = _serialize(chunks, offset, stop, encoder, unreadable)
        del chunks  # while the client is slow, only the serialized batch waits
        if batch:
            if lists:
                yield batch
            else:
                for message in batch:
                    yield message
            counted.delivered(len(batch), nbytes)
            batch = None
        if problem is not None:
            first, exc = problem
            log.error("subscription to %s/%d stopped at chunk %d: %s", name, index, first, exc)
            await context.abort(grpc.StatusCode.DATA_LOSS,
                                f"records of chunk {first} cannot be decoded: {exc}")
        if 0 <= stop < offset:  # reached, or in a gap (an unreadable sub-batch)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop offset reached")


def _serialize(chunks, offset: int, stop: int, encoder: MessageEncoder, unreadable):
    """The serialized Messages of the records of ``chunks`` from ``offset`` up to ``stop``
    (WAIT_FOR_NEW: no stop). Returns (messages, value bytes, the offset to read next,
    None or (first offset of a chunk whose entries cannot be walked, its error))."""
    batch: list[bytes] = []
    counted = encoder.value_bytes
    extend = encoder.extend
    for chunk in chunks:
        header = chunk.header
        if header.chunk_type != CHUNK_USER:
            offset = header.next_offset
            continue
        try:
            reached = extend(batch, chunk.records(unreadable), offset, stop,
                             header.timestamp_ms * 1_000_000)
        except ChunkFormatError as exc:  # entries that cannot be walked (not a sub-batch)
            return batch, encoder.value_bytes - counted, offset, (header.first_offset, exc)
        if reached:
            return batch, encoder.value_bytes - counted, stop + 1, None
        offset = header.next_offset
        if 0 <= stop < offset:  # in a gap (an unreadable sub-batch): nothing after it
            break
    return batch, encoder.value_bytes - counted, offset, None


async def _closed(service: Liftbridge, stream, partition: Partition, context) -> None:
    if service.broker.streams.get(stream.name) is not stream:
        await context.abort(grpc.StatusCode.NOT_FOUND, "stream was deleted")
    if partition.paused:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "partition was paused")
    await context.abort(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
