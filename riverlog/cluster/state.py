# Cluster metadata and its transitions, as pure functions (docs/clustering.md). Owns: the
# servers of the cluster and the doors each advertises, streams and their partitions (replicas,
# leader, in-sync replicas, leader epoch, paused/read-only), consumer groups and RabbitMQ
# super streams (each a name for an ordered list of partition streams). Rules: a
# transition takes a ClusterState and returns a new one (the old one is never changed) or
# raises a MetadataError naming what is wrong, and it is deterministic (no clock, no
# randomness, no I/O), because every Raft member applies it on its own copy and all copies
# must stay equal. Leaders come from the in-sync replicas only (no unclean election, as
# Liftbridge); the first leader epoch is 1 (RabbitMQ's first chunk epoch).
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

from ..broker.superstreams import SuperStream

FIRST_LEADER_EPOCH = 1
ALL_SERVERS = -1
"""A replication factor of -1: one replica on every server (Liftbridge's CreateStream)."""


class MetadataError(ValueError):
    """A metadata change that cannot be made; nothing was changed."""


class NoSuchServer(MetadataError):
    """A server id that is not in the cluster (add it first)."""


class StreamExists(MetadataError):
    """create_stream of a name that is taken."""


class NoSuchStream(MetadataError):
    """A stream name that is not in the metadata."""


class NoSuchPartition(MetadataError):
    """A partition index outside the stream's partitions."""


class NotEnoughServers(MetadataError):
    """A replication factor larger than the number of servers (add servers or ask fewer)."""


class NotAReplica(MetadataError):
    """A server named as leader or in-sync replica that does not hold a replica."""


class SuperStreamExists(MetadataError):
    """create_super_stream of a super stream name that is taken."""


class StaleLeaderEpoch(MetadataError):
    """A request made under a leader epoch that is no longer the partition's: re-read the
    metadata."""


@dataclasses.dataclass(frozen=True, slots=True)
class Door:
    """Where clients reach one of a server's doors (e.g. "rabbitmq-stream", "grpc", "nats")."""

    host: str
    port: int


@dataclasses.dataclass(frozen=True, slots=True)
class Server:
    """A server of the cluster: its id (``clustering.server.id``) and advertised doors."""

    id: str
    doors: Mapping[str, Door] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Partition:
    """One partition's placement. ``replicas``: server ids in preference order; ``isr``: the
    in-sync replicas (always containing ``leader`` when there is one); ``leader`` None: no
    in-sync replica could take over (unavailable)."""

    stream: str
    index: int
    replicas: tuple[str, ...]
    leader: str | None
    isr: tuple[str, ...]
    leader_epoch: int = FIRST_LEADER_EPOCH
    paused: bool = False
    read_only: bool = False
    witnesses: tuple[tuple[str, float], ...] = ()
    """(replica, report time in s) of the in-sync replicas that reported this epoch's leader
    unresponsive (report_leader); emptied by every leader change."""


@dataclasses.dataclass(frozen=True, slots=True)
class Stream:
    """A stream: its name, NATS subject and partitions (index i at position i); ``config``
    is its broker.StreamConfig as a plain dict (field name -> value), so every replica
    creates it with the same settings."""

    name: str
    subject: str
    partitions: tuple[Partition, ...]
    config: Mapping[str, object] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumerGroup:
    """A Liftbridge consumer group: its coordinator server, members (consumer id -> stream
    names) and epoch, incremented on every membership change."""

    id: str
    coordinator: str
    epoch: int
    members: Mapping[str, tuple[str, ...]]


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterState:
    """The whole metadata; the mappings are never mutated (transitions copy them)."""

    servers: Mapping[str, Server] = dataclasses.field(default_factory=dict)
    streams: Mapping[str, Stream] = dataclasses.field(default_factory=dict)
    groups: Mapping[str, ConsumerGroup] = dataclasses.field(default_factory=dict)
    super_streams: Mapping[str, SuperStream] = dataclasses.field(default_factory=dict)
    """RabbitMQ super streams by name (their own namespace: a stream may share a name)."""

    def __setstate__(self, state: list) -> None:
        """Unpickle (pysyncobj's snapshot), also a state pickled by an earlier version with
        fewer fields: the fields it lacks take their defaults."""
        for i, field in enumerate(dataclasses.fields(self)):
            if i < len(state):
                value = state[i]
            elif field.default is not dataclasses.MISSING:
                value = field.default
            else:
                value = field.default_factory()
            object.__setattr__(self, field.name, value)

    def partition(self, stream: str, index: int) -> Partition:
        """The partition; raises NoSuchStream / NoSuchPartition."""
        found = self.streams.get(stream)
        if found is None:
            raise NoSuchStream(f"no stream {stream!r}")
        if not 0 <= index < len(found.partitions):
            raise NoSuchPartition(f"stream {stream!r} has no partition {index}")
        return found.partitions[index]


