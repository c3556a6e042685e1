# This server as a member of a riverlog cluster (docs/clustering.md): the Raft metadata member
# (metadata.py) started inside `riverlog serve`, the cluster Placement every door asks ("who
# leads this partition", "where are that server's doors"), the reconcile loop that makes the
# local Broker follow the metadata (and, on the Raft leader, puts the internal `__cursors` in
# it), and the metadata changes the replication engine asks for (ReplicationEvents: ISR
# shrink/expand, a leader reported unresponsive).
# Rules: the metadata is the truth: a stream with a replica here exists locally with the
# settings the metadata carries (the same on every replica), a stream gone from the metadata (or
# holding no replica here any more) is deleted here, a partition whose replica here was deleted
# loses its records, but only once this member has caught up with the Raft log (a member restarting
# starts from an empty state and must not delete what it has not replayed yet); until it has
# caught up this server leads nothing (placement names no leader, replication plays no role,
# doors take no write): its Raft member replays its journal first, whose leaderships may be
# stale (another server was elected while this one was down), and a write taken as leader of
# a stale epoch would be truncated later. Caught up means: its own registration (add_server),
# submitted after start, was applied here, so everything committed before it was too; reconciling
# runs on the event loop after every applied change, never blocks it, and one local failure
# (a stream folder that cannot be made) is logged without stopping the rest; the placement is
# read synchronously from the latest applied state; leader changes are told to the doors
# (Placement.leader_changed; an ISR change under the same leader, Placement.isr_changed)
# after the local streams follow the new state, and counted in
# /metrics (riverlog.metrics: elections, ISR shrinks and expands of partitions held here).
# A server configured to join a running cluster (neither bootstrap seed nor peers) asks to
# join (join.py) before its Raft member first starts, and starts it with the members it was
# given (kept in DATA/raft/members, so a restart does not ask again); every member answers
# join requests while it leads the Raft. A server registers its Raft address as its `raft`
# door; the Raft leader removes from the metadata a server whose Raft address is no longer
# a Raft member (`riverlog cluster remove-server`), checking every MEMBERS_CHECK_S.
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from typing import Awaitable, Callable, Mapping

from .. import metrics
from ..broker import RESERVED_STREAMS, Broker, StreamConfig, check_writable
from ..broker.placement import OffsetsUnavailable, PartitionPlacement, Placement
from ..broker.stream import SuperStream
from ..config import ClusterConfig
from ..errors import (InvalidArgumentError, NoSuchVhostError, StreamExistsError,
                      StreamNotFoundError)
from . import features, join, raft_files, super_older
from .agreed import Agreed
from .metadata import RaftMetadata, RaftSettings, RaftUnavailable
from .offsets import OffsetForwarding
from .state import (CREATED_KEY, ClusterState, Door, MetadataError, NoSuchStream,
                    NoSuchVhost, Server, StreamExists, config_dict, stream_config)
from .state_super import SuperStreamExists
from .status import PartitionStatus

log = logging.getLogger("riverlog.cluster")

REGISTER_RETRY_S = 0.5
MEMBERS_CHECK_S = 1.0
"""How often the Raft leader looks for registered servers no longer Raft members."""
RAFT_DOOR = "raft"
"""The door a server registers its Raft address under (Door(host, port) of the address)."""
LEADER_TIMEOUT_S = 15.0  # Liftbridge's clustering.replica.max.leader.timeout: reports of
# one leader count together when at most this far apart (state.report_leader)


def _count_changes(isr_before: tuple[str, ...], isr: tuple[str, ...], elected: bool) -> None:
    """Count an applied change of a partition held here in /metrics: an election, replicas
    leaving and joining the ISR."""
    if elected:
        metrics.LEADER_ELECTIONS.inc()
    metrics.ISR_SHRINKS.inc(len(set(isr_before) - set(isr)))
    metrics.ISR_EXPANDS.inc(len(set(isr) - set(isr_before)))


