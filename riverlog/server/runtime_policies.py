# The RabbitMQ policies of one running server (rabbitmqctl set_policy / clear_policy,
# /api/policies; the table's rules are policy_table.py's). Owns where the policies are kept
# and how they reach the streams. Rules:
# - alone, the policies are DATA/policies.json (POLICIES_FILE), replaced atomically before a
#   change is answered, read at start before the streams load;
# - in a cluster the policies are ClusterState.policies: a change is the Raft command
#   change_policy (cluster/access.py), answered once applied here; every server follows the
#   metadata and applies them to its own replicas. While a server of the cluster does not
#   have the POLICIES feature (cluster.features: a rolling upgrade) a change is refused with
#   ClusterUnavailableError (503), never sent to a server that could not apply it;
# - a change applies at once to every stream of the broker (Stream.apply_policy: the policy's
#   max-length-bytes, max-age and stream-max-segment-size-bytes over the stream's own), and
#   the broker applies the current policy to every stream it adds (created or loaded);
# - deleting a virtual host deletes its policies (RabbitMQ: rabbit_vhost:delete clears them).
from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any, Callable

from ..errors import ClusterUnavailableError
from ..vhost_names import external
from .policy_table import Policy, from_json, log_overrides, stream_policy, to_json
from .runtime_access import follow_metadata, write_json

log = logging.getLogger("riverlog.policies")

POLICIES_FILE = "policies.json"
CLUSTER_REFUSAL = ("policies need every server of the cluster at the version with policies "
                   "(a riverlog without them is still a member, or the cluster is forming): "
                   "finish the upgrade, then try again")


def load(path: str) -> dict[tuple[str, str], Policy]:
    """The policies stored at ``path`` by (vhost, name); none when there is no file. Raises
    ``OSError``, ``ValueError`` naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            return from_json(json.load(f))
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: {exc}") from None


class RuntimePolicies:
    """The policies of ``app`` (riverlog.server.app.App): read at construction on a single
    server (raises as ``load``); installs itself as the broker's ``policy_overrides``."""

    def __init__(self, app) -> None:
        self.app = app
        self.path = os.path.join(app.config.data_dir, POLICIES_FILE)
        self._lock = asyncio.Lock()
        self._table: dict[tuple[str, str], Policy] = (
            load(self.path) if app.cluster is None else {})
        self._followed: tuple = ()
        self._unwatch: Callable[[], None] | None = None
        app.broker.policy_overrides = self.overrides

    def start(self) -> None:
        """In a cluster: follow ClusterState.policies (call it once the cluster runs)."""
        self._unwatch = follow_metadata(self.app, lambda state: self._follow(state.policies))

    def stop(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None

    def _follow(self, policies: tuple) -> None:
        """Take the cluster's ``policies`` (JSON objects) when they changed, and apply them."""
        if policies == self._followed:
            return
        try:
            table = from_json({"policies": list(policies)})
        except (ValueError, KeyError, TypeError) as exc:  # not one this riverlog can check
            log.error("cluster policies not followed: %s", exc)
            return
        self._followed = policies
        self._table = table
        self._apply()

    def every(self, vhost: str | None = None) -> list[Policy]:
        """The policies (of ``vhost`` only when given), by vhost then name."""
        return sorted((p for p in self._table.values() if vhost is None or p.vhost == vhost),
                      key=lambda p: (p.vhost, p.name))

    def get(self, vhost: str, name: str) -> Policy | None:
        return self._table.get((vhost, name))

    def policy_of(self, broker_name: str) -> Policy | None:
        """The policy stream ``broker_name`` (riverlog.vhost_names) takes, or None."""
        if not self._table:
            return None
        vhost, name = external(broker_name)
        return stream_policy(self._table.values(), vhost, name)

    def overrides(self, broker_name: str) -> dict[str, int]:
        """policy_table.log_overrides of the stream's policy (empty without one)."""
        return log_overrides(self.policy_of(broker_name))

    async def put(self, policy: Policy) -> bool:
        """Store ``policy`` (replacing the one of its vhost and name) and apply it; returns
        whether it is new. Raises ClusterUnavailableError in a cluster, ``OSError``."""
        key = (policy.vhost, policy.name)
        if self.app.cluster is not None:
            return bool(await self._submit(policy.vhost, policy.name, policy.to_json()))
        async with self._lock:
            table = dict(self._table)
            created = key not in table
            table[key] = policy
            await self._store(table)
        return created

    async def delete(self, vhost: str, name: str) -> bool:
        """Remove a policy and apply the change; returns whether there was one. Raises
        ClusterUnavailableError in a cluster, ``OSError``."""
        if self.app.cluster is not None:
            return bool(await self._submit(vhost, name, None))
        async with self._lock:
            if (vhost, name) not in self._table:
                return False
            table = dict(self._table)
            del table[(vhost, name)]
            await self._store(table)
        return True

    async def forget_vhost(self, vhost: str) -> None:
        """Remove the policies of a deleted virtual host. Raises as ``delete``."""
        if self.app.cluster is not None:
            for policy in self.every(vhost):
                await self._submit(vhost, policy.name, None)
            return
        async with self._lock:
            table = {k: p for k, p in self._table.items() if p.vhost != vhost}
            if len(table) != len(self._table):
                await self._store(table)

    async def _submit(self, vhost: str, name: str, policy: dict | None) -> object:
        """change_policy through Raft, once applied here (followed). Raises
        ClusterUnavailableError (no leader; the POLICIES feature not active)."""
        from ..cluster.features import POLICIES, FeatureNotActive
        placement = self.app.broker.placement
        if not placement.has_feature(POLICIES):
            raise ClusterUnavailableError(CLUSTER_REFUSAL)
        try:
            result = await placement.submit("change_policy", vhost=vhost, name=name,
                                            policy=policy)
        except FeatureNotActive:  # a server of an older version joined meanwhile
            raise ClusterUnavailableError(CLUSTER_REFUSAL) from None
        self._follow(self.app.cluster.metadata.state.policies)
        return result

    async def _store(self, table: dict[tuple[str, str], Policy]) -> None:
        await asyncio.to_thread(write_json, self.path, to_json(table.values()))
        self._table = table
        self._apply()

    def _apply(self) -> None:
        """Give every stream its policy's settings now (a stream whose policy changed logs)."""
        for stream in list(self.app.broker.streams.values()):
            overrides = self.overrides(stream.name)
            if overrides != stream.policy_overrides:
                try:
                    stream.apply_policy(overrides)
                except ValueError as exc:  # LogConfig refused a value: the stream keeps its own
                    log.error("policy not applied to stream %r: %s", stream.name, exc)
                    continue
                log.info("stream %r now under %s", stream.name,
                         overrides or "its own retention (no policy)")

    def describe(self, broker_name: str) -> dict[str, Any]:
        """The management API's queue fields: ``policy`` (name or ""),
        ``effective_policy_definition`` (the policy's definition, {} without one)."""
        policy = self.policy_of(broker_name)
        return {"policy": policy.name if policy else "",
                "effective_policy_definition": dict(policy.definition) if policy else {}}
