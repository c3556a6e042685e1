# The Prometheus endpoint of a running server: prometheus_client's HTTP server (a daemon
# thread) serving GET /metrics with the doors' counters (riverlog.metrics.REGISTRY) and the
# gauges read from server state at scrape time: connections and subscriptions per door,
# disk usage and offsets per stream, consumer lag, and on a cluster member its Raft state and
# each held partition's replication (ISR, high watermark, leader epoch, follower lag).
# The HTTP server is riverlog.prometheus_http's (a stop takes milliseconds).
# Rules: server state is read on the event loop (the scrape thread hands the work over and
# waits at most SCRAPE_TIMEOUT_S), never from the scrape thread; nothing here runs on a hot
# path; off unless configured (ServerConfig.metrics, the command line turns it on).
# Labels: every per-stream and per-partition series names its virtual host, `vhost`, and the
# stream by the name its clients use, `stream` (never the hidden broker name of a stream of
# another virtual host than `/`: riverlog.vhost_names), as RabbitMQ's per-queue series carry
# `vhost` and `queue`; per-door totals (connections, subscriptions) have no vhost.
# Format: Prometheus text exposition format 0.0.4 (prometheus_client writes it).
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Any, Iterable, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..alarms import DISK, MEMORY
from ..cluster import features
from ..config import MetricsConfig
from ..log.files import OPEN_FILES
from ..metrics import CLUSTER_REGISTRY, GRPC, RABBITMQ_STREAM, REGISTRY, forget_stream
from ..prometheus_http import serve_registry
from ..vhost_names import external
from .fd_limit import nofile_soft_limit, process_open_files

log = logging.getLogger("riverlog.metrics")

SCRAPE_TIMEOUT_S = 5.0
STREAM = ["vhost", "stream"]  # the labels that name a stream
PARTITION = STREAM + ["partition"]  # and one of its partitions


def named(broker_name: str, *more: str) -> list[str]:
    """The label values of the stream called ``broker_name`` in the broker: [vhost, client
    name], then ``more`` (STREAM, PARTITION)."""
    return [*external(broker_name), *more]


_RAFT_HELP = {
    "term": "The Raft term this server's metadata member is in.",
    "commit_index": "Index of the newest Raft log entry this member knows is committed.",
    "last_applied": "Index of the newest Raft log entry applied to this member's metadata.",
}
_PARTITION_HELP = {  # riverlog_partition_<name>, per partition held here in a cluster
    "replicas": "Replicas of the partition (its replication factor).",
    "isr": "In-sync replicas (ISR) of the partition, the leader included.",
    "under_replicated": "1 when the ISR is smaller than the replicas.",
    "under_min_isr": "1 when the ISR is smaller than the stream's min ISR (writes acked "
                     "by ALL fail).",
    "leader_epoch": "The partition's leader epoch (1 for its first leader).",
    "high_watermark": "Offset of the newest committed record, held by every ISR member "
                      "(Liftbridge's high watermark; -1: none).",
}
_FOLLOWER_HELP = {  # riverlog_follower_<name>, on the leader, per follower
    "lag_messages": "Messages the leader holds beyond a follower's log end (from its "
                    "latest fetch; none before its first).",
    "lag_bytes": "Bytes of the leader's log beyond a follower's log end.",
    "last_seen_seconds": "Seconds since a follower last fetched from this leader.",
}


def _open_files() -> list[Metric]:
    """Open files against their limits: the process's descriptors against the soft
    RLIMIT_NOFILE, and the log's segment and index files against their budget
    (riverlog/log/files.py, ``riverlog.log.open.files``)."""
    now = GaugeMetricFamily("riverlog_open_files", "Open files: scope=process, every "
                            "descriptor of the server; scope=log, segment and index files.",
                            labels=["scope"])
    limit = GaugeMetricFamily("riverlog_open_files_limit", "The limit of riverlog_open_files: "
                              "the soft RLIMIT_NOFILE (process), the log's open-file budget "
                              "(log; least recently used files are closed beyond it).",
                              labels=["scope"])
    now.add_metric(["process"], process_open_files())
    limit.add_metric(["process"], nofile_soft_limit())
    now.add_metric(["log"], len(OPEN_FILES))
    limit.add_metric(["log"], OPEN_FILES.capacity)
    return [now, limit]


