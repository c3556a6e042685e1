# Metrics of riverlog: the prometheus_client registry that the front doors count into, the
# one a cluster member's metadata changes count into (elections, ISR shrinks and expands,
# served only in a cluster), and the helpers they count with. Owns metric names, labels and
# buckets; the values that mirror server state (connections, subscriptions, disk usage,
# consumer lag, replication) are read when Prometheus scrapes, by
# riverlog.server.metrics_http, so no door updates a gauge.
# Rules: doors count per frame or chunk, never per message where a frame holds many; the
# labelled children a door needs are looked up once per (stream, door) and kept here, so a
# hot path pays one dict lookup and two lock-protected adds; names follow Prometheus'
# conventions (base units, `_total` on counters). Doors that see one message at a time (the
# Liftbridge ones) count with ``published_soon`` and ``TurnLatency``: once per event-loop turn,
# the turn being the batch their messages are appended in. Per-stream series name their
# virtual host: labels `vhost` and `stream`, the name its clients use (never the hidden broker
# name, riverlog.vhost_names), as RabbitMQ's Prometheus plugin labels its per-queue ones
# `vhost` and `queue`. Imports nothing of riverlog but vhost_names.
from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter, Histogram

from .vhost_names import external

RABBITMQ_STREAM = "rabbitmq_stream"
NATS = "nats"
GRPC = "grpc"
DOORS = (RABBITMQ_STREAM, NATS, GRPC)

STREAM_DOOR = ["vhost", "stream", "door"]  # the labels of the per-stream counters
REGISTRY = CollectorRegistry(auto_describe=True)
"""The counters of every door, for the whole process (one server per process; tests that run
several read differences)."""

PUBLISHED_MESSAGES = Counter(
    "riverlog_published_messages", "Messages written to a stream (duplicates dropped by "
    "deduplication are not counted).", STREAM_DOOR, registry=REGISTRY)
PUBLISHED_BYTES = Counter(
    "riverlog_published_bytes", "Bytes of the messages written to a stream, as received "
    "(entries of RabbitMQ Publish frames, NATS payloads, gRPC values).", STREAM_DOOR,
    registry=REGISTRY)
DELIVERED_MESSAGES = Counter(
    "riverlog_delivered_messages", "Messages sent to subscribers of a stream.",
    STREAM_DOOR, registry=REGISTRY)
DELIVERED_BYTES = Counter(
    "riverlog_delivered_bytes", "Bytes sent to subscribers of a stream (RabbitMQ: chunk "
    "header and data; Liftbridge: values).", STREAM_DOOR, registry=REGISTRY)
CONFIRM_LATENCY = Histogram(
    "riverlog_confirm_latency_seconds", "From a publish received to its confirm sent "
    "(RabbitMQ: one observation per PublishConfirm frame, from the first Publish frame it "
    "answers; Liftbridge: one per event-loop turn that sends Acks, from the reception of the "
    "turn's first one).", ["door"], registry=REGISTRY,
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
             0.5, 1.0, 2.5, 5.0, 10.0))
ERRORS = Counter(
    "riverlog_errors", "Errors by door and code: RabbitMQ Stream response codes of "
    "PublishError frames and of Close frames the server sent; gRPC status codes of failed "
    "calls; Liftbridge Ack errors (TOO_LARGE, INCORRECT_OFFSET); NATS: messages not stored.",
    ["door", "code"], registry=REGISTRY)
DROPPED = Counter(
    "riverlog_dropped_messages", "Messages a door received and did not store, by reason: "
    "\"alarm\", NATS messages that arrived while a resource alarm blocked publishers; "
    "\"slow_consumer\", NATS messages that arrived while over 512 MiB of a partition's "
    "waited to be stored; \"not_stored_here\", NATS messages read for a partition that "
    "was paused, made read-only or led elsewhere before they were stored.",
    ["door", "reason"], registry=REGISTRY)
NATS_RECONNECTS = Counter(
    "riverlog_nats_reconnects", "Times the NATS door got its connection to the NATS server "
    "back after losing it (nats-py's own reconnects, and new connections riverlog makes when "
    "the server closed the old one for good).", registry=REGISTRY)

CLUSTER_REGISTRY = CollectorRegistry(auto_describe=True)
"""The counters of a cluster member (served only by one: a single server's /metrics stays as
it was)."""

LEADER_ELECTIONS = Counter(
    "riverlog_leader_elections", "Leader changes (a new leader, or none, under a new "
    "leader_epoch) this cluster member applied to partitions it holds a replica of, since it "
    "started (a member catching up on the Raft log counts the changes it replays).",
    registry=CLUSTER_REGISTRY)
ISR_SHRINKS = Counter(
    "riverlog_isr_shrinks", "Replicas that left the ISR of a partition held here, as applied "
    "by this cluster member.", registry=CLUSTER_REGISTRY)
ISR_EXPANDS = Counter(
    "riverlog_isr_expands", "Replicas that rejoined the ISR of a partition held here, as "
    "applied by this cluster member.", registry=CLUSTER_REGISTRY)

CONFIRM_RABBITMQ = CONFIRM_LATENCY.labels(RABBITMQ_STREAM)


