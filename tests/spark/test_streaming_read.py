# Streaming reads: read limits (maxOffsetsPerTrigger), Trigger.AvailableNow, restarts from
# the checkpoint (clean and after a failed batch) with no record lost or repeated, the
# latest default, failOnDataLoss when retention removed checkpointed offsets, and a super
# stream read by its name.
from __future__ import annotations

import json
import os
import time

import pytest

from .conftest import publish, record


def stream_reader(spark, servers, stream, **options):
    r = spark.readStream.format("riverlog").option("servers", servers).option("stream", stream)
    for key, value in options.items():
        r = r.option(key, str(value))
    return r.load()


def run_to_parquet(df, out, checkpoint):
    q = (df.select("offset", "value").writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    try:
        q.awaitTermination(120)
    finally:
        q.stop()
    return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]


def parquet_offsets(spark, out):
    return sorted(r.offset for r in spark.read.parquet(out).select("offset").collect())


def test_read_limit_batches_and_restart(spark, riverlog_server, client, new_stream, tmp_path):
    s = new_stream()
    publish(client, s, [record(i) for i in range(1000)], batch=50)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    df = stream_reader(spark, riverlog_server.servers, s, startingOffsets="earliest",
                       maxOffsetsPerTrigger=300)
    assert run_to_parquet(df, out, ck) == [300, 300, 300, 100]
    assert parquet_offsets(spark, out) == list(range(1000))
    publish(client, s, [record(i) for i in range(1000, 1250)])
    assert run_to_parquet(df, out, ck) == [250]  # the restart resumes at 1000
    assert parquet_offsets(spark, out) == list(range(1250))
    assert run_to_parquet(df, out, ck) == []  # nothing new: no batch


def test_restart_after_a_failed_batch(spark, riverlog_server, client, new_stream, tmp_path):
    from pyspark.sql import functions as F

    s = new_stream()
    publish(client, s, [record(i) for i in range(600)], batch=100)
    flag = tmp_path / "fail"
    flag.write_text("x")
    path = str(flag)

    @F.udf("long")
    def check(offset):
        if offset == 450 and os.path.exists(path):
            raise RuntimeError("injected failure")
        return offset

    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    df = (stream_reader(spark, riverlog_server.servers, s, startingOffsets="earliest",
                        maxOffsetsPerTrigger=200)
          .withColumn("offset", check("offset")))
    with pytest.raises(Exception, match="injected failure"):
        run_to_parquet(df, out, ck)
    assert parquet_offsets(spark, out) == list(range(400))  # batches 0 and 1 committed
    flag.unlink()
    assert run_to_parquet(df, out, ck) == [200]  # batch 2 again, from the checkpoint
    assert parquet_offsets(spark, out) == list(range(600))


def test_starts_at_latest_by_default(spark, riverlog_server, client, new_stream, tmp_path):
    s = new_stream()
    publish(client, s, [record(i) for i in range(10)])
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    df = stream_reader(spark, riverlog_server.servers, s)
    assert run_to_parquet(df, out, ck) == []
    publish(client, s, [record(i) for i in range(10, 13)])
    assert run_to_parquet(df, out, ck) == [3]
    assert parquet_offsets(spark, out) == [10, 11, 12]


def test_fail_on_data_loss(spark, riverlog_server, client, new_stream, tmp_path):
    s = new_stream("retention", max_length_bytes=20_000, stream_max_segment_size_bytes=4096)
    publish(client, s, [record(i) for i in range(5)])
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    df = stream_reader(spark, riverlog_server.servers, s, startingOffsets="earliest")
    assert run_to_parquet(df, out, ck) == [5]
    publish(client, s, [record(i, value=b"x" * 200) for i in range(5, 405)], batch=10)
    deadline = time.monotonic() + 15
    while client.offset_range(s)[0] <= 5 and time.monotonic() < deadline:
        time.sleep(0.2)
    with pytest.raises(Exception, match="no longer available"):
        run_to_parquet(df, out, ck)
    lenient = stream_reader(spark, riverlog_server.servers, s, startingOffsets="earliest",
                            failOnDataLoss="false")
    run_to_parquet(lenient, out, ck)
    got = parquet_offsets(spark, out)
    assert got[:5] == list(range(5)) and got[-1] == 404
    assert got[5] > 5 and got[5:] == list(range(got[5], 405))


def test_a_super_stream_reads_by_its_name(spark, riverlog_server, client, tmp_path):
    """``stream`` naming a RabbitMQ super stream reads its partition streams (the server's
    Partitions answer): a batch read with offsets given per partition stream, and a
    streaming read that resumes from its checkpoint. The name alone was an unknown
    stream before."""
    import asyncio

    from riverlog.broker.stream import StreamConfig

    name = f"super-{time.monotonic_ns()}"
    members = [f"{name}-{i}" for i in range(3)]

    async def make():
        riverlog_server.app.rabbitmq_stream.super_streams.create(
            name, members, ["0", "1", "2"], StreamConfig())
    asyncio.run_coroutine_threadsafe(make(), riverlog_server.loop).result(30)
    for i, member in enumerate(members):
        publish(client, member, [record(100 * i + j) for j in range(10 + i)])
    start = json.dumps({members[1]: {"0": 4}})
    rows = (spark.read.format("riverlog").option("servers", riverlog_server.servers)
            .option("stream", name).option("startingOffsets", start).load()
            .select("stream", "offset", "value").collect())
    assert sorted((r.stream, r.offset, r.value) for r in rows) == sorted(
        [(members[0], j, b"v%d" % j) for j in range(10)]
        + [(members[1], j, b"v%d" % (100 + j)) for j in range(4, 11)]
        + [(members[2], j, b"v%d" % (200 + j)) for j in range(12)])
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    df = stream_reader(spark, riverlog_server.servers, name, startingOffsets="earliest")
    assert sum(run_to_parquet(df, out, ck)) == 33
    publish(client, members[2], [record(300)])
    assert run_to_parquet(df, out, ck) == [1]
