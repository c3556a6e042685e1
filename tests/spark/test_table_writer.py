# Streams as tables, the writing side, against a real server (the App on a free port with
# its real worker process): a table holds exactly the rows the Spark source reads for the
# same offsets, sealed segments become one file each, leftovers of a crash and a damaged
# manifest are dealt with on start, retention and compaction reach the table (unless
# archive), deleting a stream deletes its table, and only table-enabled streams get one.
from __future__ import annotations

import json
import os
import signal
import time

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("pyspark")

from riverlog.broker.broker import record_key  # noqa: E402
from riverlog.config import TableConfig  # noqa: E402
from riverlog.spark.options import Connection  # noqa: E402
from riverlog.spark.reader import RangePartition, read_partition  # noqa: E402
from riverlog.tables import manifest as mf  # noqa: E402
from riverlog.tables.read import table_files  # noqa: E402
from riverlog.tables.storage import TMP_SUFFIX, Storage, spark_uri  # noqa: E402

from ._server import ThreadServer  # noqa: E402
from .conftest import partition_of, send, tables_at, varied, wait_table  # noqa: E402

SMALL_SEGMENTS = {"x-riverlog-table": "true", "stream-max-segment-size-bytes": "8192"}


def table_rows(server: ThreadServer, stream: str, m: mf.Manifest) -> pa.Table:
    storage = Storage(server.app.config.table_dir)
    directory = mf.partition_dir(storage.root, stream, 0)
    return pa.concat_tables([pq.read_table(f"{directory}/{f.name}", filesystem=storage.fs)
                             for f in m.files])


def source_rows(server: ThreadServer, stream: str, start: int, end: int) -> pa.Table:
    """What the Spark source reads for [start, end) (its executor-side read, no Spark)."""
    conn = Connection((("127.0.0.1", server.port),))
    part = RangePartition(stream, 0, start, end, conn, fail_on_data_loss=False)
    return pa.Table.from_batches(list(read_partition(part)))


def test_table_holds_exactly_what_the_source_reads(table_server):
    with table_server.client() as c:
        c.create_stream("mirrored", SMALL_SEGMENTS)
    # in confirmed steps: separate chunks (one send of 2000 made 3 segments under load)
    for start in range(0, 2000, 200):
        send(table_server, "mirrored", varied(start, 200))
    m = wait_table(table_server, "mirrored")
    p = partition_of(table_server, "mirrored")
    assert len(p.log.segments) > 3
    assert m.first == 0
    rows = table_rows(table_server, "mirrored", m)
    assert rows.equals(source_rows(table_server, "mirrored", 0, m.end))
    # one file per sealed segment, offsets and timestamps with statistics, zstd
    assert [(f.start, f.end) for f in m.files if f.sealed] == [
        (s.base_offset, s.next_offset) for s in p.log.segments[:-1]]
    meta = pq.ParquetFile(os.path.join(mf.partition_dir(table_server.app.config.table_dir,
                                                        "mirrored", 0), m.files[0].name)).metadata
    column = meta.row_group(0).column(rows.schema.get_field_index("offset"))
    assert (column.statistics.min, column.statistics.max) == (m.files[0].start,
                                                              m.files[0].end - 1)
    assert column.compression == "ZSTD"
    # more records: the table follows, small files of the active segment first
    send(table_server, "mirrored", varied(2000, 30))
    m = wait_table(table_server, "mirrored", sealed=False)
    assert table_rows(table_server, "mirrored", m).equals(
        source_rows(table_server, "mirrored", 0, m.end))


@pytest.mark.parametrize("where", ["file", "s3"])
def test_a_table_folder_on_any_pyarrow_filesystem(tmp_path, request, where):
    """``streams.table.dir`` as a URI: a local folder as ``file:///...`` and a bucket of an
    S3 endpoint (moto, in this process). The writer publishes there (no temporary file
    left, every file listed), and the source's tableDir option reads the rows back from
    there (pyarrow.fs on the executor) without asking the server for them."""
    from riverlog.metrics import REGISTRY

    location = ((tmp_path / "tables").as_uri() if where == "file"
                else request.getfixturevalue("s3_tables")(f"{tmp_path.name}/tables"))
    with tables_at(tmp_path, location, "far", 8192) as s:
        send(s, "far", varied(0, 600))
        m = wait_table(s, "far")
        assert len(m.files) >= 2 and m.first == 0
        want = source_rows(s, "far", 0, 600)
        assert table_rows(s, "far", m).equals(want)
        storage = Storage(location)
        directory = mf.partition_dir(storage.root, "far", 0)
        assert sorted(storage.names(directory)) == sorted(
            [mf.MANIFEST] + [f.name for f in m.files] + [name for name, _ in m.retired])
        if where == "file":
            assert os.path.isfile(os.path.join(tmp_path, "tables", "far", "0", mf.MANIFEST))

        def delivered():
            return REGISTRY.get_sample_value("riverlog_delivered_messages_total", {
                "vhost": "/", "stream": "far", "door": "rabbitmq_stream"}) or 0
        before = delivered()
        part = RangePartition("far", 0, 0, 600, Connection((("127.0.0.1", s.port),)),
                              table_dir=location)
        assert pa.Table.from_batches(list(read_partition(part))).equals(want)
        assert delivered() == before


