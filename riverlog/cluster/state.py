# Cluster metadata and its transitions, as pure functions (docs/clustering.md). Owns: the
# servers of the cluster and the doors each advertises, streams and their partitions (replicas,
# leader, in-sync replicas, leader epoch, paused/read-only), consumer groups and RabbitMQ
# super streams (each a name for an ordered list of partition streams; their transitions are
# state_super.py's), runtime users. Rules: a transition takes a ClusterState and returns a new
# one (the old one is never changed) or raises a MetadataError naming what is wrong, and it is
# deterministic (no clock, no randomness, no I/O), because every Raft member applies it on its
# own copy and all copies must stay equal. Leaders come from the in-sync replicas only (no
# unclean election, as Liftbridge); the first leader epoch is 1 (RabbitMQ's first chunk epoch).
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

from ..broker.groups import (ALREADY_MEMBER, GROUP_NOT_FOUND, NOT_MEMBER, STREAM_NOT_FOUND,
                             balance, generation_mismatch)
from ..broker.stream import StreamConfig, SuperStream
from ..security.access_table import AccessTable
from ..vhost_names import hidden, vhost_of

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


class NoSuchVhost(MetadataError):
    """A stream of a virtual host the access table does not hold (deleted meanwhile)."""


class NoSuchPartition(MetadataError):
    """A partition index outside the stream's partitions."""


class NotEnoughServers(MetadataError):
    """A replication factor larger than the number of servers (add servers or ask fewer)."""


class NotAReplica(MetadataError):
    """A server named as leader or in-sync replica that does not hold a replica."""


class ReplicaExists(MetadataError):
    """add_replica on a server that holds a replica of the partition already."""


class UnsafeReplicaChange(MetadataError):
    """delete_replica that would leave fewer in-sync replicas than the stream's minIsr (at
    least 1), or no replica: add a replica and let it catch up first."""


class StaleLeaderEpoch(MetadataError):
    """A request made under a leader epoch that is no longer the partition's: re-read the
    metadata."""


class NewerMetadata(MetadataError):
    """Metadata (a Raft snapshot) with fields this riverlog does not know: a newer riverlog
    wrote it, and reading it without them would misread it. Upgrade this server."""


def _load_with_defaults(self, state: list) -> None:
    """``__setstate__`` of the metadata classes: pickle (Raft snapshots) gives each field's
    value in order; fields added after the snapshot was written (at the end of the class)
    take their defaults, so a snapshot of an earlier riverlog loads. Fields of a newer
    riverlog's (after the known ones) are dropped when empty (falsy: its feature, gated by
    cluster.features, has not written them yet, as while a cluster is upgraded) and refused
    (NewerMetadata) in a ClusterState otherwise: read without them, it would be misread. So a
    field added to ClusterState stays empty until its feature is active."""
    fields = dataclasses.fields(self)
    if type(self) is ClusterState and any(state[len(fields):]):
        raise NewerMetadata(f"the cluster metadata holds {len(state)} fields, {len(fields)} "
                            f"known here, and the others are not empty: a newer riverlog's "
                            f"feature wrote them")
    for field, value in zip(fields, state):
        object.__setattr__(self, field.name, value)
    for field in fields[len(state):]:
        object.__setattr__(self, field.name, field.default_factory()
                           if field.default is dataclasses.MISSING else field.default)


@dataclasses.dataclass(frozen=True, slots=True)
class Door:
    """Where clients reach one of a server's doors (e.g. "rabbitmq-stream", "grpc", "nats")."""

    host: str
    port: int


@dataclasses.dataclass(frozen=True, slots=True)
class Server:
    """A server of the cluster: its id (``clustering.server.id``), advertised doors and the
    cluster logical version it announced (features.VERSION; 1: a riverlog before versions).
    Fields a newer riverlog adds at the end are dropped when read here (its registration is
    what announces it), and fields missing from an older one's take their defaults."""

    id: str
    doors: Mapping[str, Door] = dataclasses.field(default_factory=dict)
    version: int = 1
    __setstate__ = _load_with_defaults


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
    __setstate__ = _load_with_defaults


