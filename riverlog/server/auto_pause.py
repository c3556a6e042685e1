# Liftbridge's auto pause (``streams.auto.pause.time``): which partitions have received no
# message for longer than their stream's limit and are paused (liftbridge server/
# partition.go, autoPauseLoop). Owns only the rule; the Liftbridge service runs the loop and
# pauses. Rules: a partition is judged by its leader only; internal streams never pause; a
# stream with ``auto_pause_disable_if_subscribers`` keeps a partition that has subscribers;
# idle time counts from the newest of its last received message, its last pause and the
# stream's creation.
from __future__ import annotations

from typing import Iterator, Mapping

from ..broker import RESERVED_STREAMS, Broker, Partition, Stream

__all__ = ["idle_partitions"]


def idle_partitions(broker: Broker, subscribers: Mapping[int, int],
                    now_ns: int) -> Iterator[tuple[Stream, Partition, int]]:
    """``(stream, partition, limit in ms)`` of each partition this server leads that is due
    for auto pause at ``now_ns`` (ns since the epoch). ``subscribers``: active Subscribe
    calls per partition (by ``id(partition)``)."""
    for stream in list(broker.streams.values()):
        limit = stream.config.auto_pause_time_ms
        if not limit or stream.name in RESERVED_STREAMS:
            continue
        for partition in stream.partitions:  # the leader's decision, as Liftbridge's
            if partition.paused or not broker.placement.leads(stream.name, partition.index):
                continue
            if (stream.config.auto_pause_disable_if_subscribers
                    and subscribers.get(id(partition), 0) > 0):
                continue
            latest = max(partition.events.get("received", (0, 0))[1],
                         partition.events.get("pause", (0, 0))[1], stream.created_ns)
            if now_ns - latest > limit * 1_000_000:
                yield stream, partition, limit