class StreamCounters:
    """The four counters of one (stream, door), ``stream`` a broker name (labelled with its
    virtual host and client name): ``published(messages, nbytes)`` and
    ``delivered(messages, nbytes)``. Get one with ``counters(stream, door)``."""

    __slots__ = ("_in_msgs", "_in_bytes", "_out_msgs", "_out_bytes", "_soon_msgs",
                 "_soon_bytes")

    def __init__(self, stream: str, door: str) -> None:
        labels = (*external(stream), door)
        self._in_msgs = PUBLISHED_MESSAGES.labels(*labels)
        self._in_bytes = PUBLISHED_BYTES.labels(*labels)
        self._out_msgs = DELIVERED_MESSAGES.labels(*labels)
        self._out_bytes = DELIVERED_BYTES.labels(*labels)
        self._soon_msgs = self._soon_bytes = 0

    def published(self, messages: int, nbytes: int) -> None:
        self._in_msgs.inc(messages)
        self._in_bytes.inc(nbytes)

    def published_soon(self, nbytes: int) -> None:
        """Count one published message of ``nbytes`` at the end of this event-loop turn,
        added with the turn's others (two locked adds per turn, not per message). Call from
        the running loop; the counters show it before anything the turn's appends answer."""
        if not self._soon_msgs:
            asyncio.get_running_loop().call_soon(self._add_soon)
        self._soon_msgs += 1
        self._soon_bytes += nbytes

    def _add_soon(self) -> None:
        self.published(self._soon_msgs, self._soon_bytes)
        self._soon_msgs = self._soon_bytes = 0

    def delivered(self, messages: int, nbytes: int) -> None:
        self._out_msgs.inc(messages)
        self._out_bytes.inc(nbytes)


class TurnLatency:
    """Confirm latency of a door that confirms one message at a time, observed once per
    event-loop turn: ``observe(seconds)`` records the turn's first confirm (the oldest of the
    batch the turn appended, as the RabbitMQ door observes the first Publish frame a
    PublishConfirm answers) and ignores the rest of the turn's."""

    __slots__ = ("_child", "_armed")

    def __init__(self, door: str) -> None:
        self._child = CONFIRM_LATENCY.labels(door)
        self._armed = True

    def observe(self, seconds: float) -> None:
        if self._armed:
            self._armed = False
            self._child.observe(seconds)
            asyncio.get_running_loop().call_soon(self._arm)

    def _arm(self) -> None:
        self._armed = True


_counters: dict[tuple[str, str], StreamCounters] = {}


def counters(stream: str, door: str) -> StreamCounters:
    """The counters of ``stream`` (a broker name) for ``door`` (one of ``DOORS``), created on
    first use."""
    found = _counters.get((stream, door))
    if found is None:
        found = _counters[(stream, door)] = StreamCounters(stream, door)
    return found


def forget_stream(stream: str) -> None:
    """Drop a deleted stream's series (``stream``: its broker name), so a scrape no longer
    lists it."""
    for door in DOORS:
        if _counters.pop((stream, door), None) is not None:
            for family in (PUBLISHED_MESSAGES, PUBLISHED_BYTES, DELIVERED_MESSAGES,
                           DELIVERED_BYTES):
                try:
                    family.remove(*external(stream), door)
                except KeyError:
                    pass


def error(door: str, code: object) -> None:
    """Count one error of ``door``: ``code`` is a RabbitMQ Stream response code (an int,
    shown as 0x-hex as in the protocol's table) or a name (a gRPC status)."""
    label = f"0x{code:02x}" if isinstance(code, int) else str(code)
    ERRORS.labels(door, label).inc()


class CallTracker:
    """gRPC calls in progress per peer, and failed calls counted in ``riverlog_errors``.

    gRPC hides its connections; a peer string ("ipv4:127.0.0.1:50312") names one, so
    ``connections`` counts the peers with a call in progress. Wrap each handler's behaviour
    with ``unary`` (a coroutine function) or ``streaming`` (an async generator function);
    a call whose status ends other than OK counts as an error labelled with the status name
    (a call cancelled by its client does not count)."""

    def __init__(self, door: str) -> None:
        self.door = door
        self.peers: dict[str, int] = {}

    @property
    def connections(self) -> int:
        return len(self.peers)

    @property
    def calls(self) -> int:
        return sum(self.peers.values())

    def unary(self, behavior):
        async def call(request, context):
            peer = self._enter(context)
            failure = None
            try:
                return await behavior(request, context)
            except BaseException as exc:
                failure = exc
                raise
            finally:
                self._leave(peer, context, failure)
        call.__name__ = getattr(behavior, "__name__", "call")
        return call

    def streaming(self, behavior):
        async def call(request, context):
            peer = self._enter(context)
            failure = None
            try:
                async for response in behavior(request, context):
                    yield response
            except BaseException as exc:
                failure = exc
                raise
            finally:
                self._leave(peer, context, failure)
        return call

    def _enter(self, context) -> str:
        peer = context.peer() or "?"
        self.peers[peer] = self.peers.get(peer, 0) + 1
        return peer

    def _leave(self, peer: str, context, failure: BaseException | None) -> None:
        left = self.peers.get(peer, 1) - 1
        if left > 0:
            self.peers[peer] = left
        else:
            self.peers.pop(peer, None)
        code = context.code()
        name = getattr(code, "name", code)
        if name not in (None, "OK", "CANCELLED"):
            error(self.door, name)
        elif code is None and isinstance(failure, Exception):
            error(self.door, "UNKNOWN")