@dataclasses.dataclass(frozen=True, slots=True)
class Stream:
    """A stream: its name, NATS subject and partitions (index i at position i); ``config``
    is its broker.StreamConfig as a plain dict (field name -> value), so every replica
    creates it with the same settings."""

    name: str
    subject: str
    partitions: tuple[Partition, ...]
    config: Mapping[str, object] = dataclasses.field(default_factory=dict)
    resume_all: bool = False
    """Paused with Liftbridge's resumeAll: a publish to any partition resumes every paused
    one (set by the latest pause, cleared by a resume)."""
    __setstate__ = _load_with_defaults


_LOCAL_ONLY = ("replicated",)  # StreamConfig fields each server sets for itself
CREATED_KEY = "created_ns"  # in the metadata config: creation time (ns), on every server alike


def config_dict(config: StreamConfig) -> dict:
    """``config`` as the plain dict the metadata carries (state.Stream.config)."""
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in _LOCAL_ONLY}


def stream_config(stored: Mapping[str, object], replicated: bool) -> StreamConfig:
    """The StreamConfig of a metadata stream's ``stored`` dict; fields this version does not
    know are left out (a newer server's)."""
    known = {f.name for f in dataclasses.fields(StreamConfig)} - set(_LOCAL_ONLY)
    return StreamConfig(**{k: v for k, v in stored.items() if k in known},
                        replicated=replicated)


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumerGroup:
    """A Liftbridge consumer group: its coordinator server, epoch (new with every change of
    members or coordinator, never lower than one the cluster gave before), members (consumer
    id -> stream names) and their ``assignments`` (consumer id -> stream -> partition
    indexes, broker.groups.balance as each change happened)."""

    id: str
    coordinator: str
    epoch: int
    members: Mapping[str, tuple[str, ...]]
    assignments: Mapping[str, Mapping[str, tuple[int, ...]]] = dataclasses.field(
        default_factory=dict)
    witnesses: tuple[tuple[str, float], ...] = ()
    """(member, report time in s) of the members that reported this coordinator
    unresponsive (report_group_coordinator); emptied by every coordinator change."""
    __setstate__ = _load_with_defaults


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterState:
    """The whole metadata; the mappings are never mutated (transitions copy them)."""

    servers: Mapping[str, Server] = dataclasses.field(default_factory=dict)
    streams: Mapping[str, Stream] = dataclasses.field(default_factory=dict)
    groups: Mapping[str, ConsumerGroup] = dataclasses.field(default_factory=dict)
    group_epoch: int = 0
    """The newest consumer group epoch given (a group's later epochs are above it, so a
    group made again never reuses one: riverlog's single server does the same)."""
    super_streams: Mapping[str, SuperStream] = dataclasses.field(default_factory=dict)
    """RabbitMQ super streams by name (their own namespace: a stream may share a name)."""
    access: AccessTable = dataclasses.field(default_factory=AccessTable)
    """Runtime users and permissions (the management API's; cluster/access.py changes it)."""
    policies: tuple = ()  # RabbitMQ policies (Policy.to_json): cluster/access.py change_policy
    __setstate__ = _load_with_defaults

    def partition(self, stream: str, index: int) -> Partition:
        """The partition; raises NoSuchStream / NoSuchPartition."""
        found = self.streams.get(stream)
        if found is None:
            raise NoSuchStream(f"no stream {stream!r}")
        if not 0 <= index < len(found.partitions):
            raise NoSuchPartition(f"stream {stream!r} has no partition {index}")
        return found.partitions[index]


def add_server(state: ClusterState, server: Server) -> tuple[ClusterState, Server]:
    """Add ``server`` to the cluster, or replace its advertised doors and announced version
    (Server.version, features.py) if it is known."""
    if not server.id:
        raise MetadataError("a server needs an id")
    server = Server(server.id, dict(server.doors), int(getattr(server, "version", 1)))
    return dataclasses.replace(state, servers={**state.servers, server.id: server}), server


def remove_server(state: ClusterState, server_id: str) -> tuple[ClusterState, None]:
    """Take server ``server_id`` out of the cluster: new streams no longer place replicas on
    it. Partitions keep it in their replicas (delete_replica takes it out; `riverlog cluster
    remove-server --move-replicas` moves them first); the ISR loses it as it stops fetching,
    as for any server that stopped. Raises NoSuchServer."""
    if server_id not in state.servers:
        raise NoSuchServer(f"no server {server_id!r}")
    servers = {i: server for i, server in state.servers.items() if i != server_id}
    return dataclasses.replace(state, servers=servers), None


