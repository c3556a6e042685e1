# The cluster's runtime users and permissions (issue 30 item 2): the Raft command that changes
# ClusterState.access, the management API's AccessTable. Rules: one command, change_access,
# carries one access_table change by name (put_user, delete_user, set_permissions,
# clear_permissions) with its arguments; like every transition it is deterministic (the
# password was hashed before it was submitted) and a refusal is a MetadataError whose cause is
# the AccessError (the API tells 400 from 404 by it).
from __future__ import annotations

import dataclasses

from ..security.access_table import CHANGES, AccessError
from .state import TRANSITIONS, ClusterState, MetadataError


class AccessRefused(MetadataError):
    """A change_access the table refused; ``error`` is the access_table.AccessError."""

    def __init__(self, error: AccessError) -> None:
        super().__init__(str(error))
        self.error = error


def change_access(state: ClusterState, change: str, **arguments) -> tuple[ClusterState, object]:
    """Apply access_table.CHANGES[``change``](state.access, **arguments). Returns (state, the
    change's result). Raises AccessRefused, MetadataError (an unknown change)."""
    apply = CHANGES.get(change)
    if apply is None:
        raise MetadataError(f"unknown access change {change!r}")
    try:
        table, result = apply(state.access, **arguments)
    except AccessError as exc:
        raise AccessRefused(exc) from None
    return dataclasses.replace(state, access=table), result


COMMANDS = {**TRANSITIONS, "change_access": change_access}
"""Every command Raft replicates: state.TRANSITIONS and change_access."""
