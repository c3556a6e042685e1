# Streams as Apache Iceberg tables (streams.table.format: iceberg), against a real server
# (the App on a free port with its real table worker process) and a real pyiceberg SQL
# catalog on SQLite in the table folder: the table is a format v2 table partitioned by
# partition and day(timestamp), sorted by offset, holding exactly the rows the Spark source
# reads (through pyiceberg's Arrow scan, pandas and DuckDB); every snapshot's summary says
# which offsets it holds; sealed segments are written whole; files a crash left before a
# commit are removed; retention reaches the table; an unreachable catalog stops only the
# table writer.
from __future__ import annotations

import json
import socket
import time

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")
pytest.importorskip("pyiceberg")

from riverlog.config import TableConfig  # noqa: E402
from riverlog.spark.options import Connection  # noqa: E402
from riverlog.spark.reader import RangePartition, read_partition  # noqa: E402
from riverlog.tables import iceberg as ice  # noqa: E402

from ._server import ThreadServer  # noqa: E402
from .conftest import catalog, partition_of, send, varied, wait_iceberg  # noqa: E402

SMALL_SEGMENTS = {"x-riverlog-table": "true", "stream-max-segment-size-bytes": "8192"}


@pytest.fixture(scope="module")
def iceberg_server(tmp_path_factory):
    server = ThreadServer(str(tmp_path_factory.mktemp("riverlog-iceberg")),
                          tables=TableConfig(lag_ms=300, format="iceberg")).start()
    yield server
    server.stop()


def source_rows(server: ThreadServer, stream: str, start: int, end: int) -> pa.Table:
    """What the Spark source reads for [start, end) (its executor-side read, no Spark)."""
    conn = Connection((("127.0.0.1", server.port),))
    part = RangePartition(stream, 0, start, end, conn, fail_on_data_loss=False)
    return pa.Table.from_batches(list(read_partition(part)))


def by_offset(table: pa.Table) -> pa.Table:
    return table.sort_by("offset")


def written_on(server: ThreadServer, stream: str, start: int, n: int) -> None:
    """Publish records ``start .. start + n - 1`` and check the table then holds exactly
    what the source reads from offset 0 on."""
    send(server, stream, varied(start, n))
    table = wait_iceberg(server, stream)
    expected = source_rows(server, stream, 0, start + n)
    assert by_offset(table.scan().to_arrow()).cast(expected.schema).equals(expected)


def test_the_table_is_iceberg_and_holds_what_the_source_reads(iceberg_server):
    with iceberg_server.client() as c:
        c.create_stream("ice", SMALL_SEGMENTS)
    for start in range(0, 1500, 300):  # each confirmed before the next: separate chunks
        send(iceberg_server, "ice", varied(start, 300), batch=20)
    table = wait_iceberg(iceberg_server, "ice")
    assert table.metadata.format_version == 2
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [
        ("partition", "identity"), ("timestamp_day", "day")]
    assert [table.schema().find_column_name(f.source_id) for f in table.sort_order().fields] \
        == ["offset"]
    p = partition_of(iceberg_server, "ice")
    assert len(p.log.segments) >= 3
    end = p.committed_offset + 1
    expected = source_rows(iceberg_server, "ice", 0, end)
    assert ice.snapshot_offsets(table.current_snapshot()) == {0: (0, end)}
    # pyiceberg's Arrow scan, pandas and DuckDB over it: the source's rows
    scanned = by_offset(table.scan().to_arrow())
    assert scanned.column("offset").to_pylist() == list(range(end))
    assert scanned.cast(expected.schema).to_pylist() == expected.to_pylist()
    frame = table.scan().to_pandas().sort_values("offset").reset_index(drop=True)
    assert frame["value"].tolist() == expected.column("value").to_pylist()
    assert frame["offset"].tolist() == list(range(end))
    duckdb = pytest.importorskip("duckdb")
    arrow_scan = table.scan().to_arrow()
    got = duckdb.sql('select "offset", key, value from arrow_scan order by "offset"')
    got = got.arrow().read_all()
    assert arrow_scan.num_rows == end
    assert got.equals(expected.select(["offset", "key", "value"]))
    # every snapshot riverlog committed says what it holds; ranges only grow here (the
    # first, the writer's claim of partition 0 under its leader epoch, holds none)
    first, *snapshots = table.snapshots()
    assert ice.snapshot_offsets(first) == {} and ice.snapshot_epochs(first) == {0: 1}
    ends = [ice.snapshot_offsets(s)[0][1] for s in snapshots]
    assert ends == sorted(ends) and ends[-1] == end
    # sealed segments written whole: no data file holds records of two segments
    bases = [s.base_offset for s in p.log.segments]
    field = table.schema().find_field("offset").field_id
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import LongType
    for task in table.scan().plan_files():
        lo = from_bytes(LongType(), task.file.lower_bounds[field])
        hi = from_bytes(LongType(), task.file.upper_bounds[field])
        assert max(b for b in bases if b <= lo) == max(b for b in bases if b <= hi)
    # more records: the table follows with the active segment
    send(iceberg_server, "ice", varied(1500, 30))
    table = wait_iceberg(iceberg_server, "ice", sealed=False)
    end = partition_of(iceberg_server, "ice").committed_offset + 1
    assert by_offset(table.scan().to_arrow()).cast(expected.schema).equals(
        source_rows(iceberg_server, "ice", 0, end))


