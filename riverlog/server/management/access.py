# Who sees what in the management API, from docs/security.md's authorization: a caller that
# may `admin` every stream (pattern "*"; everyone while authorization is off), or a runtime
# user tagged `administrator`, is RabbitMQ's "administrator": it sees and closes every
# connection and alone changes users and permissions. Any other caller sees the streams it
# may do anything with, and only its own connections with their publishers and consumers, as
# RabbitMQ shows non-monitoring users their own connections only (rabbit_mgmt_util:
# filter_user).
# Rules: pure functions of the Guard and the caller; no I/O. Seeing is asked quietly
# (Guard.permits: a listing logs no denial per stream it leaves out); `may` logs a denial.
from __future__ import annotations

import dataclasses

from ...security.authz import ACTIONS
from ...security.guard import Guard


@dataclasses.dataclass(frozen=True, slots=True)
class Caller:
    """The authenticated user of one request and what it may see."""

    user: str
    guard: Guard

    @property
    def administrator(self) -> bool:
        """May see and close every connection, and change users and permissions
        (Guard.administrator: ``admin`` on ``*``, or a runtime user's tag)."""
        return self.guard.administrator(self.user)

    @property
    def tags(self) -> list[str]:
        """RabbitMQ user tags: a runtime user's own; ``administrator`` or none for a
        configuration-file user."""
        runtime = self.guard.users.runtime(self.user)
        if runtime is not None:
            return list(runtime.tags)
        return ["administrator"] if self.administrator else []

    def sees_stream(self, name: str) -> bool:
        """Any action allowed on stream ``name``. Denials are not logged (listings ask
        about every stream); an administrator sees every stream without a check per
        action."""
        return self.administrator or any(self.guard.permits(self.user, name, action)
                                         for action in ACTIONS)

    def may(self, name: str, action: str) -> bool:
        return self.guard.allowed(self.user, name, action)

    def sees_connection(self, user: str | None) -> bool:
        """A connection logged in as ``user``: the caller's own, or any for an
        administrator."""
        return user == self.user or self.administrator
