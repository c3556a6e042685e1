# The runtime users, permissions and virtual hosts of one running server (issue 30 items 1
# and 2; the table and its changes are riverlog.security.access_table's). Owns where the
# table is kept and what follows a change on this server. Rules:
# - alone, the table is DATA/access.json (ACCESS_FILE), replaced atomically (a temporary file,
#   fsync, rename, fsync of the folder) before a change is answered; it holds hashes only;
# - in a cluster the table is ClusterState.access: a change is the Raft command change_access
#   (cluster/access.py), answered once applied here; every server follows the metadata;
# - what follows a change here, whoever made it: the Guard takes the table (the next login
#   and the next permission check see it), the embedded nats-server reloads its users and
#   permissions (a deleted user's NATS connections end there), and the RabbitMQ stream
#   connections of a user or on a virtual host that is gone are closed (RabbitMQ closes them:
#   rabbit_connection_tracking_handler on user_deleted and vhost_deleted).
from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any, Callable

from ..errors import ClusterUnavailableError
from ..security.access_table import CHANGES, AccessTable, from_json, to_json
from ..vhost_names import DEFAULT

log = logging.getLogger("riverlog.security")

ACCESS_FILE = "access.json"
VHOST_CHANGES = ("put_vhost", "delete_vhost")
"""The changes that only a cluster whose every server has virtual hosts may take."""


def load(path: str) -> AccessTable:
    """The table stored at ``path``; an empty one when there is no file. Raises ``OSError``,
    ``ValueError`` (access_table.AccessError, JSON errors) naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return AccessTable()
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    try:
        return from_json(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def save(path: str, table: AccessTable) -> None:
    """Replace ``path`` with ``table`` atomically (blocking: run it in a thread). Raises
    ``OSError``."""
    write_json(path, to_json(table))


def write_json(path: str, data: Any) -> None:
    """Replace ``path`` with ``data`` as JSON atomically (a temporary file, fsync, rename,
    fsync of the folder; mode 0600); blocking. Raises ``OSError``."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def follow_metadata(app, follow: Callable[[Any], None]) -> Callable[[], None] | None:
    """In a cluster (``app.cluster``): call ``follow`` with the metadata's state
    (cluster ClusterState) now and after every change it applies. Returns the function that
    stops following; None on a single server (nothing to follow)."""
    metadata = app.cluster.metadata if app.cluster is not None else None
    if metadata is None:
        return None
    unwatch = metadata.watch(asyncio.get_running_loop(), follow)
    follow(metadata.state)
    return unwatch


class RuntimeAccess:
    """The runtime users and permissions of ``app`` (riverlog.server.app.App). Alone, the
    table is read at construction (raises as ``load``); in a cluster ``start()`` follows
    the metadata (call it once the cluster runs)."""

    def __init__(self, app) -> None:
        self.app = app
        self.path = os.path.join(app.config.data_dir, ACCESS_FILE)
        self._lock = asyncio.Lock()
        self._unwatch: Callable[[], None] | None = None
        if app.cluster is None:
            self._follow(load(self.path))

    @property
    def table(self) -> AccessTable:
        return self.app.guard.runtime

    def start(self) -> None:
        self._unwatch = follow_metadata(self.app, lambda state: self._follow(state.access))

    def stop(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None

    async def change(self, change: str, **arguments: Any) -> object:
        """Apply access_table.CHANGES[``change``] with ``arguments`` and return its result,
        once stored and in effect on this server's doors (nats-server reloaded). Raises
        access_table.AccessError (NoSuchUser, NoSuchPermission), ``OSError`` (the file),
        ClusterUnavailableError (Raft; a virtual host change while a server of the cluster
        does not have virtual hosts, cluster.features.VIRTUAL_HOSTS)."""
        cluster = self.app.cluster
        if cluster is not None:
            from ..cluster.access import AccessRefused
            from ..cluster.features import VIRTUAL_HOSTS
            if (change in VHOST_CHANGES or arguments.get("vhost", DEFAULT) != DEFAULT) \
                    and not self.app.broker.placement.has_feature(VIRTUAL_HOSTS):
                raise ClusterUnavailableError(
                    f"{change} of a virtual host needs every server of the cluster at the "
                    f"version with virtual hosts (a riverlog without them is still a "
                    f"member, or the cluster is forming): finish the upgrade, then try again")
            try:
                result = await self.app.broker.placement.submit(
                    "change_access", change=change, **arguments)
            except AccessRefused as exc:
                raise exc.error from None
            self._follow(cluster.metadata.state.access)
        else:
            async with self._lock:
                table, result = CHANGES[change](self.table, **arguments)
                await asyncio.to_thread(save, self.path, table)
                self._follow(table)
        if self.app.nats is not None:
            await self.app.nats.sync()  # this server's nats-server reloaded
        return result

    def _follow(self, table: AccessTable) -> None:
        """Make this server follow ``table`` (nothing when it is the one followed)."""
        old = self.table
        if table is old or table == old:
            return
        guard = self.app.guard
        guard.set_runtime(table)
        nats = self.app.nats
        if nats is not None:
            nats.permissions_changed(users=True)
        gone = {name for name in old.users if name not in guard.users}
        vhosts_gone = {name for name in old.vhosts if not table.has_vhost(name)}
        if gone and self.app.grpc is not None:
            self.app.grpc.end_calls_of(gone)
        door = self.app.rabbitmq_stream
        if (gone or vhosts_gone) and door is not None:
            for conn in list(door.connections):
                if conn.link.user in gone:
                    log.info("closing stream connection of deleted user %r", conn.link.user)
                    conn.close_for_shutdown()
                elif conn.link.vhost in vhosts_gone:
                    log.info("closing stream connection of %r on deleted virtual host %r",
                             conn.link.user, conn.link.vhost)
                    conn.close_for_shutdown()
