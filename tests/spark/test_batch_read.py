# Batch reads through Spark: exact offset ranges (earliest/latest/JSON), minPartitions,
# startingTimestamp, projections, every column's content, records from other clients, and
# failOnDataLoss when retention removed what a query asks for.
from __future__ import annotations

import time

import pytest

from riverlog.record import Record, encode_record

from .conftest import publish, reader, record


@pytest.fixture(scope="module")
def hundred(riverlog_server):
    """A stream of 100 records in 5 chunks of 20: value v<i>, key k<i % 3>."""
    c = riverlog_server.client()
    name = f"read-{time.monotonic_ns()}"
    c.create_stream(name)
    publish(c, name, [record(i) for i in range(100)], batch=20)
    c.close()
    return name


def offsets(df):
    return sorted(r.offset for r in df.select("offset").collect())


def test_schema_and_columns(spark, riverlog_server, hundred):
    df = reader(spark, riverlog_server.servers, hundred,
                startingOffsets=f'{{"{hundred}": {{"0": 41}}}}',
                endingOffsets=f'{{"{hundred}": {{"0": 43}}}}').load()
    assert df.schema.simpleString() == ("struct<key:binary,value:binary,stream:string,"
                                        "partition:int,offset:bigint,timestamp:timestamp,"
                                        "headers:map<string,binary>>")
    rows = sorted(df.collect(), key=lambda r: r.offset)
    assert [(r.key, r.value, r.stream, r.partition, r.offset, r.headers) for r in rows] == [
        (b"k2", b"v41", hundred, 0, 41, None), (b"k0", b"v42", hundred, 0, 42, None)]
    # x-opt-timestamp-ns 1_700_000_000_000_000_041 ns, truncated to µs
    assert int(rows[0].timestamp.timestamp() * 1_000_000) == 1_700_000_000_000_000


@pytest.mark.parametrize("start, end, expect", [
    ("earliest", "latest", range(0, 100)),
    ('{"S": {"0": 17}}', '{"S": {"0": 63}}', range(17, 63)),
    ('{"S": {"0": -2}}', '{"S": {"0": 20}}', range(0, 20)),
    ('{"S": {"0": 99}}', '{"S": {"0": -1}}', range(99, 100)),
    ("latest", "latest", range(0)),
])
def test_exact_ranges(spark, riverlog_server, hundred, start, end, expect):
    df = reader(spark, riverlog_server.servers, hundred, startingOffsets=start.replace("S", hundred),
                endingOffsets=end.replace("S", hundred)).load()
    assert offsets(df) == list(expect)


def test_min_partitions_splits_without_gaps_or_overlap(spark, riverlog_server, hundred):
    df = reader(spark, riverlog_server.servers, hundred, minPartitions=7,
                startingOffsets=f'{{"{hundred}": {{"0": 3}}}}').load()
    assert df.rdd.getNumPartitions() == 7
    assert offsets(df) == list(range(3, 100))
    counts = {r.key: r["count"] for r in df.groupBy("key").count().collect()}
    assert counts == {b"k0": 33, b"k1": 32, b"k2": 32}


def test_projection(spark, riverlog_server, hundred):
    df = reader(spark, riverlog_server.servers, hundred).schema("offset long, value binary").load()
    assert df.columns == ["offset", "value"]
    assert sorted((r.offset, r.value) for r in df.collect())[:2] == [(0, b"v0"), (1, b"v1")]
    with pytest.raises(Exception, match="no column"):
        reader(spark, riverlog_server.servers, hundred).schema("nope int").load().collect()


def test_starting_timestamp(spark, riverlog_server, client, new_stream):
    s = new_stream()
    publish(client, s, [record(i) for i in range(10)])
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    publish(client, s, [record(i) for i in range(10, 15)])
    df = reader(spark, riverlog_server.servers, s, startingTimestamp=cut).load()
    assert offsets(df) == list(range(10, 15))
    later = reader(spark, riverlog_server.servers, s, startingTimestamp=cut + 3_600_000).load()
    assert later.count() == 0


