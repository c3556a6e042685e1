"""Liftbridge's YAML keys and LIFTBRIDGE_* overrides turned into one ServerConfig
(riverlog/config_file.py): nested and dotted keys, Go durations, precedence file < env <
flags, and clear refusals."""
from __future__ import annotations

import pytest

from riverlog.config import Durability
from riverlog.config_file import ConfigError, build, load, parse_duration_ns


def write(tmp_path, text: str) -> str:
    path = tmp_path / "liftbridge.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, ns", [
    ("168h", 168 * 3600 * 10**9), ("5m", 300 * 10**9), ("1.5s", 1_500_000_000),
    ("300ms", 300_000_000), ("1h30m", 5400 * 10**9), ("250us", 250_000), ("42", 42), (7, 7),
])
def test_durations(text, ns):
    assert parse_duration_ns("k", text) == ns


@pytest.mark.parametrize("text", ["1d", "h", "5 m", "", True])
def test_bad_durations(text):
    with pytest.raises(ConfigError, match="k: "):
        parse_duration_ns("k", text)


def test_liftbridge_file(tmp_path):
    path = write(tmp_path, """
listen: 0.0.0.0:9393
host: broker.example
data.dir: /var/lib/lb
logging.level: warn
batch.max.messages: 512
nats:
  servers: ["nats://a:4222", "nats://b:4222"]
streams:
  retention.max.age: 24h
  retention.max.bytes: 1000000
  segment.max.bytes: 1048576
  compact.enabled: true
  auto.pause.time: 30s
  concurrency.control: true
clustering:
  server.id: s1
  namespace: ns1
  replication.max.bytes: 2048
  raft.bootstrap.seed: true
activity.stream.enabled: true
cursors.stream.partitions: 3
cursors.stream.replication.factor: 2
riverlog.cursors.max.per.stream: 50
groups:
  consumer.timeout: 10s
""")
    config, level = build(load(path, {}), {})
    assert level == "warning" and config.data_dir == "/var/lib/lb"
    assert (config.grpc.host, config.grpc.port, config.grpc.advertised_host) == (
        "0.0.0.0", 9393, "broker.example")
    assert config.grpc.port_fallback is False
    assert (config.grpc.server_id, config.grpc.replication_max_bytes) == ("s1", 2048)
    assert (config.grpc.cursors_partitions, config.grpc.activity_enabled) == (3, True)
    assert config.grpc.cursors_replication_factor == 2
    assert config.grpc.cursors_max_per_stream == 50
    assert (config.grpc.consumer_timeout_ms, config.grpc.auto_pause_time_ms) == (10_000, 30_000)
    assert config.grpc.concurrency_control and config.grpc.batch_max_messages == 512
    assert config.nats.servers == ("nats://a:4222", "nats://b:4222") and not config.nats.embedded
    assert config.nats.namespace == "ns1"
    log = config.log
    assert (log.retention_max_age_ms, log.segment_max_age_ms) == (86_400_000, 86_400_000)
    assert (log.retention_max_bytes, log.segment_max_bytes, log.compact) == (1_000_000, 1_048_576, True)


def test_defaults_and_precedence(tmp_path):
    config, level = build(load(None, {}), {})
    assert level == "info" and config.data_dir == "./data"
    assert (config.grpc.port, config.nats.port, config.rabbitmq_stream.port) == (9292, 4222, 5552)
    assert config.nats.embedded and config.grpc.port_fallback and config.nats.port_fallback
    assert config.log.durability is Durability.INTERVAL
    path = write(tmp_path, "port: 1000\ndata.dir: /from/file\nclustering.server.id: file\n")
    env = {"LIFTBRIDGE_PORT": "2000", "LIFTBRIDGE_CLUSTERING.SERVER.ID": "env-dotted",
           "LIFTBRIDGE_RIVERLOG_DURABILITY": "always", "UNRELATED": "x"}
    config, _ = build(load(path, env), {"port": 3000, "data_dir": None})
    assert config.grpc.port == 3000 and config.data_dir == "/from/file"
    assert config.grpc.server_id == "env-dotted" and config.log.durability is Durability.ALWAYS
    config, _ = build(load(None, {}), {"nats_servers": ["nats://x:1"], "embedded_nats": False})
    assert config.nats.servers == ("nats://x:1",)
    config, _ = build(load(None, {}), {"nats_servers": ["nats://x:1"], "embedded_nats": True})
    assert config.nats.embedded