def create_stream(state: ClusterState, name: str, subject: str, partitions: int = 1,
                  replication_factor: int = 1,
                  config: Mapping[str, object] | None = None) -> tuple[ClusterState, Stream]:
    """Create stream ``name`` with ``partitions`` partitions of ``replication_factor``
    replicas each (ALL_SERVERS: every server) and settings ``config`` (a StreamConfig as a
    dict, kept as given). Replicas are spread round robin over the servers in id order,
    starting after the partitions that exist, so leaders spread too; each partition's first
    replica leads, every replica is in sync, epoch 1.
    Raises StreamExists, NoSuchVhost, NotEnoughServers, MetadataError (bad counts)."""
    if not name:
        raise MetadataError("a stream needs a name")
    if name in state.streams:
        raise StreamExists(f"stream {name!r} exists")
    _check_vhost(state, name)
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


def _check_vhost(state: ClusterState, name: str) -> None:
    """Raise NoSuchVhost for a stream of a virtual host ``state.access`` lacks (an older
    member, which does not check, never sees one: no vhost but `/` exists while it is one)."""
    vhost = vhost_of(name)
    if hidden(name) and not state.access.has_vhost(vhost):
        raise NoSuchVhost(f"stream {name!r}: no virtual host {vhost!r}")


def delete_stream(state: ClusterState, name: str) -> tuple[ClusterState, Stream]:
    """Remove stream ``name``: from the consumer groups reading it (a new epoch, their
    other streams balanced again) and its binding from any super stream it is a partition of
    (as RabbitMQ drops the binding); returns the removed stream. Raises NoSuchStream."""
    if name not in state.streams:
        raise NoSuchStream(f"no stream {name!r}")
    streams = dict(state.streams)
    removed = streams.pop(name)
    supers = {key: s.without(name) for key, s in state.super_streams.items()}
    state = dataclasses.replace(state, streams=streams, super_streams=supers)
    for group in list(state.groups.values()):  # Liftbridge's StreamDeleted: a new epoch
        if any(name in s for s in group.members.values()):
            members = {c: tuple(x for x in s if x != name) for c, s in group.members.items()}
            assignments = {c: {} for c in members}
            _rebalance(state, assignments, members, {x for s in members.values() for x in s})
            state = _with_group(state, group, assignments, members=members)
    return state, removed


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


def add_replica(state: ClusterState, stream: str, index: int,
                server: str) -> tuple[ClusterState, Partition]:
    """Add a replica of the partition on ``server`` (rabbitmq-streams add_replica): last in
    the replicas, outside the ISR. It copies the leader's log like any follower, and the
    leader asks it into the ISR (expand_isr) once it holds everything committed, so it
    counts for commits only then. Raises NoSuchStream, NoSuchPartition, NoSuchServer,
    ReplicaExists."""
    part = state.partition(stream, index)
    if server not in state.servers:
        raise NoSuchServer(f"no server {server!r} (servers: {', '.join(sorted(state.servers))})")
    if server in part.replicas:
        raise ReplicaExists(f"stream {stream!r} partition {index}: {server!r} holds a replica "
                            f"already (replicas {list(part.replicas)})")
    new = dataclasses.replace(part, replicas=part.replicas + (server,))
    return _with_partition(state, new), new