def add_server(state: ClusterState, server: Server) -> tuple[ClusterState, Server]:
    """Add ``server`` to the cluster, or replace its advertised doors if it is known."""
    if not server.id:
        raise MetadataError("a server needs an id")
    server = Server(server.id, dict(server.doors))
    return dataclasses.replace(state, servers={**state.servers, server.id: server}), server


def create_stream(state: ClusterState, name: str, subject: str, partitions: int = 1,
                  replication_factor: int = 1,
                  config: Mapping[str, object] | None = None) -> tuple[ClusterState, Stream]:
    """Create stream ``name`` with ``partitions`` partitions of ``replication_factor``
    replicas each (ALL_SERVERS: every server) and settings ``config`` (a StreamConfig as a
    dict, kept as given). Replicas are spread round robin over the servers in id order,
    starting after the partitions that exist, so leaders spread too; each partition's first
    replica leads, every replica is in sync, epoch 1.
    Raises StreamExists, NotEnoughServers, MetadataError (bad counts)."""
    if not name:
        raise MetadataError("a stream needs a name")
    if name in state.streams:
        raise StreamExists(f"stream {name!r} exists")
    if partitions < 1:
        raise MetadataError(f"stream {name!r}: partitions must be >= 1, got {partitions}")
    servers = sorted(state.servers)
    factor = len(servers) if replication_factor == ALL_SERVERS else replication_factor
    if factor < 1:
        raise MetadataError(f"stream {name!r}: replication factor must be >= 1 or "
                            f"{ALL_SERVERS}, got {replication_factor}")
    if factor > len(servers):
        raise NotEnoughServers(f"stream {name!r}: replication factor {factor} but the cluster "
                               f"has {len(servers)} servers")
    start = sum(len(s.partitions) for s in state.streams.values())
    placed = []
    for index in range(partitions):
        replicas = tuple(servers[(start + index + k) % len(servers)] for k in range(factor))
        placed.append(Partition(name, index, replicas, replicas[0], replicas))
    stream = Stream(name, subject, tuple(placed), dict(config or {}))
    return dataclasses.replace(state, streams={**state.streams, name: stream}), stream


def delete_stream(state: ClusterState, name: str) -> tuple[ClusterState, Stream]:
    """Remove stream ``name``, and its binding from any super stream it is a partition of
    (as RabbitMQ drops the binding); returns the removed stream. Raises NoSuchStream."""
    if name not in state.streams:
        raise NoSuchStream(f"no stream {name!r}")
    streams = dict(state.streams)
    removed = streams.pop(name)
    supers = {key: s.without(name) for key, s in state.super_streams.items()}
    return dataclasses.replace(state, streams=streams, super_streams=supers), removed


def _with_partition(state: ClusterState, partition: Partition) -> ClusterState:
    stream = state.streams[partition.stream]
    parts = list(stream.partitions)
    parts[partition.index] = partition
    stream = dataclasses.replace(stream, partitions=tuple(parts))
    return dataclasses.replace(state, streams={**state.streams, stream.name: stream})


def _check_epoch(partition: Partition, leader_epoch: int | None) -> None:
    if leader_epoch is not None and leader_epoch != partition.leader_epoch:
        raise StaleLeaderEpoch(f"stream {partition.stream!r} partition {partition.index}: "
                               f"leader epoch {leader_epoch} is not the current "
                               f"{partition.leader_epoch}")