class ServerState(Protocol):
    """What the gauges read of a running server (riverlog.server.app.App is the one that
    serves them): its broker and doors, each None when off."""

    broker: Any  # riverlog.broker.Broker
    rabbitmq_stream: Any  # server.rabbitmq_stream.RabbitStreamServer or None
    grpc: Any  # server.grpc_api.GrpcApi or None
    liftbridge: Any  # server.liftbridge.Liftbridge or None
    nats: Any  # server.nats_bridge.NatsBridge or None
    cluster: Any  # cluster.node.ClusterNode or None
    tables: Any  # riverlog.tables.service.TableService


class StateCollector(Collector):
    """Gauges computed from the server's state, on its event loop, when Prometheus scrapes."""

    def __init__(self, app: ServerState, loop: asyncio.AbstractEventLoop) -> None:
        self.app = app
        self.loop = loop

    def collect(self) -> Iterable[Metric]:
        done: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(self.families())
            except BaseException as exc:
                done.set_exception(exc)

        try:
            self.loop.call_soon_threadsafe(run)
            return done.result(SCRAPE_TIMEOUT_S)
        except RuntimeError:  # the loop is closed: the server is stopping
            return []

    def families(self) -> list[Metric]:
        """Every state gauge, now (call on the event loop)."""
        app = self.app
        info = GaugeMetricFamily("riverlog_build_info", "riverlog's version.",
                                 labels=["version"])
        info.add_metric([__version__], 1)
        connections = GaugeMetricFamily(
            "riverlog_connections", "Open client connections per door (gRPC: peers with a "
            "call in progress; NATS clients connect to nats-server, not counted here).",
            labels=["door"])
        subscriptions = GaugeMetricFamily(
            "riverlog_subscriptions", "Active subscriptions per door (RabbitMQ Subscribe, "
            "Liftbridge Subscribe calls).", labels=["door"])
        nats_up = GaugeMetricFamily("riverlog_nats_connected",
                                    "1 when the NATS door's connections (control and data) are up.")
        sub_lag = GaugeMetricFamily(
            "riverlog_subscription_lag_messages", "Largest lag of a RabbitMQ Stream "
            "subscription per stream: committed offset + 1 minus the next offset it is sent.",
            labels=STREAM)
        rabbit = app.rabbitmq_stream
        if rabbit is not None:
            conns = list(rabbit.connections)
            subs = [s for c in conns for s in c.subscriptions.values()]
            connections.add_metric([RABBITMQ_STREAM], len(conns))
            subscriptions.add_metric([RABBITMQ_STREAM], len(subs))
            worst: dict[str, int] = {}
            for sub in subs:
                lag = max(sub.partition.committed_offset + 1 - sub.offset, 0)
                worst[sub.stream.name] = max(worst.get(sub.stream.name, 0), lag)
            for name, lag in sorted(worst.items()):
                sub_lag.add_metric(named(name), lag)
        if app.grpc is not None:
            connections.add_metric([GRPC], app.grpc.calls.connections)
        if app.liftbridge is not None:
            subscriptions.add_metric([GRPC], sum(app.liftbridge.subscribers.values()))
        if app.nats is not None:
            nc, data = app.nats.nc, app.nats.data  # control and data connections: both
            up = nc is not None and nc.is_connected and data is not None and data.connected
            nats_up.add_metric([], 1 if up else 0)
        families = [info, connections, subscriptions, nats_up, sub_lag, *_open_files()]
        families += self._alarm_families()
        if app.cluster is not None:
            families += self._cluster_families()
        return families + self._stream_families()

    def _alarm_families(self) -> list[Metric]:
        """The resource alarms (riverlog.alarms) and what they measure, under the names of
        RabbitMQ's Prometheus plugin with riverlog's prefix (rabbitmq_alarms_*,
        rabbitmq_disk_space_available_*, rabbitmq_resident_memory_limit_bytes); no measure
        before the first check."""
        alarms = self.app.broker.alarms
        families = []
        for name, resource, text in (
                ("alarms_free_disk_space_watermark", DISK, "1 while the disk alarm holds: "
                 "the data folder's filesystem has less space available than the limit."),
                ("alarms_memory_used_watermark", MEMORY, "1 while the memory alarm holds: "
                 "the server's resident memory is above the high watermark.")):
            family = GaugeMetricFamily(f"riverlog_{name}", text)
            family.add_metric([], int(resource in alarms.raised))
            families.append(family)
        for name, value, text in (
                ("disk_space_available_bytes", alarms.disk_free,
                 "Bytes available on the data folder's filesystem."),
                ("disk_space_available_limit_bytes", alarms.disk_limit,
                 "The disk alarm's limit (--disk-free-limit), in bytes."),
                ("process_resident_memory_bytes", alarms.memory_used,
                 "The server process' resident memory, as the memory alarm measures it."),
                ("resident_memory_limit_bytes", alarms.memory_limit,
                 "The memory alarm's high watermark (--memory-high-watermark), in bytes.")):
            if value is not None:
                family = GaugeMetricFamily(f"riverlog_{name}", text)
                family.add_metric([], value)
                families.append(family)
        return families

    def _cluster_families(self) -> list[Metric]:
        """A cluster member's Raft state, and the replication state of each partition it
        holds a replica of (Replication.stats; follower lag only where this server leads)."""
        cluster = self.app.cluster
        families: list[Metric] = []
        metadata = cluster.metadata
        if metadata is not None:
            raft = GaugeMetricFamily("riverlog_raft_leader", "1 when this server's Raft "
                                     "member leads the cluster metadata.")
            raft.add_metric([], 1 if metadata.is_leader else 0)
            families.append(raft)
            for key, value in metadata.status().items():
                family = GaugeMetricFamily(f"riverlog_raft_{key}", _RAFT_HELP[key])
                family.add_metric([], value)
                families.append(family)
            families += _feature_families(features.table(metadata.state))
        replication = cluster.replication
        if replication is None:
            return families
        labels = PARTITION
        gauges = {name: GaugeMetricFamily(f"riverlog_partition_{name}", text, labels=labels)
                  for name, text in _PARTITION_HELP.items()}
        leader = GaugeMetricFamily(
            "riverlog_partition_leader_info", "1, labelled with the partition's leader "
            "(empty: none) as the metadata this server applied says.",
            labels=labels + ["leader"])
        in_sync = GaugeMetricFamily(
            "riverlog_partition_replica_in_sync", "Each replica of a partition: 1 in the "
            "ISR, 0 out of it.", labels=labels + ["replica"])
        followers = {name: GaugeMetricFamily(f"riverlog_follower_{name}", text,
                                             labels=labels + ["replica"])
                     for name, text in _FOLLOWER_HELP.items()}
        for stream in list(self.app.broker.streams.values()):
            for p in stream.partitions:
                try:
                    stats = replication.stats(stream.name, p.index)
                except KeyError:  # not replicated (an internal stream), or not assigned yet
                    continue
                key = named(stream.name, str(p.index))
                isr, replicas = stats["isr"], stats["replicas"]
                for name, value in (("replicas", len(replicas)), ("isr", len(isr)),
                                    ("under_replicated", int(len(isr) < len(replicas))),
                                    ("under_min_isr", int(stats["under_min_isr"])),
                                    ("leader_epoch", stats["leader_epoch"]),
                                    ("high_watermark", stats["high_watermark"])):
                    gauges[name].add_metric(key, value)
                leader.add_metric(key + [stats["leader"] or ""], 1)
                for replica in replicas:
                    in_sync.add_metric(key + [replica], int(replica in isr))
                for replica, f in stats.get("followers", {}).items():
                    if f["log_end"] is not None:  # it has fetched since this leader took over
                        followers["lag_messages"].add_metric(key + [replica], f["lag_messages"])
                        followers["lag_bytes"].add_metric(key + [replica], f["lag_bytes"])
                    followers["last_seen_seconds"].add_metric(key + [replica],
                                                              f["last_seen_ms"] / 1000)
        return families + list(gauges.values()) + [leader, in_sync] + list(followers.values())

    def _stream_families(self) -> list[Metric]:
        app = self.app
        disk = GaugeMetricFamily("riverlog_stream_disk_bytes",
                                 "Bytes of a stream's segment files (indexes excluded).",
                                 labels=STREAM)
        segments = GaugeMetricFamily("riverlog_stream_segments",
                                     "Segment files of a stream.", labels=STREAM)
        first = GaugeMetricFamily("riverlog_partition_first_offset",
                                  "Offset of the oldest record kept.",
                                  labels=PARTITION)
        committed = GaugeMetricFamily("riverlog_partition_committed_offset",
                                      "Offset of the newest committed record (-1: none).",
                                      labels=PARTITION)
        lag = GaugeMetricFamily(
            "riverlog_consumer_lag_messages", "Offset of the newest committed message minus "
            "a named consumer's stored position: RabbitMQ StoreOffset (source=offset) or "
            "Liftbridge cursor (source=cursor).",
            labels=PARTITION + ["consumer", "source"])
        for stream in list(app.broker.streams.values()):
            disk.add_metric(named(stream.name), sum(p.size_bytes for p in stream.partitions))
            segments.add_metric(named(stream.name), sum(p.segment_count
                                                        for p in stream.partitions))
            for p in stream.partitions:
                labels = named(stream.name, str(p.index))
                first.add_metric(labels, p.first_offset)
                committed.add_metric(labels, p.committed_offset)
                stored = p.offsets.items() if p.is_open else ()  # closed: none asked since
                newest = p.last_message_offset if stored else -1  # stored offsets pass over
                for consumer, offset in stored:
                    lag.add_metric(labels + [consumer, "offset"], max(newest - offset, 0))
        if app.liftbridge is not None:
            for cursor_id, name, index, offset in app.liftbridge.cursors.items():
                stream = app.broker.streams.get(name)
                if stream is not None and 0 <= index < len(stream.partitions):
                    end = stream.partitions[index].last_message_offset
                    lag.add_metric(named(name, str(index), cursor_id, "cursor"),
                                   max(end - offset, 0))
        return [disk, segments, first, committed, lag] + self._table_families()

    def _table_families(self) -> list[Metric]:
        """Streams as tables: one sample per partition of each table-enabled stream."""
        app = self.app
        labels = PARTITION
        first = GaugeMetricFamily("riverlog_table_first_offset", "Oldest offset a stream's "
                                  "Parquet table holds (-1: none yet).", labels=labels)
        end = GaugeMetricFamily("riverlog_table_end_offset", "Offset after the newest one a "
                                "stream's Parquet table holds (-1: none yet).", labels=labels)
        size = GaugeMetricFamily("riverlog_table_bytes", "Bytes of a table's listed Parquet "
                                 "files.", labels=labels)
        files = GaugeMetricFamily("riverlog_table_files", "Parquet files a table lists.",
                                  labels=labels)
        lag = GaugeMetricFamily("riverlog_table_lag_messages", "Committed records not yet in "
                                "the table.", labels=labels)
        lag_s = GaugeMetricFamily("riverlog_table_lag_seconds", "How long the table has been "
                                  "behind the committed offset (0: up to date).", labels=labels)
        failing = GaugeMetricFamily("riverlog_table_failing", "1 when the last pass of the "
                                    "table writer failed (the server log says why).",
                                    labels=labels)
        info = GaugeMetricFamily("riverlog_table_info", "1 for each stream with an Iceberg "
                                 "table: where readers find it (the catalog, passwords "
                                 "left out, and the table's name in it).",
                                 labels=STREAM + ["format", "catalog", "table"])
        tables = app.tables
        for stream in tables.streams():
            where = tables.catalog(stream.name)
            if where is not None:
                info.add_metric(named(stream.name, "iceberg", *where), 1)
            for p in stream.partitions:
                key = named(stream.name, str(p.index))
                status = tables.status.get((stream.name, p.index))
                messages, seconds = tables.lag(stream, p.index)
                first.add_metric(key, -1 if status is None or status.first is None
                                 else status.first)
                end.add_metric(key, -1 if status is None or status.end is None else status.end)
                size.add_metric(key, 0 if status is None else status.bytes)
                files.add_metric(key, 0 if status is None else status.files)
                lag.add_metric(key, messages)
                lag_s.add_metric(key, seconds)
                failing.add_metric(key, int(status is not None and status.error is not None))
        return [first, end, size, files, lag, lag_s, failing, info]