def delete_replica(state: ClusterState, stream: str, index: int,
                   server: str) -> tuple[ClusterState, Partition]:
    """Take ``server``'s replica out of the partition (rabbitmq-streams delete_replica; the
    server need not be in the cluster any more). The leader's replica hands the leadership
    to the first other in-sync replica in replica order first (epoch + 1, as change_leader).
    Refused when an in-sync ``server`` leaves fewer in-sync replicas than the stream's
    ``min_isr`` (at least 1): ALL acks and confirms could no longer be given, or nothing
    committed would be left. Raises NoSuchStream, NoSuchPartition, NotAReplica,
    UnsafeReplicaChange."""
    part = state.partition(stream, index)
    where = f"stream {stream!r} partition {index}"
    if server not in part.replicas:
        raise NotAReplica(f"{where}: {server!r} holds no replica (replicas "
                          f"{list(part.replicas)})")
    isr = tuple(r for r in part.isr if r != server)
    need = max(1, int(state.streams[stream].config.get("min_isr") or 1))
    if len(part.replicas) == 1:
        raise UnsafeReplicaChange(f"{where}: {server!r} holds the only replica (delete the "
                                  f"stream instead)")
    if server in part.isr and len(isr) < need:
        raise UnsafeReplicaChange(
            f"{where}: deleting {server!r} would leave {len(isr)} in-sync replicas "
            f"{list(isr)}, below the stream's minimum of {need}: add a replica and wait until "
            f"it is in sync first")
    new = dataclasses.replace(part, replicas=tuple(r for r in part.replicas if r != server),
                              isr=isr, witnesses=tuple(w for w in part.witnesses
                                                       if w[0] != server))
    if part.leader == server:
        new = dataclasses.replace(new, leader=isr[0], leader_epoch=part.leader_epoch + 1,
                                  witnesses=())
    return _with_partition(state, new), new


def set_partition_flags(state: ClusterState, stream: str, partitions: tuple[int, ...] = (),
                        paused: bool | None = None, read_only: bool | None = None,
                        resume_all: bool | None = None) -> tuple[ClusterState, Stream]:
    """Set the paused / read-only flags of ``partitions`` of ``stream`` (empty: all of them,
    as Liftbridge's PauseStream and SetStreamReadonly), and the stream's ``resume_all``
    (None leaves a flag as it is). Returns the changed stream. Raises NoSuchStream,
    NoSuchPartition (nothing changes then)."""
    found = state.streams.get(stream)
    if found is None:
        raise NoSuchStream(f"no stream {stream!r}")
    chosen = set(partitions or range(len(found.partitions)))
    for index in chosen:
        state.partition(stream, index)  # NoSuchPartition
    parts = tuple(dataclasses.replace(
        p, paused=p.paused if paused is None else paused,
        read_only=p.read_only if read_only is None else read_only)
        if p.index in chosen else p for p in found.partitions)
    new = dataclasses.replace(found, partitions=parts, resume_all=found.resume_all
                              if resume_all is None else resume_all)
    return dataclasses.replace(state, streams={**state.streams, stream: new}), new


class GroupNotFound(MetadataError):
    """A consumer group that does not exist (Liftbridge: NotFound)."""


class GroupRefused(MetadataError):
    """A consumer group request Liftbridge refuses with FailedPrecondition (not a member,
    already one, an unknown stream, a stale coordinator report)."""


def _group_assignments(group: ConsumerGroup) -> dict[str, dict[str, list[int]]]:
    return {c: {s: list(p) for s, p in a.items()} for c, a in group.assignments.items()}


def _with_group(state: ClusterState, old: ConsumerGroup,
                assignments: dict[str, dict[str, list[int]]], **changes) -> ClusterState:
    epoch = state.group_epoch + 1
    new = dataclasses.replace(old, epoch=epoch, assignments={
        c: {s: tuple(p) for s, p in a.items()} for c, a in assignments.items()}, **changes)
    return dataclasses.replace(state, groups={**state.groups, new.id: new}, group_epoch=epoch)


def _rebalance(state: ClusterState, assignments: dict[str, dict[str, list[int]]],
               members: Mapping[str, tuple[str, ...]], streams) -> None:
    for name in sorted(streams):
        balance({c: assignments.setdefault(c, {}) for c, s in members.items() if name in s},
                name, len(state.streams[name].partitions))


def _least_loaded(state: ClusterState, candidates) -> str:
    """The candidate coordinating the fewest groups (ties: the smaller id), as Liftbridge's
    selectGroupCoordinator."""
    load = {c: 0 for c in candidates}
    for group in state.groups.values():
        if group.coordinator in load:
            load[group.coordinator] += 1
    return min(sorted(load), key=lambda c: load[c])


