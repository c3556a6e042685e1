# Partition replication, Kafka-style ISR as Liftbridge does it: the engine of one server.
# Owns which role this server plays for each partition it holds a replica of (leader: answers
# its followers' fetches and advances the high watermark; follower: truncates its divergent
# tail, then fetches its leader's chunks), the NATS subjects of that traffic, the notification
# subscription `<ns>.notify.<server id>` and the high-watermark checkpoints. The leader side is
# replication_leader.py, the follower side replication_follower.py; what both see of this
# engine, and its settings, replication_context.py.
# Rules: everything runs on the event loop that owns the partitions' logs; ``assign`` is called
# after every metadata change and switches roles synchronously (a follower's fetch is cancelled
# before the same log starts taking writes as a leader, so no chunk of an old leader lands in a
# new leader's log); metadata changes (ISR shrink/expand, a silent leader) are only *asked for*
# through ``ReplicationEvents`` (the Raft metadata decides, then calls ``assign`` again).
# Wire facts: /work/shared/DESIGN.md "Scaling out"; Liftbridge server/partition.go and
# server/replicator.go (liftbridge-io/liftbridge 50ac358): requests, subjects, the ISR rules
# (last seen / last caught up within replica.max.lag.time), the follower's loop.
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..broker.placement import PartitionPlacement
from ..errors import LogError
from ..log.high_watermark import HighWatermarkCheckpoint
from ..protocol.liftbridge.envelope import EnvelopeError, MsgType, decode_internal
from .replication_context import ReplicationEvents, ReplicationSettings
from .replication_follower import Follower
from .replication_leader import Leader
from .replication_subjects import notify_subject, partition_subject

if TYPE_CHECKING:
    import nats.aio.client

    from ..broker.partition import Partition

log = logging.getLogger("riverlog.replication")

__all__ = ["ReplicationEvents", "ReplicationSettings", "Replication"]


class _Replica:
    """This server's replica of one partition: its placement, role and checkpoint.
    ``chain`` runs the roles' subscription changes one after the other."""

    __slots__ = ("partition", "placement", "role", "checkpoint", "_chain")

    def __init__(self, partition: "Partition", placement: PartitionPlacement) -> None:
        self.partition = partition
        self.placement = placement
        self.role: Leader | Follower | None = None
        self.checkpoint = HighWatermarkCheckpoint(partition.log.directory)
        self._chain: asyncio.Task | None = None

    async def settled(self) -> None:
        """Wait for the subscription changes chained so far."""
        if self._chain is not None:
            await asyncio.gather(self._chain, return_exceptions=True)

    def chain(self, step) -> None:
        previous = self._chain

        async def run() -> None:
            if previous is not None:
                await asyncio.gather(previous, return_exceptions=True)
            await step

        self._chain = asyncio.get_running_loop().create_task(run())


