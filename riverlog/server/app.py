# The running server: opens the broker, starts every front door, and stops them in order on
# shutdown (stop accepting, finish in-flight confirms, close connections; in a cluster then
# hand the partitions it leads to in-sync replicas and stop replication and Raft; close the
# logs).
# With a cluster configured (ServerConfig.cluster) it is also a cluster member: the cluster
# Placement is installed before any door starts, the shared NATS link joins the other
# servers' nats-servers, and the Raft member starts once every door listens (it registers
# where they are); without one nothing of the cluster is started or imported.
# Rules: startup failures (a port taken, a data folder not writable) raise with a message
# that names the cause; shutdown never loses a confirmed message; a door listening beyond
# loopback that no remote client can log in to, or whose logins riverlog does not manage, is
# warned about at start (every door serves clients without credentials from loopback only).
from __future__ import annotations

import dataclasses
import logging
import os
from urllib.parse import urlsplit

from .. import __version__, _compiled, data_layout
from ..alarms import ResourceAlarms
from ..broker import RESERVED_STREAMS, Broker
from ..broker.broker import CURSORS_STREAM
from ..config import ServerConfig
from ..security.guard import Guard
from ..security.users import listens_on_loopback
from ..tables.service import TableService
from . import fd_limit
from .metrics_http import MetricsServer
from .rabbitmq_stream import RabbitStreamServer
from .runtime_access import RuntimeAccess
from .runtime_policies import RuntimePolicies

# The Liftbridge doors (NATS bridge, gRPC API) import grpc and nats-py: loaded only when on.

log = logging.getLogger("riverlog")


