# Helpers of the replication tests: N "servers" in the test's event loop, each a Broker in its
# own folder with its own nats-py connection to one real nats-server (the embedded one) and its
# own Replication engine, plus a small metadata holder standing in for Raft: it applies the
# engines' events with riverlog/cluster/state.py's pure functions and assigns the new placement
# on every server, as the Raft metadata will.
from __future__ import annotations

import asyncio
import dataclasses

import nats

from riverlog.broker.broker import Broker
from riverlog.broker.placement import PartitionPlacement
from riverlog.broker.stream import StreamConfig
from riverlog.cluster import state as meta
from riverlog.cluster.replication import Replication, ReplicationSettings
from riverlog.config import LogConfig

NS = "rl-test"
FAST = ReplicationSettings(replica_max_lag_time_ms=1000, replica_max_leader_timeout_ms=2000,
                           replica_max_idle_wait_ms=100, replica_fetch_timeout_ms=1000,
                           high_watermark_checkpoint_ms=100)
"""Short enough for quick tests, long enough that a loaded machine makes no false report."""
SLOW = dataclasses.replace(FAST, replica_max_idle_wait_ms=600_000,
                           replica_max_lag_time_ms=1_200_000,
                           replica_max_leader_timeout_ms=1_200_000)
"""Nothing happens on a timer within a test: a follower only fetches when notified."""


def placement_of(part: meta.Partition) -> PartitionPlacement:
    return PartitionPlacement(part.leader, part.replicas, part.isr, part.leader_epoch)


class Node:
    """One server: broker, NATS connection, replication engine (None while "stopped")."""

    def __init__(self, cluster: "Cluster", server_id: str, data_dir: str) -> None:
        self.cluster = cluster
        self.id = server_id
        self.data_dir = data_dir
        self.broker = Broker(data_dir, cluster.log_config)
        self.broker.open()
        self.nc = None
        self.url: str | None = None  # this server's own way to nats-server (default: the cluster's)
        self.replication: Replication | None = None

    async def start(self) -> None:
        self.nc = await nats.connect(self.url or self.cluster.url)
        self.replication = Replication(self.id, NS, self.nc, self.cluster.settings,
                                       self.cluster)
        await self.replication.start()
        for part in self.cluster.partitions():
            self.cluster.assign_on(self, part)

    async def stop(self) -> None:
        """Stop replicating (the broker and its logs stay open, as a paused process)."""
        replication, self.replication = self.replication, None
        await replication.stop()
        await self.nc.close()

    async def reopen(self) -> None:
        """Close the broker and open it again from its folder, as a restarted process does
        (while stopped: ``start`` replicates again)."""
        await self.broker.close()
        self.broker = Broker(self.data_dir, self.cluster.log_config)
        self.broker.open()

    def partition(self, stream: str = "s", index: int = 0):
        return self.broker.get(stream).partitions[index]


class Cluster:
    """The servers and the metadata (a ClusterState) they share; implements
    ReplicationEvents by applying the change and assigning the result everywhere."""

    def __init__(self, url: str, root, ids=("a", "b", "c"), settings=FAST,
                 log_config: LogConfig | None = None) -> None:
        self.url = url
        self.settings = settings
        self.log_config = log_config or LogConfig()
        self.state = meta.ClusterState()
        self.nodes = {i: Node(self, i, str(root / i)) for i in ids}
        for i in ids:
            self.state, _ = meta.add_server(self.state, meta.Server(i))
        self.events: list[tuple] = []

    async def start(self) -> None:
        for node in self.nodes.values():
            await node.start()

    async def close(self) -> None:
        for node in self.nodes.values():
            if node.replication is not None:
                await node.stop()
            await node.broker.close()

    def partitions(self):
        for stream in self.state.streams.values():
            yield from stream.partitions

    def create_stream(self, name: str = "s", partitions: int = 1, replication_factor: int = 3):
        self.state, stream = meta.create_stream(self.state, name, name, partitions,
                                                replication_factor)
        for node in self.nodes.values():
            if any(node.id in p.replicas for p in stream.partitions):
                node.broker.create(name, StreamConfig(partitions=partitions, replicated=True))
        self.apply_all()
        return stream

    def assign_on(self, node: Node, part: meta.Partition) -> None:
        if node.replication is not None and node.id in part.replicas:
            node.replication.assign(node.partition(part.stream, part.index), placement_of(part))

    def apply_all(self) -> None:
        for part in self.partitions():
            for node in self.nodes.values():
                self.assign_on(node, part)

    def placement(self, stream: str = "s", index: int = 0) -> meta.Partition:
        return self.state.partition(stream, index)

    def set_placement(self, leader: str | None, isr: tuple[str, ...], leader_epoch: int,
                      stream: str = "s", index: int = 0) -> None:
        """Force a placement (scenarios Raft would reach through several failures)."""
        part = dataclasses.replace(self.state.partition(stream, index), leader=leader, isr=isr,
                                   leader_epoch=leader_epoch)
        s = self.state.streams[stream]
        parts = s.partitions[:index] + (part,) + s.partitions[index + 1:]
        self.state = dataclasses.replace(self.state, streams={
            **self.state.streams, stream: dataclasses.replace(s, partitions=parts)})
        self.apply_all()

    def change(self, fn, *args, **kwargs) -> meta.Partition:
        self.state, part = fn(self.state, *args, **kwargs)
        self.apply_all()
        return part

    # -- ReplicationEvents --------------------------------------------------------------
    async def shrink_isr(self, stream, index, replica, leader_epoch):
        self.events.append(("shrink_isr", stream, index, replica, leader_epoch))
        self.change(meta.shrink_isr, stream, index, replica, leader_epoch)

    async def expand_isr(self, stream, index, replica, leader_epoch):
        self.events.append(("expand_isr", stream, index, replica, leader_epoch))
        self.change(meta.expand_isr, stream, index, replica, leader_epoch)

    async def report_leader(self, stream, index, leader, leader_epoch):
        """As the Raft metadata will: the next in-sync replica leads (epoch + 1); a report
        under an older epoch is refused (StaleLeaderEpoch)."""
        self.events.append(("report_leader", stream, index, leader, leader_epoch))
        self.change(meta.change_leader, stream, index, leader_epoch=leader_epoch)


async def eventually(condition, timeout: float = 20.0, what: str = "condition") -> None:
    """Wait (polling every 10 ms) until ``condition()`` holds; fail after ``timeout`` s."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def chunk_bytes(partition, committed_only: bool = True) -> bytes:
    """Every (committed) chunk of the partition, as stored."""
    out, offset = [], partition.log.first_offset
    while True:
        chunks = partition.log.read_chunks(offset, 1 << 24, committed_only=committed_only)
        if not chunks:
            return b"".join(out)
        out += [bytes(c.raw) for c in chunks]
        offset = chunks[-1].header.next_offset
