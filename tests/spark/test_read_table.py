# riverlog.spark.read_table on Spark: the rows are exactly those spark.read.format("riverlog")
# returns for the same offsets (whole files, ranges cutting files, timestamps, projections),
# and a damaged or missing Parquet file or manifest is reported and read from the log.
from __future__ import annotations

import asyncio
import json
import logging
import os
import pathlib
import shutil

import pytest

from riverlog.config import TableConfig
from riverlog.spark import read_table
from riverlog.spark.schema import spark_schema
from riverlog.tables import manifest as mf
from riverlog.tables.storage import Storage

from ._server import ThreadServer
from .conftest import partition_of, reader, send, tables_at, varied, wait_table


@pytest.fixture(scope="module")
def table(table_server):
    """A table-enabled stream of 1500 records over several segments, its table caught up."""
    with table_server.client() as c:
        c.create_stream("read-table", {"x-riverlog-table": "true",
                                       "stream-max-segment-size-bytes": "16384"})
    send(table_server, "read-table", varied(0, 1500))
    wait_table(table_server, "read-table")
    return "read-table"


def rows(df):
    return sorted(df.collect(), key=lambda r: r.offset)


def both(spark, server, stream, columns=None, table_dir=None, **options):
    """(read_table's rows, the source's rows) for the same options."""
    table = read_table(spark, stream, table_dir or server.app.config.table_dir, columns=columns,
                       servers=server.servers, **options)
    source = reader(spark, server.servers, stream, **options)
    if columns is not None:
        types = {f.name: f.dataType.simpleString() for f in spark_schema().fields}
        source = source.schema(", ".join(f"{c} {types[c]}" for c in columns))
    return rows(table), rows(source.load())


def test_same_rows_as_the_source(spark, table_server, table):
    got, want = both(spark, table_server, table)
    assert len(got) == 1500 and got == want
    # and they came from the table's files, every one of them
    df = read_table(spark, table, table_server.app.config.table_dir,
                    servers=table_server.servers)
    directory = mf.partition_dir(table_server.app.config.table_dir, table, 0)
    m = mf.load(Storage(directory), directory)
    assert sorted(os.path.basename(p) for p in df.inputFiles()) == [f.name for f in m.files]
    cut = {"startingOffsets": json.dumps({table: {"0": 123}}),
           "endingOffsets": json.dumps({table: {"0": 1234}})}
    got, want = both(spark, table_server, table, **cut)
    assert [r.offset for r in got] == list(range(123, 1234)) and got == want
    got, want = both(spark, table_server, table, columns=["value", "offset"], **cut)
    assert got == want and got[0].asDict() == {"value": b"v123", "offset": 123}
    # a timestamp resolves to a chunk's first offset, as the source does it
    got, want = both(spark, table_server, table, startingTimestamp="0")
    assert got == want and len(got) == 1500


def test_a_table_folder_named_by_a_uri(spark, table_server, table):
    """table_dir as ``file:///...``: the manifest and footers are read through pyarrow.fs,
    Spark reads the files, and the rows are the source's."""
    uri = pathlib.Path(table_server.app.config.table_dir).as_uri()
    got, want = both(spark, table_server, table, table_dir=uri)
    assert len(got) == 1500 and got == want
    df = read_table(spark, table, uri, servers=table_server.servers)
    directory = mf.partition_dir(table_server.app.config.table_dir, table, 0)
    m = mf.load(Storage(directory), directory)
    assert sorted(os.path.basename(p) for p in df.inputFiles()) == [f.name for f in m.files]


@pytest.mark.parametrize("columns", [["value", "nope"], [], ["key", "key"]])
def test_bad_columns_are_refused(columns):
    with pytest.raises(ValueError, match="read_table: "):
        read_table(None, "any", "/nowhere", columns=columns)


