# Liftbridge consumer groups on one server: membership, partition assignment, consumer
# timeouts, coordinator reports and epochs. This server is every group's coordinator (a
# cluster's groups are its metadata's: riverlog/cluster/state.py and agreed.py, with the same
# ``balance`` and messages).
# Rules (liftbridge server/groups.go and metadata.go, liftbridge-io/liftbridge 50ac358):
# a group is created by its first join with epoch 0 and deleted when its last member leaves;
# every later membership change takes a new, higher epoch; the partitions of each stream are
# spread over the members that asked for it, each partition (in order) going to the member
# with the fewest assigned partitions (ties: the smaller consumer id); a member that does not
# fetch its assignments within the consumer timeout is removed ("expired"); fetching with an
# epoch other than the group's is refused. Groups are saved (atomically) to
# ``DATA/liftbridge-groups.json`` on every change, so epochs never go back after a restart.
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger("riverlog.broker")

GROUPS_FILE = "liftbridge-groups.json"


class GroupError(Exception):
    """A consumer group request that cannot be done; ``kind`` tells the door which status:
    "not_found" (no such group), "precondition" (not a member, wrong epoch, ...)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# The messages are Liftbridge's (server/metadata.go), clients may match on them.
GROUP_NOT_FOUND = "consumer group does not exist"
NOT_MEMBER = "consumer is not a member of the consumer group"
ALREADY_MEMBER = "consumer is already a member of the consumer group"
WRONG_EPOCH = "client-provided group epoch differs from broker group epoch"
STREAM_NOT_FOUND = "stream does not exist"


NOT_COORDINATOR = "broker is not the consumer group coordinator"
_ECHOED_CHARS = 255


def generation_mismatch(coordinator: str, epoch: int, reported: str,
                        reported_epoch: int) -> str:
    """Liftbridge's refusal of a coordinator report under another coordinator or epoch
    (server/groups.go); a ``reported`` name over 255 characters is cut there ("..."): the
    message goes to the client in gRPC's status details, which must fit 16 KiB."""
    if len(reported) > _ECHOED_CHARS:
        reported = reported[:_ECHOED_CHARS] + "..."
    return (f"Coordinator generation mismatch, current coordinator: {coordinator} epoch: "
            f"{epoch}, got coordinator: {reported} epoch: {reported_epoch}")


def balance(assignments: dict[str, dict[str, list[int]]], stream: str,
            partitions: int) -> None:
    """Liftbridge's balanceAssignmentsForStream (server/groups.go), in place: the consumers
    of ``assignments`` (consumer id -> stream -> partition indexes: those subscribed to
    ``stream``) lose their partitions of ``stream``, then each of its ``partitions`` in order
    goes to the consumer with the fewest assigned partitions (ties: the smaller id)."""
    for assigned in assignments.values():
        assigned.pop(stream, None)
    counts = {consumer: sum(map(len, assigned.values()))
              for consumer, assigned in assignments.items()}
    if not counts:
        return
    for partition in range(partitions):
        target = min(counts, key=lambda consumer: (counts[consumer], consumer))
        assignments[target].setdefault(stream, []).append(partition)
        counts[target] += 1


def consumer_left(on_leave: Callable[[str, str, bool], None] | None, group_id: str,
                  consumer_id: str, expired: bool) -> None:
    """After a consumer left a group: log it when it timed out (``expired``) and call
    ``on_leave(group_id, consumer_id, expired)``, if any."""
    if expired:
        log.warning("consumer %s timed out, removed from consumer group %s",
                    consumer_id, group_id)
    if on_leave is not None:
        on_leave(group_id, consumer_id, expired)


@dataclass
class _Member:
    id: str
    streams: list[str]
    assignments: dict[str, list[int]] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None


@dataclass
class _Group:
    id: str
    coordinator: str
    epoch: int
    members: dict[str, _Member] = field(default_factory=dict)
    reports: dict[str, float] = field(default_factory=dict)