@pytest.mark.parametrize("location, uri", [
    ("s3://key:secret@bucket/tables?region=eu-west-1", "s3a://bucket/tables/s/0/f.parquet"),
    ("gs://bucket/a/tables/", "gs://bucket/a/tables/s/0/f.parquet"),
    ("hdfs://namenode:8020/tables", "hdfs://namenode:8020/tables/s/0/f.parquet"),
    ("abfs://box@account.dfs.core.windows.net/t",
     "abfs://box@account.dfs.core.windows.net/t/s/0/f.parquet"),
])
def test_spark_reads_table_files_by_their_hadoop_uri(location, uri):
    """read_table hands Spark each file as its Hadoop filesystems name it: the scheme
    (S3 as s3a), the authority (a bucket, a namenode, a container; no credentials) and the
    path, without pyarrow's options."""
    assert spark_uri(location, "s/0/f.parquet") == uri


def test_a_table_folder_pyarrow_cannot_open_is_reported_and_publishers_go_on(tmp_path):
    s = ThreadServer(str(tmp_path / "data"), tables=TableConfig(
        lag_ms=300, enabled=True, directory="nosuch://bucket/tables",
        format="parquet")).start()
    try:
        with s.client() as c:
            c.create_stream("nowhere")
        send(s, "nowhere", varied(0, 100))
        deadline = time.monotonic() + 60
        while (status := s.app.tables.status.get(("nowhere", 0))) is None:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert "nosuch" in status.error and status.end is None
        send(s, "nowhere", varied(100, 100))  # publishers go on
        assert partition_of(s, "nowhere").committed_offset == 199
        assert s.app.tables.worker_pid is not None  # the writer did not die over it
    finally:
        s.stop()


def test_duckdb_reads_the_table(table_server):
    """The docs/spark.md example: DuckDB over the files a table lists."""
    duckdb = pytest.importorskip("duckdb")
    with table_server.client() as c:
        c.create_stream("ducks", SMALL_SEGMENTS)
    send(table_server, "ducks", varied(0, 700))
    m = wait_table(table_server, "ducks")
    files = table_files(table_server.app.config.table_dir, "ducks")
    assert [os.path.basename(f) for f in files] == [f.name for f in m.files]
    got = duckdb.sql(f"select key, count(*) as n, sum(octet_length(value)) as bytes "
                     f"from read_parquet({files!r}) group by key order by key").fetchall()
    rows = table_rows(table_server, "ducks", m).to_pylist()
    want = sorted({k: (k, sum(1 for r in rows if r["key"] == k),
                       sum(len(r["value"]) for r in rows if r["key"] == k))
                   for k in {r["key"] for r in rows}}.values(),
                  key=lambda t: (t[0] is None, t[0] or b""))
    assert got == want


def test_only_table_streams_get_a_table_and_delete_removes_it(table_server):
    with table_server.client() as c:
        c.create_stream("plain")
        c.create_stream("doomed", {"x-riverlog-table": "true"})
    send(table_server, "plain", varied(0, 10))
    send(table_server, "doomed", varied(0, 10))
    wait_table(table_server, "doomed")
    table_dir = table_server.app.config.table_dir
    assert not os.path.exists(mf.stream_dir(table_dir, "plain"))
    with table_server.client() as c:
        c.delete_stream("doomed")
    deadline = time.monotonic() + 30
    while os.path.exists(mf.stream_dir(table_dir, "doomed")):
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_killed_writer_is_started_again(table_server):
    """The worker process dies (SIGKILL mid-pass or idle): the server starts another, which
    goes on from the manifest."""
    with table_server.client() as c:
        c.create_stream("phoenix", SMALL_SEGMENTS)
    send(table_server, "phoenix", varied(0, 300))
    wait_table(table_server, "phoenix")
    pid = table_server.app.tables.worker_pid
    os.kill(pid, signal.SIGKILL)
    send(table_server, "phoenix", varied(300, 300))
    m = wait_table(table_server, "phoenix")
    assert table_server.app.tables.worker_pid not in (pid, None)
    assert table_rows(table_server, "phoenix", m).equals(
        source_rows(table_server, "phoenix", 0, 600))


def test_bad_table_argument_is_refused(table_server):
    from riverlog.client import ClientError
    with table_server.client() as c, pytest.raises(ClientError):
        c.create_stream("bad-table", {"x-riverlog-table": "maybe"})


