# Where each partition lives, as the doors see it: which server leads it, which hold replicas
# and which are in sync, and where each server's doors listen. Owns the question every door
# asks before serving a partition ("do I lead it?", "who does?"). Rules: doors read placement
# only through ``Broker.placement`` (never the Raft metadata or replication state directly);
# reads are synchronous and answer from the latest applied metadata; the single-server
# answer (``LocalPlacement``) is that this server leads every partition alone, so doors behave
# exactly as before when no cluster is configured. The cluster runtime (riverlog/cluster/)
# installs its own implementation when ``riverlog serve`` runs as a cluster member.
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Mapping

if TYPE_CHECKING:
    from .stream import StreamConfig
    from .superstreams import SuperStream

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


class OffsetsUnavailable(Exception):
    """A partition's leader could not be asked for a stored offset (no leader, no answer, or
    it no longer leads): RabbitMQ answers QueryOffset with STREAM_NOT_AVAILABLE then."""


LeaderListener = Callable[[str, int], None]
"""Called with (stream name, partition index) after the partition's leader changed."""


class Placement:
    """The interface doors use. ``server_id`` is this server's id; ``clustered`` tells whether
    other servers exist (single server: False)."""

    clustered: bool = False

    def __init__(self, server_id: str = "") -> None:
        self.server_id = server_id
        self._listeners: list[LeaderListener] = []

    def of(self, stream: str, index: int) -> PartitionPlacement | None:
        """The placement of partition ``index`` of ``stream``; None when unknown."""
        raise NotImplementedError

    def leads(self, stream: str, index: int) -> bool:
        """Whether this server is the partition's leader (takes its writes)."""
        found = self.of(stream, index)
        return found is not None and found.leader == self.server_id

    def door(self, server_id: str, door: str) -> tuple[str, int] | None:
        """(host, port) where clients reach ``door`` ("rabbitmq-stream", "rabbitmq-stream-tls",
        "grpc", "nats") of server ``server_id``; None when that server does not advertise it."""
        raise NotImplementedError

    def servers(self) -> tuple[str, ...]:
        """Every server id of the cluster, sorted."""
        raise NotImplementedError

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

    def add_leader_listener(self, listener: LeaderListener) -> Callable[[], None]:
        """Call ``listener`` after each leader change; returns a function that removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def leader_changed(self, stream: str, index: int) -> None:
        """Tell the listeners (the implementation calls this, on the event loop)."""
        for listener in list(self._listeners):
            listener(stream, index)


class LocalPlacement(Placement):
    """A single server: it leads every partition of every stream it has, alone, epoch 1.
    ``doors`` maps door names to the (host, port) this server advertises."""

    def __init__(self, server_id: str = "", doors: Mapping[str, tuple[str, int]] | None = None,
                 has_partition: Callable[[str, int], bool] | None = None) -> None:
        super().__init__(server_id)
        self.doors = dict(doors or {})
        self._has_partition = has_partition

    def of(self, stream: str, index: int) -> PartitionPlacement | None:
        if self._has_partition is not None and not self._has_partition(stream, index):
            return None
        me = (self.server_id,)
        return PartitionPlacement(self.server_id, me, me)

    def door(self, server_id: str, door: str) -> tuple[str, int] | None:
        return self.doors.get(door) if server_id == self.server_id else None

    def servers(self) -> tuple[str, ...]:
        return (self.server_id,)