def test_damaged_files_and_manifest_are_read_from_the_log(spark, table_server, table, caplog,
                                                         tmp_path):
    # damage a copy: the server's writer would rebuild a damaged manifest at once
    copy = str(tmp_path / "tables")
    shutil.copytree(mf.stream_dir(table_server.app.config.table_dir, table),
                    mf.stream_dir(copy, table))
    directory = mf.partition_dir(copy, table, 0)
    m = mf.load(Storage(directory), directory)
    # how many files the writer's passes left depends on how the publishes were batched
    # (a full run's load made 2 of what are 3 or more on a quiet machine)
    assert len(m.files) >= 2
    # a torn file (shorter than listed) and a missing one: their offsets come from the log
    torn, missing = m.files[-2], m.files[-1]
    with open(os.path.join(directory, torn.name), "r+b") as f:
        f.truncate(torn.size // 2)
    os.unlink(os.path.join(directory, missing.name))
    with caplog.at_level(logging.WARNING, logger="riverlog.tables"):
        got, want = both(spark, table_server, table, table_dir=copy)
    assert got == want and len(got) == 1500
    assert f"{torn.name} is {torn.size // 2} bytes" in caplog.text
    assert f"{missing.name} is missing" in caplog.text
    caplog.clear()
    with open(os.path.join(directory, mf.MANIFEST), "w") as f:
        f.write("{not json")
    with caplog.at_level(logging.WARNING, logger="riverlog.tables"):
        got, want = both(spark, table_server, table, table_dir=copy)
    assert got == want and len(got) == 1500
    assert "damaged manifest" in caplog.text


def test_streaming_query_catches_up_from_the_table(spark, table_server, tmp_path):
    """The source's tableDir option: a streaming query from earliest reads what the table
    holds from its files and only the rest from the server, then goes on with records the
    table has not got; the rows are the source's."""
    from riverlog.metrics import REGISTRY

    def delivered():
        return REGISTRY.get_sample_value("riverlog_delivered_messages_total", {
            "vhost": "/", "stream": "catch-up", "door": "rabbitmq_stream"}) or 0

    with table_server.client() as c:
        c.create_stream("catch-up", {"x-riverlog-table": "true"})
    send(table_server, "catch-up", varied(0, 1000))
    send(table_server, "catch-up", varied(1000, 1))  # the newest chunk: 1 record
    wait_table(table_server, "catch-up")
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    query = (spark.readStream.format("riverlog").option("servers", table_server.servers)
             .option("stream", "catch-up").option("startingOffsets", "earliest")
             .option("tableDir", table_server.app.config.table_dir).load()
             .writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", ck).trigger(availableNow=True))
    before = delivered()
    q = query.start()  # the history, from the table
    try:
        q.awaitTermination(120)
    finally:
        q.stop()
    assert [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]] == [1001]
    # the server sent the executors none of the 1001 records: only the newest chunk (1
    # record) to each offset lookup of the planner (riverlog.client offset_range)
    assert delivered() - before < 100
    send(table_server, "catch-up", varied(1001, 20))
    q = query.start()  # newer records: what the table has not got yet comes from the log
    try:
        q.awaitTermination(120)
    finally:
        q.stop()
    got = rows(spark.read.schema(spark_schema()).parquet(out))
    want = rows(reader(spark, table_server.servers, "catch-up",
                       endingOffsets=json.dumps({"catch-up": {"0": 1021}})).load())
    assert len(got) == 1021 and got == want


def test_archived_offsets_beyond_retention_are_read_from_the_table(spark, tmp_path):
    """streams.table.archive: retention deletes the log's first segments, the table keeps
    them; read_table from earliest starts at the table's first offset and returns every
    record once, offsets contiguous from the table into the log, values as published; so
    does the source with tableDir."""
    s = ThreadServer(str(tmp_path), tables=TableConfig(lag_ms=300, archive=True, format="parquet",
                                                       enabled=True)).start()
    try:
        with s.client() as c:
            c.create_stream("archived", {"stream-max-segment-size-bytes": "8192",
                                         "max-length-bytes": "60000"})
        # rounds of 5 chunks (~34 KB, a segment each): retention deletes only segments of
        # earlier rounds, which the table has by then
        for start in range(0, 3000, 250):
            send(s, "archived", varied(start, 250))
            m = wait_table(s, "archived")
        assert all(a.end == b.start for a, b in zip(m.files, m.files[1:])), m.files
        # retention now, not at the server's next housekeeping in the middle of the reads
        p = partition_of(s, "archived")

        async def retain():
            p.log.enforce_retention()
        asyncio.run_coroutine_threadsafe(retain(), s.loop).result(30)
        log_first = p.first_offset
        assert log_first > 500 and m.first == 0
        published = [b"raw%d" % i if i % 11 == 0 else b"v%d" % i for i in range(3000)]

        got = rows(read_table(spark, "archived", s.app.config.table_dir, servers=s.servers,
                              columns=["offset", "value"]))
        assert [r.offset for r in got] == list(range(3000))
        assert [r.value for r in got] == published
        # the part the log still has: the source's rows, byte for byte
        tail, want = both(spark, s, "archived",
                          startingOffsets=json.dumps({"archived": {"0": log_first}}))
        assert tail == want
        assert [(r.offset, r.value) for r in tail] == [(r.offset, r.value)
                                                       for r in got[log_first:]]
        # an explicit start inside the archive, and the source's tableDir option
        cut = rows(read_table(spark, "archived", s.app.config.table_dir, servers=s.servers,
                              startingOffsets=json.dumps({"archived": {"0": 100}}),
                              endingOffsets=json.dumps({"archived": {"0": log_first + 10}})))
        assert [r.offset for r in cut] == list(range(100, log_first + 10))
        source = rows(reader(spark, s.servers, "archived",
                             tableDir=s.app.config.table_dir).load())
        assert [r.offset for r in source] == list(range(3000))
        assert [r.value for r in source] == published
        # a damaged archived file (in a copy): neither the table nor the log has its
        # offsets, which is data loss, reported; skipped with failOnDataLoss=false
        copy = str(tmp_path / "copy")
        shutil.copytree(mf.stream_dir(s.app.config.table_dir, "archived"),
                        mf.stream_dir(copy, "archived"))
        bad = m.files[1]
        os.unlink(os.path.join(mf.partition_dir(copy, "archived", 0), bad.name))
        with pytest.raises(Exception, match="no longer available"):
            read_table(spark, "archived", copy, servers=s.servers).collect()
        kept = rows(read_table(spark, "archived", copy, servers=s.servers,
                               failOnDataLoss="false"))
        assert [r.offset for r in kept] == [o for o in range(3000)
                                            if not bad.start <= o < bad.end]
    finally:
        s.stop()


def test_spark_tasks_read_a_table_in_an_s3_bucket(spark, tmp_path, s3_tables):
    """The source's tableDir as an s3:// URI (an S3 endpoint run by moto in this process):
    Spark's Python tasks read the table's files through pyarrow.fs, the server sends them
    none of the records, and the rows are the source's."""
    from riverlog.metrics import REGISTRY

    def delivered():
        return REGISTRY.get_sample_value("riverlog_delivered_messages_total", {
            "vhost": "/", "stream": "in-s3", "door": "rabbitmq_stream"}) or 0

    location = s3_tables(f"{tmp_path.name}/tables")
    with tables_at(tmp_path, location, "in-s3", 16384) as s:
        send(s, "in-s3", varied(0, 800))
        send(s, "in-s3", varied(800, 1))  # the newest chunk, which offset lookups read: 1 record
        wait_table(s, "in-s3")
        ending = json.dumps({"in-s3": {"0": 801}})
        before = delivered()
        got = rows(reader(spark, s.servers, "in-s3", tableDir=location,
                          endingOffsets=ending).load())
        assert delivered() - before < 100  # only the planner's offset lookups
        want = rows(reader(spark, s.servers, "in-s3", endingOffsets=ending).load())
        assert len(got) == 801 and got == want