class ClusterPlacement(Agreed, Placement):
    """Placement from the applied metadata (``state``, replaced by the reconcile loop);
    creates and deletes streams, changes flags and consumer groups (Agreed) through Raft
    (``metadata``, set once Raft runs). An internal stream outside the metadata
    (``__activity``; ``__cursors`` until it is made) is each server's own: it holds and
    leads it, as a single server does."""

    clustered = True

    def __init__(self, server_id: str, min_isr: int = 1) -> None:
        super().__init__(server_id)
        self.min_isr = min_isr  # of streams created without one
        self.state = ClusterState()
        self.caught_up = False
        """Whether this server has applied everything the cluster had committed when it
        started (ClusterNode sets it); before, every partition is told without a leader."""
        self.metadata: RaftMetadata | None = None
        self.created: Callable[[str], Awaitable[None]] | None = None
        """Awaited after a create_stream applied here (PartitionStatus.wait_for_replicas)."""
        self.offsets = None
        """cluster.offsets.OffsetForwarding once the NATS link runs (stored offsets)."""
        self.bootstrap_size = 1  # the servers the cluster starts with (``forming``)

    def of(self, stream: str, index: int) -> PartitionPlacement | None:
        found = self.state.streams.get(stream)
        if found is None and stream in RESERVED_STREAMS:  # this server's own: it leads it
            me = (self.server_id,)
            return PartitionPlacement(self.server_id, me, me)
        if found is None or not 0 <= index < len(found.partitions):
            return None
        part = found.partitions[index]
        min_isr = found.config.get("min_isr") or self.min_isr
        return PartitionPlacement(part.leader if self.caught_up else None, part.replicas,
                                  part.isr, part.leader_epoch, int(min_isr))

    def created_ns(self, stream: str) -> int | None:
        """CREATED_KEY (0: a stream made before it was kept); None: no such stream."""
        found = self.state.streams.get(stream)
        return None if found is None else int(found.config.get(CREATED_KEY) or 0)

    def door(self, server_id: str, door: str) -> tuple[str, int] | None:
        server = self.state.servers.get(server_id)
        found = None if server is None else server.doors.get(door)
        return None if found is None else (found.host, found.port)

    def servers(self) -> tuple[str, ...]:
        return tuple(sorted(self.state.servers))

    def has_feature(self, feature: str) -> bool:
        """Whether every server of the cluster has ``feature`` (features.FEATURES); not while
        the cluster forms (a server not yet registered has announced nothing)."""
        return not self.forming() and features.active(self.state, feature)

    def forming(self) -> bool:
        return not self.caught_up or len(self.state.servers) < self.bootstrap_size

    def reachable(self, server_id: str) -> bool:
        """This server, or one whose Raft member this one's is connected to now."""
        if server_id == self.server_id:
            return True
        raft = self.door(server_id, RAFT_DOOR)
        return (self.metadata is not None and raft is not None
                and self.metadata.connected(f"{raft[0]}:{raft[1]}"))

    def streams(self) -> Mapping[str, tuple[str, int]]:
        return {name: (s.subject, len(s.partitions)) for name, s in self.state.streams.items()}

    async def submit(self, command: str, **arguments) -> object:
        """Apply a metadata command through Raft (RaftMetadata.submit). Raises its
        MetadataError, RaftUnavailable (also before Raft runs)."""
        if self.metadata is None:
            raise RaftUnavailable("the cluster metadata is not running yet")
        return await self.metadata.submit(command, **arguments)

    async def create_stream(self, name: str, config: StreamConfig, *,
                            internal: bool = False) -> None:
        """Create the stream through Raft: ``config.replication_factor`` replicas (-1: every
        server) of ``config.partitions`` partitions, every replica with ``config``'s
        settings (``min_isr`` None: clustering.min.insync.replicas). Returns once
        applied here (the local replica, if any, exists then) and, best effort, once each
        replica says it has the partition and its leader that it leads it (``created``).
        Raises StreamExistsError, InvalidArgumentError (e.g. more replicas than servers;
        ReservedStreamError for ``__cursors``/``__activity`` unless ``internal``: the
        cluster's own; NoSuchVhostError, its virtual host is gone), RaftUnavailable (no
        Raft leader: the outcome is unknown)."""
        if not internal:
            check_writable(name)
        try:
            await self.submit("create_stream", name=name, **self._stream_arguments(config))
        except StreamExists as exc:
            raise StreamExistsError(str(exc)) from None
        except NoSuchVhost as exc:
            raise NoSuchVhostError(str(exc)) from None
        except MetadataError as exc:
            raise InvalidArgumentError(str(exc)) from None
        if self.created is not None:
            await self.created(name)

    def _stream_arguments(self, config: StreamConfig) -> dict:
        """The create_stream arguments of ``config`` but the name (``min_isr`` None:
        clustering.min.insync.replicas; the creation time, the same on every server)."""
        if config.min_isr is None:
            config = dataclasses.replace(config, min_isr=self.min_isr)
        return {"subject": config.subject or "", "partitions": config.partitions,
                "replication_factor": config.replication_factor,
                "config": {**config_dict(config), CREATED_KEY: time.time_ns()}}

    async def delete_stream(self, name: str) -> None:
        """Delete the stream through Raft, on every server. Raises StreamNotFoundError,
        ReservedStreamError (``__cursors``, ``__activity``), RaftUnavailable."""
        check_writable(name)
        try:
            await self.submit("delete_stream", name=name)
        except NoSuchStream as exc:
            raise StreamNotFoundError(str(exc)) from None

    # -- RabbitMQ super streams, in the metadata ------------------------------------------
    def super_streams(self) -> Mapping[str, SuperStream]:
        return self.state.super_streams

    async def create_super_stream(self, name: str, partitions: tuple[str, ...],
                                  binding_keys: tuple[str, ...]) -> None:
        try:
            await self.submit("create_super_stream", name=name, partitions=tuple(partitions),
                              binding_keys=tuple(binding_keys))
        except SuperStreamExists as exc:
            raise StreamExistsError(str(exc)) from None
        except NoSuchStream as exc:
            raise StreamNotFoundError(str(exc)) from None
        except MetadataError as exc:
            raise InvalidArgumentError(str(exc)) from None

    async def delete_super_stream(self, name: str) -> None:
        try:
            await self.submit("delete_super_stream", name=name)
        except NoSuchStream as exc:
            raise StreamNotFoundError(str(exc)) from None

    async def create_super_stream_with_streams(self, name: str, partitions: tuple[str, ...],
                                               binding_keys: tuple[str, ...],
                                               config: StreamConfig) -> None:
        """One Raft entry (state_super.create_super_stream_with_streams) once every server has
        features.SUPER_STREAM_COMMANDS, else the older commands (super_older); returns once
        applied here and, best effort, once every partition's replicas hold it
        (``created``). Raises as ``create_stream`` (ReservedStreamError for an internal
        partition name), RaftUnavailable."""
        for partition in partitions:
            check_writable(partition)
        if not self.has_feature(features.SUPER_STREAM_COMMANDS):
            return await super_older.create(self, name, partitions, binding_keys, config)
        arguments = self._stream_arguments(config)
        try:
            await self.submit("create_super_stream_with_streams", name=name,
                              partitions=tuple(partitions), binding_keys=tuple(binding_keys),
                              subject=arguments["subject"],
                              stream_partitions=arguments["partitions"],
                              replication_factor=arguments["replication_factor"],
                              config=arguments["config"])
        except (StreamExists, SuperStreamExists) as exc:
            raise StreamExistsError(str(exc)) from None
        except MetadataError as exc:
            raise InvalidArgumentError(str(exc)) from None
        if self.created is not None:
            await asyncio.gather(*(self.created(p) for p in partitions))

    async def delete_super_stream_with_streams(self, name: str) -> None:
        """One Raft entry (state_super.delete_super_stream_with_streams) once every server has
        features.SUPER_STREAM_COMMANDS, else the older commands (super_older). Raises
        StreamNotFoundError, ReservedStreamError (an internal partition), RaftUnavailable."""
        for partition in self.state.super_streams.get(name, SuperStream(name, (), ())
                                                      ).partitions:
            check_writable(partition)
        if not self.has_feature(features.SUPER_STREAM_COMMANDS):
            return await super_older.delete(self, name)
        try:
            await self.submit("delete_super_stream_with_streams", name=name)
        except NoSuchStream as exc:
            raise StreamNotFoundError(str(exc)) from None

    async def bind_super_stream(self, name: str, partition: str, binding_key: str,
                                index: int) -> None:
        """One Raft entry (state_super.bind_super_stream) once every server has
        features.SUPER_STREAM_COMMANDS, else the older commands (super_older). Raises
        StreamNotFoundError, InvalidArgumentError, RaftUnavailable."""
        if not self.has_feature(features.SUPER_STREAM_COMMANDS):
            return await super_older.bind(self, name, partition, binding_key, index)
        try:
            await self.submit("bind_super_stream", name=name, partition=partition,
                              binding_key=binding_key, index=index)
        except NoSuchStream as exc:
            raise StreamNotFoundError(str(exc)) from None
        except MetadataError as exc:
            raise InvalidArgumentError(str(exc)) from None

    # -- stored consumer offsets at the leader (cluster/offsets.py) -----------------------
    async def store_offset_at_leader(self, stream: str, index: int, reference: str,
                                     offset: int) -> None:
        if self.offsets is None:
            raise OffsetsUnavailable("the cluster's NATS link is not running")
        await self.offsets.store(stream, index, reference, offset)

    async def query_offset_at_leader(self, stream: str, index: int,
                                     reference: str) -> int | None:
        if self.offsets is None:
            raise OffsetsUnavailable("the cluster's NATS link is not running")
        return await self.offsets.query(stream, index, reference)


