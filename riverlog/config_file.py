# Liftbridge-style configuration for `riverlog serve`: a YAML file with Liftbridge's keys
# (nested maps and dotted keys alike, e.g. `clustering: {server.id: a}` == `clustering.server.id:
# a`), LIFTBRIDGE_* environment overrides, then command-line flags; the result is one
# riverlog.config.ServerConfig. Rules: an unknown key is an error naming it (as Liftbridge
# does); a known key riverlog cannot honour (encryption at rest) is an error
# saying so, never silently dropped; cluster-only keys are accepted and logged as having no
# effect on a single server (the metadata Raft's keys are read into ServerConfig.cluster).
# Durations are Go durations ("168h", "5m", "1.5s", "300ms"); a bare number is nanoseconds,
# as Liftbridge's config library reads it.
# Keys: reference/liftbridge.md "Configuration" and liftbridge's server/config.go
# (liftbridge-io/liftbridge 50ac358). Environment: LIFTBRIDGE_<KEY> with the key upper-cased
# and dots as underscores (LIFTBRIDGE_DATA_DIR) or kept (LIFTBRIDGE_DATA.DIR, Liftbridge's form).
from __future__ import annotations

import ipaddress
import logging
import math
import re
from typing import Any, Mapping

import humanfriendly

from .config import (AlarmConfig, ClusterConfig, Durability, GrpcConfig, LogConfig,
                     ManagementConfig, MetricsConfig, NatsConfig, RabbitStreamConfig,
                     SecurityConfig, ServerConfig, TableConfig, Threshold, TlsConfig)
from .security.authz import read_policy_file

log = logging.getLogger("riverlog.config")

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
            "m": 60_000_000_000, "h": 3_600_000_000_000}