def change_leader(state: ClusterState, stream: str, index: int, leader: str | None = None,
                  leader_epoch: int | None = None) -> tuple[ClusterState, Partition]:
    """Replace the partition's leader (it failed or is being moved), epoch + 1. The new
    leader is ``leader`` if given, else the first in-sync replica in replica order other
    than the current leader; the old leader leaves the ISR (it must catch up to rejoin).
    With no other in-sync replica the partition is left without a leader (``leader`` None:
    unavailable, no unclean election) and its ISR kept, so only a replica that was in sync
    can take over later (change_leader again, naming it). ``leader_epoch``: the epoch the
    request was made under, refused when no longer current (as Liftbridge's ReportLeader).
    Raises NoSuchStream, NoSuchPartition, StaleLeaderEpoch, NotAReplica (``leader`` is not
    an in-sync replica other than the current leader)."""
    part = state.partition(stream, index)
    _check_epoch(part, leader_epoch)
    candidates = [r for r in part.replicas if r in part.isr and r != part.leader]
    if leader is not None:
        if leader not in candidates:
            raise NotAReplica(f"stream {stream!r} partition {index}: {leader!r} is not an "
                              f"in-sync replica other than the leader (ISR {list(part.isr)})")
        candidates = [leader]
    if candidates:
        new = dataclasses.replace(part, leader=candidates[0],
                                  isr=tuple(r for r in part.isr if r != part.leader),
                                  leader_epoch=part.leader_epoch + 1, witnesses=())
    else:
        new = dataclasses.replace(part, leader=None, leader_epoch=part.leader_epoch + 1,
                                  witnesses=())
    return _with_partition(state, new), new


def report_leader(state: ClusterState, stream: str, index: int, replica: str, leader: str,
                  leader_epoch: int, now: float,
                  window: float) -> tuple[ClusterState, Partition]:
    """In-sync ``replica`` reports ``leader`` (under ``leader_epoch``) unresponsive at time
    ``now`` (s, the reporter's clock, passed in so every member applies the same). As
    Liftbridge's ReportLeader (server/failover.go): once more than (ISR size - 1) // 2
    replicas reported it within ``window`` s of each other (a majority of the followers;
    one of two, two of three), the leader is changed as ``change_leader`` does; otherwise
    the report is recorded. Raises NoSuchStream, NoSuchPartition, StaleLeaderEpoch (the
    leader or epoch changed since), NotAReplica (``replica`` is not a follower in the ISR)."""
    part = state.partition(stream, index)
    _check_epoch(part, leader_epoch)
    if leader != part.leader:
        raise StaleLeaderEpoch(f"stream {stream!r} partition {index}: {leader!r} is not the "
                               f"leader ({part.leader!r})")
    if replica not in part.isr or replica == part.leader:
        raise NotAReplica(f"stream {stream!r} partition {index}: {replica!r} is not a "
                          f"follower in the ISR (ISR {list(part.isr)})")
    witnesses = tuple((r, t) for r, t in part.witnesses if r != replica and now - t <= window)
    witnesses += ((replica, now),)
    if len(witnesses) > (len(part.isr) - 1) // 2:
        return change_leader(state, stream, index, leader_epoch=leader_epoch)
    new = dataclasses.replace(part, witnesses=witnesses)
    return _with_partition(state, new), new


def shrink_isr(state: ClusterState, stream: str, index: int, replica: str,
               leader_epoch: int | None = None) -> tuple[ClusterState, Partition]:
    """Remove a lagging ``replica`` from the ISR (no change if it is not in it). The leader
    cannot leave its own ISR (change_leader moves it). Raises NoSuchStream, NoSuchPartition,
    StaleLeaderEpoch, NotAReplica, MetadataError (``replica`` is the leader)."""
    part = state.partition(stream, index)
    _check_epoch(part, leader_epoch)
    if replica not in part.replicas:
        raise NotAReplica(f"stream {stream!r} partition {index}: {replica!r} holds no replica")
    if replica == part.leader:
        raise MetadataError(f"stream {stream!r} partition {index}: the leader {replica!r} "
                            f"cannot leave the ISR")
    new = dataclasses.replace(part, isr=tuple(r for r in part.isr if r != replica))
    return _with_partition(state, new), new


def expand_isr(state: ClusterState, stream: str, index: int, replica: str,
               leader_epoch: int | None = None) -> tuple[ClusterState, Partition]:
    """Add ``replica``, caught up with the leader, to the ISR (no change if it is in it).
    Raises NoSuchStream, NoSuchPartition, StaleLeaderEpoch, NotAReplica, MetadataError (the
    partition has no leader to have caught up with)."""
    part = state.partition(stream, index)
    _check_epoch(part, leader_epoch)
    if replica not in part.replicas:
        raise NotAReplica(f"stream {stream!r} partition {index}: {replica!r} holds no replica")
    if part.leader is None:
        raise MetadataError(f"stream {stream!r} partition {index} has no leader: an in-sync "
                            f"replica must lead before others rejoin")
    if replica in part.isr:
        return state, part
    new = dataclasses.replace(part, isr=tuple(r for r in part.replicas
                                              if r in part.isr or r == replica))
    return _with_partition(state, new), new