class MetricsServer:
    """GET /metrics on ``config.host``:``config.port`` (0 picks a free port; ``port`` tells
    which). ``start()`` raises OSError naming the address when it cannot listen."""

    def __init__(self, app: ServerState, config: MetricsConfig) -> None:
        self.app = app
        self.config = config
        self.port = config.port
        self._httpd = None

    @property
    def url(self) -> str:
        host = self.config.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> None:
        registry = CollectorRegistry()
        registry.register(REGISTRY)
        if self.app.cluster is not None:
            registry.register(CLUSTER_REGISTRY)
        registry.register(StateCollector(self.app, asyncio.get_running_loop()))
        host, port = self.config.host, self.config.port
        try:
            self._httpd = serve_registry(host, port, registry)
        except OSError as exc:
            if not (self.config.port_fallback and port):
                raise OSError(exc.errno, f"cannot serve metrics on {host}:{port}: "
                                         f"{exc.strerror} (use --metrics-port, or --no-metrics)"
                              ) from None
            log.warning("metrics port %s:%d is taken; serving metrics on a free port instead "
                        "(pass --metrics-port to require one)", host, port)
            self._httpd = serve_registry(host, 0, registry)
        self.port = self._httpd.server_address[1]
        self.app.broker.deletion_listeners.append(lambda stream: forget_stream(stream.name))
        log.info("Prometheus metrics on %s", self.url)

    async def stop(self) -> None:
        """Stop serving (the scrape thread may be waiting on the loop: shut down off it)."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            await asyncio.to_thread(httpd.shutdown)
            httpd.server_close()


def _feature_families(table: dict) -> list[Metric]:
    """The feature table (cluster.features.table) as gauges: this server's version, the
    cluster's (the lowest its servers announced), each server's, each feature active or not."""
    mine = GaugeMetricFamily("riverlog_version", "The cluster logical version this server "
                             "speaks (docs/operations.md Upgrading).")
    mine.add_metric([], table["version"])
    cluster = GaugeMetricFamily("riverlog_cluster_version", "The lowest version the cluster's "
                                "servers announced: features above it wait.")
    cluster.add_metric([], table["cluster_version"])
    servers = GaugeMetricFamily("riverlog_server_version", "The version each server announced "
                                "(1: a riverlog before versions).", labels=["server"])
    for server, version in table["servers"].items():
        servers.add_metric([server], version)
    active = GaugeMetricFamily("riverlog_feature_active", "1 when every server has the "
                               "feature, 0 while it waits (cluster.features).", labels=["feature"])
    for name, feature in table["features"].items():
        active.add_metric([name], 1 if feature["active"] else 0)
    return [mine, cluster, servers, active]
