# Where each partition lives, as the doors see it: which server leads it, which hold replicas
# and which are in sync, and where each server's doors listen; and what the servers agreed on
# about it: Liftbridge's paused / read-only flags and consumer groups. Owns the questions
# every door asks before serving a partition ("do I lead it?", "who does?", "is it paused?"),
# the way a door changes the flags (``set_flags``: agreed first, then applied by every server
# holding the partition, through the flag listeners) and where the doors' consumer groups
# come from (``consumer_groups``). Rules: doors read placement
# only through ``Broker.placement`` (never the Raft metadata or replication state directly);
# reads are synchronous and answer from the latest applied metadata; the single-server
# answer (``LocalPlacement``) is that this server leads every partition alone, its own
# streams hold the flags (applied at once) and its broker.groups.ConsumerGroups the groups, so
# doors behave exactly as before when no cluster is configured. The cluster runtime (riverlog/cluster/)
# installs its own implementation when ``riverlog serve`` runs as a cluster member.
from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Awaitable, Callable, Mapping, Sequence

from ..errors import StreamNotFoundError
from .groups import ConsumerGroups

if TYPE_CHECKING:
    from .stream import Stream, StreamConfig, SuperStream

FIRST_LEADER_EPOCH = 1


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionPlacement:
    """One partition's placement: ``leader`` (server id; None while no in-sync replica can
    lead, the partition is unavailable), ``replicas`` (server ids, preference order), ``isr``
    (in-sync replicas, the leader included), ``leader_epoch`` (1 for the first leader, + 1
    on every leader change) and ``min_isr`` (the stream's minimum ISR: below it the high
    watermark stops and writes with ALL acks are refused, as Liftbridge's minIsr)."""

    leader: str | None
    replicas: tuple[str, ...]
    isr: tuple[str, ...]
    leader_epoch: int = FIRST_LEADER_EPOCH
    min_isr: int = 1

    @property
    def under_min_isr(self) -> bool:
        """Fewer in-sync replicas than ``min_isr``: nothing more is committed."""
        return len(self.isr) < self.min_isr


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionFlags:
    """Liftbridge's partition flags: ``paused`` (its NATS subject is not listened to until a
    publish, or a subscribe asking it, resumes it) and ``read_only`` (publishes are refused,
    subscribers end at its end)."""

    paused: bool = False
    read_only: bool = False


class OffsetsUnavailable(Exception):
    """A partition's leader could not be asked for a stored offset (no leader, no answer, or
    it no longer leads): RabbitMQ answers QueryOffset with STREAM_NOT_AVAILABLE then."""


LeaderListener = Callable[[str, int], None]
"""Called with (stream name, partition index) after the partition's leader changed."""
FlagListener = Callable[[str, int, PartitionFlags], None]
"""Called with (stream name, partition index, its new flags) on every server holding the
partition, once they are agreed."""


