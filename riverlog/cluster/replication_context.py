# What the two replication roles (replication_leader.py, replication_follower.py) share with
# the engine that runs them (replication.py): the replication settings (Liftbridge's
# ``clustering.*`` keys), the changes replication asks of the cluster metadata
# (ReplicationEvents) and the narrow view of the engine a role works through
# (ReplicationEngine: identity, NATS connection, settings, events), so the roles never import
# the engine. Rules: nothing here runs; the engine (replication.Replication) is the one
# implementation of ReplicationEngine.
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import nats.aio.client

__all__ = ["ReplicationEngine", "ReplicationEvents", "ReplicationSettings"]


class ReplicationEvents(Protocol):
    """What replication asks of the cluster metadata (each call submits one Raft change and
    returns once it is applied; a refused change, e.g. a stale ``leader_epoch``, raises)."""

    async def shrink_isr(self, stream: str, index: int, replica: str,
                         leader_epoch: int) -> None: ...

    async def expand_isr(self, stream: str, index: int, replica: str,
                         leader_epoch: int) -> None: ...

    async def report_leader(self, stream: str, index: int, leader: str,
                            leader_epoch: int) -> None:
        """A follower has not heard from ``leader`` for replica_max_leader_timeout."""


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicationSettings:
    """Liftbridge's ``clustering.*`` replication keys, in milliseconds and bytes.

    The defaults are riverlog's, chosen for a leader failover within 3 s (Liftbridge's 15 s
    lag time and leader timeout take 15 s or more): a follower reports a silent leader after
    ``replica_max_leader_timeout_ms`` (1.5 s), a follower that fetched nothing new for
    ``replica_max_lag_time_ms`` (3 s) leaves the ISR (ALL acks wait at most that long for a
    dead follower), an idle follower checks in every ``replica_max_idle_wait_ms`` (0.5 s:
    less than both, so an idle follower is never taken for a dead one or a dead leader),
    a fetch waits ``replica_fetch_timeout_ms`` (1 s) for its answer (the minimum ISR is
    the stream's: PartitionPlacement.min_isr); ``replication_max_bytes`` caps a
    fetch answer (at least one whole chunk is sent; also capped by the NATS max payload).
    ``high_watermark_checkpoint_ms``: how often changed high watermarks are saved
    (riverlog's own). Raises ValueError for values out of range.
    """

    replica_max_lag_time_ms: int = 3000
    replica_max_leader_timeout_ms: int = 1500
    replica_max_idle_wait_ms: int = 500
    replica_fetch_timeout_ms: int = 1000
    replication_max_bytes: int = 1024 * 1024
    high_watermark_checkpoint_ms: int = 1000

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) < 1:
                raise ValueError(f"replication setting {field.name} must be >= 1")
        if self.replica_max_idle_wait_ms >= min(self.replica_max_lag_time_ms,
                                                self.replica_max_leader_timeout_ms):
            raise ValueError("clustering.replica.max.idle.wait must be less than "
                             "clustering.replica.max.lag.time and "
                             "clustering.replica.max.leader.timeout")


class ReplicationEngine(Protocol):
    """What a leader or follower role uses of the engine that runs it: this server's id, the
    cluster namespace (NATS subjects), the NATS connection, the settings and the metadata
    events it asks for."""

    server_id: str
    namespace: str
    nc: "nats.aio.client.Client"
    settings: ReplicationSettings
    events: ReplicationEvents
