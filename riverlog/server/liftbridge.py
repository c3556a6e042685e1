# Liftbridge semantics shared by the two Liftbridge doors (NATS bridge and gRPC API): stream
# administration with Liftbridge's rules (subjects, reserved names, pause/resume, read-only),
# the publish path (size limit, optimistic concurrency, ack policies and the Ack they produce),
# cursors, consumer groups, the activity stream and auto pause. The doors translate their wire
# requests into calls here and the answers back; this module owns no socket.
# Rules: every write goes through the broker's per-partition Appender (one chunk per partition
# per event-loop turn); an Ack is produced per ack policy (LEADER once written, ALL once
# committed, NONE never) with correlation id and reception/commit timestamps in ns; stored
# Liftbridge messages carry the headers "subject" and "reply" as Liftbridge adds them.
# Wire facts: reference/liftbridge.md; details (messages, checks, their order) from liftbridge's
# server/api.go, partition.go, metadata.go (liftbridge-io/liftbridge 50ac358).
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Awaitable, Callable, Iterable

from ..broker import Broker, Partition, Stream, StreamConfig, check_writable
from ..broker.appender import Appenders
from ..broker.broker import ACTIVITY_STREAM
from ..broker.cursors import Cursors
from ..broker.placement import PartitionFlags
from ..config import GrpcConfig, NatsConfig
from ..errors import (ClusterUnavailableError, InvalidArgumentError, LimitExceededError,
                      ReservedStreamError, ResourceExhaustedError, StreamExistsError,
                      StreamNotFoundError)
from ..metrics import counters, error as count_error
from ..protocol.liftbridge import api_pb2 as pb
from ..protocol.nats_subject import queue_problem, subject_problem
from ..record import Record, encode_record
from ..vhost_names import hidden
from .ack_sinks import AckSink
from .activity import ActivityStream
from .auto_pause import idle_partitions
from .server_id import load_server_id

log = logging.getLogger("riverlog.liftbridge")

LEADER, ALL, NONE = pb.AckPolicy.LEADER, pb.AckPolicy.ALL, pb.AckPolicy.NONE
ACK_OK = pb.Ack.Error.OK
ACK_INCORRECT_OFFSET = pb.Ack.Error.INCORRECT_OFFSET
ACK_TOO_LARGE = pb.Ack.Error.TOO_LARGE
ACK_UNKNOWN = pb.Ack.Error.UNKNOWN
_RUNNING = PartitionFlags()  # the flags of a partition the placement does not know


class LiftbridgeError(Exception):
    """A request refused with Liftbridge's answer: ``code`` is a grpc.StatusCode name
    ("NOT_FOUND", "INVALID_ARGUMENT", ...) and the message is Liftbridge's text."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def partition_subject(subject: str, index: int) -> str:
    """The NATS subject partition ``index`` listens on: ``subject``, ``subject.1``, ..."""
    return subject if index == 0 else f"{subject}.{index}"


def nats_problem(subject: str, group: str) -> str | None:
    """Why NATS cannot take a stream's ``subject`` (wildcards allowed) or queue ``group``
    ("" is none), in Liftbridge's words and why ("Subject is invalid: it has an empty
    token"); None when it can (riverlog.protocol.nats_subject)."""
    problem = subject_problem(subject, wildcards=True)
    if problem is not None:
        return f"Subject is invalid: it {problem}"
    problem = queue_problem(group)
    return None if problem is None else f"Group is invalid: it {problem}"


def writable(name: str, code: str) -> None:
    """The broker's rule on reserved streams (check_writable) in Liftbridge's words: raises
    LiftbridgeError ``code`` "Stream is reserved"."""
    try:
        check_writable(name)
    except ReservedStreamError:
        raise LiftbridgeError(code, "Stream is reserved") from None