class Placement:
    """The interface doors use. ``server_id`` is this server's id; ``clustered`` tells whether
    other servers exist (single server: False)."""

    clustered: bool = False
    initial_cluster_size: int | None = None
    """In a cluster, the replication factor of a RabbitMQ-created stream that names none
    (ClusterConfig.initial_cluster_size; None: every server)."""

    def __init__(self, server_id: str = "") -> None:
        self.server_id = server_id
        self._listeners: list[tuple[LeaderListener, bool]] = []
        self._flag_listeners: list[FlagListener] = []

    def of(self, stream: str, index: int) -> PartitionPlacement | None:
        """The placement of partition ``index`` of ``stream``; None when unknown."""
        raise NotImplementedError

    def leads(self, stream: str, index: int) -> bool:
        """Whether this server is the partition's leader (takes its writes)."""
        found = self.of(stream, index)
        return found is not None and found.leader == self.server_id

    def has_feature(self, feature: str) -> bool:
        """Whether every server has ``feature`` (cluster.features.FEATURES): a single server
        has all of its own."""
        return True

    def created_ns(self, stream: str) -> int | None:
        """When ``stream`` was created (ns) as every server of a cluster tells; None on a
        single server (the Broker's stream knows) or when unknown."""
        return None

    def door(self, server_id: str, door: str) -> tuple[str, int] | None:
        """(host, port) where clients reach ``door`` ("rabbitmq-stream", "rabbitmq-stream-tls",
        "grpc", "nats") of server ``server_id``; None when that server does not advertise it."""
        raise NotImplementedError

    def servers(self) -> tuple[str, ...]:
        """Every server id of the cluster, sorted."""
        raise NotImplementedError

    def forming(self) -> bool:
        """True while the cluster is still forming: a member that has not applied the
        metadata yet, or fewer servers registered than it started with (its bootstrap
        peers). What needs more servers is then to be retried. A single server never is."""
        return False

    def reachable(self, server_id: str) -> bool:
        """Whether server ``server_id`` runs and this one is in touch with it (a single
        server: itself)."""
        return server_id == self.server_id

    def streams(self) -> Mapping[str, tuple[str, int]] | None:
        """Every stream of the cluster, held here or not: name -> (NATS subject, partition
        count); None on a single server, whose Broker holds every stream."""
        return None

    async def create_stream(self, name: str, config: "StreamConfig") -> None:
        """Create a stream on every server that will hold one of its replicas (cluster only:
        a single server's doors create streams through ``Broker.create``). ``config``
        carries ``partitions``, ``replication_factor`` (-1: every server) and ``min_isr``.
        Returns once this server has applied the change. Raises ``StreamExistsError``,
        ``InvalidArgumentError`` (e.g. a replication factor above the server count)."""
        raise NotImplementedError("a single server creates streams with Broker.create")

    async def delete_stream(self, name: str) -> None:
        """Delete a stream on every server (cluster only). Raises ``StreamNotFoundError``."""
        raise NotImplementedError("a single server deletes streams with Broker.delete")

    def super_streams(self) -> Mapping[str, "SuperStream"] | None:
        """The RabbitMQ super streams every server agrees on, by name; None on a single
        server, whose SuperStreams keeps its own (DATA/superstreams.json)."""
        return None

    async def create_super_stream(self, name: str, partitions: tuple[str, ...],
                                  binding_keys: tuple[str, ...]) -> None:
        """Record a super stream whose partition streams exist, on every server (cluster
        only). Raises ``StreamExistsError``, ``StreamNotFoundError`` (a partition is no
        stream), ``InvalidArgumentError``."""
        raise NotImplementedError("a single server records super streams in SuperStreams")

    async def delete_super_stream(self, name: str) -> None:
        """Forget a super stream on every server (cluster only; its partition streams
        stay). Raises ``StreamNotFoundError``."""
        raise NotImplementedError("a single server forgets super streams in SuperStreams")

    async def create_super_stream_with_streams(self, name: str, partitions: tuple[str, ...],
                                               binding_keys: tuple[str, ...],
                                               config: "StreamConfig") -> None:
        """Create the partition streams (each as ``create_stream(partition, config)``) and
        record the super stream binding them, all or nothing, on every server (cluster only:
        one metadata change). Raises ``StreamExistsError`` (the super stream or a partition
        stream exists), ``InvalidArgumentError`` (counts, names, replication factor)."""
        raise NotImplementedError("a single server creates super streams in SuperStreams")

    async def delete_super_stream_with_streams(self, name: str) -> None:
        """Forget a super stream and delete its partition streams, all or nothing, on every
        server (cluster only: one metadata change). Raises ``StreamNotFoundError``."""
        raise NotImplementedError("a single server deletes super streams in SuperStreams")

    async def bind_super_stream(self, name: str, partition: str, binding_key: str,
                                index: int) -> None:
        """Bind stream ``partition`` to super stream ``name`` with ``binding_key`` at position
        ``index`` of its partitions (the end when larger), on every server (cluster only: one
        metadata change). Raises ``StreamNotFoundError`` (no such super stream or stream),
        ``InvalidArgumentError`` (bound already)."""
        raise NotImplementedError("a single server binds super streams in SuperStreams")

    async def store_offset_at_leader(self, stream: str, index: int, reference: str,
                                     offset: int) -> None:
        """Pass a RabbitMQ StoreOffset to the partition's leader, another server (cluster
        only: a single server leads every partition). Raises ``OffsetsUnavailable``."""
        raise NotImplementedError("a single server stores offsets itself")

    async def query_offset_at_leader(self, stream: str, index: int,
                                     reference: str) -> int | None:
        """The offset ``reference`` stored in the partition, as its leader (another server)
        holds it; None when it stored none. Raises ``OffsetsUnavailable``."""
        raise NotImplementedError("a single server answers stored offsets itself")

    def flags(self, stream: str, index: int) -> PartitionFlags | None:
        """The partition's agreed flags; None when the partition is unknown."""
        raise NotImplementedError

    def resumes_all(self, stream: str) -> bool:
        """Whether ``stream`` was paused with Liftbridge's resumeAll: a publish to one of
        its partitions resumes every paused one."""
        raise NotImplementedError

    def set_flags(self, stream: str, partitions: Sequence[int], *, paused: bool | None = None,
                  read_only: bool | None = None,
                  resume_all: bool | None = None) -> Awaitable[None]:
        """Change the flags of ``partitions`` (indexes that exist) of ``stream`` and its
        resumeAll (None: unchanged). Starts at once and returns an awaitable done once this
        server has applied the change (the flag listeners ran); on a single server it is
        applied before this returns. Awaiting it raises ``StreamNotFoundError`` (the stream
        or a partition is gone), ``ClusterUnavailableError`` (no metadata leader: outcome
        unknown)."""
        raise NotImplementedError

    def consumer_groups(self, data_dir: str, consumer_timeout_ms: int,
                        coordinator_timeout_ms: int, partitions_of: Callable[[str], int],
                        on_leave: Callable[[str, str, bool], None] | None = None):
        """The Liftbridge consumer groups the doors use (made once, by the Liftbridge layer):
        a broker.groups.ConsumerGroups on a single server (this server coordinates every
        group; kept in ``data_dir``), agreed through the metadata in a cluster. Same
        methods either way: ``await join(group, consumer, streams)`` -> (coordinator,
        epoch), ``await leave(group, consumer)``, ``assignments(group, consumer, epoch)``
        -> ({stream: [partition]}, epoch) (the consumer's heartbeat, on its coordinator),
        ``await report_coordinator(group, consumer, coordinator, epoch)``,
        ``coordinator_of(group)`` -> (coordinator, epoch) or None, ``is_member``,
        ``member_streams(group, consumer)`` -> the member's streams or None, and ``start()``, ``close()``, ``stream_deleted(name)``; their refusals are
        broker.groups.GroupError. ``partitions_of(stream)``: its partition count (0: none);
        ``on_leave(group, consumer, expired)`` after a consumer left through this server or
        timed out on it."""
        raise NotImplementedError

    def add_flag_listener(self, listener: FlagListener) -> Callable[[], None]:
        """Call ``listener`` after each agreed flag change of a partition held here;
        returns a function that removes it."""
        self._flag_listeners.append(listener)
        return lambda: (self._flag_listeners.remove(listener)
                        if listener in self._flag_listeners else None)

    def flags_changed(self, stream: str, index: int, flags: PartitionFlags) -> None:
        """Tell the flag listeners (the implementation calls this, on the event loop)."""
        for listener in list(self._flag_listeners):
            listener(stream, index, flags)

    def add_leader_listener(self, listener: LeaderListener,
                            isr: bool = False) -> Callable[[], None]:
        """Call ``listener`` after each leader change (with ``isr``, also after each change of
        the in-sync replicas under the same leader); returns a function that removes it."""
        entry = (listener, isr)
        self._listeners.append(entry)
        return lambda: self._listeners.remove(entry) if entry in self._listeners else None

    def leader_changed(self, stream: str, index: int) -> None:
        """Tell the listeners (the implementation calls this, on the event loop)."""
        for listener, _ in list(self._listeners):
            listener(stream, index)

    def isr_changed(self, stream: str, index: int) -> None:
        """Tell the listeners that asked for ISR changes that the partition's in-sync
        replicas changed, not its leader (the implementation calls this, on the loop)."""
        for listener, isr in list(self._listeners):
            if isr:
                listener(stream, index)


