# The riverlog sink: batch writes of every accepted column, schema errors, the publisher
# sequence that makes a retried task harmless, and streaming writes that stay exactly-once
# when Spark replays a micro-batch (after a lost commit, and after a task failed half-way).
from __future__ import annotations

import datetime as dt
import glob
import os

import pytest

from .conftest import publish, reader, record


def read_values(spark, servers, stream):
    rows = reader(spark, servers, stream).load().orderBy("offset").collect()
    return [r.value for r in rows]


def test_batch_write_all_columns(spark, riverlog_server, new_stream):
    out = new_stream("sink")
    ts = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.timezone.utc)
    df = spark.createDataFrame(
        [("a", b"k1", {"h": "x"}, 0, ts), ("b", None, None, None, None)],
        "value string, key binary, headers map<string,string>, partition int, timestamp timestamp")
    df.write.format("riverlog").option("servers", riverlog_server.servers) \
        .option("stream", out).mode("append").save()
    rows = reader(spark, riverlog_server.servers, out).load().orderBy("value").collect()
    assert [(r.value, r.key, r.headers, r.partition) for r in rows] == [
        (b"a", b"k1", {"h": b"x"}, 0), (b"b", None, None, 0)]
    assert rows[0].timestamp.replace(tzinfo=dt.timezone.utc) == ts
    # a riverlog read can be written back as it is (stream and offset are ignored)
    reader(spark, riverlog_server.servers, out).load().write.format("riverlog") \
        .option("servers", riverlog_server.servers).option("stream", out).mode("append").save()
    assert sorted(read_values(spark, riverlog_server.servers, out)) == [b"a", b"a", b"b", b"b"]


@pytest.mark.parametrize("ddl, mode, message", [
    ("v string", "append", "unknown column"),
    ("key binary", "append", "value column"),
    ("value int", "append", "binary or string"),
    ("value string", "overwrite", "append-only"),
])
def test_schema_errors(spark, riverlog_server, new_stream, ddl, mode, message):
    out = new_stream("sink")
    df = spark.createDataFrame([], ddl)
    with pytest.raises(Exception, match=message):
        df.write.format("riverlog").option("servers", riverlog_server.servers) \
            .option("stream", out).mode(mode).save()


def test_bad_partition_fails_the_task(spark, riverlog_server, new_stream):
    out = new_stream("sink")
    df = spark.createDataFrame([("a", 1)], "value string, partition int")
    with pytest.raises(Exception, match="partition 1 does not exist"):
        df.write.format("riverlog").option("servers", riverlog_server.servers) \
            .option("stream", out).mode("append").save()


def test_retried_task_writes_nothing_twice(riverlog_server, client, new_stream):
    import pyarrow as pa

    from riverlog.spark.options import write_options
    from riverlog.spark.writer import publish_task

    out = new_stream("sink")
    opts = write_options({"servers": riverlog_server.servers, "stream": out})
    batch = pa.RecordBatch.from_pydict({"value": [b"r%d" % i for i in range(30)]})
    first = publish_task(opts, "job-1-0", [batch.slice(0, 12)], 1, False)  # dies after 12
    again = publish_task(opts, "job-1-0", [batch], 1, False)  # the retry sends all 30
    assert (first.written, again.written, again.skipped) == (12, 18, 12)
    assert client.offset_range(out) == (0, 30)


def _stream_copy(spark, servers, source, target, checkpoint, **read_options):
    r = (spark.readStream.format("riverlog").option("servers", servers).option("stream", source)
         .option("startingOffsets", "earliest"))
    for key, value in read_options.items():
        r = r.option(key, str(value))
    q = (r.load().select("key", "value").writeStream.format("riverlog")
         .option("servers", servers).option("stream", target)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    try:
        q.awaitTermination(120)
    finally:
        q.stop()
    return q


def test_stream_sink_replayed_batch_is_not_duplicated(spark, riverlog_server, client,
                                                      new_stream, tmp_path):
    source, target = new_stream("src"), new_stream("dst")
    publish(client, source, [record(i) for i in range(300)], batch=60)
    ck = str(tmp_path / "ck")
    _stream_copy(spark, riverlog_server.servers, source, target, ck, maxOffsetsPerTrigger=100)
    expect = [b"v%d" % i for i in range(300)]
    assert read_values(spark, riverlog_server.servers, target) == expect
    # lose the record of the last batch's commit: Spark runs batch 2 again on restart
    last = max(int(os.path.basename(p)) for p in glob.glob(os.path.join(ck, "commits", "[0-9]*")))
    for name in (str(last), f".{last}.crc"):
        if os.path.exists(os.path.join(ck, "commits", name)):
            os.unlink(os.path.join(ck, "commits", name))
    q = _stream_copy(spark, riverlog_server.servers, source, target, ck, maxOffsetsPerTrigger=100)
    assert [p["batchId"] for p in q.recentProgress if p["numInputRows"]] == [2]
    assert read_values(spark, riverlog_server.servers, target) == expect


def test_stream_sink_task_failing_half_way(spark, riverlog_server, client, new_stream,
                                           tmp_path):
    """The sink task fails after publishing part of a micro-batch (a row for a partition
    the stream lacks, while a flag file exists); the query is restarted without the flag:
    the replay skips what was stored and writes the rest, each row once, in order."""
    from pyspark.sql import functions as F

    source, target = new_stream("src"), new_stream("dst")
    publish(client, source, [record(i) for i in range(2000)])
    flag = tmp_path / "fail"
    flag.write_text("x")
    path = str(flag)

    @F.udf("int")
    def partition(value):
        return 1 if value == b"v1500" and os.path.exists(path) else 0

    ck = str(tmp_path / "ck")

    def run():
        r = (spark.readStream.format("riverlog").option("servers", riverlog_server.servers)
             .option("stream", source).option("startingOffsets", "earliest").load())
        q = (r.select("key", "value", partition("value").alias("partition"))
             .writeStream.format("riverlog")
             .option("servers", riverlog_server.servers).option("stream", target)
             .option("checkpointLocation", ck).trigger(availableNow=True).start())
        try:
            q.awaitTermination(120)
        finally:
            q.stop()

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        with pytest.raises(Exception, match="partition 1 does not exist"):
            run()
        stored = client.offset_range(target)[1]
        assert 0 < stored < 2000  # the failed attempt had written part of the batch
        flag.unlink()
        run()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert read_values(spark, riverlog_server.servers, target) == [b"v%d" % i for i in range(2000)]