def join_group(state: ClusterState, group: str, consumer: str,
               streams: tuple[str, ...]) -> tuple[ClusterState, ConsumerGroup]:
    """Add ``consumer``, reading ``streams``, to ``group``. A new group gets epoch 0 and the
    server coordinating the fewest groups as its coordinator (Liftbridge's createConsumerGroup);
    joining one takes a new epoch. The consumer's streams are balanced over their readers.
    Raises GroupRefused (a stream that does not exist, already a member), MetadataError (no
    server to coordinate)."""
    streams = tuple(dict.fromkeys(streams))
    for name in streams:
        if name not in state.streams:
            raise GroupRefused(STREAM_NOT_FOUND)
    old = state.groups.get(group)
    if old is not None and consumer in old.members:
        raise GroupRefused(ALREADY_MEMBER)
    members = {**(old.members if old else {}), consumer: streams}
    assignments = _group_assignments(old) if old else {}
    assignments[consumer] = {}
    if old is None:
        if not state.servers:
            raise MetadataError("no server to coordinate a consumer group")
        _rebalance(state, assignments, members, streams)
        new = ConsumerGroup(group, _least_loaded(state, state.servers), 0, members,
                            {c: {s: tuple(p) for s, p in a.items()}
                             for c, a in assignments.items()})
        return dataclasses.replace(state, groups={**state.groups, group: new}), new
    _rebalance(state, assignments, members, streams)
    state = _with_group(state, old, assignments, members=members)
    return state, state.groups[group]


def leave_group(state: ClusterState, group: str,
                consumer: str) -> tuple[ClusterState, ConsumerGroup | None]:
    """Remove ``consumer`` from ``group`` (a new epoch; the partitions it read go to the
    others); the last one leaving removes the group (returns None). Raises GroupNotFound,
    GroupRefused (not a member)."""
    old = state.groups.get(group)
    if old is None:
        raise GroupNotFound(GROUP_NOT_FOUND)
    if consumer not in old.members:
        raise GroupRefused(NOT_MEMBER)
    members = {k: v for k, v in old.members.items() if k != consumer}
    if not members:
        groups = {k: v for k, v in state.groups.items() if k != group}
        return dataclasses.replace(state, groups=groups), None
    assignments = _group_assignments(old)
    gone = assignments.pop(consumer, {})
    _rebalance(state, assignments, members, gone)
    state = _with_group(state, old, assignments, members=members,
                        witnesses=tuple(w for w in old.witnesses if w[0] != consumer))
    return state, state.groups[group]


def report_group_coordinator(state: ClusterState, group: str, consumer: str, coordinator: str,
                             epoch: int, now: float,
                             window: float) -> tuple[ClusterState, ConsumerGroup]:
    """Member ``consumer`` reports ``coordinator`` (under ``epoch``) unresponsive at ``now``
    (s, the reporter's clock). As Liftbridge's ReportGroupCoordinator: once more than half
    of the members reported it within ``window`` s of each other, the group gets the
    server coordinating the fewest groups among the others, and a new epoch. Raises
    GroupRefused (no such group, another coordinator or epoch, not a member: Liftbridge's
    messages), MetadataError (no other server)."""
    old = state.groups.get(group)
    if old is None:
        raise GroupRefused(f"No such consumer group {group}")
    if (coordinator, epoch) != (old.coordinator, old.epoch):
        raise GroupRefused(generation_mismatch(old.coordinator, old.epoch, coordinator, epoch))
    if consumer not in old.members:
        raise GroupRefused(f"Consumer {consumer} is not a member of consumer group {group}")
    witnesses = tuple((c, t) for c, t in old.witnesses if c != consumer and now - t <= window)
    witnesses += ((consumer, now),)
    if len(witnesses) <= len(old.members) // 2:
        new = dataclasses.replace(old, witnesses=witnesses)
        return dataclasses.replace(state, groups={**state.groups, group: new}), new
    candidates = [s for s in state.servers if s != old.coordinator]
    if not candidates:
        raise MetadataError("No group coordinator candidates")
    state = _with_group(state, old, _group_assignments(old),
                        coordinator=_least_loaded(state, candidates), witnesses=())
    return state, state.groups[group]


TRANSITIONS: Mapping[str, Callable[..., tuple[ClusterState, object]]] = {
    f.__name__: f for f in (add_server, create_stream, delete_stream, change_leader,
                            report_leader, shrink_isr, expand_isr, set_partition_flags, join_group,
                            leave_group, report_group_coordinator, remove_server, add_replica,
                            delete_replica)}
"""This module's commands, by name: ``TRANSITIONS[name](state, **arguments)``; every command
Raft replicates is in state_super.TRANSITIONS (these and the super streams') and
access.COMMANDS (those and change_access)."""