class LocalPlacement(Placement):
    """A single server: it leads every partition of every stream it has, alone, epoch 1, and
    its own streams are the truth about the flags (``stream_of``: the Broker's stream of a
    name, None when it has none). ``doors`` maps door names to the (host, port) this server
    advertises."""

    def __init__(self, server_id: str = "", doors: Mapping[str, tuple[str, int]] | None = None,
                 stream_of: Callable[[str], "Stream | None"] | None = None) -> None:
        super().__init__(server_id)
        self.doors = dict(doors or {})
        self._stream_of = stream_of or (lambda name: None)

    def of(self, stream: str, index: int) -> PartitionPlacement | None:
        found = self._stream_of(stream)
        if found is None or not 0 <= index < len(found.partitions):
            return None
        me = (self.server_id,)
        return PartitionPlacement(self.server_id, me, me)

    def door(self, server_id: str, door: str) -> tuple[str, int] | None:
        return self.doors.get(door) if server_id == self.server_id else None

    def servers(self) -> tuple[str, ...]:
        return (self.server_id,)

    def consumer_groups(self, data_dir: str, consumer_timeout_ms: int,
                        coordinator_timeout_ms: int, partitions_of: Callable[[str], int],
                        on_leave: Callable[[str, str, bool], None] | None = None):
        return ConsumerGroups(data_dir, self.server_id, consumer_timeout_ms,
                              coordinator_timeout_ms, partitions_of, on_leave)

    def flags(self, stream: str, index: int) -> PartitionFlags | None:
        found = self._stream_of(stream)
        if found is None or not 0 <= index < len(found.partitions):
            return None
        partition = found.partitions[index]
        return PartitionFlags(partition.paused, partition.readonly)

    def resumes_all(self, stream: str) -> bool:
        found = self._stream_of(stream)
        return found is not None and found.resume_all

    def set_flags(self, stream: str, partitions: Sequence[int], *, paused: bool | None = None,
                  read_only: bool | None = None,
                  resume_all: bool | None = None) -> Awaitable[None]:
        """Applied here and now (the listeners run before this returns)."""
        done = asyncio.get_running_loop().create_future()
        try:
            set_local_flags(self, self._stream_of(stream), stream, partitions, paused,
                            read_only, resume_all)
        except StreamNotFoundError as exc:
            done.set_exception(exc)
        else:
            done.set_result(None)
        return done


def set_local_flags(placement: Placement, found: "Stream | None", name: str,
                    partitions: Sequence[int], paused: bool | None, read_only: bool | None,
                    resume_all: bool | None) -> None:
    """Set the flags of a stream this server alone decides on (any stream of a single
    server, a cluster member's internal streams): its resumeAll (in memory only, as
    Liftbridge keeps it), then each partition's flags through ``placement``'s listeners
    (None: unchanged). ``found``: the local stream ``name``. Raises StreamNotFoundError
    (no such stream or partition)."""
    if found is None or any(not 0 <= i < len(found.partitions) for i in partitions):
        raise StreamNotFoundError(f"stream {name!r} or one of its partitions "
                                  f"{list(partitions)} is gone")
    if resume_all is not None:
        found.resume_all = resume_all
    for index in partitions:
        now = found.partitions[index]
        placement.flags_changed(name, index, PartitionFlags(
            now.paused if paused is None else paused,
            now.readonly if read_only is None else read_only))