class App:
    """The broker and its doors. ``await start()``, then ``await stop()``."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.guard = Guard(config.security)  # users, authorization, TLS (docs/security.md)
        self.broker = Broker(config.data_dir, config.log)
        self.broker.max_streams_per_user = config.security.max_streams_per_user
        self.broker.alarms = ResourceAlarms(config.data_dir, config.alarms)
        self.rabbitmq_stream: RabbitStreamServer | None = None
        self.liftbridge = None  # server.liftbridge.Liftbridge, when a Liftbridge door is on
        self.nats = None  # server.nats_bridge.NatsBridge
        self.nats_link = None  # server.nats_link.NatsLink, when NATS or a cluster is on
        self.grpc = None  # server.grpc_api.GrpcApi
        self.forwarded = None  # server.forward_leader.ForwardedPublishes, in a cluster
        self.metrics = None  # server.metrics_http.MetricsServer, when config.metrics is set
        self.management = None  # server.management.ManagementServer, when config.management
        self.tables = TableService(self.broker, config.tables, config.table_dir)
        self.cluster = None  # cluster.node.ClusterNode, when config.cluster is set
        if config.cluster is not None:
            from ..cluster.metadata import RaftSettings
            from ..cluster.node import ClusterNode
            self.cluster = ClusterNode(
                config.cluster, self.broker,
                RaftSettings.from_config(config.cluster, config.data_dir),
                self._create_local, self._delete_local, doors_synced=self._doors_synced)
        # runtime users and permissions (the management API's; alone: read from DATA now)
        self.access = RuntimeAccess(self)
        # RabbitMQ policies (alone: read from DATA now, before the streams load)
        self.policies = RuntimePolicies(self)
        if self.cluster is None:  # a cluster checks in its Raft transition (state.py)
            self.broker.vhost_exists = lambda vhost: self.guard.runtime.has_vhost(vhost)

    def _create_local(self, name: str, stream_config) -> None:
        """The cluster's way to make a stream's local replica: as the doors make one (an
        internal stream, ``__cursors``, as the server's own)."""
        if name in RESERVED_STREAMS:
            self.broker.create(name, stream_config, internal=True)
        elif self.liftbridge is not None:
            self.liftbridge.add_stream(name, stream_config)
        else:
            self.broker.create(name, stream_config)

    async def _doors_synced(self) -> None:
        """Return once the doors' subscriptions changes are in effect (the NATS door's)."""
        if self.nats is not None:
            await self.nats.sync()

    def _delete_local(self, name: str) -> None:
        if self.liftbridge is not None:
            self.liftbridge.remove_stream(name)
        else:
            self.broker.delete(name)

    async def start(self) -> None:
        fd_limit.prepare(self.config.log_open_files)  # before the logs open their files
        data_layout.check_and_stamp(self.config.data_dir)  # LayoutTooNew: a newer one's
        self.broker.open()
        self.broker.start()
        self.tables.start()
        try:
            await self._start_liftbridge()
            self.rabbitmq_stream = RabbitStreamServer(self.broker, self.config.rabbitmq_stream,
                                                      self.guard, self.tables.catalog_uri())
            await self.rabbitmq_stream.start()
            if self.cluster is not None:
                await self.nats_link.start()
                self.cluster.replication = self._replication()
                if self.liftbridge is not None and self.liftbridge.cursors.enabled:
                    cursors = self.liftbridge.cursors
                    self.cluster.internal_streams[CURSORS_STREAM] = cursors.stream_config()
                self.nats_link.add_reconnect_listener(self.cluster.reconnected)
                await self.cluster.start(self.doors(), self.nats_link)
                self.access.start()
                self.policies.start()
            if self.config.metrics is not None:
                self.metrics = MetricsServer(self, self.config.metrics)
                self.metrics.start()
            self.broker.alarms.start()
            if self.config.management is not None:
                from .management import ManagementServer
                self.management = ManagementServer(self, self.config.management)
                await self.management.start()
        except BaseException:
            await self.broker.alarms.stop()  # started just before the management API
            if self.metrics is not None:
                await self.metrics.stop()
            if self.cluster is not None:
                await self.cluster.stop()
            if self.rabbitmq_stream is not None:
                await self.rabbitmq_stream.stop()
            await self._stop_liftbridge()
            await self.tables.stop()
            await self.broker.close()
            raise
        self._warn_beyond_loopback()
        log.info("riverlog %s serving %s (%d streams, durability %s)", __version__,
                 os.path.abspath(self.config.data_dir),
                 sum(1 for name in self.broker.streams if not name.startswith("__")),
                 self.config.log.durability.value)
        log.info("codecs: %s", _compiled.status())  # which per-message codecs are compiled

    def _warn_beyond_loopback(self) -> None:
        """Warn about each door that listens beyond loopback where no user may log in from
        there (remote clients are all refused), and about an embedded nats-server with a
        configuration file of its own there (its logins are not riverlog's)."""
        guard = self.guard
        doors = []  # (name, host, takes client certificates)
        if self.rabbitmq_stream is not None:
            doors.append(("RabbitMQ Stream", self.config.rabbitmq_stream.host, True))
        if self.grpc is not None:
            doors.append(("Liftbridge gRPC", self.grpc.config.host, True))
        if self.nats is not None and self.nats.embedded is not None:
            host = self.nats.embedded.host
            if not self.nats.config.embedded_config:
                doors.append(("NATS", host, False))
            elif not listens_on_loopback(host):
                log.warning("NATS listens on %s beyond loopback with a nats-server "
                            "configuration of its own (nats.embedded.config): riverlog does "
                            "not manage its logins, make sure it requires them", host)
        for name, host, certificates in doors:
            if listens_on_loopback(host):
                continue
            if not guard.remote_users(certificates):
                log.warning("%s listens on %s beyond loopback, but no user may log in from "
                            "there (loopback-only users: %s): remote clients are refused",
                            name, host, ", ".join(sorted(guard.users.loopback_only)) or "none")
            elif name == "NATS":
                log.info("NATS listens on %s beyond loopback: every NATS client logs in, on "
                         "loopback too (nats-server cannot tell them apart)", host)

    def doors(self) -> dict[str, tuple[str, int]]:
        """Where clients reach this server's doors: door name ("rabbitmq-stream",
        "rabbitmq-stream-tls", "grpc", "nats") -> advertised (host, port)."""
        doors = {}
        if self.rabbitmq_stream is not None:
            doors["rabbitmq-stream"] = self.rabbitmq_stream.advertised
            if self.config.security.tls is not None:
                doors["rabbitmq-stream-tls"] = self.rabbitmq_stream.advertised_for(tls=True)
        if self.grpc is not None:
            doors["grpc"] = self.liftbridge.advertised
        if self.nats_link is not None and self.nats_link.url:
            address = urlsplit(self.nats_link.url)
            host = address.hostname or ""
            if self.nats is not None and self.nats.embedded is not None:
                host = self.config.grpc.advertised_host or host  # this server's own NATS
            doors["nats"] = (host, address.port or 4222)
        return doors

    async def stop(self) -> None:
        log.info("shutting down")
        if self.management is not None:
            await self.management.stop()
        await self.broker.alarms.stop()
        if self.metrics is not None:
            await self.metrics.stop()
        self.access.stop()
        self.policies.stop()
        # the doors first, while replication still runs, so what they took commits and is
        # confirmed; then the controlled shutdown (cluster.leaving) and the cluster
        if self.rabbitmq_stream is not None:
            await self.rabbitmq_stream.stop()
        await self._stop_liftbridge_doors()
        if self.cluster is not None:
            from ..cluster.leaving import leave
            await leave(self.cluster)
        await self._close_liftbridge_doors()
        if self.cluster is not None:
            await self.cluster.stop()
        await self._stop_liftbridge()
        await self.tables.stop()
        await self.broker.close()
        log.info("stopped")

    async def _start_liftbridge(self) -> None:
        """NATS first (the embedded server, then the bridge's subscriptions), then gRPC."""
        config, cluster = self.config, self.config.cluster
        if config.nats is not None or cluster is not None:
            self.nats_link = self._nats_link()
        if config.nats is None and config.grpc is None:
            return
        from ..config import GrpcConfig
        from .liftbridge import Liftbridge
        grpc = config.grpc or GrpcConfig()
        if cluster is not None:  # one server id for the cluster and Liftbridge
            grpc = dataclasses.replace(grpc, server_id=cluster.server_id)
        self.liftbridge = Liftbridge(self.broker, grpc, config.nats)
        self.liftbridge.open()
        self.liftbridge.start()
        if config.nats is not None:
            from .nats_bridge import NatsBridge
            self.nats = NatsBridge(self.liftbridge, self.nats_link)
            await self.nats.start()
            if cluster is not None:  # publishes other servers forward to its partitions
                from .forward_leader import ForwardedPublishes
                self.forwarded = ForwardedPublishes(self.liftbridge, self.nats_link)
                await self.forwarded.start()
        if self.config.grpc is not None:
            from .grpc_api import GrpcApi
            self.grpc = GrpcApi(self.liftbridge, self.config.grpc, self.guard)
            await self.grpc.start()

    def _replication(self):
        """The partition replication engine of this cluster member, on the NATS link's
        cluster connection (NatsLink.cluster_nc, not the NATS door's), reporting ISR and
        leader changes to the cluster metadata (ClusterNode)."""
        from ..cluster.replication import Replication, ReplicationSettings
        from ..config import GrpcConfig, NatsConfig
        cluster = self.config.cluster
        settings = ReplicationSettings(
            replication_max_bytes=(self.config.grpc or GrpcConfig()).replication_max_bytes,
            **dict(cluster.replica_timings_ms))
        self.cluster.leader_timeout_s = settings.replica_max_leader_timeout_ms / 1000
        namespace = (self.config.nats or NatsConfig()).namespace
        return Replication(cluster.server_id, namespace, self.nats_link.cluster_nc, settings,
                           self.cluster)

    def _nats_link(self):
        """The shared NATS link; a cluster member's embedded nats-server is named after the
        server and, with ``nats.cluster_port``, routed to the others' (routes log in with a
        password derived from the Raft password)."""
        from ..config import NatsConfig
        from .embedded_nats import route_settings
        from .nats_link import NatsLink
        nats, cluster = self.config.nats or NatsConfig(), self.config.cluster
        routes = None
        if cluster is not None and nats.cluster_port is not None:
            routes = route_settings(nats.namespace, nats.host, nats.cluster_port, nats.routes,
                                    cluster.raft_password)
        name = None if cluster is None else f"riverlog-{cluster.server_id}"
        return NatsLink(nats, self.guard, routes, name, clustered=cluster is not None)

    async def _stop_liftbridge_doors(self) -> None:
        """gRPC (stop taking calls), forwarded batches (refused from now on, answered so their
        senders send them on) and NATS (unsubscribed, what arrived stored) take no more; what
        they wrote is committed (the appenders drained) and its acks go out on the bridge's
        data connection, which stays open for ``_close_liftbridge_doors``."""
        grpc, self.grpc = self.grpc, None
        if grpc is not None:
            await grpc.stop()
        if self.forwarded is not None:
            await self.forwarded.refuse()
        if self.nats is not None:
            await self.nats.quiesce()
        if self.liftbridge is not None:
            await self.liftbridge.appenders.drain()

    async def _close_liftbridge_doors(self) -> None:
        """After the controlled shutdown (its partitions have new leaders): the forwarded
        batches' subscription ends (ForwardedPublishes.close), then the NATS bridge sends
        what is queued and closes its data connection."""
        forwarded, self.forwarded = self.forwarded, None
        if forwarded is not None:
            await forwarded.close()
        nats, self.nats = self.nats, None
        if nats is not None:
            await nats.stop()

    async def _stop_liftbridge(self) -> None:
        """After the doors and the cluster: the NATS link (nats-server down), then the
        Liftbridge layer."""
        link, self.nats_link = self.nats_link, None
        if link is not None:
            await link.stop()
        liftbridge, self.liftbridge = self.liftbridge, None
        if liftbridge is not None:
            await liftbridge.close()
