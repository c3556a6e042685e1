# The policy commands of `riverlog ctl`: rabbitmqctl's set_policy, clear_policy and
# list_policies, with their arguments, banners, columns and errors (rabbitmq_cli
# lib/rabbitmq/cli/ctl/commands/set_policy_command.ex, clear_policy_command.ex,
# list_policies_command.ex; rabbit_policy:parse_set, rabbit_runtime_parameters:clear_any),
# through the management API's /api/policies/{vhost}/{name}.
# Rules: a definition that is no JSON is refused before anything is sent; a refusal prints
# "Error:" and the server's reason and exits 70, a missing virtual host exits 65.
from __future__ import annotations

import json

import click

from .cli_ctl_base import Ctl, command
from .ctl_client import EX_SOFTWARE, CtlError, HTTPFailure, no_such_vhost, segment

POLICY_KEYS = ("vhost", "name", "pattern", "apply-to", "definition", "priority")
"""list_policies' columns, in rabbitmqctl's order."""


def _path(ctl: Ctl, name: str) -> str:
    return f"/api/policies/{segment(ctl.vhost)}/{segment(name)}"


@command("set_policy")
@click.argument("name")
@click.argument("pattern")
@click.argument("definition")
@click.option("--priority", type=int, default=0, show_default=True,
              help="Policy priority (the highest of the matching policies applies).")
@click.option("--apply-to", "apply_to", default="all", show_default=True,
              help="queues, streams, classic_queues, quorum_queues, exchanges or all.")
def set_policy(ctl: Ctl, name: str, pattern: str, definition: str, priority: int,
               apply_to: str) -> None:
    """Sets or updates a policy: PATTERN is a regular expression over queue (stream)
    names, DEFINITION a JSON object (max-length-bytes, max-age,
    stream-max-segment-size-bytes, ...)."""
    ctl.banner(f'Setting policy "{name}" for pattern "{pattern}" to "{definition}" with '
               f'priority "{priority}" for vhost "{ctl.vhost}" ...')
    try:
        parsed = json.loads(definition)
    except ValueError as exc:
        raise CtlError(EX_SOFTWARE, f"Error:\nJSON decoding error. Reason: {exc}") from None
    try:
        ctl.api.request("PUT", _path(ctl, name), {"pattern": pattern, "definition": parsed,
                                                  "priority": priority,
                                                  "apply-to": apply_to})
    except HTTPFailure as exc:
        if exc.status == 404:
            raise no_such_vhost(ctl.vhost) from None
        raise


@command("clear_policy")
@click.argument("name")
def clear_policy(ctl: Ctl, name: str) -> None:
    """Clears a policy."""
    ctl.banner(f'Clearing policy "{name}" on vhost "{ctl.vhost}" ...')
    try:
        ctl.api.request("DELETE", _path(ctl, name))
    except HTTPFailure as exc:
        if exc.status != 404:
            raise
        if exc.word == "Object Not Found" and not any(
                v.get("name") == ctl.vhost for v in ctl.api.get("/api/vhosts") or []):
            raise no_such_vhost(ctl.vhost) from None
        raise CtlError(EX_SOFTWARE, "Error:\nParameter does not exist") from None


@command("list_policies")
def list_policies(ctl: Ctl) -> None:
    """Lists the policies of a virtual host."""
    ctl.banner(f'Listing policies for vhost "{ctl.vhost}" ...')
    try:
        answer = ctl.api.get(f"/api/policies/{segment(ctl.vhost)}")
    except HTTPFailure as exc:
        if exc.status == 404:
            raise no_such_vhost(ctl.vhost) from None
        raise
    ctl.listing([{key: policy.get(key) for key in POLICY_KEYS}
                 for policy in answer or []])
