# The cluster's runtime users and permissions (issue 30 item 2): the Raft command that changes
# ClusterState.access, the management API's AccessTable. Rules: one command, change_access,
# carries one access_table change by name (put_user, delete_user, set_permissions,
# clear_permissions) with its arguments; like every transition it is deterministic (the
# password was hashed before it was submitted) and a refusal is a MetadataError whose cause is
# the AccessError (the API tells 400 from 404 by it). RabbitMQ's policies ride beside them:
# change_policy sets or clears one policy of ClusterState.policies (checked before it was
# submitted: riverlog.server.policy_table.check; the transition only stores it).
from __future__ import annotations

import dataclasses

from ..security.access_table import CHANGES, AccessError
from .state import ClusterState, MetadataError
from .state_super import TRANSITIONS


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


def change_policy(state: ClusterState, vhost: str, name: str,
                  policy: dict | None = None) -> tuple[ClusterState, bool]:
    """Set policy ``name`` of ``vhost`` to ``policy`` (its JSON object, Policy.to_json), or
    clear it for None. Returns (state, whether it was new / whether there was one)."""
    kept = [p for p in state.policies if (p["vhost"], p["name"]) != (vhost, name)]
    existed = len(kept) != len(state.policies)
    if policy is not None:
        if (policy.get("vhost"), policy.get("name")) != (vhost, name):
            raise MetadataError(f"policy {policy!r} is not {name!r} of {vhost!r}")
        kept.append(dict(policy))
    elif not existed:
        return state, False
    kept.sort(key=lambda p: (p["vhost"], p["name"]))
    return dataclasses.replace(state, policies=tuple(kept)), (
        not existed if policy is not None else True)


COMMANDS = {**TRANSITIONS, "change_access": change_access, "change_policy": change_policy}
"""Every command Raft replicates: state_super.TRANSITIONS (state.py's and the super streams'),
change_access and change_policy."""
