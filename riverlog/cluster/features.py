# The cluster's feature table (docs/clustering.md "Versions and the feature table"), after
# Redpanda's: each server announces the cluster logical VERSION it speaks in its add_server
# registration (state.Server.version; a server of riverlog before versions announces nothing
# and counts as UNANNOUNCED), the cluster's version is the lowest of its servers', and a
# feature (an internal NATS message, a Raft command) is used only once the cluster's version
# reaches the version it came with. Owns: VERSION, FEATURES, COMMAND_VERSIONS and the
# questions about them. Rules: pure functions of a ClusterState (every member that applied the
# same entries answers the same); a feature is never used before every server has it, and the
# code that uses one always keeps the older way for a cluster that has not (a fallback).
# Adding a feature: a FEATURES row with the VERSION it needs (bump VERSION when the last
# release already announced the current one), its Raft commands in COMMAND_VERSIONS, and a
# fallback where it is used (``active(state, name)``). A field added to ClusterState stays
# empty until its feature is active (an older server reading a snapshot refuses one that is not).
from __future__ import annotations

from typing import Mapping

from .state import ClusterState, MetadataError

UNANNOUNCED = 1
"""The version of a server that registered without one: riverlog up to this feature table
(which already had forwarded batches and the one-entry super stream commands, but cannot be
told from the riverlog before them)."""
VERSION = 3
"""This riverlog's cluster logical version: what it announces, reads and may write."""

FORWARD_BATCH = "forward_batch"
SUPER_STREAM_COMMANDS = "super_stream_commands"
VIRTUAL_HOSTS = "virtual_hosts"
POLICIES = "policies"
FEATURES: Mapping[str, int] = {
    FORWARD_BATCH: 2,
    # forwarded PublishAsync batches on <namespace>.forward.<leader> (protocol/forward_batch);
    # before: each request enveloped to its partition's NATS subject, acked on an inbox
    SUPER_STREAM_COMMANDS: 2,
    # create_super_stream_with_streams, delete_super_stream_with_streams, bind_super_stream
    # (state_super.py); before: create_stream per partition then create_super_stream, and so on
    VIRTUAL_HOSTS: 2,
    # change_access's put_vhost and delete_vhost, and permissions on a vhost other than "/"
    # (security/access_table.py): an older server refuses those changes (its table would
    # differ); before: "/" only, and the changes are refused (riverlog.server.runtime_access)
    POLICIES: 3,
    # change_policy (cluster/access.py) and ClusterState.policies, RabbitMQ's policies; an
    # older server knows neither; before: policy changes are refused with 503
    # (riverlog.server.runtime_policies)
}
"""Feature name -> the cluster version it needs."""

COMMAND_VERSIONS: Mapping[str, int] = {
    "create_super_stream_with_streams": FEATURES[SUPER_STREAM_COMMANDS],
    "delete_super_stream_with_streams": FEATURES[SUPER_STREAM_COMMANDS],
    "bind_super_stream": FEATURES[SUPER_STREAM_COMMANDS],
    "change_policy": FEATURES[POLICIES],
}
"""Raft command name -> the version it came with; every other command is version 1."""


class FeatureNotActive(MetadataError):
    """A command of a feature some server of the cluster does not have yet (an older
    riverlog is still a member): nothing was submitted; use the older way."""


def cluster_version(state: ClusterState) -> int:
    """The lowest version the servers of ``state`` announced (UNANNOUNCED for one that
    announced none); VERSION while no server is registered."""
    return min((getattr(s, "version", UNANNOUNCED) for s in state.servers.values()),
               default=VERSION)


def active(state: ClusterState, feature: str) -> bool:
    """Whether every server of ``state`` has ``feature`` (a FEATURES name). Raises
    KeyError for a name that is not in FEATURES."""
    return cluster_version(state) >= FEATURES[feature]


def command_version(name: str) -> int:
    """The version Raft command ``name`` came with (1 unless COMMAND_VERSIONS says)."""
    return COMMAND_VERSIONS.get(name, 1)


def check_command(state: ClusterState, name: str) -> None:
    """Raise FeatureNotActive when command ``name`` needs a version above the cluster's."""
    need = command_version(name)
    have = cluster_version(state)
    if need > have:
        raise FeatureNotActive(f"metadata command {name!r} needs every server at cluster "
                               f"version {need}; the cluster is at {have}: "
                               + ", ".join(f"{i} {getattr(s, 'version', UNANNOUNCED)}"
                                           for i, s in sorted(state.servers.items())))


def table(state: ClusterState) -> dict:
    """The feature table as JSON values: ``version`` (this server's), ``cluster_version``,
    ``servers`` (id -> announced version) and ``features`` (name -> {"version": needed,
    "active": bool})."""
    return {"version": VERSION, "cluster_version": cluster_version(state),
            "servers": {i: getattr(s, "version", UNANNOUNCED)
                        for i, s in sorted(state.servers.items())},
            "features": {name: {"version": need, "active": active(state, name)}
                         for name, need in FEATURES.items()}}