class Replication:
    """Replication of every partition this server holds a replica of, over ``nc``.

    ``await start()`` subscribes ``<namespace>.notify.<server_id>``; then ``assign`` each
    partition with its placement (at start and after every metadata change), ``unassign``
    when it is deleted or moved away; ``await stop()`` stops every role and saves the high
    watermarks. ``events`` receives the metadata changes replication asks for.
    """

    def __init__(self, server_id: str, namespace: str, nc: "nats.aio.client.Client",
                 settings: ReplicationSettings, events: ReplicationEvents) -> None:
        self.server_id = server_id
        self.namespace = namespace
        self.nc = nc
        self.settings = settings
        self.events = events
        self._replicas: dict[tuple[str, int], _Replica] = {}
        self._notify_sub = None
        self._checkpointer: asyncio.Task | None = None

    async def start(self) -> None:
        self._notify_sub = await self.nc.subscribe(
            notify_subject(self.namespace, self.server_id), cb=self._on_notification)
        self._checkpointer = asyncio.get_running_loop().create_task(self._save_periodically())

    async def stop(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.cancel()
            await asyncio.gather(self._checkpointer, return_exceptions=True)
        if self._notify_sub is not None:
            await self._notify_sub.unsubscribe()
            self._notify_sub = None
        replicas, self._replicas = list(self._replicas.values()), {}
        for replica in replicas:
            await self._drop(replica)

    # -- placement ----------------------------------------------------------------------
    def assign(self, partition: "Partition", placement: PartitionPlacement) -> None:
        """Play this server's role for ``partition`` under ``placement`` (on the event loop).

        Leader (``placement.leader`` is this server): the log writes chunks of
        ``placement.leader_epoch`` from now on (recorded in its leader-epoch checkpoint at
        the log end when new), followers' fetches are answered and the high watermark is the
        lowest log end across the ISR. Follower: truncate the divergent tail (asking the
        leader for the end of this log's latest epoch), then fetch. No leader, or this
        server not a replica: nothing runs. Only the leader's log compacts on its own
        (``CommitLog.follows_compaction``). The same leader and epoch again only updates the
        ISR. The first assign of a partition restores its high watermark from the checkpoint.
        Raises ValueError for a partition whose log commits its own writes (not replicated).
        """
        if partition.log.auto_commit:
            raise ValueError(f"{partition!r} is not replicated (its log commits its own "
                             "writes): create its stream with StreamConfig(replicated=True)")
        key = (partition.stream, partition.index)
        replica = self._replicas.get(key)
        if replica is None or replica.partition is not partition:
            if replica is not None:
                self._stop_role(replica)
            replica = self._replicas[key] = _Replica(partition, placement)
            self._restore(replica)
        elif (replica.role is not None and replica.placement.leader == placement.leader
              and replica.placement.leader_epoch == placement.leader_epoch):
            replica.placement = placement
            if isinstance(replica.role, Leader):
                replica.role.update(placement)
            return
        else:
            self._stop_role(replica)
        replica.placement = placement
        # only the leader compacts on its own; the others, even with no leader known, wait
        # for its compaction point (a restarted server has no role until it caught up)
        partition.log.follows_compaction = placement.leader != self.server_id
        subjects = [partition_subject(self.namespace, partition.stream, partition.index, kind)
                    for kind in ("replicate", "offset")]
        if placement.leader == self.server_id:
            leader = Leader(self, partition, placement, *subjects)
            replica.role = leader
            replica.chain(leader.subscribe())
        elif placement.leader is not None and self.server_id in placement.replicas:
            replica.role = Follower(self, partition, placement, *subjects)

    def unassign(self, stream: str, index: int, forget: bool = False) -> None:
        """Stop replicating partition ``index`` of ``stream`` (deleted, or no longer held
        here); its high watermark is saved unless its folder is gone. ``forget``: its
        replica here was deleted while the stream stays (state.delete_replica): its records
        and segment files are removed too (CommitLog.reset to offset 0)."""
        replica = self._replicas.pop((stream, index), None)
        if replica is not None:
            asyncio.get_running_loop().create_task(self._drop(replica, forget))

    def stats(self, stream: str, index: int) -> dict:
        """What describe and /metrics show: ``role`` ("leader", "follower" or "none"),
        ``leader``, ``leader_epoch``, ``replicas``, ``isr``, ``high_watermark``, ``log_end``
        (next offset),
        and by role: a leader's ``followers`` (replica -> ``log_end`` (None until its first
        fetch), ``lag_messages``, ``lag_bytes``, ``in_sync``, ``in_sync_since`` (Unix ms,
        None when out of sync), ``last_seen_ms`` (ms ago)), a follower's ``refused_chunks``
        and ``leader_last_seen_ms``. Raises KeyError for a partition not assigned here."""
        replica = self._replicas[(stream, index)]
        log_ = replica.partition.log
        out = {"role": "none", "leader": replica.placement.leader,
               "leader_epoch": replica.placement.leader_epoch,
               "replicas": list(replica.placement.replicas), "isr": list(replica.placement.isr),
               "high_watermark": log_.committed_offset, "log_end": log_.next_offset,
               "under_min_isr": replica.placement.under_min_isr}
        if replica.role is not None:
            out.update(replica.role.stats())
        return out

    # -- internals ----------------------------------------------------------------------
    def _stop_role(self, replica: _Replica) -> None:
        role, replica.role = replica.role, None
        if isinstance(role, Leader):
            role.deactivate()
            replica.chain(role.unsubscribe())
        elif role is not None:
            role.stop()
            replica.chain(role.finished())

    async def _drop(self, replica: _Replica, forget: bool = False) -> None:
        self._stop_role(replica)
        await replica.settled()
        if forget:
            try:
                replica.partition.log.reset(0)
            except LogError as exc:  # closed meanwhile (the stream went), compacting
                log.warning("the deleted replica of %r keeps its records: %s",
                            replica.partition, exc)
        self._save(replica)

    def _restore(self, replica: _Replica) -> None:
        if replica.checkpoint.problem:
            log.warning("%s", replica.checkpoint.problem)
        replica.partition.log.commit(replica.checkpoint.offset)

    def _save(self, replica: _Replica) -> None:
        try:
            replica.checkpoint.write(replica.partition.log.committed_offset)
        except OSError as exc:  # a deleted partition's folder is gone
            log.debug("high watermark of %r not saved: %s", replica.partition, exc)

    async def _save_periodically(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.settings.high_watermark_checkpoint_ms / 1000)
            changed = [r for r in self._replicas.values()
                       if r.checkpoint.offset != r.partition.log.committed_offset]
            if changed:
                await loop.run_in_executor(None, lambda: [self._save(r) for r in changed])

    async def _on_notification(self, msg) -> None:
        try:
            note = decode_internal(msg.data, MsgType.PartitionNotification)
        except EnvelopeError as exc:
            log.warning("ignored a bad partition notification: %s", exc)
            return
        replica = self._replicas.get((note.stream, note.partition))
        if replica is not None and isinstance(replica.role, Follower):
            replica.role.wake.set()
