# Consumer groups per user on the Liftbridge gRPC door (SecurityConfig.max_groups_per_user,
# RabbitMQ's per-user limits the model): a JoinConsumerGroup that would create a group is
# refused with RESOURCE_EXHAUSTED once its user owns that many live groups.
# Rules: a group is owned by the user whose join created it (first join; Liftbridge makes a
# group on its first join and drops it when its last member leaves or expires); ownership is
# kept in memory, and a group that no longer exists stops counting (checked against the
# groups themselves, ``coordinator_of``) unless a join that may create it is still in flight
# (``check`` .. ``settled``: in a cluster the join waits on Raft, and the group does not exist
# yet, so it must count meanwhile); joining an existing group creates nothing and is never
# refused here; anonymous callers (None) are not limited.
from __future__ import annotations

from typing import Callable, Protocol

from .liftbridge import LiftbridgeError


class Groups(Protocol):
    def coordinator_of(self, group_id: str) -> tuple[str, int] | None: ...


class GroupQuota:
    """``groups()``: the consumer groups now (single server or the cluster's); ``limit``:
    groups one user may own (0: no limit)."""

    def __init__(self, groups: Callable[[], Groups], limit: int) -> None:
        self.groups = groups
        self.limit = limit
        self._owners: dict[str, str] = {}  # group id -> the user whose join created it
        self._pending: dict[str, int] = {}  # group id -> joins in flight that may create it

    def owned(self, user: str) -> int:
        """Live groups ``user`` owns, joins in flight that may create one included
        (forgetting groups that are gone and have no join in flight)."""
        groups = self.groups()
        for group_id in [g for g in self._owners
                         if g not in self._pending and groups.coordinator_of(g) is None]:
            del self._owners[group_id]
        return sum(1 for owner in self._owners.values() if owner == user)

    def check(self, user: str | None, group_id: str) -> bool:
        """Before ``user`` joins ``group_id``: raise LiftbridgeError RESOURCE_EXHAUSTED when
        the join would create a group and ``user`` already owns ``limit`` groups; otherwise
        note ``user`` as the owner of a group the join creates, counted while the join is in
        flight. True when the join is counted: then ``settled(group_id)`` must follow once it
        succeeded or failed; False (nothing to settle) for an existing group or no limit."""
        if user is None or not self.limit:
            return False
        if self.groups().coordinator_of(group_id) is not None:
            return False  # an existing group: nothing is created
        if group_id in self._pending:  # another join is creating it: counted for its user
            self._pending[group_id] += 1
            return True
        held = self.owned(user)
        if held >= self.limit:
            raise LiftbridgeError("RESOURCE_EXHAUSTED", (
                f"user {user!r} owns {held} consumer group(s), the limit per user "
                f"(riverlog.limits.groups.per.user); a join may not create group {group_id!r}"))
        self._owners[group_id] = user
        self._pending[group_id] = 1
        return True

    def settled(self, group_id: str) -> None:
        """A join ``check`` counted (True) has ended, either way: once no join of ``group_id``
        is in flight, a group that does not exist (the join failed) stops counting."""
        left = self._pending.get(group_id, 0) - 1
        if left > 0:
            self._pending[group_id] = left
            return
        self._pending.pop(group_id, None)
        if group_id in self._owners and self.groups().coordinator_of(group_id) is None:
            del self._owners[group_id]