class Liftbridge:
    """The Liftbridge side of one riverlog server. ``open()`` (sync, after the broker is
    open), ``start()`` (on the loop), ``await close()``."""

    def __init__(self, broker: Broker, config: GrpcConfig, nats: NatsConfig | None) -> None:
        self.broker = broker
        self.config = config
        self.namespace = nats.namespace if nats is not None else NatsConfig().namespace
        self.server_id = load_server_id(broker.data_dir, config.server_id)
        if not broker.placement.server_id:  # a single server: this id leads everything
            broker.placement.server_id = self.server_id
        self.appenders = Appenders(config.batch_max_messages)
        self.cursors = Cursors(broker, self.appenders, config.cursors_partitions,
                               f"{self.namespace}.cursors", config.cursors_replication_factor,
                               config.cursors_max_per_stream)
        self.groups = broker.placement.consumer_groups(
            broker.data_dir, config.consumer_timeout_ms, config.coordinator_timeout_ms,
            self._partition_count, self._group_left)
        self.bridge = None  # the NatsBridge, when NATS is on (set by the App)
        self.host = config.host
        self.port = config.port
        # per partition (by id): active Subscribe calls, and group id -> (consumer, epoch, stop)
        self.subscribers: dict[int, int] = {}
        self.group_subscribers: dict[int, dict[str, tuple[str, int, Callable[[], None]]]] = {}
        self._interrupts: dict[int, set[asyncio.Future]] = {}
        self._resuming: dict[tuple[str, tuple[int, ...]], asyncio.Future] = {}
        """Resumes under way (``resume``): (stream, partition indexes) -> their future."""
        self._auto_pause_task: asyncio.Task | None = None
        self.activity_stream = ActivityStream(broker, self.appenders, config.activity_enabled)
        broker.deletion_listeners.append(self._stream_deleted)
        broker.flag_listeners.append(self._flags_changed)

    # -- lifecycle ----------------------------------------------------------------------
    def open(self) -> None:
        """Create the internal streams that are on (``__cursors``, ``__activity``) and load
        the cursors."""
        self.cursors.open()
        if self.config.activity_enabled and ACTIVITY_STREAM not in self.broker.streams:
            self.broker.create(ACTIVITY_STREAM, StreamConfig(subject=f"{self.namespace}.activity"),
                               internal=True)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.groups.start()
        self._auto_pause_task = loop.create_task(self._auto_pause_loop())
        self.activity_stream.start()

    async def close(self) -> None:
        if self._auto_pause_task is not None:
            self._auto_pause_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._auto_pause_task
        await self.activity_stream.close()
        await self.appenders.drain()
        self.groups.close()

    @property
    def advertised(self) -> tuple[str, int]:
        host = self.config.advertised_host or (
            "localhost" if self.host in ("0.0.0.0", "::", "") else self.host)
        return host, self.config.advertised_port or self.port

    # -- lookups ------------------------------------------------------------------------
    def stream(self, name: str) -> Stream:
        """The stream; raises LiftbridgeError NOT_FOUND (also for a stream of another
        virtual host than ``/``: riverlog.vhost_names, never reachable here)."""
        stream = None if hidden(name) else self.broker.streams.get(name)
        if stream is None:
            raise LiftbridgeError("NOT_FOUND", f"no such stream: {name}")
        return stream

    def partition(self, name: str, index: int) -> Partition | None:
        stream = None if hidden(name) else self.broker.streams.get(name)
        if stream is None or not 0 <= index < len(stream.partitions):
            return None
        return stream.partitions[index]

    def led_elsewhere(self, stream: str, index: int) -> str | None:
        """The NATS subject of a cluster partition another server leads, where a publish
        reaching this server goes (Liftbridge publishes every gRPC publish there); None
        when this server leads it, on a single server, or for an unknown partition."""
        placement = self.broker.placement
        if not placement.clustered or hidden(stream) or placement.leads(stream, index):
            return None
        known = (placement.streams() or {}).get(stream)
        if known is None or not 0 <= index < known[1]:
            return None
        return partition_subject(known[0], index)

    def _partition_count(self, name: str) -> int:
        stream = self.broker.streams.get(name)
        return 0 if stream is None else len(stream.partitions)

    # -- reader wake-ups ----------------------------------------------------------------
    def interrupt_future(self, partition: Partition) -> asyncio.Future:
        """A future completed when ``partition``'s flags change (pause, read-only, delete),
        so a reader waiting for data can re-check them. Discard it with ``forget_interrupt``."""
        future = asyncio.get_running_loop().create_future()
        self._interrupts.setdefault(id(partition), set()).add(future)
        return future

    def forget_interrupt(self, partition: Partition, future: asyncio.Future) -> None:
        futures = self._interrupts.get(id(partition))
        if futures is not None:
            futures.discard(future)
            if not futures:
                del self._interrupts[id(partition)]

    def interrupt(self, partition: Partition) -> None:
        for future in self._interrupts.pop(id(partition), ()):
            if not future.done():
                future.set_result(None)

    # -- stream administration ----------------------------------------------------------
    def check_create(self, name: str, subject: str, config: StreamConfig) -> None:
        """CreateStream's checks, Liftbridge's and a subject and queue group NATS takes
        (riverlog.protocol.nats_subject: wildcards allowed, at most MAX_SUBJECT_BYTES).
        Raises LiftbridgeError INVALID_ARGUMENT (empty name, bad subject or group, reserved
        name)."""
        if not name:
            raise LiftbridgeError("INVALID_ARGUMENT", "Name cannot be empty")
        problem = nats_problem(subject, config.group or "")
        if problem is not None:
            raise LiftbridgeError("INVALID_ARGUMENT", problem)
        writable(name, "INVALID_ARGUMENT")

    async def create_stream(self, name: str, subject: str, config: StreamConfig) -> None:
        """CreateStream: ``check_create``, then on this server (``add_stream``) or, in a
        cluster, through the metadata, which creates it on every server holding a replica.
        Raises LiftbridgeError INVALID_ARGUMENT (see check_create, bad settings, more
        replicas than servers), ALREADY_EXISTS, INTERNAL (no metadata leader), RESOURCE_EXHAUSTED
        (no descriptor; or ``config.owner`` at SecurityConfig.max_streams_per_user)."""
        self.check_create(name, subject, config)
        placement = self.broker.placement
        try:
            self.broker.check_quota(config.owner, config.partitions)
            if placement.clustered:
                await placement.create_stream(name, config)
            else:
                self.add_stream(name, config)
        except StreamExistsError:
            raise LiftbridgeError("ALREADY_EXISTS", "stream already exists") from None
        except InvalidArgumentError as exc:
            raise LiftbridgeError("INVALID_ARGUMENT", str(exc)) from None
        except ClusterUnavailableError as exc:  # Liftbridge's answer without a Raft leader
            raise LiftbridgeError("INTERNAL", f"no known metadata leader ({exc})") from None
        except (ResourceExhaustedError, LimitExceededError) as exc:  # this request only
            raise LiftbridgeError("RESOURCE_EXHAUSTED", str(exc)) from None

    def add_stream(self, name: str, config: StreamConfig) -> Stream:
        """Create stream ``name`` on this server and attach it to NATS. Raises
        StreamExistsError, InvalidArgumentError."""
        stream = self.broker.create(name, config)
        if self.bridge is not None:
            self.bridge.attach(stream)
        self.activity(pb.ActivityStreamEvent(
            op=pb.ActivityStreamOp.CREATE_STREAM, createStreamOp=pb.CreateStreamOp(
                stream=name, partitions=range(len(stream.partitions)))))
        return stream

    async def delete_stream(self, name: str) -> None:
        """DeleteStream, on this server or, in a cluster, through the metadata (every
        server deletes its replica). Raises LiftbridgeError INVALID_ARGUMENT (reserved),
        NOT_FOUND, INTERNAL (no metadata leader)."""
        writable(name, "INVALID_ARGUMENT")  # also in a cluster: the metadata has no such name
        placement = self.broker.placement
        try:
            if placement.clustered:
                await placement.delete_stream(name)
            else:
                self.remove_stream(name)
        except StreamNotFoundError:
            raise LiftbridgeError("NOT_FOUND", "stream does not exist") from None
        except ClusterUnavailableError as exc:
            raise LiftbridgeError("INTERNAL", f"no known metadata leader ({exc})") from None

    def remove_stream(self, name: str) -> None:
        """Delete stream ``name`` on this server. Raises StreamNotFoundError."""
        self.broker.delete(name)  # listeners: _stream_deleted, the doors
        self.activity(pb.ActivityStreamEvent(
            op=pb.ActivityStreamOp.DELETE_STREAM, deleteStreamOp=pb.DeleteStreamOp(stream=name)))

    def _stream_deleted(self, stream: Stream) -> None:
        for partition in stream.partitions:
            self.interrupt(partition)
            self.appenders.forget(partition)
            self.subscribers.pop(id(partition), None)
            for _, _, stop in self.group_subscribers.pop(id(partition), {}).values():
                stop()
        if self.bridge is not None:
            self.bridge.detach(stream)
        self.groups.stream_deleted(stream.name)

    def partition_count(self, name: str) -> int | None:
        """Partitions of stream ``name``, held here or (in a cluster) elsewhere; None when
        no such stream exists."""
        stream = self.broker.streams.get(name)
        if stream is not None:
            return len(stream.partitions)
        known = (self.broker.placement.streams() or {}).get(name)
        return None if known is None else known[1]

    def _chosen(self, name: str, partitions: Iterable[int]) -> list[int]:
        """The partition indexes a PauseStream / SetStreamReadonly names (all when none).
        Raises LiftbridgeError NOT_FOUND (Liftbridge's messages)."""
        count = self.partition_count(name)
        if count is None:
            raise LiftbridgeError("NOT_FOUND", "stream not found")
        chosen = list(dict.fromkeys(partitions)) or list(range(count))
        if any(not 0 <= index < count for index in chosen):
            raise LiftbridgeError("NOT_FOUND", "partition does not exist")
        return chosen

    @staticmethod
    async def _agreed(change: Awaitable[None]) -> None:
        """Wait for a Placement.set_flags ``change``, its errors as Liftbridge's statuses."""
        try:
            await change
        except StreamNotFoundError:
            raise LiftbridgeError("NOT_FOUND", "stream not found") from None
        except ClusterUnavailableError as exc:
            raise LiftbridgeError("INTERNAL", f"no known metadata leader ({exc})") from None

    async def pause(self, name: str, partitions: Iterable[int], resume_all: bool) -> None:
        """PauseStream: the partitions (all when none given) stop taking NATS messages
        until a publish resumes them (all of them with ``resume_all``); in a cluster, on
        every server, agreed through the metadata. Raises LiftbridgeError NOT_FOUND,
        INTERNAL (no metadata leader)."""
        chosen = self._chosen(name, partitions)
        await self._agreed(self.broker.placement.set_flags(name, chosen, paused=True,
                                                           resume_all=resume_all))
        self.activity(pb.ActivityStreamEvent(
            op=pb.ActivityStreamOp.PAUSE_STREAM, pauseStreamOp=pb.PauseStreamOp(
                stream=name, partitions=chosen, resumeAll=resume_all)))

    def resume_for_publish(self, name: str, index: int) -> asyncio.Future | None:
        """A publish to partition ``index`` resumes it when paused (every paused one when
        the stream was paused with resumeAll, as Liftbridge's resumeStream). Returns None
        when nothing is paused, else ``resume``'s future."""
        placement = self.broker.placement
        if placement.resumes_all(name):
            targets = [i for i in range(self.partition_count(name) or 0)
                       if (placement.flags(name, i) or _RUNNING).paused]
        else:
            targets = [index] if (placement.flags(name, index) or _RUNNING).paused else []
        return self.resume(name, targets) if targets else None

    def resume(self, name: str, partitions: list[int]) -> asyncio.Future:
        """Resume the paused ``partitions`` of stream ``name`` (and forget its resumeAll):
        started now (on a single server applied before this returns); the future raises
        LiftbridgeError NOT_FOUND, INTERNAL. Publishes and subscribes arriving while a
        resume of the same partitions is under way share it (one Raft command in a
        cluster, however many of them); cancelling one's future leaves the others'."""
        key = (name, tuple(partitions))
        running = self._resuming.get(key)
        if running is None:
            change = self.broker.placement.set_flags(name, partitions, paused=False,
                                                     resume_all=False)
            running = self._resuming[key] = asyncio.ensure_future(
                self._resumed(name, partitions, change))
            running.add_done_callback(lambda _: self._resuming.pop(key, None))
        return asyncio.shield(running)

    async def _resumed(self, name: str, partitions: list[int], change: Awaitable[None]) -> None:
        await self._agreed(change)
        log.info("resumed %s partition(s) %s", name, partitions)
        self.activity(pb.ActivityStreamEvent(
            op=pb.ActivityStreamOp.RESUME_STREAM, resumeStreamOp=pb.ResumeStreamOp(
                stream=name, partitions=partitions)))

    async def set_readonly(self, name: str, partitions: Iterable[int], readonly: bool) -> None:
        """SetStreamReadonly: read-only partitions refuse publishes; their subscribers end
        at the end of the data. Raises LiftbridgeError NOT_FOUND, INTERNAL."""
        chosen = self._chosen(name, partitions)
        await self._agreed(self.broker.placement.set_flags(name, chosen, read_only=readonly))
        self.activity(pb.ActivityStreamEvent(
            op=pb.ActivityStreamOp.SET_STREAM_READONLY,
            setStreamReadonlyOp=pb.SetStreamReadonlyOp(
                stream=name, partitions=chosen, readonly=readonly)))

    def _flags_changed(self, stream: Stream, partition: Partition) -> None:
        """Broker flag listener: readers waiting at the end re-check the flags, and the NATS
        door listens on the partition's subject only while it is not paused."""
        self.interrupt(partition)
        if self.bridge is not None:
            if partition.paused:
                self.bridge.pause(stream, partition)
            else:
                self.bridge.resume(stream, partition)

    # -- publishing ---------------------------------------------------------------------
    def check_publish(self, name: str, index: int, ack_policy: int) -> tuple[Stream, Partition]:
        """Liftbridge's publish preconditions, as (code, message) of a PublishAsyncError:
        raises LiftbridgeError with code "BAD_REQUEST" (no stream name, a reserved stream,
        NONE ack policy on a stream with optimistic concurrency), "NOT_FOUND" (stream,
        partition; in a cluster, a partition this server does not lead), "READONLY",
        "RESOURCE_EXHAUSTED" (a resource alarm holds: riverlog's). Reserved streams are
        riverlog's rule: Liftbridge refuses only to create and delete them, but a
        client-written cursor record is read back at every start."""
        if not name:
            raise LiftbridgeError("BAD_REQUEST", "no stream provided")
        writable(name, "BAD_REQUEST")
        stream = None if hidden(name) else self.broker.streams.get(name)
        if stream is None:
            raise LiftbridgeError("NOT_FOUND", f"no such stream: {name}")
        if not 0 <= index < len(stream.partitions):
            raise LiftbridgeError("NOT_FOUND", f"no such partition: {index}")
        if self.broker.alarms.blocked:
            raise LiftbridgeError("RESOURCE_EXHAUSTED", self.broker.alarms.refusal())
        placement = self.broker.placement
        placed = placement.of(name, index) if placement.clustered else None  # one lookup
        if placement.clustered and (placed is None or placed.leader != placement.server_id):
            # no leader known here (a restarting member before it caught up with Raft, a
            # partition without an in-sync replica): a write here would be truncated later
            raise LiftbridgeError("NOT_FOUND", f"no leader of partition {index} of stream "
                                  f"{name} is known here")
        partition = stream.partitions[index]
        if partition.readonly:
            raise LiftbridgeError("READONLY", f"readonly partition: {index}")
        if stream.config.optimistic_concurrency and ack_policy == NONE:
            raise LiftbridgeError("BAD_REQUEST",
                                  "stream with concurrency control must have AckPolicy set")
        if ack_policy == ALL and placed is not None and placed.under_min_isr:
            raise LiftbridgeError("INTERNAL", f"not enough in-sync replicas for AckPolicy "
                                  f"ALL: ISR {len(placed.isr)} < minIsr {placed.min_isr}")
        return stream, partition

    def refuse_read_only(self, name: str, index: int) -> None:
        """A publish this server sends on to the partition's leader, another server: refused
        when the placement says the partition is read-only, before it leaves (Liftbridge's
        ensurePublishPreconditions, on the server asked). Raises LiftbridgeError READONLY."""
        if (self.broker.placement.flags(name, index) or _RUNNING).read_only:
            raise LiftbridgeError("READONLY", f"readonly partition: {index}")

    def ingest(self, stream: Stream, partition: Partition, *, value: bytes, key: bytes | None,
               headers: dict[str, bytes] | None, msg_subject: str, reply: str,
               ack_inbox: str, correlation_id: str, ack_policy: int, expected_offset: int | None,
               size: int, deliver: Callable[[pb.Ack], None] | None,
               fail: Callable[[BaseException], None] | None = None, door: str) -> None:
        """Store one Liftbridge message (what a partition does with a NATS message).
        ``door`` (riverlog.metrics.NATS or GRPC) is the label its metrics are counted under.

        ``size`` is the NATS message size Liftbridge compares with
        ``clustering.replication.max.bytes``; bigger: a TOO_LARGE ack, nothing stored.
        ``expected_offset`` (None: no check) applies when the stream has optimistic
        concurrency: a mismatch gets an INCORRECT_OFFSET ack. ``deliver`` gets the Ack when
        the policy says (never for NONE); None: nobody wants acks. Raises LogClosedError
        when the partition is gone."""
        now = time.time_ns()
        want_ack = deliver is not None and ack_policy != NONE
        if size > self.config.replication_max_bytes:
            log.error("rejecting a %d-byte message on %s/%d: it exceeds "
                      "clustering.replication.max.bytes (%d)", size, stream.name,
                      partition.index, self.config.replication_max_bytes)
            count_error(door, "TOO_LARGE")
            if deliver is not None:  # Liftbridge sends this one whatever the policy
                deliver(self._ack(stream, msg_subject, ack_inbox, correlation_id, ack_policy,
                                  now, ACK_TOO_LARGE))
            return
        hdrs = dict(headers) if headers else {}
        hdrs["subject"] = msg_subject.encode()
        hdrs["reply"] = reply.encode()
        record = encode_record(Record(
            value=value, key=key, headers=hdrs, timestamp_ns=now, subject=msg_subject or None,
            reply=reply or None, correlation_id=correlation_id or None,
            ack_inbox=ack_inbox or None))
        sink = None
        if want_ack:
            sink = AckSink(self._ack(stream, msg_subject, ack_inbox, correlation_id, ack_policy,
                                     now, ACK_OK), deliver, fail, door)
        appender = self.appenders.get(partition)
        if expected_offset is not None and stream.config.optimistic_concurrency:
            if not appender.append(record, sink, expected_offset):
                count_error(door, "INCORRECT_OFFSET")
                if deliver is not None:
                    ack = self._ack(stream, msg_subject, ack_inbox, correlation_id, ack_policy,
                                    now, ACK_INCORRECT_OFFSET)
                    ack.commitTimestamp = time.time_ns()
                    deliver(ack)
                return
        else:
            appender.append(record, sink)
        counters(stream.name, door).published_soon(len(value))

    @staticmethod
    def _ack(stream: Stream, msg_subject: str, ack_inbox: str, correlation_id: str,
             ack_policy: int, reception_ns: int, error: int) -> pb.Ack:
        return pb.Ack(stream=stream.name, partitionSubject=stream.config.subject or "",
                      msgSubject=msg_subject, ackInbox=ack_inbox, correlationId=correlation_id,
                      ackPolicy=ack_policy, receptionTimestamp=reception_ns, ackError=error)

    # -- consumer groups ----------------------------------------------------------------
    def _group_left(self, group_id: str, consumer_id: str, expired: bool) -> None:
        self.activity(pb.ActivityStreamEvent(
            op=pb.ActivityStreamOp.LEAVE_CONSUMER_GROUP,
            leaveConsumerGroupOp=pb.LeaveConsumerGroupOp(
                groupId=group_id, consumerId=consumer_id, expired=expired)))

    async def join_group(self, group_id: str, consumer_id: str,
                         streams: list[str]) -> tuple[str, int]:
        """JoinConsumerGroup (Placement.consumer_groups' join), noted in the activity
        stream. Raises GroupError, ClusterUnavailableError."""
        coordinator, epoch = await self.groups.join(group_id, consumer_id, streams)
        self.activity(pb.ActivityStreamEvent(
            op=pb.ActivityStreamOp.JOIN_CONSUMER_GROUP,
            joinConsumerGroupOp=pb.JoinConsumerGroupOp(
                groupId=group_id, consumerId=consumer_id, streams=streams)))
        return coordinator, epoch

    # -- activity stream ----------------------------------------------------------------
    def activity(self, event: pb.ActivityStreamEvent) -> None:
        """Queue an activity event for ``__activity`` (no-op unless the activity stream is on)."""
        self.activity_stream.emit(event)

    # -- auto pause ---------------------------------------------------------------------
    async def _auto_pause_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            for stream, partition, limit in idle_partitions(self.broker, self.subscribers,
                                                             time.time_ns()):
                log.info("partition %s/%d has not received a message in over %d ms, "
                         "auto pausing partition", stream.name, partition.index, limit)
                try:
                    await self.pause(stream.name, [partition.index], False)
                except LiftbridgeError as exc:
                    log.error("cannot auto pause %s/%d: %s", stream.name,
                              partition.index, exc.message)
