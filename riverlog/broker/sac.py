# Single active consumer groups (RabbitMQ Stream): for each (stream, group name) the members
# (subscriptions, in subscription order) and which one of them is active. Sans-IO: every
# change returns the ConsumerUpdate notifications the door must send; nothing else happens
# here, so the rules can be tested without sockets.
# Rules (as RabbitMQ's rabbit_stream_sac_coordinator): at most one member of a group is active
# or stepping down at a time. A plain stream's group (partition index -1) activates its first
# member and, when the active one leaves, the next one in subscription order. A super-stream
# partition's group (partition index >= 0) wants member ``index % len(members)`` active so
# that the active consumers spread over the partitions: when that changes, the active member
# is first told to step down (ConsumerUpdate active=0), and the wanted one is activated only
# once the client answered, so the old one can store its offset first. A group's partition
# index is fixed by its first member: a member with another one is refused (RabbitMQ:
# partition_index_conflict, Subscribe answered 0x11).
from __future__ import annotations

import dataclasses
from typing import Hashable, Iterable

INACTIVE, ACTIVE, STEPPING_DOWN = "inactive", "active", "stepping down"


@dataclasses.dataclass(frozen=True, slots=True)
class Notification:
    """Tell subscription ``subscription_id`` of connection ``owner`` that it is now active
    or not. A deactivation is a step-down: call ``stepped_down`` once the client answered."""

    owner: Hashable
    subscription_id: int
    active: bool


@dataclasses.dataclass(slots=True)
class Member:
    """One subscription in a group; ``state`` is INACTIVE, ACTIVE or STEPPING_DOWN."""

    owner: Hashable
    subscription_id: int
    state: str = INACTIVE


@dataclasses.dataclass(slots=True)
class Group:
    """The members of one (stream, name) in subscription order; ``partition_index`` is -1
    for a plain stream."""

    partition_index: int
    members: list[Member] = dataclasses.field(default_factory=list)

    def current(self) -> Member | None:
        """The member that is active or stepping down, if any."""
        return next((m for m in self.members if m.state != INACTIVE), None)

    def wanted(self) -> Member:
        """The member that should be active (the group is not empty)."""
        if self.partition_index < 0:
            return self.members[0]
        return self.members[self.partition_index % len(self.members)]


def _activate(member: Member) -> list[Notification]:
    member.state = ACTIVE
    return [Notification(member.owner, member.subscription_id, True)]


class SingleActiveConsumers:
    """Every single-active-consumer group of one server, keyed by (stream, group name).

    A member is one subscription, named by its connection (``owner``, any hashable) and its
    subscription id. Methods return the notifications to send, in order."""

    def __init__(self) -> None:
        self.groups: dict[tuple[str, str], Group] = {}
        self._member_group: dict[tuple[Hashable, int], tuple[str, str]] = {}

    def conflicts(self, stream: str, name: str, partition_index: int) -> bool:
        """True when group (stream, name) exists with another partition index: ``register``
        would refuse such a member."""
        group = self.groups.get((stream, name))
        return group is not None and group.partition_index != partition_index

    def register(self, stream: str, name: str, partition_index: int, owner: Hashable,
                 subscription_id: int) -> list[Notification]:
        """Add a member at the end of group (stream, name). ``partition_index`` is the
        stream's position in its super stream, -1 for a plain stream. Raises ``ValueError``
        if the member is already known or ``conflicts`` says the index differs from the
        group's."""
        key = (owner, subscription_id)
        if key in self._member_group:
            raise ValueError(f"subscription {subscription_id} is already in a group")
        if self.conflicts(stream, name, partition_index):
            raise ValueError(f"group {name!r} on {stream!r} has another partition index")
        group = self.groups.setdefault((stream, name), Group(partition_index))
        member = Member(owner, subscription_id)
        group.members.append(member)
        self._member_group[key] = (stream, name)
        return self._rebalance(group)

    def unregister(self, owner: Hashable, subscription_id: int) -> list[Notification]:
        """Remove a member (Unsubscribe, or its stream is gone); activates the next one if
        it was active or stepping down. Unknown members are ignored."""
        where = self._remove((owner, subscription_id))
        return self._settle([where] if where else [])

    def unregister_owner(self, owner: Hashable) -> list[Notification]:
        """Remove every member of a connection (connection lost)."""
        keys = [k for k in self._member_group if k[0] == owner]
        return self._settle(dict.fromkeys(self._remove(k) for k in keys))

    def _remove(self, key: tuple[Hashable, int]) -> tuple[str, str] | None:
        where = self._member_group.pop(key, None)
        if where is not None:
            group = self.groups[where]
            group.members = [m for m in group.members if (m.owner, m.subscription_id) != key]
        return where

    def _settle(self, touched: Iterable[tuple[str, str]]) -> list[Notification]:
        notes: list[Notification] = []
        for where in touched:
            group = self.groups[where]
            if group.members:
                notes += self._rebalance(group)
            else:
                del self.groups[where]
        return notes

    def stepped_down(self, owner: Hashable, subscription_id: int) -> list[Notification]:
        """The client answered a stepping-down ConsumerUpdate: activate the wanted member."""
        member = self._member((owner, subscription_id))
        if member is None or member.state != STEPPING_DOWN:
            return []
        member.state = INACTIVE
        return self._rebalance(self.groups[self._member_group[(owner, subscription_id)]])

    def is_active(self, owner: Hashable, subscription_id: int) -> bool:
        """True when the member is active (not when stepping down or unknown)."""
        return self.state(owner, subscription_id) == ACTIVE

    def state(self, owner: Hashable, subscription_id: int) -> str | None:
        """INACTIVE, ACTIVE or STEPPING_DOWN; None when the subscription is in no group."""
        member = self._member((owner, subscription_id))
        return member.state if member else None

    def _member(self, key: tuple[Hashable, int]) -> Member | None:
        where = self._member_group.get(key)
        if where is None:
            return None
        return next(m for m in self.groups[where].members if (m.owner, m.subscription_id) == key)

    def drop_stream(self, stream: str) -> None:
        """Forget every group of a deleted stream, without notifications (its subscriptions
        are closed with MetadataUpdate)."""
        for key in [k for k in self.groups if k[0] == stream]:
            for m in self.groups.pop(key).members:
                del self._member_group[(m.owner, m.subscription_id)]

    @staticmethod
    def _rebalance(group: Group) -> list[Notification]:
        current, wanted = group.current(), group.wanted()
        if current is None:
            return _activate(wanted)
        if current is wanted or current.state == STEPPING_DOWN:
            return []  # settled, or waiting for the client's answer
        current.state = STEPPING_DOWN
        return [Notification(current.owner, current.subscription_id, False)]
