# Fixtures of the Spark tests: one riverlog server and one SparkSession for the whole session
# (Spark starts in ~5-8 s on 2 cores), small shuffle partitions, no UI; helpers to make
# streams and publish records. Tests that need Spark skip when pyspark or Java is missing.
from __future__ import annotations

import itertools
import os
import shutil
import sys
import time

import pytest

from riverlog.record import Record, encode_record

from ._server import ThreadServer

_names = itertools.count()


@pytest.fixture(scope="session")
def riverlog_server(tmp_path_factory):
    server = ThreadServer(str(tmp_path_factory.mktemp("riverlog-data"))).start()
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