# Keys whose values riverlog uses.
USED_KEYS = {
    "listen", "host", "port", "data.dir", "logging.level", "batch.max.messages",
    "nats.servers", "nats.embedded", "nats.embedded.config",
    "streams.retention.max.bytes", "streams.retention.max.messages", "streams.retention.max.age",
    "streams.cleaner.interval", "streams.segment.max.bytes", "streams.segment.max.age",
    "streams.compact.enabled", "streams.auto.pause.time",
    "streams.auto.pause.disable.if.subscribers", "streams.concurrency.control",
    "streams.encryption", "clustering.server.id", "clustering.namespace",
    "clustering.replication.max.bytes", "clustering.min.insync.replicas",
    "activity.stream.enabled", "activity.stream.publish.timeout",
    "activity.stream.publish.ack.policy", "cursors.stream.partitions",
    "cursors.stream.replication.factor",
    "groups.consumer.timeout", "groups.coordinator.timeout",
    # riverlog's own
    "riverlog.durability", "riverlog.fsync.interval", "riverlog.stream.host",
    "riverlog.stream.port", "riverlog.nats.host", "riverlog.nats.port",
    "riverlog.metrics.enabled", "riverlog.metrics.host", "riverlog.metrics.port",
    "riverlog.management.enabled", "riverlog.management.host", "riverlog.management.port",
    "riverlog.management.peers",
    "riverlog.log.format", "riverlog.grpc.transport", "riverlog.stream.validate.sub.batches",
    "riverlog.stream.handshake.timeout", "riverlog.stream.silent.close.delay",
    "riverlog.stream.silent.close.max", "riverlog.log.open.files",
    "riverlog.cursors.max.per.stream", "riverlog.stream.sendfile",
    "streams.table.enabled", "streams.table.lag", "streams.table.archive", "streams.table.dir",
    "streams.table.compression", "riverlog.disk.free.limit", "riverlog.memory.high.watermark",
    "streams.table.format", "streams.table.catalog",
    "streams.table.snapshot.expiry",
}
# Liftbridge keys that have no effect on one riverlog server (accepted, logged).
IGNORED_KEYS = {
    "metadata.cache.max.age", "logging.recovery", "logging.raft", "logging.nats",
    "batch.max.time", "streams.compact.max.goroutines", "clustering.raft.snapshot.retain",
    "clustering.raft.snapshot.threshold", "clustering.raft.cache.size",
    "clustering.raft.max.quorum.size", "cursors.stream.auto.pause.time", "telemetry.enabled", "telemetry.interval.seconds",
}
# Security (docs/security.md): Liftbridge's TLS, authorization and NATS credential keys, and
# riverlog's users, authorization rules and RabbitMQ Stream TLS port.
SECURITY_KEYS = {
    "tls.key", "tls.cert", "tls.client.auth.enabled", "tls.client.auth.ca",
    "tls.client.authz.enabled", "tls.client.authz.model", "tls.client.authz.policy",
    "nats.user", "nats.password", "nats.tls.cert", "nats.tls.key", "nats.tls.ca",
    "riverlog.users", "riverlog.loopback.users", "riverlog.authz.rules",
    "riverlog.stream.tls.port", "riverlog.limits.streams.per.user",
    "riverlog.limits.groups.per.user",
}
INITIAL_SIZE_KEY = "riverlog.stream.initial.cluster.size"
# The cluster member (ClusterConfig, docs/clustering.md): read, checked and kept in
# ServerConfig.cluster when riverlog.raft.address is set, which makes `riverlog serve` a
# cluster member; without it they are logged as having no effect on a single server.
CLUSTER_KEYS = {
    "clustering.raft.bootstrap.seed", "clustering.raft.bootstrap.peers",
    "riverlog.raft.address", "riverlog.raft.peers", "riverlog.raft.password",
    "riverlog.nats.cluster.port", "riverlog.nats.routes", INITIAL_SIZE_KEY,
    "clustering.replica.max.lag.time", "clustering.replica.max.leader.timeout",
    "clustering.replica.max.idle.wait", "clustering.replica.fetch.timeout",
}
# The clustering.replica.* keys and the ReplicationSettings fields they set (durations).
REPLICA_TIMINGS = {
    "clustering.replica.max.lag.time": "replica_max_lag_time_ms",
    "clustering.replica.max.leader.timeout": "replica_max_leader_timeout_ms",
    "clustering.replica.max.idle.wait": "replica_max_idle_wait_ms",
    "clustering.replica.fetch.timeout": "replica_fetch_timeout_ms",
}
NO_EFFECT_KEYS = IGNORED_KEYS | CLUSTER_KEYS
KNOWN_KEYS = USED_KEYS | IGNORED_KEYS | SECURITY_KEYS | CLUSTER_KEYS


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key and the problem."""


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested YAML maps to dotted, lower-cased keys: {"a": {"b.c": 1}} -> {"a.b.c": 1}."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'the configuration'}: expected a map of settings")
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}".lower() if prefix else str(key).lower()
        if isinstance(value, dict) and name not in KNOWN_KEYS:
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def read_file(path: str) -> dict[str, Any]:
    """The settings of a Liftbridge YAML file, flattened. Raises ConfigError."""
    import yaml
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(f"Failed to load configuration file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"Failed to load configuration file {path}: {exc}") from None
    return flatten(data or {})


def read_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """LIFTBRIDGE_* variables naming a known key, as settings (values still strings)."""
    by_env = {}
    for key in KNOWN_KEYS:
        by_env["LIFTBRIDGE_" + key.upper()] = key
        by_env["LIFTBRIDGE_" + key.upper().replace(".", "_")] = key
    return {by_env[name]: value for name, value in environ.items() if name in by_env}


def parse_duration_ns(key: str, value: Any) -> int:
    """A Go duration ("1h30m", "300ms", "1.5s") or a number of nanoseconds, in ns."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a duration, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):  # YAML's .inf and .nan are floats too (found by tests/fuzz)
        if not math.isfinite(value):
            raise ConfigError(f"{key}: expected a duration, got {value!r}")
        return int(value)
    text = str(value).strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    sign = -1 if text.startswith("-") else 1
    text = text.lstrip("+-")
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_NS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ConfigError(f"{key}: bad duration {value!r} (use e.g. 168h, 5m, 30s, 500ms)")
    return sign * int(total)


def _ms(key: str, value: Any) -> int:
    return parse_duration_ns(key, value) // 1_000_000


def _int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    try:
        return int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise ConfigError(f"{key}: expected a number, got {value!r}") from None


