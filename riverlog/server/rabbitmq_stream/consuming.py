# Consuming on the RabbitMQ Stream door: Subscribe, Credit, Unsubscribe, ResolveOffsetSpec,
# StoreOffset and QueryOffset, and the delivery of chunks (one task per subscription).
# Owns a connection's subscriptions.
# Rules: only committed chunks are sent; credit counts chunks and is never exceeded; a chunk
# a subscription's filter cannot match is skipped without using credit; delivery waits while
# the socket's send buffer is full; an unfiltered subscription on a connection that can
# sendfile sends large chunks' data from the segment file (sendfile.py) when nothing waits in
# the socket's buffer; consumers read any local replica; consumer offsets are
# stored and queried at the partition's leader (forwarded when another server leads it); a
# single active consumer's membership is the ``groups`` object's (single_active.py).
from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Awaitable, Callable, Collection, Protocol

from ...broker import Partition, Stream
from ...broker.placement import OffsetsUnavailable
from ...errors import CorruptChunkError, LogClosedError, LogError, OffsetOutOfRangeError
from ...log.bloom import ChunkFilter, filter_from_properties
from ...log import ChunkSpan
from ...log.chunk import CHUNK_USER
from ...metrics import RABBITMQ_STREAM, counters
from ...protocol.rabbitmq_stream import OffsetType, ResponseCode
from ...protocol.rabbitmq_stream import frames as f
from ...security.authz import CONSUME
from .link import Link
from .sendfile import SENDFILE_MIN_BYTES

log = logging.getLogger("riverlog.rabbitmq_stream")

OK = ResponseCode.OK
READ_BYTES = 1024 * 1024


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


def _offset_answer(respond: Callable[[int, int], f.Frame], offset: int | None) -> f.Frame:
    """The QueryOffset response for a stored ``offset`` (None: NO_OFFSET, 0x13)."""
    return respond(ResponseCode.NO_OFFSET, 0) if offset is None else respond(OK, offset)


class Groups(Protocol):
    """Single active consumer groups as consuming uses them (single_active.SingleActive)."""

    def join(self, frame: f.Subscribe, group: str, index: int) -> None: ...

    def leave(self, subscription_id: int) -> None: ...

    def forget(self, subscription_id: int) -> None: ...


class Subscription:
    """One Subscribe: a task that sends chunks from ``offset`` on while credit lasts. With
    ``offset`` None (a single active consumer not active yet) there is no task until
    ``start``; meanwhile ``offset`` is the partition's next offset (lag 0). ``name`` is
    the stream name subscribed to, ``partition`` the partition of ``stream`` it serves.
    ``properties`` are the Subscribe properties; ``consumed`` counts the messages sent, as
    RabbitMQ's messages_consumed counter (for the management API)."""

    __slots__ = ("link", "id", "stream", "partition", "name", "offset", "credit",
                 "_credit_event", "_buffer", "task", "chunk_filter", "properties", "consumed")

    def __init__(self, link: Link, sub_id: int, stream: Stream, partition: Partition,
                 name: str, offset: int | None, credit: int,
                 chunk_filter: ChunkFilter | None = None,
                 properties: dict[str, str] | None = None) -> None:
        self.link = link
        self.properties = properties or {}
        self.consumed = 0
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
        link = self.link
        flow = link.flow
        send_chunk, send_span = link.send_chunk, link.send_span
        counted = counters(self.stream.name, RABBITMQ_STREAM)
        try:
            while True:
                if self.credit <= 0:
                    self._credit_event.clear()
                    await self._credit_event.wait()
                    continue
                await flow.writable()
                # reuse the read buffer only once the socket took every byte sent from it
                buffer = self._buffer if flow.idle() else None
                try:
                    if self.chunk_filter is None and buffer is not None and \
                            link.sendfile_fd >= 0:
                        chunks = partition.read_spans(self.offset, READ_BYTES, self.credit,
                                                      SENDFILE_MIN_BYTES, buffer)
                    elif self.chunk_filter is None:
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
                spans = type(chunks[0]) is ChunkSpan
                read = 0 if spans else sum(len(c.raw) for c in chunks)
                if read > len(self._buffer):  # it came as new bytes: grow for next time
                    self._buffer = bytearray(read)
                messages = sent = 0
                for chunk in chunks:
                    if self.credit <= 0:
                        break
                    self.offset = chunk.header.next_offset
                    if chunk.header.chunk_type != CHUNK_USER:
                        continue
                    if spans:  # its data by os.sendfile from the segment file (sendfile.py)
                        send_span(self.id, partition, chunk)
                        sent += chunk.size
                    else:
                        data = chunk.header_and_data
                        send_chunk(self.id, partition, data)
                        sent += len(data)
                    self.credit -= 1
                    messages += chunk.header.num_records
                if messages:
                    self.consumed += messages
                    counted.delivered(messages, sent)
        except LogClosedError:  # stream deleted or server stopping
            return
        except CorruptChunkError as exc:
            log.error("subscription %d on %r stopped: %s", self.id, self.stream.name, exc)
            link.send(f.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, self.name))