class ConsumerGroups:
    """Every consumer group of this server. ``partitions_of(stream)`` gives a stream's
    partition count (0 when it does not exist); ``on_leave(group, consumer, expired)`` is
    called after every removal (for the activity stream)."""

    def __init__(self, data_dir: str, server_id: str, consumer_timeout_ms: int,
                 coordinator_timeout_ms: int, partitions_of: Callable[[str], int],
                 on_leave: Callable[[str, str, bool], None] | None = None) -> None:
        self.path = os.path.join(data_dir, GROUPS_FILE)
        self.server_id = server_id
        self.consumer_timeout_ms = consumer_timeout_ms
        self.coordinator_timeout_ms = coordinator_timeout_ms
        self.partitions_of = partitions_of
        self.on_leave = on_leave
        self.groups: dict[str, _Group] = {}
        self._epoch = 0
        self._load()

    # -- persistence --------------------------------------------------------------------
    def _load(self) -> None:
        try:
            with open(self.path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.error("cannot read %s (consumer groups start empty): %s", self.path, exc)
            return
        try:
            self._epoch = int(data.get("epoch", 0))
            for gid, g in data.get("groups", {}).items():
                group = _Group(str(gid), self.server_id, int(g["epoch"]))
                for cid, streams in g["members"].items():
                    group.members[str(cid)] = _Member(str(cid), [str(s) for s in streams])
                self.groups[group.id] = group
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            log.error("malformed %s (consumer groups start empty): %s", self.path, exc)
            self.groups.clear()
            return
        for group in self.groups.values():
            self._rebalance_all(group)

    def _save(self) -> None:
        data = {"epoch": self._epoch, "groups": {
            g.id: {"epoch": g.epoch, "members": {m.id: m.streams for m in g.members.values()}}
            for g in self.groups.values()}}
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(data, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            log.error("cannot save consumer groups to %s: %s", self.path, exc)

    def start(self) -> None:
        """Start the consumer timers of groups loaded from disk (needs a running loop)."""
        for group in self.groups.values():
            for member in group.members.values():
                self._arm(group, member)

    def close(self) -> None:
        for group in self.groups.values():
            for member in group.members.values():
                if member.timer is not None:
                    member.timer.cancel()
                    member.timer = None

    # -- requests -----------------------------------------------------------------------
    async def join(self, group_id: str, consumer_id: str,
                   streams: list[str]) -> tuple[str, int]:
        """Add a consumer (creating the group). Returns ``(coordinator, epoch)``.
        Raises GroupError("precondition") for an unknown stream or an existing member."""
        for name in streams:
            if self.partitions_of(name) <= 0:
                raise GroupError("precondition", STREAM_NOT_FOUND)
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = _Group(group_id, self.server_id, 0)
        elif consumer_id in group.members:
            raise GroupError("precondition", ALREADY_MEMBER)
        else:
            group.epoch = self._next_epoch()
        member = _Member(consumer_id, list(dict.fromkeys(streams)))
        group.members[consumer_id] = member
        for name in sorted(member.streams):
            self._balance(group, name)
        self._arm(group, member)
        self._save()
        return group.coordinator, group.epoch

    async def leave(self, group_id: str, consumer_id: str) -> None:
        """Remove a consumer; the group goes when its last member does. Raises
        GroupError("not_found") or GroupError("precondition") when not a member."""
        self._leave(group_id, consumer_id)

    def _leave(self, group_id: str, consumer_id: str, expired: bool = False) -> None:
        group = self.groups.get(group_id)
        if group is None:
            raise GroupError("not_found", GROUP_NOT_FOUND)
        member = group.members.pop(consumer_id, None)
        if member is None:
            raise GroupError("precondition", NOT_MEMBER)
        if member.timer is not None:
            member.timer.cancel()
        group.reports.pop(consumer_id, None)
        if not group.members:
            del self.groups[group_id]
        else:
            group.epoch = self._next_epoch()
            for name in sorted(member.streams):
                if name in member.assignments:
                    self._balance(group, name)
        self._save()
        consumer_left(self.on_leave, group_id, consumer_id, expired)

    def assignments(self, group_id: str, consumer_id: str,
                    epoch: int) -> tuple[dict[str, list[int]], int]:
        """The consumer's partitions per stream and the group epoch; also the consumer's
        heartbeat. Raises GroupError("not_found"), ("precondition") for a wrong epoch or a
        non-member."""
        group = self.groups.get(group_id)
        if group is None:
            raise GroupError("not_found", GROUP_NOT_FOUND)
        if epoch != group.epoch:
            raise GroupError("precondition", WRONG_EPOCH)
        member = group.members.get(consumer_id)
        if member is None:
            raise GroupError("precondition", NOT_MEMBER)
        self._arm(group, member)
        return {s: list(p) for s, p in member.assignments.items()}, group.epoch

    async def report_coordinator(self, group_id: str, consumer_id: str, coordinator: str,
                                 epoch: int) -> None:
        """A member says the coordinator is unresponsive. When a majority of the members
        report within the coordinator timeout, the group gets a new coordinator (this server
        again: there is no other) and a new epoch. Raises GroupError("precondition")."""
        group = self.groups.get(group_id)
        if group is None:
            raise GroupError("precondition", f"No such consumer group {group_id}")
        if coordinator != group.coordinator or epoch != group.epoch:
            raise GroupError("precondition", generation_mismatch(
                group.coordinator, group.epoch, coordinator, epoch))
        if consumer_id not in group.members:
            raise GroupError("precondition", (
                f"Consumer {consumer_id} is not a member of consumer group {group_id}"))
        now = time.monotonic()
        window = self.coordinator_timeout_ms / 1000
        group.reports = {c: t for c, t in group.reports.items() if now - t <= window}
        group.reports[consumer_id] = now
        if len(group.reports) > len(group.members) // 2:
            log.warning("consumer group %s: a majority reported the coordinator; re-electing",
                        group_id)
            group.reports.clear()
            group.epoch = self._next_epoch()
            self._save()

    def stream_deleted(self, name: str) -> None:
        """Drop a deleted stream from every member and rebalance what is left."""
        changed = False
        for group in self.groups.values():
            touched = [m for m in group.members.values() if name in m.streams]
            for member in touched:
                member.streams.remove(name)
                member.assignments.pop(name, None)
            if touched:
                changed = True
                group.epoch = self._next_epoch()
                self._rebalance_all(group)
        if changed:
            self._save()

    def coordinator_of(self, group_id: str) -> tuple[str, int] | None:
        """``(coordinator, epoch)`` of a group, None when it does not exist."""
        group = self.groups.get(group_id)
        return None if group is None else (group.coordinator, group.epoch)

    def is_member(self, group_id: str, consumer_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and consumer_id in group.members

    def member_streams(self, group_id: str, consumer_id: str) -> tuple[str, ...] | None:
        """The streams the member consumes; None when it is no member."""
        group = self.groups.get(group_id)
        member = None if group is None else group.members.get(consumer_id)
        return None if member is None else tuple(member.streams)

    # -- internals ----------------------------------------------------------------------
    def _next_epoch(self) -> int:
        self._epoch += 1
        return self._epoch

    def _rebalance_all(self, group: _Group) -> None:
        for member in group.members.values():
            member.assignments.clear()
        for name in sorted({s for m in group.members.values() for s in m.streams}):
            self._balance(group, name)

    def _balance(self, group: _Group, stream: str) -> None:
        balance({m.id: m.assignments for m in group.members.values() if stream in m.streams},
                stream, self.partitions_of(stream))

    def _arm(self, group: _Group, member: _Member) -> None:
        if member.timer is not None:
            member.timer.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            member.timer = None
            return
        member.timer = loop.call_later(self.consumer_timeout_ms / 1000, self._expired,
                                       group.id, member.id)

    def _expired(self, group_id: str, consumer_id: str) -> None:
        group = self.groups.get(group_id)
        if group is None or consumer_id not in group.members:
            return
        group.members[consumer_id].timer = None
        try:
            self._leave(group_id, consumer_id, expired=True)
        except GroupError:
            pass