class ClusterNode:
    """This server's part of the cluster. ``await start(doors)``, ``await stop()``.

    ``create_local(name, config)`` / ``delete_local(name)`` make and remove a stream on this
    server the way its doors do (the App passes the Liftbridge layer's, so the NATS door
    attaches it); ``placement`` is installed as ``broker.placement`` at construction.
    ``replication`` (riverlog.cluster.replication.Replication, or None while there is no
    data replication: then every replica commits on its own and only the leader takes
    writes) is told every partition held here after each change. ``link`` (the NatsLink
    given to ``start``) carries Liftbridge's partition status requests
    (``<namespace>.raft.metadata.status.<server id>``): this server answers whether it holds
    and leads a partition once ``doors_synced()`` returned (its NATS door listens then), and
    asks a new stream's replicas and leaders before a create returns, so a publish right
    after it reaches a listening leader and a consumer finds the stream on any replica
    (status.py)."""

    def __init__(self, config: ClusterConfig, broker: Broker, settings: RaftSettings,
                 create_local: Callable[[str, StreamConfig], object],
                 delete_local: Callable[[str], None],
                 doors_synced: Callable[[], Awaitable[None]] | None = None) -> None:
        self.config = config
        self.link = None  # server.nats_link.NatsLink: partition status requests and answers
        self.doors_synced = doors_synced
        self.server_id = config.server_id
        self.broker = broker
        self.settings = settings
        self.create_local = create_local
        self.delete_local = delete_local
        self.placement = ClusterPlacement(config.server_id, config.min_insync_replicas)
        self.placement.initial_cluster_size = config.initial_cluster_size
        self.placement.bootstrap_size = len({config.server_id, *config.bootstrap_peers})
        self.status = PartitionStatus(self)
        self.placement.created = self.status.wait_for_replicas
        self.placement.settled = self.status.wait_for_leaders
        self.placement.local = broker.streams
        broker.placement = self.placement
        self.metadata: RaftMetadata | None = None
        self.replication = None
        self.leader_timeout_s = LEADER_TIMEOUT_S  # report_leader's window (replication's)
        self.join_attempts = join.JOIN_ATTEMPTS
        self._assigned: set[tuple[str, int]] = set()
        # internal streams (``__cursors``) put in the metadata once every Raft member is
        # registered, by the Raft leader, as Liftbridge's metadata leader creates them
        self.internal_streams: dict[str, StreamConfig] = {}
        self._internal_task: asyncio.Task | None = None
        self._unwatch: Callable[[], None] | None = None
        self._register_task: asyncio.Task | None = None
        self._forget_task: asyncio.Task | None = None
        self._joins: join.JoinAnswers | None = None

    async def start(self, doors: Mapping[str, tuple[str, int]], link=None) -> None:
        """Start the Raft member (its thread; the Raft files are checked first), follow its
        metadata, register this server with ``doors`` (door name -> advertised host and
        port) in the background until Raft takes it, and answer partition status requests
        on ``link`` (a started NatsLink), and join requests while this member leads the Raft.
        A server configured to join (ClusterConfig.joins) asks to join first, unless it has
        its members file (it joined before). ``replication``, when set, is started first and
        stopped by ``stop``. Raises RaftConfigError, RaftFileCorrupt, RaftBindError,
        join.RaftJoinError."""
        self.link = link
        if self.replication is not None:
            await self.replication.start()
        settings = await self._start_settings()
        self.metadata = await asyncio.to_thread(RaftMetadata, settings)
        self.placement.metadata = self.metadata
        loop = asyncio.get_running_loop()
        self._unwatch = self.metadata.watch(loop, self.apply)
        self.apply(self.metadata.state)
        raft_host, _, raft_port = settings.address.rpartition(":")
        server = Server(self.server_id, {RAFT_DOOR: Door(raft_host, int(raft_port)),
                                         **{name: Door(host, port)
                                            for name, (host, port) in doors.items()}},
                        features.VERSION)
        self._register_task = loop.create_task(self._register(server))
        self._forget_task = loop.create_task(self._forget_removed())
        if self.link is not None:
            self._joins = join.JoinAnswers(self.metadata, self.link.config.namespace,
                                           settings.password)
            await self._listen()
            self.link.add_reconnect_listener(self._listen)
            self.placement.offsets = OffsetForwarding(self.link, self.broker, self.placement)
            await self.placement.offsets.answer(self.link.cluster_nc)
            self.link.add_reconnect_listener(
                lambda _: self.placement.offsets.answer(self.link.cluster_nc))
        log.info("cluster member %s: Raft on %s, peers %s", self.server_id,
                 settings.address, ", ".join(settings.peers) or "none")

    async def _start_settings(self) -> RaftSettings:
        """The Raft settings to start with: as configured; for a server that joins, with
        the members it was given as partners (its members file, else asked for now and kept
        in it). Raises join.RaftJoinError, RaftFileCorrupt."""
        settings = self.settings
        if not self.config.joins:
            return settings
        raft_dir = settings.raft_dir
        members = await asyncio.to_thread(raft_files.read_members, raft_dir)
        if members is None:
            if raft_files.has_journal(raft_dir):
                raise join.RaftJoinError(
                    f"{raft_dir} holds the Raft files of a member that bootstrapped its "
                    f"cluster: keep its clustering.raft.bootstrap.* settings, or remove "
                    f"{raft_dir} to join the cluster afresh")
            if self.link is None or self.link.nc is None:
                raise join.RaftJoinError("joining a running cluster needs NATS")
            members = await join.ask(self.link.nc, self.link.config.namespace,
                                     self.server_id, settings.address, settings.password,
                                     self.join_attempts)
            os.makedirs(raft_dir, exist_ok=True)
            await asyncio.to_thread(raft_files.write_members, raft_dir, members)
        else:
            log.info("server %s joined the cluster before: Raft starts from its journal and "
                     "members %s", self.server_id, ", ".join(members))
        return dataclasses.replace(settings, peers=members)

    async def _register(self, server: Server) -> None:
        """add_server until Raft applies it (no leader yet while the members start). Its
        application here proves this member caught up with the Raft log: the Raft leader
        appended it after everything committed before this member started, and pysyncobj
        applies in log order and calls back once this member applied it; the metadata
        watcher's calls for those entries were queued on the loop before the callback's."""
        while True:
            try:
                await self.placement.submit("add_server", server=server)
            except RaftUnavailable as exc:
                log.debug("registering %s: %s; trying again", self.server_id, exc)
                await asyncio.sleep(REGISTER_RETRY_S)
                continue
            log.info("server %s registered in the cluster metadata, caught up with Raft",
                     self.server_id)
            self.placement.caught_up = True
            self._follow(self.placement.state, ClusterState())  # every leadership is news
            return

    async def _forget_removed(self) -> None:
        """While this member leads the Raft: a registered server whose Raft address is no
        longer a Raft member (taken out with `riverlog cluster remove-server`, pysyncobj's
        removeNodeFromCluster) is removed from the metadata (state.remove_server)."""
        while True:
            await asyncio.sleep(MEMBERS_CHECK_S)
            metadata = self.metadata
            if metadata is None or not metadata.is_leader:
                continue
            members = set(metadata.members())
            for server in list(self.placement.state.servers.values()):
                raft = server.doors.get(RAFT_DOOR)
                if raft is None or f"{raft.host}:{raft.port}" in members:
                    continue
                log.info("server %s (Raft %s:%d) is no Raft member any more: removing it "
                         "from the metadata", server.id, raft.host, raft.port)
                try:
                    await self.placement.submit("remove_server", server_id=server.id)
                except (MetadataError, RaftUnavailable) as exc:
                    log.info("removing server %s: %s", server.id, exc)

    async def _listen(self, _nc=None) -> None:
        """On the NATS link's cluster connection (a reconnect listener: the new door
        connection ``_nc`` is not it): answer partition status requests (status.py) and,
        while this member leads the Raft, join requests (join.JoinAnswers)."""
        nc = self.link.cluster_nc
        if nc is None:
            return
        if self._joins is not None:
            await self._joins.listen(nc)
        await self.status.answer(nc)

    async def stop_following(self) -> None:
        """Stop following the metadata, and replication; the Raft member runs on."""
        for task in (self._register_task, self._forget_task, self._internal_task):
            if task is not None:
                task.cancel()
        self.status.stop()
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        if self.replication is not None:
            await self.replication.stop()

    async def stop(self) -> None:
        """``stop_following``, then the Raft member."""
        await self.stop_following()
        if self.metadata is not None:
            await asyncio.to_thread(self.metadata.close)

    async def reconnected(self, nc) -> None:
        """The NATS link replaced a connection the server closed (NatsLink reconnect
        listener, ``nc`` the NATS door's new connection): replication starts over on the
        link's new cluster connection and every held partition is assigned again (followers
        re-check their tail against the leader)."""
        replication = self.replication
        if replication is None:
            return
        await replication.stop()
        replication.nc = self.link.cluster_nc if self.link is not None else nc
        await replication.start()
        self._assigned = set()
        self._assign(self.placement.state)

    # -- the reconcile loop -------------------------------------------------------------
    def apply(self, state: ClusterState) -> None:
        """Make this server follow ``state`` (called on the loop after every applied
        change): create the streams with a replica here, delete the ones gone, tell
        replication every partition held here, and the doors every leader change."""
        old, self.placement.state = self.placement.state, state
        self._follow(state, old)

    def _follow(self, state: ClusterState, old: ClusterState) -> None:
        """``apply``'s work, ``old`` the state followed before. Before this member caught
        up, only streams gone from the metadata between ``old`` and ``state`` are deleted (a
        replica taken from here is kept, records and all, until then), and no leader change
        is told (the placement names no leader yet)."""
        me, broker = self.server_id, self.broker
        caught_up = self.placement.caught_up
        for name, stream in state.streams.items():
            if name in broker.streams or not any(me in p.replicas for p in stream.partitions):
                continue
            try:
                self.create_local(name, stream_config(stream.config,
                                                      replicated=self.replication is not None))
            except Exception:
                log.exception("cannot create the local replica of stream %r", name)
        for name in list(broker.streams):
            stream = state.streams.get(name)
            if name in RESERVED_STREAMS and stream is None:  # this server's own
                continue
            held = stream is not None and any(me in p.replicas for p in stream.partitions)
            # before caught up only a stream gone from the metadata is deleted: a replica
            # taken from here may be added again further on in the journal being replayed
            if not held and (caught_up or (stream is None and name in old.streams)):
                try:
                    if name in RESERVED_STREAMS:  # __cursors: its replica here was deleted
                        broker.delete(name, internal=True)
                    else:
                        self.delete_local(name)
                except Exception:
                    log.exception("cannot delete the local replica of stream %r", name)
        self._assign(state)
        self.placement.follow_agreed(state)
        self._create_internal(state)
        for name, stream in state.streams.items():
            before = old.streams.get(name)
            for part in stream.partitions:
                prior = before.partitions[part.index] if before is not None and \
                    part.index < len(before.partitions) else None
                elected = prior is None or (prior.leader, prior.leader_epoch) != (
                    part.leader, part.leader_epoch)
                if elected and caught_up:
                    self.placement.leader_changed(name, part.index)
                elif caught_up and prior is not None and prior.isr != part.isr:
                    self.placement.isr_changed(name, part.index)
                if prior is not None and me in part.replicas:
                    _count_changes(prior.isr, part.isr, elected)

    def _create_internal(self, state: ClusterState) -> None:
        """On the Raft leader, once every member is registered: create the internal streams
        missing from ``state`` (in the background; a failure is tried again at the next
        change)."""
        missing = [n for n in self.internal_streams if n not in state.streams]
        if not missing or (self._internal_task is not None and not self._internal_task.done()) \
                or self.metadata is None or not self.metadata.is_leader \
                or len(state.servers) < len(self.settings.peers) + 1:
            return

        async def create() -> None:
            for name in missing:
                try:
                    await self.placement.create_stream(name, self.internal_streams[name],
                                                       internal=True)
                except StreamExistsError:
                    pass
                except Exception as exc:  # RaftUnavailable, ...: again at the next change
                    log.warning("creating %s in the cluster metadata: %s", name, exc)
        self._internal_task = asyncio.get_running_loop().create_task(create())

    def _assign(self, state: ClusterState) -> None:
        """Replication.assign for every partition held here, unassign for those no more."""
        replication = self.replication
        if replication is None:
            return
        held = set()
        for name, stream in state.streams.items():
            local = self.broker.streams.get(name)
            if local is None:
                continue
            for part in stream.partitions:
                if self.server_id in part.replicas and part.index < len(local.partitions):
                    held.add((name, part.index))
                    replication.assign(local.partitions[part.index],
                                       self.placement.of(name, part.index))
        for name, index in self._assigned - held:  # a replica deleted: its records go too
            if not self.placement.caught_up and name in self.broker.streams:
                held.add((name, index))  # replaying: decided once caught up (``_follow``)
                continue
            replication.unassign(name, index, forget=name in self.broker.streams)
        self._assigned = held

    # -- ReplicationEvents: what replication asks of the metadata -------------------------
    async def shrink_isr(self, stream: str, index: int, replica: str, leader_epoch: int) -> None:
        """``replica`` lags: it leaves the ISR (state.shrink_isr). Raises MetadataError
        (e.g. StaleLeaderEpoch), RaftUnavailable."""
        await self.placement.submit("shrink_isr", stream=stream, index=index, replica=replica,
                                    leader_epoch=leader_epoch)

    async def expand_isr(self, stream: str, index: int, replica: str, leader_epoch: int) -> None:
        """``replica`` caught up: it rejoins the ISR (state.expand_isr)."""
        await self.placement.submit("expand_isr", stream=stream, index=index, replica=replica,
                                    leader_epoch=leader_epoch)

    async def report_leader(self, stream: str, index: int, leader: str,
                            leader_epoch: int) -> None:
        """This server, a follower, finds ``leader`` unresponsive: state.report_leader
        records it, and changes the leader once a majority of the followers in the ISR
        reported it within ``leader_timeout_s`` of each other (Liftbridge's quorum,
        server/failover.go). Raises MetadataError (StaleLeaderEpoch: the leader changed
        since; NotAReplica: this server is not a follower in the ISR), RaftUnavailable."""
        await self.placement.submit("report_leader", stream=stream, index=index,
                                    replica=self.server_id, leader=leader,
                                    leader_epoch=leader_epoch, now=time.time(),
                                    window=self.leader_timeout_s)