class Consuming:
    """The consuming commands of one connection (``link``); ``groups`` (set by the
    connection) handles single active consumers."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.send = link.send
        self.subscriptions: dict[int, Subscription] = {}
        self.groups: Groups | None = None

    def on_subscribe(self, frame: f.Subscribe) -> None:
        link = self.link
        if frame.subscription_id in self.subscriptions:
            self.send(f.SubscribeResponse(frame.correlation_id,
                                          ResponseCode.SUBSCRIPTION_ID_ALREADY_EXISTS))
            return
        found = link.resolve(frame.stream)
        if not link.may(frame.stream, CONSUME, found):
            self.send(f.SubscribeResponse(frame.correlation_id, ResponseCode.ACCESS_REFUSED))
            return
        if found is None:
            self.send(f.SubscribeResponse(frame.correlation_id, link.missing(frame.stream)))
            return
        stream, partition = found
        offset = resolve_offset(partition, frame.offset_type, frame.offset)
        properties = frame.properties or {}
        # single active consumer (as RabbitMQ's reader): the `name` property is required
        sac = properties.get("single-active-consumer") == "true"
        group = properties.get("name") if sac else None
        server = link.server
        index = server.super_streams.partition_index(
            properties.get("super-stream", ""), frame.stream) if sac else -1
        if offset is None or sac and (group is None or server.sac.conflicts(
                frame.stream, group, index)):
            self.send(f.SubscribeResponse(frame.correlation_id,
                                          ResponseCode.PRECONDITION_FAILED))
            return
        self.send(f.SubscribeResponse(frame.correlation_id, OK))
        self.subscriptions[frame.subscription_id] = Subscription(
            link, frame.subscription_id, stream, partition, frame.stream,
            None if sac else offset, frame.credit, filter_from_properties(frame.properties),
            properties)
        if sac:
            self.groups.join(frame, group, index)

    def on_resolve_offset_spec(self, frame: f.ResolveOffsetSpec) -> None:
        """ResolveOffsetSpec (0x1f): the offset a Subscribe with this offset spec would start
        at, answered as type OFFSET (as RabbitMQ does). Properties are accepted; filter
        properties do not move the answer (a filtered subscription skips chunks itself)."""
        link = self.link
        code, offset = OK, 0
        found = link.resolve(frame.stream)
        if not link.may(frame.stream, CONSUME, found):
            code = ResponseCode.ACCESS_REFUSED
        elif found is None:
            code = link.missing(frame.stream)
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
        with self.link.notes_after():  # UnsubscribeResponse, then a ConsumerUpdate it causes
            self.groups.leave(frame.subscription_id)
            self.send(f.UnsubscribeResponse(frame.correlation_id, OK))

    def on_store_offset(self, frame: f.StoreOffset) -> None:
        """Stored by the partition's leader (a tracking chunk of its log, replicated with
        the data); a server that does not lead it passes it to the leader, as RabbitMQ's
        reader does. No response (RabbitMQ's is a cast); a refused one is logged."""
        link = self.link
        found = link.resolve(frame.stream)
        place = link.place(frame.stream, found)
        if place is None or not frame.reference or not link.may(frame.stream, CONSUME, found):
            return
        name, index, _ = place
        placement = link.broker.placement
        if found is None or not placement.leads(name, index):
            self._forward(placement.store_offset_at_leader(name, index, frame.reference,
                                                           frame.offset), frame.stream)
            return
        try:
            found[1].store_offset(frame.reference, frame.offset)
        except (ValueError, LogError) as exc:  # RabbitMQ logs a reference too long
            log.warning("StoreOffset %r (%d bytes) on %r not stored: %s",
                        frame.reference[:64], len(frame.reference.encode()), frame.stream, exc)

    def _forward(self, request: Awaitable[object], stream: str) -> None:
        """Run a request to a partition's leader in the background; its failure is logged."""
        async def run() -> None:
            try:
                await request
            except OffsetsUnavailable as exc:
                log.warning("StoreOffset on %r: the leader could not take it: %s", stream, exc)
        self.link.background(run())

    def on_query_offset(self, frame: f.QueryOffset) -> None:
        """Answered from the partition's leader, as RabbitMQ's reader reads the leader's
        tracking: here when this server leads it, else asked of the leader
        (STREAM_NOT_AVAILABLE when it cannot be)."""
        link = self.link
        found = link.resolve(frame.stream)
        respond = partial(f.QueryOffsetResponse, frame.correlation_id)
        if not link.may(frame.stream, CONSUME, found):
            self.send(respond(ResponseCode.ACCESS_REFUSED, 0))
            return
        place = link.place(frame.stream, found)
        if place is None:
            self.send(respond(link.missing(frame.stream), 0))
            return
        name, index, _ = place
        placement = link.broker.placement
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
        link.background(ask())

    def drop(self, partitions: Collection[Partition]) -> list[str]:
        """End the subscriptions on ``partitions`` (their groups forget them: the server
        dropped them); the stream names they were made on."""
        touched = []
        for sub_id, sub in list(self.subscriptions.items()):
            if sub.partition in partitions:
                sub.cancel()
                del self.subscriptions[sub_id]
                self.groups.forget(sub_id)
                touched.append(sub.name)
        return touched

    def stop(self) -> None:
        """Stop every delivery (shutdown); the subscriptions stay."""
        for sub in self.subscriptions.values():
            sub.cancel()

    def close(self) -> None:
        """The connection is gone: stop and forget every subscription."""
        self.stop()
        self.subscriptions.clear()