@pytest.mark.parametrize("text, message", [
    ("nope: 1\n", "Unknown configuration setting 'nope'"),
    ("tls.cert: a.pem\n", "tls.cert and tls.key: give both"),
    ("nats:\n  password: s\n", "nats.password needs nats.user"),
    ("streams.encryption: true\n", "streams.encryption"),
    ("clustering.min.insync.replicas: 2\n", "must be 1"),
    ("logging.level: loud\n", "Invalid logging.level"),
    ("streams.retention.max.age: forever\n", "streams.retention.max.age: bad duration"),
    ("streams.segment.max.bytes: 10\n", "segment_max_bytes"),
    ("listen: nonsense\n", "listen: could not parse"),
    ("- a\n- b\n", "expected a map"),
    ("streams.table.lag: 10ms\n", "streams.table.lag must be at least 100ms"),
    ("streams.table.compression: brotli\n", "streams.table.compression: expected one of"),
    ("streams.table.format: delta\n", "streams.table.format: expected one of"),
])
def test_refusals(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        build(load(write(tmp_path, text), {}), {})


def test_table_settings(tmp_path):
    """streams.table.* (docs/configuration.md), and --tables/--table-dir over them."""
    config, _ = build(load(None, {}), {})
    assert not config.tables.enabled and config.table_dir == "./data/tables"
    path = write(tmp_path, "streams:\n  table:\n    enabled: true\n    lag: 2s\n"
                           "    archive: true\n    compression: snappy\n    dir: /t\n")
    tables = build(load(path, {}), {})[0].tables
    assert (tables.enabled, tables.lag_ms, tables.archive, tables.compression,
            tables.directory) == (True, 2000, True, "snappy", "/t")
    config, _ = build(load(None, {}), {"tables": True, "table_dir": "/elsewhere"})
    assert config.tables.enabled and config.table_dir == "/elsewhere"
    assert (config.tables.format, config.tables.catalog, config.tables.expiry_ms) == (
        "iceberg", None, 3_600_000)  # Iceberg is the default format
    path = write(tmp_path, "streams:\n  table:\n    format: parquet\n"
                           "    catalog: http://cat:8181\n    snapshot.expiry: 10m\n")
    tables = build(load(path, {}), {})[0].tables
    assert (tables.format, tables.catalog, tables.expiry_ms) == (
        "parquet", "http://cat:8181", 600_000)
    tables = build(load(None, {}), {"table_format": "parquet",
                                    "table_catalog": "sqlite:////c.db"})[0].tables
    assert (tables.format, tables.catalog) == ("parquet", "sqlite:////c.db")
    # the default (Iceberg) on an object-storage folder with no catalog is refused at start
    # (before, every writer pass failed and the tables went stale: review finding)
    with pytest.raises(ValueError, match="need a catalog every server reaches"):
        build(load(None, {}), {"tables": True, "table_dir": "s3://bucket/t?region=x"})
    tables = build(load(None, {}), {"table_dir": "s3://bucket/t", "table_format": "parquet"}
                   )[0].tables
    assert (tables.format, tables.directory) == ("parquet", "s3://bucket/t")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="Failed to load configuration file"):
        load(str(tmp_path / "missing.yaml"), {})


def test_silent_close_delay(tmp_path):
    """RabbitMQ 4's 3 s by default; the key, its environment variable and the flag set it."""
    stream = build(load(None, {}), {})[0].rabbitmq_stream
    assert (stream.silent_close_delay_ms, stream.silent_close_max) == (3000, 1000)
    path = write(tmp_path, "riverlog.stream.silent.close.delay: 500ms\n"
                           "riverlog.stream.silent.close.max: 10\n")
    stream = build(load(path, {}), {})[0].rabbitmq_stream
    assert (stream.silent_close_delay_ms, stream.silent_close_max) == (500, 10)
    env = {"LIFTBRIDGE_RIVERLOG_STREAM_SILENT_CLOSE_DELAY": "1s"}
    assert build(load(None, env), {})[0].rabbitmq_stream.silent_close_delay_ms == 1000
    flags = {"silent_close_delay": "0"}
    assert build(load(path, env), flags)[0].rabbitmq_stream.silent_close_delay_ms == 0