def test_files_of_a_pass_that_never_committed_are_removed(tmp_path):
    """What a crash between writing data files and committing leaves (files written by
    pyiceberg, no snapshot listing them) is invisible to readers, and the writer of the
    next start removes it."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    data = str(tmp_path / "data")
    config = TableConfig(lag_ms=300, format="iceberg", enabled=True)
    server = ThreadServer(data, tables=config).start()
    try:
        with server.client() as c:
            c.create_stream("crashy", {})
        send(server, "crashy", varied(0, 200))
        table = wait_iceberg(server, "crashy")
    finally:
        server.stop()
    rows = by_offset(table.scan().to_arrow())
    orphans = [f.file_path for f in _dataframe_to_data_files(
        table_metadata=table.metadata, df=rows, io=table.io)]
    assert orphans and all(table.io.new_input(f).exists() for f in orphans)
    assert by_offset(table.refresh().scan().to_arrow()).equals(rows)  # not visible
    server = ThreadServer(data, tables=config).start()
    try:
        deadline = time.monotonic() + 60
        while any(table.io.new_input(f).exists() for f in orphans):
            assert time.monotonic() < deadline, "the leftovers were never removed"
            time.sleep(0.1)
        written_on(server, "crashy", 200, 10)
    finally:
        server.stop()


def test_an_unreachable_catalog_stops_only_the_table_writer(tmp_path):

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadServer(str(tmp_path / "data"), tables=TableConfig(
        lag_ms=300, format="iceberg", enabled=True,
        catalog=f"http://127.0.0.1:{port}")).start()
    try:
        with server.client() as c:
            c.create_stream("nocat", {})
        send(server, "nocat", varied(0, 100))
        service = server.app.tables
        deadline = time.monotonic() + 60
        while (status := service.status.get(("nocat", 0))) is None or status.error is None:
            assert time.monotonic() < deadline, "the table writer never reported the catalog"
            time.sleep(0.1)
        assert f"127.0.0.1:{port}" in status.error
        send(server, "nocat", varied(100, 100))  # publishers go on
        assert partition_of(server, "nocat").committed_offset == 199
    finally:
        server.stop()


def test_snapshot_summary_is_json_per_partition(iceberg_server):
    table = wait_iceberg(iceberg_server, "ice", sealed=False)
    raw = table.current_snapshot().summary.additional_properties[ice.OFFSETS_PROPERTY]
    assert json.loads(raw) == {"0": [0, partition_of(iceberg_server, "ice").committed_offset
                                     + 1]}


def test_read_table_through_the_catalog_equals_the_source(iceberg_server, spark):
    """read_table(catalog=...) gives the source's rows: the snapshot's data files (Spark's
    Parquet reader), records the table has not got yet (its writer stopped) from the log,
    and a range starting inside the table (files filtered)."""
    import asyncio

    import riverlog.spark
    from riverlog.tables.iceberg import catalog_uri

    with iceberg_server.client() as c:
        c.create_stream("iceread", {"x-riverlog-table": "true"})
    send(iceberg_server, "iceread", varied(0, 400))
    wait_iceberg(iceberg_server, "iceread")
    app = iceberg_server.app
    asyncio.run_coroutine_threadsafe(app.tables.stop(), iceberg_server.loop).result(60)
    try:
        send(iceberg_server, "iceread", varied(400, 50))  # only in the log
        uri = catalog_uri(app.config.table_dir, None)
        cols = ["stream", "partition", "offset", "key", "value", "timestamp", "headers"]
        for start in ("earliest", json.dumps({"iceread": {"0": 123}})):
            table = riverlog.spark.read_table(spark, "iceread", catalog=uri,
                                              servers=iceberg_server.servers,
                                              startingOffsets=start).select(*cols)
            source = (spark.read.format("riverlog").option("servers", iceberg_server.servers)
                      .option("stream", "iceread").option("startingOffsets", start)
                      .load().select(*cols))
            assert any(f.endswith(".parquet") for f in table.inputFiles())  # the table's
            got = table.orderBy("offset").collect()
            assert got == source.orderBy("offset").collect()
            assert [r.offset for r in got] == list(range(0 if start == "earliest" else 123,
                                                         450))
        assert ice.snapshot_offsets(ice.load_table(catalog(iceberg_server), "iceread")
                                    .current_snapshot()) == {0: (0, 400)}
    finally:
        iceberg_server.loop.call_soon_threadsafe(app.tables.start)


def test_retention_compaction_and_damaged_metadata_reach_the_table(iceberg_server):
    """Retention removes the data files below the log's first offset (one overwrite
    snapshot), a compaction makes the writer write the compacted segments again, and a
    current metadata file that cannot be read is reported and the table written again from
    the log."""
    import asyncio

    from riverlog.broker.broker import record_key

    with iceberg_server.client() as c:
        c.create_stream("icekept", dict(SMALL_SEGMENTS, **{"max-length-bytes": "60000"}))
    for start in range(0, 3000, 500):
        send(iceberg_server, "icekept", varied(start, 500))
        wait_iceberg(iceberg_server, "icekept")
    p = partition_of(iceberg_server, "icekept")
    assert p.first_offset > 0 and len(p.log.segments) >= 2
    deadline = time.monotonic() + 60
    while True:
        table = wait_iceberg(iceberg_server, "icekept")
        first, end = ice.snapshot_offsets(table.current_snapshot())[0]
        rows = by_offset(table.scan().to_arrow())
        if rows.column("offset")[0].as_py() >= p.log.segments[0].base_offset - 500:
            break  # files wholly below the log's first offset are gone
        assert time.monotonic() < deadline, (first, rows.column("offset")[0])
        time.sleep(0.1)
    assert "overwrite" in {s.summary.operation.value for s in table.snapshots()}
    # retention may go on after the snapshot, and while the source reads: compare from the
    # first offset the source still had (a full run saw the log start at 2500, not 1700)
    source = source_rows(iceberg_server, "icekept", max(first, p.first_offset), end)
    assert source.num_rows > 0
    first = source.column("offset")[0].as_py()
    keep = rows.filter(pa.compute.greater_equal(rows.column("offset"), first))
    assert keep.cast(rows.schema).to_pylist() == source.to_pylist()
    # compaction of the sealed segments: they are written again, fewer rows
    before = ice.snapshot_segments(table.current_snapshot())[0]
    asyncio.run_coroutine_threadsafe(p.log.compact(record_key),
                                     iceberg_server.loop).result(30)
    deadline = time.monotonic() + 60
    while True:
        table = wait_iceberg(iceberg_server, "icekept")
        after = ice.snapshot_segments(table.current_snapshot())[0]
        if all(after.get(b) != v for b, v in before.items()
               if b >= p.log.segments[0].base_offset):
            break
        assert time.monotonic() < deadline, (before, after)
        time.sleep(0.1)
    first, end = ice.snapshot_offsets(table.current_snapshot())[0]
    first = max(first, p.first_offset)
    rows = by_offset(table.scan().to_arrow())
    rows = rows.filter(pa.compute.greater_equal(rows.column("offset"), first))
    assert rows.num_rows < end - first
    assert rows.cast(rows.schema).to_pylist() == source_rows(
        iceberg_server, "icekept", first, end).to_pylist()
    # damaged current metadata: reported, written again from the log
    path = table.metadata_location.removeprefix("file://")
    with open(path, "w") as f:
        f.write("{not json")
    deadline = time.monotonic() + 60
    while True:
        try:  # None: dropped, not made again yet
            table = ice.load_table(catalog(iceberg_server), "icekept")
            if table is not None and table.metadata_location.removeprefix("file://") != path:
                break
        except ValueError:
            pass
        assert time.monotonic() < deadline, "the damaged table was never written again"
        time.sleep(0.1)
    table = wait_iceberg(iceberg_server, "icekept")
    first, end = ice.snapshot_offsets(table.current_snapshot())[0]
    assert first == p.first_offset
    assert by_offset(table.scan().to_arrow()).cast(rows.schema).to_pylist() == source_rows(
        iceberg_server, "icekept", first, end).to_pylist()


def test_an_archived_parquet_table_is_converted_on_start(tmp_path):
    """A Parquet-mirror table (manifest layout) that archived offsets the log dropped: the
    server started with the Iceberg format (the default) carries them over (the old files'
    rows) and writes the rest from the log; then the old folder is gone."""
    from .conftest import wait_table

    data = str(tmp_path / "data")
    old = ThreadServer(data, tables=TableConfig(lag_ms=300, archive=True, enabled=True,
                                                format="parquet")).start()
    try:
        with old.client() as c:
            c.create_stream("legacy", {"stream-max-segment-size-bytes": "8192",
                                       "max-length-bytes": "30000"})
        for start in range(0, 1500, 100):  # steps the writer keeps up with (test_table_writer)
            send(old, "legacy", varied(start, 100))
            m = wait_table(old, "legacy")
        log_first = partition_of(old, "legacy").first_offset
        assert log_first > 0 and m.first == 0
        table_dir = old.app.config.table_dir
    finally:
        old.stop()
    config = TableConfig(lag_ms=300, archive=True, enabled=True)  # Iceberg: the default
    assert config.format == "iceberg"
    server = ThreadServer(data, tables=config).start()
    try:
        assert_converted(server, table_dir)
    finally:
        server.stop()


def assert_converted(server: ThreadServer, table_dir: str) -> None:
    """The Iceberg table of the stream "legacy" on ``server`` holds every offset from 0:
    those older than the log's carried over from its old Parquet table under ``table_dir``
    (records of varied(0, ...)), the rest the log's rows; the old table's folder is
    removed."""
    from riverlog.tables import manifest as mf
    from riverlog.tables.storage import Storage

    table = wait_iceberg(server, "legacy", sealed=False)
    end = partition_of(server, "legacy").committed_offset + 1
    assert ice.snapshot_offsets(table.current_snapshot()) == {0: (0, end)}
    rows = by_offset(table.scan().to_arrow())
    assert rows.column("offset").to_pylist() == list(range(end))
    assert rows.column("value").to_pylist()[:3] == [b"raw0", b"v1", b"v2"]
    log_first = partition_of(server, "legacy").first_offset  # retention went on
    tail = rows.slice(log_first)
    assert tail.cast(tail.schema).to_pylist() == source_rows(
        server, "legacy", log_first, end).to_pylist()
    storage = Storage(table_dir)
    deadline = time.monotonic() + 60
    while storage.names(mf.partition_dir(storage.root, "legacy", 0)):
        assert time.monotonic() < deadline, "the old table folder was never removed"
        time.sleep(0.1)


COLUMNS = ["stream", "partition", "offset", "key", "value", "timestamp", "headers"]


def delivered(stream: str) -> float:
    """Records the server has sent to readers of ``stream`` (its metrics, in this process)."""
    from riverlog.metrics import REGISTRY
    return REGISTRY.get_sample_value("riverlog_delivered_messages_total", {
        "vhost": "/", "stream": stream, "door": "rabbitmq_stream"}) or 0


def test_the_server_names_the_catalog_and_the_source_reads_the_table(iceberg_server, spark):
    """Open names the Iceberg catalog, so read_table needs neither folder nor catalog; the
    source with option catalog (or tableDir, the folder of the embedded catalog) reads what
    the table holds from its data files and only the rest from the server: the same rows
    as the source without a table, in batch and streaming reads."""
    import asyncio

    import riverlog.spark
    from riverlog.tables.iceberg import catalog_uri

    app = iceberg_server.app
    uri = catalog_uri(app.config.table_dir, None)
    with iceberg_server.client() as c:
        assert c.table_catalog == uri
        c.create_stream("icesrc", SMALL_SEGMENTS)
    send(iceberg_server, "icesrc", varied(0, 600))
    wait_iceberg(iceberg_server, "icesrc")
    asyncio.run_coroutine_threadsafe(app.tables.stop(), iceberg_server.loop).result(60)
    try:
        send(iceberg_server, "icesrc", varied(600, 40))  # only in the log
        source = (spark.read.format("riverlog").option("servers", iceberg_server.servers)
                  .option("stream", "icesrc"))
        want = source.load().select(*COLUMNS).orderBy("offset").collect()
        assert [r.offset for r in want] == list(range(640))
        table = riverlog.spark.read_table(spark, "icesrc", servers=iceberg_server.servers)
        assert any(f.endswith(".parquet") for f in table.inputFiles())
        assert table.select(*COLUMNS).orderBy("offset").collect() == want
        for option, value in (("catalog", uri), ("tableDir", app.config.table_dir)):
            before = delivered("icesrc")
            got = source.option(option, value).load().select(*COLUMNS).orderBy("offset")
            assert got.collect() == want, option
            # the server sent the newest chunk (40 records) to the read and to planning
            assert delivered("icesrc") - before < 200, option
        before = delivered("icesrc")
        query = (spark.readStream.format("riverlog").option("servers", iceberg_server.servers)
                 .option("stream", "icesrc").option("startingOffsets", "earliest")
                 .option("catalog", uri).load().select(*COLUMNS).writeStream
                 .format("memory").queryName("icesrc_stream").trigger(availableNow=True)
                 .start())
        query.awaitTermination(120)
        got = spark.sql("select * from icesrc_stream order by offset").collect()
        assert got == want
        # each offset lookup of the planner gets the newest chunk (40 records): never the
        # 600 records of the history
        assert delivered("icesrc") - before < 600
    finally:
        iceberg_server.loop.call_soon_threadsafe(app.tables.start)


def test_a_super_stream_reads_as_one_table(iceberg_server, spark):
    """read_table on a super stream's name: its partition streams' tables (and each one's
    newest records from the log), unioned: the rows of reading each partition stream
    through the source; offsets are given per partition stream."""
    from riverlog.broker.stream import StreamConfig
    from riverlog.spark import read_table

    members = ["icesuper-0", "icesuper-1", "icesuper-2"]

    async def make():
        app.rabbitmq_stream.super_streams.create("icesuper", members, ["0", "1", "2"],
                                                 StreamConfig(table=True))
    import asyncio
    app = iceberg_server.app
    asyncio.run_coroutine_threadsafe(make(), iceberg_server.loop).result(30)
    for i, member in enumerate(members):
        send(iceberg_server, member, varied(i * 1000, 200 + 50 * i))
    for member in members:
        wait_iceberg(iceberg_server, member, sealed=False)
    table = read_table(spark, "icesuper", servers=iceberg_server.servers)
    assert any(f.endswith(".parquet") for f in table.inputFiles())
    got = table.select(*COLUMNS).orderBy("stream", "offset").collect()
    want = []
    for member in members:
        want += (spark.read.format("riverlog").option("servers", iceberg_server.servers)
                 .option("stream", member).load().select(*COLUMNS).orderBy("offset")
                 .collect())
    assert len(got) == 200 + 250 + 300
    assert got == want
    later = read_table(spark, "icesuper", servers=iceberg_server.servers,
                       startingOffsets=json.dumps({"icesuper-1": {"0": 100}}))
    assert later.count() == 200 + 150 + 300  # offsets per partition stream (refused before)


def test_a_deleted_streams_table_is_dropped_and_a_new_one_made(iceberg_server):
    """Deleting a table-enabled stream drops its table (the drop names the table's creation
    time); a stream made again under the name gets a table of its own."""
    with iceberg_server.client() as c:
        c.create_stream("icegone", SMALL_SEGMENTS)
    send(iceberg_server, "icegone", varied(0, 100))
    old = wait_iceberg(iceberg_server, "icegone", sealed=False)
    created = old.properties[ice.CREATED_PROPERTY]
    with iceberg_server.client() as c:
        c.delete_stream("icegone")
    deadline = time.monotonic() + 60
    while ice.load_table(catalog(iceberg_server), "icegone") is not None:
        assert time.monotonic() < deadline, "the deleted stream's table is still there"
        time.sleep(0.1)
    with iceberg_server.client() as c:
        c.create_stream("icegone", SMALL_SEGMENTS)
    send(iceberg_server, "icegone", varied(0, 10))
    new = wait_iceberg(iceberg_server, "icegone", sealed=False)
    assert new.properties[ice.CREATED_PROPERTY] != created
    assert ice.snapshot_offsets(new.current_snapshot()) == {0: (0, 10)}


def test_open_names_the_catalog_only_to_a_client_that_asks(iceberg_server):
    """RabbitMQ answers Open with advertised_host and advertised_port only, and the Go stream
    client reads no value for a key it does not know (its connections broke when riverlog
    added the catalog for every client): a client that did not name riverlog_table_catalog
    in its PeerProperties gets exactly RabbitMQ's two."""
    import asyncio

    from compat._raw import RawPeer

    async def open_properties():
        peer = await RawPeer.open("127.0.0.1", iceberg_server.port)
        try:
            return peer.open_properties
        finally:
            peer.close()
    got = asyncio.run(open_properties())
    assert sorted(got) == ["advertised_host", "advertised_port"]
    with iceberg_server.client() as c:  # riverlog's client asks
        assert c.table_catalog is not None