def test_keys_headers_and_foreign_records(spark, riverlog_server, client, new_stream):
    s = new_stream()
    records = [
        encode_record(Record(value=b"a", key=None, headers={"h": b"1", "e": b""},
                             timestamp_ns=2_000)),
        encode_record(Record(value=b"", key=b"", subject="nats.subject", timestamp_ns=3_000)),
        b"not an AMQP message",  # what a client publishing raw bytes stores
    ]
    publish(client, s, records)
    rows = sorted(reader(spark, riverlog_server.servers, s).load().collect(),
                  key=lambda r: r.offset)
    assert [(r.key, r.value, r.headers) for r in rows] == [
        (None, b"a", {"h": b"1", "e": b""}), (b"", b"", None), (None, b"not an AMQP message", None)]
    assert rows[0].timestamp.timestamp() == pytest.approx(2e-6)


def test_multiple_streams(spark, riverlog_server, client, new_stream):
    a, b = new_stream("multi"), new_stream("multi")
    publish(client, a, [record(i) for i in range(4)])
    publish(client, b, [record(i) for i in range(6)])
    df = reader(spark, riverlog_server.servers, f"{a},{b}",
                startingOffsets=f'{{"{b}": {{"0": 2}}}}').load()
    got = sorted((r.stream, r.offset) for r in df.collect())
    assert got == sorted([(a, i) for i in range(4)] + [(b, i) for i in range(2, 6)])


def test_missing_stream_is_an_error(spark, riverlog_server):
    with pytest.raises(Exception, match="does not exist"):
        reader(spark, riverlog_server.servers, "no-such-stream").load().collect()


def test_fail_on_data_loss(spark, riverlog_server, client, new_stream):
    s = new_stream("retention", max_length_bytes=20_000, stream_max_segment_size_bytes=4096)
    publish(client, s, [record(i, value=b"x" * 200) for i in range(400)], batch=10)
    deadline = time.monotonic() + 15
    seen = None  # wait until retention (every second) has nothing more to remove
    while time.monotonic() < deadline:
        now = client.offset_range(s)
        if now == seen and now[0] > 0:
            break
        seen = now
        time.sleep(1.2)
    first, end = client.offset_range(s)
    assert 0 < first < end == 400
    spec = f'{{"{s}": {{"0": 0}}}}'
    with pytest.raises(Exception, match="no longer available"):
        reader(spark, riverlog_server.servers, s, startingOffsets=spec).load().collect()
    df = reader(spark, riverlog_server.servers, s, startingOffsets=spec,
                failOnDataLoss="false").load()
    assert offsets(df) == list(range(first, 400))
    # a task whose range retention cut after it was planned (its read, without Spark)
    from riverlog.spark.offsets import DataLossError
    from riverlog.spark.options import Connection
    from riverlog.spark.reader import RangePartition, read_partition
    conn = Connection((("127.0.0.1", riverlog_server.port),))
    task = RangePartition(s, 0, first - 1, 400, conn)
    with pytest.raises(DataLossError, match=f"offsets {first - 1}..{first - 1} are no longer"):
        list(read_partition(task))


def test_a_range_starting_in_a_compaction_gap_is_not_data_loss(spark, riverlog_server, client,
                                                               new_stream):
    """A task whose range starts at an offset compaction removed (the stream keeps records
    before it) reads from the next record kept, as Spark's Kafka source does; here every
    task's, with minPartitions cutting the range at offsets that are gone too."""
    import asyncio

    from riverlog.broker.broker import record_key

    from .conftest import partition_of
    s = new_stream("compacted", stream_max_segment_size_bytes=4096)
    # every tenth record has a key of its own (kept), the others share three keys
    publish(client, s, [record(i, value=b"x" * 200, key=b"u%d" % i if i % 10 == 0
                               else b"k%d" % (i % 3)) for i in range(400)], batch=10)
    log = partition_of(riverlog_server, s).log

    async def compact_and_list() -> list[int]:
        await log.compact(record_key)
        kept, offset = [], 5
        while chunks := log.read_chunks(offset):
            kept += [at for chunk in chunks for at, _ in chunk.records()]
            offset = chunks[-1].header.next_offset
        return kept
    kept = asyncio.run_coroutine_threadsafe(compact_and_list(), riverlog_server.loop).result(30)
    assert kept[0] == 10 and len(kept) < 300  # offsets 1..9 and others are gone
    spec = f'{{"{s}": {{"0": 5}}}}'
    assert offsets(reader(spark, riverlog_server.servers, s, startingOffsets=spec).load()) == kept
    assert offsets(reader(spark, riverlog_server.servers, s, startingOffsets=spec,
                          minPartitions=7).load()) == kept
