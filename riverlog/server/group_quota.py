# Consumer groups per user on the Liftbridge gRPC door (SecurityConfig.max_groups_per_user,
# RabbitMQ's per-user limits the model): a JoinConsumerGroup that would create a group is
# refused with RESOURCE_EXHAUSTED once its user owns that many live groups.
# Rules: a group is owned by the user whose join created it (first join; Liftbridge makes a
# group on its first join and drops it when its last member leaves or expires); ownership is
# kept in memory, and a group that no longer exists stops counting (checked against the
# groups themselves, ``coordinator_of``); joining an existing group creates nothing and is
# never refused here; anonymous callers (None) are not limited.
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

    def owned(self, user: str) -> int:
        """Live groups ``user`` owns (forgetting groups that are gone)."""
        groups = self.groups()
        for group_id in [g for g in self._owners if groups.coordinator_of(g) is None]:
            del self._owners[group_id]
        return sum(1 for owner in self._owners.values() if owner == user)

    def check(self, user: str | None, group_id: str) -> None:
        """Before ``user`` joins ``group_id``: raise LiftbridgeError RESOURCE_EXHAUSTED when
        the join would create a group and ``user`` already owns ``limit`` groups; otherwise
        note ``user`` as the owner of a group the join creates."""
        if user is None or not self.limit:
            return
        if self.groups().coordinator_of(group_id) is not None:
            return  # an existing group: nothing is created
        held = self.owned(user)
        if held >= self.limit:
            raise LiftbridgeError("RESOURCE_EXHAUSTED", (
                f"user {user!r} owns {held} consumer group(s), the limit per user "
                f"(riverlog.limits.groups.per.user); a join may not create group {group_id!r}"))
        self._owners[group_id] = user  # forgotten by ``owned`` if the join fails
