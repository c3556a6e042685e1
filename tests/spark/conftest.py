# Fixtures of the Spark tests: one riverlog server and one SparkSession for the whole session
# (Spark starts in ~5-8 s on 2 cores), small shuffle partitions, no UI; helpers to make
# streams and publish records; a server with tables and helpers to wait for them. Tests that
# need Spark skip when pyspark or Java is missing.
from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import sys
import time

import pytest

from riverlog.record import Record, encode_record
from riverlog.tables import manifest as mf
from riverlog.tables.storage import Storage

from ._server import ThreadServer

_names = itertools.count()


@pytest.fixture(scope="session")
def riverlog_server(tmp_path_factory):
    server = ThreadServer(str(tmp_path_factory.mktemp("riverlog-data"))).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def table_server(tmp_path_factory):
    """A server that mirrors streams created with ``x-riverlog-table`` to Parquet, with a
    short ``streams.table.lag`` (300 ms)."""
    from riverlog.config import TableConfig
    server = ThreadServer(str(tmp_path_factory.mktemp("riverlog-tables")),
                          tables=TableConfig(lag_ms=300, format="parquet")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def iceberg_tables(tmp_path_factory):
    """A server whose streams created with ``x-riverlog-table`` have Iceberg tables (the
    default format) in the embedded catalog, with a short ``streams.table.lag`` (300 ms)."""
    from riverlog.config import TableConfig
    server = ThreadServer(str(tmp_path_factory.mktemp("riverlog-iceberg-tables")),
                          tables=TableConfig(lag_ms=300)).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("Spark needs Java 17")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import riverlog.spark

    session = (SparkSession.builder.master("local[2]").appName("riverlog-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "2g")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    riverlog.spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def client(riverlog_server):
    c = riverlog_server.client()
    yield c
    c.close()


@pytest.fixture
def new_stream(client):
    """``new_stream(prefix="s", **arguments)`` -> the name of a fresh stream."""
    def make(prefix: str = "s", **arguments) -> str:
        name = f"{prefix}-{next(_names)}-{time.monotonic_ns()}"
        client.create_stream(name, {k.replace("_", "-"): str(v) for k, v in arguments.items()})
        return name
    return make


def record(i: int, **extra) -> bytes:
    """A record with value ``v<i>`` and key ``k<i % 3>`` (plus any Record fields)."""
    fields = {"value": b"v%d" % i, "key": b"k%d" % (i % 3), "timestamp_ns": 1_700_000_000_000_000_000 + i}
    fields.update(extra)
    return encode_record(Record(**fields))


def publish(client, stream: str, records, batch: int | None = None) -> None:
    """Publish ``records`` (bytes) and wait for their confirms; ``batch`` splits them into
    separate publishes (so separate chunks)."""
    records = list(records)
    with client.publisher(stream) as pub:
        step = batch or len(records) or 1
        for i in range(0, len(records), step):
            pub.publish(records[i:i + step])
            pub.flush()


def reader(spark, servers: str, stream: str, **options):
    r = spark.read.format("riverlog").option("servers", servers).option("stream", stream)
    for key, value in options.items():
        r = r.option(key, str(value))
    return r


def varied(start: int, n: int, keys: int = 7) -> list[bytes]:
    """Records ``start`` .. ``start + n - 1`` in riverlog's layout and in others (headers on
    every third, no key on every fifth, an AMQP body another client would send on every
    eleventh)."""
    out = []
    for i in range(start, start + n):
        if i % 11 == 0:  # a bare AMQP 1.0 data section: decoded one record at a time
            body = b"raw%d" % i
            out.append(b"\x00\x53\x75\xa0" + bytes([len(body)]) + body)
            continue
        out.append(encode_record(Record(
            value=b"v%d" % i, key=None if i % 5 == 0 else b"k%d" % (i % keys),
            headers={"h": b"%d" % i, "n": b"x"} if i % 3 == 0 else {},
            timestamp_ns=1_700_000_000_000_000_000 + i * 1000)))
    return out


def send(server: ThreadServer, stream: str, values: list[bytes], batch: int = 50) -> None:
    """Publish ``values`` to ``server`` in batches of ``batch`` (one chunk each, at most)."""
    with server.client() as c, c.publisher(stream) as pub:
        for i in range(0, len(values), batch):
            pub.publish(values[i:i + batch])
        pub.flush()


@contextlib.contextmanager
def tables_at(tmp_path, location: str, stream: str, segment_bytes: int):
    """A server under ``tmp_path/data`` whose table writer publishes to ``location`` (a path
    or a URI), with ``stream`` created (segments of ``segment_bytes``); stopped on exit."""
    from riverlog.config import TableConfig
    s = ThreadServer(str(tmp_path / "data"), tables=TableConfig(
        lag_ms=300, enabled=True, directory=location, format="parquet")).start()
    try:
        with s.client() as c:
            c.create_stream(stream, {"stream-max-segment-size-bytes": str(segment_bytes)})
        yield s
    finally:
        s.stop()


def partition_of(server: ThreadServer, stream: str):
    """Partition 0 of ``stream`` inside ``server`` (for its log's offsets and segments)."""
    return server.app.broker.get(stream).partitions[0]


def wait_table(server: ThreadServer, stream: str, *, sealed: bool = True) -> mf.Manifest:
    """The manifest once the table holds every committed offset (and, with ``sealed``, one
    sealed file per sealed segment of the log)."""
    p = partition_of(server, stream)
    storage = Storage(server.app.config.table_dir)
    directory = mf.partition_dir(storage.root, stream, 0)
    deadline = time.monotonic() + 60
    while True:
        try:
            m = mf.load(storage, directory)
        except mf.ManifestError:  # damaged on purpose: the server has not rebuilt it yet
            m = None
        segments = {s.base_offset for s in p.log.segments[:-1]}
        if m is not None and m.end == p.committed_offset + 1 and (
                not sealed or segments <= {f.start for f in m.files if f.sealed}):
            return m
        assert time.monotonic() < deadline, (
            f"table of {stream} never caught up: {m}, log segments "
            f"{[(s.base_offset, s.next_offset) for s in p.log.segments]}")
        time.sleep(0.1)


def catalog(server: ThreadServer):
    """The Iceberg catalog of ``server``'s tables (the embedded one of its table folder
    unless it names one), reaching the folder with its credentials."""
    from riverlog.tables import iceberg as ice
    return ice.load_catalog(server.app.config.table_dir, server.app.config.tables.catalog)


def wait_iceberg(server: ThreadServer, stream: str, *, sealed: bool = True,
                 wait_s: float = 90):
    """The Iceberg table once its current snapshot holds every committed offset of
    partition 0 (and, with ``sealed``, every sealed segment written whole); fails after
    ``wait_s`` seconds."""
    from riverlog.tables import iceberg as ice
    p = partition_of(server, stream)
    deadline = time.monotonic() + wait_s
    while True:
        table = ice.load_table(catalog(server), stream)
        snap = table.current_snapshot() if table is not None else None
        held = ice.snapshot_offsets(snap).get(0)
        whole = set(ice.snapshot_segments(snap).get(0, {}))
        bases = {s.base_offset for s in p.log.segments[:-1]}
        if held is not None and held[1] == p.committed_offset + 1 and (
                not sealed or bases <= whole):
            return table
        assert time.monotonic() < deadline, (
            f"table of {stream} never caught up: {held}, whole {sorted(whole)}, log "
            f"{[(s.base_offset, s.next_offset) for s in p.log.segments]}")
        time.sleep(0.1)