def set_partition_flags(state: ClusterState, stream: str, index: int,
                        paused: bool | None = None,
                        read_only: bool | None = None) -> tuple[ClusterState, Partition]:
    """Set the partition's paused / read-only flags (None leaves a flag as it is)."""
    part = state.partition(stream, index)
    new = dataclasses.replace(part, paused=part.paused if paused is None else paused,
                              read_only=part.read_only if read_only is None else read_only)
    return _with_partition(state, new), new


def join_group(state: ClusterState, group: str, consumer: str, streams: tuple[str, ...],
               coordinator: str) -> tuple[ClusterState, ConsumerGroup]:
    """Add or update ``consumer`` in ``group`` (created with ``coordinator``, a server id,
    if new); the epoch goes up by one. Raises NoSuchServer, NoSuchStream."""
    for name in streams:
        if name not in state.streams:
            raise NoSuchStream(f"no stream {name!r}")
    old = state.groups.get(group)
    if old is None:
        if coordinator not in state.servers:
            raise NoSuchServer(f"no server {coordinator!r}")
        old = ConsumerGroup(group, coordinator, 0, {})
    new = dataclasses.replace(old, epoch=old.epoch + 1,
                              members={**old.members, consumer: tuple(streams)})
    return dataclasses.replace(state, groups={**state.groups, group: new}), new


def leave_group(state: ClusterState, group: str,
                consumer: str) -> tuple[ClusterState, ConsumerGroup | None]:
    """Remove ``consumer`` from ``group`` (epoch + 1); the last one leaving removes the
    group (returns None). Raises MetadataError when either is unknown."""
    old = state.groups.get(group)
    if old is None or consumer not in old.members:
        raise MetadataError(f"consumer {consumer!r} is not in group {group!r}")
    members = {k: v for k, v in old.members.items() if k != consumer}
    groups = dict(state.groups)
    if not members:
        del groups[group]
        return dataclasses.replace(state, groups=groups), None
    new = dataclasses.replace(old, epoch=old.epoch + 1, members=members)
    groups[group] = new
    return dataclasses.replace(state, groups=groups), new


def create_super_stream(state: ClusterState, name: str, partitions: tuple[str, ...],
                        binding_keys: tuple[str, ...]) -> tuple[ClusterState, SuperStream]:
    """Record super stream ``name``: ``partitions[i]`` (streams that exist) bound with
    ``binding_keys[i]``, in that order. Raises SuperStreamExists, NoSuchStream (a partition
    that is no stream), MetadataError (counts differ, a partition named twice)."""
    if not name:
        raise MetadataError("a super stream needs a name")
    if name in state.super_streams:
        raise SuperStreamExists(f"super stream {name!r} exists")
    if len(partitions) != len(binding_keys) or len(set(partitions)) != len(partitions):
        raise MetadataError(f"super stream {name!r}: as many distinct partitions as binding "
                            f"keys are needed, got {list(partitions)} and {list(binding_keys)}")
    for partition in partitions:
        if partition not in state.streams:
            raise NoSuchStream(f"super stream {name!r}: no stream {partition!r}")
    created = SuperStream(name, tuple(partitions), tuple(binding_keys))
    return dataclasses.replace(state, super_streams={**state.super_streams,
                                                     name: created}), created


def delete_super_stream(state: ClusterState, name: str) -> tuple[ClusterState, SuperStream]:
    """Forget super stream ``name`` (its partition streams stay: delete_stream them).
    Raises NoSuchStream."""
    if name not in state.super_streams:
        raise NoSuchStream(f"no super stream {name!r}")
    supers = dict(state.super_streams)
    removed = supers.pop(name)
    return dataclasses.replace(state, super_streams=supers), removed


TRANSITIONS: Mapping[str, Callable[..., tuple[ClusterState, object]]] = {
    f.__name__: f for f in (add_server, create_stream, delete_stream, change_leader,
                            report_leader, shrink_isr, expand_isr, set_partition_flags, join_group,
                            leave_group, create_super_stream, delete_super_stream)}
"""The commands Raft replicates, by name: ``TRANSITIONS[name](state, **arguments)``."""