def test_retention_and_compaction_reach_the_table(table_server):
    with table_server.client() as c:
        c.create_stream("kept", dict(SMALL_SEGMENTS, **{"max-length-bytes": "60000"}))
    for start in range(0, 3000, 500):
        send(table_server, "kept", varied(start, 500))
        m = wait_table(table_server, "kept")
    p = partition_of(table_server, "kept")
    # retention removed segments; at least one sealed segment is left (how many depends on
    # how publishes were batched into chunks, so on timing)
    assert p.first_offset > 0 and len(p.log.segments) >= 2
    # the writer drops the removed segments' rows at its next pass (within the table's lag),
    # and then holds exactly what the log holds. Retention may drop a segment again after the
    # last publish (its periodic pass), between reading the manifest and the log: then the
    # next pass must catch up (CI saw "offsets 2000..2499 are gone" in the comparison)
    deadline = time.monotonic() + 60
    while not (m.first == p.log.segments[0].base_offset and table_rows(
            table_server, "kept", m).equals(source_rows(table_server, "kept", m.first, m.end))):
        assert time.monotonic() < deadline, (m, p.log.segments[0].base_offset)
        time.sleep(0.1)
        m = wait_table(table_server, "kept")
    # a compaction rewrites sealed segments: their files are written again
    import asyncio
    asyncio.run_coroutine_threadsafe(p.log.compact(record_key), table_server.loop).result(30)
    before = {f.name for f in m.files if f.sealed}
    deadline = time.monotonic() + 60
    while True:
        m = wait_table(table_server, "kept")
        if before.isdisjoint(f.name for f in m.files if f.sealed):
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    rows = table_rows(table_server, "kept", m)
    assert rows.num_rows < m.end - m.first
    assert rows.equals(source_rows(table_server, "kept", m.first, m.end))


def test_archive_keeps_what_retention_drops(tmp_path):
    s = ThreadServer(str(tmp_path), tables=TableConfig(lag_ms=300, archive=True, enabled=True,
                                                       compression="snappy", format="parquet")).start()
    try:
        with s.client() as c:
            c.create_stream("archived", {"stream-max-segment-size-bytes": "8192",
                                         "max-length-bytes": "30000"})
        # the table keeps up: it has what retention drops (steps of 100 records, ~1/3 of
        # max-length-bytes: a step of 500 rolled and dropped segments of its own before the
        # writer's next pass saw them, and the table started at 50 on a loaded machine)
        for start in range(0, 3000, 100):
            send(s, "archived", varied(start, 100))
            m = wait_table(s, "archived")
        p = partition_of(s, "archived")
        assert p.first_offset > 0 and m.first == 0
        rows = table_rows(s, "archived", m)
        assert rows.column("offset").to_pylist()[:3] == [0, 1, 2]
        newest = os.path.join(mf.partition_dir(s.app.config.table_dir, "archived", 0),
                              m.files[-1].name)
        assert pq.ParquetFile(newest).metadata.row_group(0).column(0).compression == "SNAPPY"
        assert rows.slice(rows.num_rows - 100).equals(source_rows(s, "archived", m.end - 100,
                                                                  m.end))
    finally:
        s.stop()


def test_start_removes_leftovers_and_rebuilds_a_damaged_manifest(tmp_path):
    config = TableConfig(lag_ms=300, enabled=True, format="parquet")
    s = ThreadServer(str(tmp_path), tables=config).start()
    try:
        with s.client() as c:
            c.create_stream("crashy", {"stream-max-segment-size-bytes": "8192"})
        send(s, "crashy", varied(0, 600))
        m = wait_table(s, "crashy")
    finally:
        s.stop()
    directory = mf.partition_dir(s.app.config.table_dir, "crashy", 0)
    # what a crash mid-write leaves: a partial temporary file, a renamed but unlisted file
    with open(os.path.join(directory, mf.file_name(600, 700, 99) + TMP_SUFFIX), "wb") as f:
        f.write(b"PAR1 half a file")
    unlisted = os.path.join(directory, mf.file_name(600, 700, 98))
    with open(unlisted, "wb") as f:
        f.write(b"PAR1")
    s = ThreadServer(str(tmp_path), tables=config).start()
    try:
        send(s, "crashy", varied(600, 100))
        m = wait_table(s, "crashy")
        assert sorted(os.listdir(directory)) == sorted(
            [mf.MANIFEST] + [f.name for f in m.files] + [name for name, _ in m.retired])
        assert os.path.basename(unlisted) not in os.listdir(directory)
        assert table_rows(s, "crashy", m).equals(source_rows(s, "crashy", 0, 700))
    finally:
        s.stop()
    with open(os.path.join(directory, mf.MANIFEST), "w") as f:
        f.write(json.dumps({"version": 1, "files": "garbage"}))
    s = ThreadServer(str(tmp_path), tables=config).start()
    try:
        m = wait_table(s, "crashy")
        assert table_rows(s, "crashy", m).equals(source_rows(s, "crashy", 0, 700))
    finally:
        s.stop()