def threshold(key: str, value: Any) -> Threshold:
    """A resource limit: a number without a unit from 0 to 1 is a fraction ("0.4"), anything
    else bytes, with an optional unit ("50MB" = 50,000,000, "2GiB", "1048576"; units as
    RabbitMQ's disk_free_limit.absolute, parsed by humanfriendly). Raises ConfigError."""
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        number = None
    try:
        if number is not None and 0 <= number <= 1:
            return Threshold(number, relative=True)
        return Threshold(humanfriendly.parse_size(text))
    except (ValueError, humanfriendly.InvalidSize) as exc:
        raise ConfigError(f"{key}: expected bytes (50MB, 2GiB) or a fraction from 0 to 1, "
                          f"got {value!r} ({exc})") from None


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "t", "true", "yes", "on"):
        return True
    if text in ("0", "f", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def _list(value: Any) -> list[str]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return [str(i).strip() for i in items if str(i).strip()]


def _host_port(key: str, value: Any) -> tuple[str | None, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return None, value
    text = str(value).strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ConfigError(f"{key}: could not parse address string {text!r}")
    return host.strip("[]") or None, _int(key, port)


def load(path: str | None, environ: Mapping[str, str]) -> dict[str, Any]:
    """File settings overridden by LIFTBRIDGE_* environment settings. Raises ConfigError for
    unknown keys and unreadable files."""
    values: dict[str, Any] = read_file(path) if path else {}
    values.update(read_environment(environ))
    unknown = sorted(k for k in values if k not in KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"Unknown configuration setting {unknown[0]!r}")
    return values


def log_ignored(values: dict[str, Any]) -> None:
    """Log the settings that have no effect on this riverlog server (once logging is set
    up): IGNORED_KEYS, and CLUSTER_KEYS unless it is a cluster member."""
    ignored = IGNORED_KEYS if values.get("riverlog.raft.address") is not None \
        else NO_EFFECT_KEYS
    for key in sorted(k for k in values if k in ignored):
        log.info("configuration setting %s has no effect on a single riverlog server", key)


def _security(v: dict[str, Any]) -> SecurityConfig:
    """SecurityConfig from the merged settings (flags already applied); docs/security.md."""
    kwargs: dict[str, Any] = {}
    users = v.get("riverlog.users")
    if users is not None:
        if not isinstance(users, dict):
            raise ConfigError("riverlog.users: expected a map of user name to bcrypt hash")
        kwargs["users"] = tuple((str(name), "" if h is None else str(h))
                                for name, h in users.items())
    if v.get("riverlog.loopback.users") is not None:
        kwargs["loopback_users"] = tuple(_list(v["riverlog.loopback.users"]))
    cert, key = v.get("tls.cert"), v.get("tls.key")
    if bool(cert) != bool(key):
        raise ConfigError("tls.cert and tls.key: give both (the server certificate and its key)")
    client_auth = v.get("tls.client.auth.enabled") is not None and _bool(
        "tls.client.auth.enabled", v["tls.client.auth.enabled"])
    ca = str(v["tls.client.auth.ca"]) if v.get("tls.client.auth.ca") else None
    if cert:
        try:
            kwargs["tls"] = TlsConfig(str(cert), str(key), ca, client_auth)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    elif client_auth or ca:
        raise ConfigError("tls.client.auth.*: TLS client authentication needs tls.cert and "
                          "tls.key")
    if v.get("tls.client.authz.enabled") is not None:
        kwargs["authz"] = _bool("tls.client.authz.enabled", v["tls.client.authz.enabled"])
    rules: list[tuple[str, ...]] = []
    listed = v.get("riverlog.authz.rules") or ()
    if not isinstance(listed, (list, tuple)):
        raise ConfigError("riverlog.authz.rules: expected a list of rules such as "
                          "[alice, \"orders.*\", publish]")
    for rule in listed:
        items = _list(rule)
        if not items or items[0] not in ("p", "g"):
            items = ["p"] + items
        rules.append(tuple(items))
    if v.get("tls.client.authz.policy"):
        try:
            rules += read_policy_file(str(v["tls.client.authz.policy"]))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"tls.client.authz.policy: {exc}") from None
    kwargs["authz_rules"] = tuple(rules)
    if v.get("tls.client.authz.model"):
        kwargs["authz_model"] = str(v["tls.client.authz.model"])
    for key, field in (("riverlog.limits.streams.per.user", "max_streams_per_user"),
                       ("riverlog.limits.groups.per.user", "max_groups_per_user")):
        if v.get(key) is not None:
            kwargs[field] = _int(key, v[key])
    try:
        return SecurityConfig(**kwargs)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _raft_peers(value: Any) -> tuple[tuple[str, str], ...]:
    """``riverlog.raft.peers``: a map of server id to "host:port", or "id=host:port,..."."""
    items = [f"{k}={a}" for k, a in value.items()] if isinstance(value, dict) else _list(value)
    pairs = []
    for item in items:
        server_id, sep, address = item.partition("=")
        if not (server_id and sep and address):
            raise ConfigError(f"riverlog.raft.peers: expected server id to host:port, got "
                              f"{item!r}")
        _host_port("riverlog.raft.peers", address)
        pairs.append((server_id, address))
    return tuple(sorted(pairs))


def unspecified_host(host: str) -> bool:
    """Whether ``host`` is a wildcard address (0.0.0.0, ::), not one to connect to."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:  # a host name
        return False


def _cluster(v: dict[str, Any]) -> ClusterConfig | None:
    """ClusterConfig when ``riverlog.raft.address`` is set (docs/clustering.md), else None."""
    if v.get("riverlog.raft.address") is None:
        return None
    address = str(v["riverlog.raft.address"]).strip()
    host, _ = _host_port("riverlog.raft.address", address)
    if not host:
        raise ConfigError("riverlog.raft.address: give host:port (the address the other "
                          "servers reach this one's Raft at)")
    if unspecified_host(host):
        raise ConfigError(f"riverlog.raft.address: {host} is no address the other servers "
                          f"can reach (it means every address of this machine); give this "
                          f"server's own address, which Raft listens on")
    seed = v.get("clustering.raft.bootstrap.seed")
    peers = v.get("clustering.raft.bootstrap.peers")
    try:
        return ClusterConfig(
            server_id=str(v.get("clustering.server.id") or ""), raft_address=address,
            bootstrap_seed=seed is not None and _bool("clustering.raft.bootstrap.seed", seed),
            bootstrap_peers=tuple(_list(peers)) if peers is not None else (),
            raft_peers=_raft_peers(v.get("riverlog.raft.peers") or {}),
            raft_password=str(v.get("riverlog.raft.password") or ""),
            min_insync_replicas=_int("clustering.min.insync.replicas",
                                     v.get("clustering.min.insync.replicas") or 1),
            initial_cluster_size=None if v.get(INITIAL_SIZE_KEY) is None else _int(
                INITIAL_SIZE_KEY, v[INITIAL_SIZE_KEY]),
            replica_timings_ms=tuple((field, _ms(key, v[key]))
                                     for key, field in REPLICA_TIMINGS.items()
                                     if v.get(key) is not None))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def build(values: dict[str, Any], flags: dict[str, Any]) -> tuple[ServerConfig, str]:
    """The ServerConfig from merged settings and the command-line ``flags`` that were given
    (flags win). Returns (config, log level). Raises ConfigError / ValueError naming the key."""
    v = dict(values)
    for flag, key in (("data_dir", "data.dir"), ("port", "port"), ("server_id",
                      "clustering.server.id"), ("namespace", "clustering.namespace"),
                      ("level", "logging.level"), ("durability", "riverlog.durability"),
                      ("stream_port", "riverlog.stream.port"), ("nats_port", "riverlog.nats.port"),
                      ("nats_cluster_port", "riverlog.nats.cluster.port"),
                      ("metrics_host", "riverlog.metrics.host"),
                      ("metrics_port", "riverlog.metrics.port"),
                      ("management_host", "riverlog.management.host"),
                      ("management_port", "riverlog.management.port"),
                      ("tls_cert", "tls.cert"), ("tls_key", "tls.key"),
                      ("tls_ca", "tls.client.auth.ca"),
                      ("stream_tls_port", "riverlog.stream.tls.port"),
                      ("silent_close_delay", "riverlog.stream.silent.close.delay"),
                      ("grpc_transport", "riverlog.grpc.transport"),
                      ("table_dir", "streams.table.dir"),
                      ("disk_free_limit", "riverlog.disk.free.limit"),
                      ("memory_high_watermark", "riverlog.memory.high.watermark"),
                      ("table_format", "streams.table.format"),
                      ("table_catalog", "streams.table.catalog")):
        if flags.get(flag) is not None:
            v[key] = flags[flag]
    if flags.get("fsync_interval_ms") is not None:
        v["riverlog.fsync.interval"] = f"{flags['fsync_interval_ms']}ms"
    if flags.get("nats_servers"):
        v["nats.servers"] = flags["nats_servers"]
    if flags.get("nats_routes"):
        v["riverlog.nats.routes"] = flags["nats_routes"]
    for flag, key in (("embedded_nats", "nats.embedded"),
                      ("tls_client_auth", "tls.client.auth.enabled"),
                      ("validate_sub_batches", "riverlog.stream.validate.sub.batches"),
                      ("sendfile", "riverlog.stream.sendfile")):  # on/off flags: on
        if flags.get(flag):
            v[key] = True
    if flags.get("no_metrics"):
        v["riverlog.metrics.enabled"] = False
    if flags.get("no_management"):
        v["riverlog.management.enabled"] = False
    if flags.get("embedded_nats_config"):
        v["nats.embedded.config"] = flags["embedded_nats_config"]
    if flags.get("tables"):
        v["streams.table.enabled"] = True
    if flags.get("raft_bootstrap_seed"):
        v["clustering.raft.bootstrap.seed"] = True

    if v.get("streams.encryption") is not None and _bool("streams.encryption",
                                                         v["streams.encryption"]):
        raise ConfigError("streams.encryption: riverlog does not encrypt streams at rest")
    min_isr = v.get("clustering.min.insync.replicas")
    if min_isr is not None and _int("clustering.min.insync.replicas", min_isr) > 1 \
            and v.get("riverlog.raft.address") is None:
        raise ConfigError("clustering.min.insync.replicas: a single riverlog server has one "
                          "replica, so min.insync.replicas must be 1. To make this server a "
                          "cluster member (which may ask more), also set riverlog.raft.address "
                          "(host:port its Raft listens on), riverlog.raft.peers (each other "
                          "server id: its Raft address) and riverlog.raft.password (the same "
                          "on every member); see docs/clustering.md")
    if v.get("riverlog.raft.address") is None and (
            v.get("riverlog.nats.cluster.port") is not None or v.get("riverlog.nats.routes")):
        raise ConfigError("riverlog.nats.cluster.port and riverlog.nats.routes join the "
                          "embedded nats-servers of a cluster: set riverlog.raft.address too "
                          "(the routes' password comes from riverlog.raft.password)")

    # the log defaults every partition starts from
    log_kwargs: dict[str, Any] = {}
    for key, field, conv in (
            ("streams.retention.max.bytes", "retention_max_bytes", _int),
            ("streams.retention.max.messages", "retention_max_messages", _int),
            ("streams.retention.max.age", "retention_max_age_ms", _ms),
            ("streams.segment.max.bytes", "segment_max_bytes", _int),
            ("streams.segment.max.age", "segment_max_age_ms", _ms),
            ("streams.compact.enabled", "compact", _bool),
            ("riverlog.fsync.interval", "fsync_interval_ms", _ms)):
        if v.get(key) is not None:
            log_kwargs[field] = conv(key, v[key])
    if "retention_max_age_ms" in log_kwargs and "segment_max_age_ms" not in log_kwargs \
            and log_kwargs["retention_max_age_ms"] > 0:
        log_kwargs["segment_max_age_ms"] = log_kwargs["retention_max_age_ms"]  # as Liftbridge
    if v.get("riverlog.durability") is not None:
        try:
            log_kwargs["durability"] = Durability(str(v["riverlog.durability"]).lower())
        except ValueError:
            raise ConfigError(f"riverlog.durability: expected one of always, interval, never, "
                              f"got {v['riverlog.durability']!r}") from None
    try:
        log_config = LogConfig(**log_kwargs)
    except ValueError as exc:
        raise ConfigError(f"streams settings: {exc}") from None

    # gRPC (Liftbridge's listen/host/port)
    base_host = flags.get("host") or "127.0.0.1"
    grpc_host, grpc_port, advertised = base_host, GrpcConfig().port, flags.get("advertised_host")
    if v.get("listen") is not None:
        lhost, lport = _host_port("listen", v["listen"])
        grpc_host = lhost or grpc_host
        grpc_port = lport
    if v.get("host") is not None:
        advertised = advertised or str(v["host"])
        if v.get("listen") is None:
            grpc_host = str(v["host"])
    explicit_port = v.get("port") is not None or v.get("listen") is not None
    if v.get("port") is not None:
        grpc_port = _int("port", v["port"])
    grpc_kwargs: dict[str, Any] = {"host": grpc_host, "port": grpc_port,
                                   "advertised_host": advertised,
                                   "port_fallback": not explicit_port}
    for key, field, conv in (
            ("clustering.server.id", "server_id", lambda k, x: str(x) or None),
            ("clustering.replication.max.bytes", "replication_max_bytes", _int),
            ("batch.max.messages", "batch_max_messages", _int),
            ("cursors.stream.partitions", "cursors_partitions", _int),
            ("cursors.stream.replication.factor", "cursors_replication_factor", _int),
            ("riverlog.cursors.max.per.stream", "cursors_max_per_stream", _int),
            ("activity.stream.enabled", "activity_enabled", _bool),
            ("activity.stream.publish.timeout", "activity_publish_timeout_ms", _ms),
            ("groups.consumer.timeout", "consumer_timeout_ms", _ms),
            ("groups.coordinator.timeout", "coordinator_timeout_ms", _ms),
            ("streams.auto.pause.time", "auto_pause_time_ms", _ms),
            ("streams.auto.pause.disable.if.subscribers", "auto_pause_disable_if_subscribers",
             _bool),
            ("streams.concurrency.control", "concurrency_control", _bool),
            ("riverlog.grpc.transport", "transport", lambda k, x: str(x).lower())):
        if v.get(key) is not None:
            grpc_kwargs[field] = conv(key, v[key])
    policy = v.get("activity.stream.publish.ack.policy")
    if policy is not None and str(policy).lower() not in ("none", "leader", "all"):
        raise ConfigError(f"Unknown activity stream publish ack policy {policy!r}")
    grpc_config = GrpcConfig(**grpc_kwargs)

    # NATS
    servers = _list(v["nats.servers"]) if v.get("nats.servers") is not None else []
    embedded = _bool("nats.embedded", v["nats.embedded"]) if v.get("nats.embedded") is not None \
        else False
    nats_kwargs: dict[str, Any] = {
        "servers": () if (embedded or not servers) else tuple(servers),
        "host": str(v.get("riverlog.nats.host") or base_host),
    }
    if v.get("riverlog.nats.port") is not None:
        nats_kwargs["port"] = _int("riverlog.nats.port", v["riverlog.nats.port"])
    else:  # the default port: if it is taken, warn and take a free one
        nats_kwargs["port_fallback"] = True
    if v.get("nats.embedded.config"):
        nats_kwargs["embedded_config"] = str(v["nats.embedded.config"])
    if v.get("riverlog.nats.cluster.port") is not None:
        nats_kwargs["cluster_port"] = _int("riverlog.nats.cluster.port",
                                           v["riverlog.nats.cluster.port"])
    if v.get("riverlog.nats.routes") is not None:
        routes = _list(v["riverlog.nats.routes"])
        for route in routes:
            _host_port("riverlog.nats.routes", route)
        nats_kwargs["routes"] = tuple(routes)
    if v.get("clustering.namespace"):
        nats_kwargs["namespace"] = str(v["clustering.namespace"])
    if v.get("nats.password") and not v.get("nats.user"):
        raise ConfigError("nats.password needs nats.user")
    for key in ("nats.user", "nats.password", "nats.tls.ca", "nats.tls.cert", "nats.tls.key"):
        if v.get(key):
            nats_kwargs[key[5:].replace(".", "_")] = str(v[key])
    nats_config = NatsConfig(**nats_kwargs)

    stream_kwargs: dict[str, Any] = {"host": str(v.get("riverlog.stream.host") or base_host)}
    if flags.get("advertised_host"):
        stream_kwargs["advertised_host"] = flags["advertised_host"]
    if flags.get("advertised_port") is not None:
        stream_kwargs["advertised_port"] = flags["advertised_port"]
    for key, field, conv in (("port", "port", _int), ("tls.port", "tls_port", _int),
                             ("validate.sub.batches", "validate_sub_batches", _bool),
                             ("sendfile", "sendfile", _bool),
                             ("handshake.timeout", "handshake_timeout_ms", _ms),
                             ("silent.close.delay", "silent_close_delay_ms", _ms),
                             ("silent.close.max", "silent_close_max", _int)):
        if v.get(f"riverlog.stream.{key}") is not None:
            stream_kwargs[field] = conv(f"riverlog.stream.{key}", v[f"riverlog.stream.{key}"])

    metrics_config = _http_endpoint(v, "riverlog.metrics", MetricsConfig)
    management_config = _http_endpoint(v, "riverlog.management", ManagementConfig)

    table_kwargs: dict[str, Any] = {}
    for key, field, conv in (("streams.table.enabled", "enabled", _bool),
                             ("streams.table.lag", "lag_ms", _ms),
                             ("streams.table.archive", "archive", _bool),
                             ("streams.table.dir", "directory", lambda k, x: str(x) or None),
                             ("streams.table.compression", "compression",
                              lambda k, x: str(x).lower()),
                             ("streams.table.format", "format", lambda k, x: str(x).lower()),
                             ("streams.table.catalog", "catalog", lambda k, x: str(x) or None),
                             ("streams.table.snapshot.expiry", "expiry_ms", _ms)):
        if v.get(key) is not None:
            table_kwargs[field] = conv(key, v[key])
    try:
        tables = TableConfig(**table_kwargs)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None

    alarm_kwargs: dict[str, Any] = {}
    for key, field in (("riverlog.disk.free.limit", "disk_free_limit"),
                       ("riverlog.memory.high.watermark", "memory_high_watermark")):
        if v.get(key) is not None:
            alarm_kwargs[field] = threshold(key, v[key])

    level = str(v.get("logging.level") or "info").lower()
    level = {"warn": "warning"}.get(level, level)
    if level not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"Invalid logging.level setting {level!r}")
    open_files = _int("riverlog.log.open.files", v.get("riverlog.log.open.files", 0))
    if open_files < 0:
        raise ConfigError("riverlog.log.open.files: expected 0 (automatic) or more files")
    config = ServerConfig(data_dir=str(v.get("data.dir") or "./data"), log=log_config,
                          rabbitmq_stream=RabbitStreamConfig(**stream_kwargs),
                          nats=nats_config, grpc=grpc_config, metrics=metrics_config,
                          management=management_config,
                          security=_security(v), tables=tables, cluster=_cluster(v),
                          log_open_files=open_files,
                          alarms=AlarmConfig(**alarm_kwargs))
    return config, level


def _http_endpoint(v: dict[str, Any], prefix: str, kind: type) -> Any:
    """``kind`` (MetricsConfig, ManagementConfig) from ``<prefix>.enabled``, ``.host``,
    ``.port`` (and the management API's ``.peers``); None when disabled. Without a port the
    default is taken, and another one when it is in use (``port_fallback``)."""
    if not _bool(f"{prefix}.enabled", v.get(f"{prefix}.enabled", True)):
        return None
    kwargs: dict[str, Any] = {}
    if v.get(f"{prefix}.host") is not None:
        kwargs["host"] = str(v[f"{prefix}.host"])
    if v.get(f"{prefix}.port") is not None:
        kwargs["port"] = _int(f"{prefix}.port", v[f"{prefix}.port"])
    else:  # the default port: if it is taken, warn and take a free one
        kwargs["port_fallback"] = True
    if v.get(f"{prefix}.peers"):  # riverlog.management.peers (serve --workers)
        kwargs["peers"] = tuple(_list(v[f"{prefix}.peers"]))
    return kind(**kwargs)


def log_format(values: dict[str, Any], flag: str | None) -> str:
    """"text" or "json": the --log-format ``flag``, else ``riverlog.log.format``, else text.
    Raises ConfigError for another value."""
    fmt = str(flag or values.get("riverlog.log.format") or "text").lower()
    if fmt not in ("text", "json"):
        raise ConfigError(f"riverlog.log.format: expected text or json, got {fmt!r}")
    return fmt
