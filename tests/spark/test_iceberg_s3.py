# Streams as Apache Iceberg tables on object storage (issue 23: "object storage through
# pyarrow filesystems"): the table folder is an s3:// URI of a bucket an S3 endpoint serves
# in this process (moto, the real S3 protocol: conftest's s3_tables), the catalog a SQLite
# file on local disk. The writer puts data files, manifests and metadata in the bucket with
# the URI's credentials, endpoint and region as pyiceberg FileIO properties; nothing it
# persists holds the secret; pyiceberg's scan, pandas and DuckDB read it; leftovers of a
# crash before a commit and the files expired snapshots freed are deleted from the bucket;
# the riverlog source reads the table's files through the URI's credentials.
from __future__ import annotations

import dataclasses
import json
import time

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyiceberg")
pytest.importorskip("moto")

from riverlog.config import TableConfig  # noqa: E402
from riverlog.tables import iceberg as ice  # noqa: E402
from riverlog.tables.storage import Storage  # noqa: E402

from ._server import ThreadServer  # noqa: E402
from .conftest import catalog, reader, send, varied, wait_iceberg  # noqa: E402
from .test_iceberg_table import by_offset, delivered, source_rows  # noqa: E402

KEY, SECRET = "riverlog-key", "S3cr3t-of-riverlog-7"
"""The bucket's credentials in the table folder URI (moto takes any)."""


def s3_config(tmp_path, s3_tables, **changes) -> TableConfig:
    """Iceberg tables in ``<bucket>/<test>/tables`` with the catalog a SQLite file on local
    disk (the embedded one cannot live in a bucket)."""
    return TableConfig(lag_ms=300, enabled=True,
                       directory=s3_tables(f"{tmp_path.name}/tables", KEY, SECRET),
                       catalog="sqlite:///" + str(tmp_path / "catalog" / "catalog.db"),
                       **changes)


def s3_server(tmp_path, s3_tables, stream: str, segment_bytes: int):
    """``(config, server)``: a started server with s3_config's tables and ``stream`` made
    with a table and segments of ``segment_bytes``."""
    config = s3_config(tmp_path, s3_tables)
    server = ThreadServer(str(tmp_path / "data"), tables=config).start()
    with server.client() as c:
        c.create_stream(stream, {"x-riverlog-table": "true",
                                 "stream-max-segment-size-bytes": str(segment_bytes)})
        assert c.table_catalog == config.catalog  # no secret in it
    return config, server


def paths(storage: Storage, table) -> list[str]:
    """The objects of ``table``'s folder in the bucket (pyarrow.fs paths)."""
    from pyarrow import fs
    folder = table.location().removeprefix("s3://")
    infos = storage.fs.get_file_info(fs.FileSelector(folder, recursive=True,
                                                     allow_not_found=True))
    return [i.path for i in infos if i.type == fs.FileType.File]


def objects(storage: Storage, table) -> dict[str, bytes]:
    """Every object of ``table``'s folder in the bucket: pyarrow.fs path -> content (while
    no writer deletes any)."""
    return {path: storage.read_bytes(path) for path in paths(storage, table)}


def data_paths(paths) -> set[str]:
    return {p for p in paths if "/data/" in p and p.endswith(".parquet")}


def listed(table, current_only: bool = False) -> set[str]:
    """The data files (pyarrow.fs paths) the current snapshot, or any snapshot, lists."""
    snapshots = [table.current_snapshot()] if current_only else table.snapshots()
    return {e.data_file.file_path.removeprefix("s3://")
            for s in snapshots for m in s.manifests(table.io)
            for e in m.fetch_manifest_entry(table.io)}


def test_the_writer_keeps_the_iceberg_table_in_a_bucket(tmp_path, s3_tables, capfd):
    """The writer commits to a table whose files are all in the bucket under the folder's
    prefix; pyiceberg's scan, pandas and DuckDB read the source's rows; the secret is in no
    metadata, manifest or property, not in the catalog and not in the server's or the
    worker's logs. A crash's leftovers (data files no snapshot lists) and the files that
    expired snapshots freed (streams.table.snapshot.expiry) are deleted from the bucket on
    the next start's first pass; a deleted stream's table is dropped and its files deleted
    from the bucket."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    config, server = s3_server(tmp_path, s3_tables, "ons3", 8192)
    try:
        for start in range(0, 900, 300):  # passes apart: sealed segments replace pieces
            send(server, "ons3", varied(start, 300), batch=20)
            wait_iceberg(server, "ons3", sealed=False)
        table = wait_iceberg(server, "ons3")
        expected = source_rows(server, "ons3", 0, 900)
    finally:
        server.stop()
    prefix = f"riverlog-tables/{tmp_path.name}/tables/riverlog/"
    assert table.location().startswith("s3://" + prefix)
    assert table.metadata_location.startswith("s3://" + prefix)
    assert ice.snapshot_offsets(table.current_snapshot()) == {0: (0, 900)}
    scanned = by_offset(table.scan().to_arrow())
    assert scanned.cast(expected.schema).to_pylist() == expected.to_pylist()
    frame = table.scan().to_pandas().sort_values("offset")
    assert frame["value"].tolist() == expected.column("value").to_pylist()
    duckdb = pytest.importorskip("duckdb")
    arrow_scan = table.scan().to_arrow()
    assert arrow_scan.num_rows == 900
    got = duckdb.sql('select "offset", value from arrow_scan order by "offset"').arrow()
    assert got.read_all().equals(expected.select(["offset", "value"]))
    # every file in the bucket: metadata JSON, manifest lists, manifests, data files
    storage = Storage(config.directory)
    files = objects(storage, table)
    assert any(p.endswith(".metadata.json") for p in files)
    assert any(p.endswith(".avro") for p in files)
    assert listed(table, current_only=True) <= data_paths(files)
    assert not any(SECRET.encode() in content or KEY.encode() in content
                   for content in files.values())
    assert not any(k.startswith("s3.") for k in table.properties)
    with open(tmp_path / "catalog" / "catalog.db", "rb") as f:
        assert SECRET.encode() not in f.read()
    assert not (tmp_path / "data" / "tables").exists()  # nothing on the local disk
    # a crash between writing files and committing, and snapshots that expire: files an
    # older snapshot lists, the current one not (replaced pieces), stay until expiry
    freed = listed(table) - listed(table, current_only=True)
    assert freed and freed <= data_paths(files)
    orphans = {f.file_path.removeprefix("s3://") for f in _dataframe_to_data_files(
        table_metadata=table.metadata, df=scanned.slice(0, 50), io=table.io)}
    assert orphans <= data_paths(paths(storage, table))
    server = ThreadServer(str(tmp_path / "data"),
                          tables=dataclasses.replace(config, expiry_ms=0)).start()
    try:
        deadline = time.monotonic() + 60
        while (left := data_paths(paths(storage, table)) & (orphans | freed)):
            assert time.monotonic() < deadline, f"never deleted from the bucket: {left}"
            time.sleep(0.2)
        table = ice.load_table(catalog(server), "ons3")
        assert data_paths(paths(storage, table)) == listed(table, current_only=True)
        send(server, "ons3", varied(900, 30))
        table = wait_iceberg(server, "ons3", sealed=False)
        assert by_offset(table.scan().to_arrow()).cast(expected.schema).to_pylist() == \
            source_rows(server, "ons3", 0, 930).to_pylist()
        # the stream deleted: its table dropped and its folder emptied in the bucket
        with server.client() as c:
            c.delete_stream("ons3")
        deadline = time.monotonic() + 60
        while (left := paths(storage, table)) or ice.load_table(catalog(server), "ons3"):
            assert time.monotonic() < deadline, f"the dropped table left {sorted(left)}"
            time.sleep(0.2)
    finally:
        server.stop()
    logged = capfd.readouterr()
    assert SECRET not in logged.out + logged.err


def test_the_source_reads_an_iceberg_table_in_a_bucket(tmp_path, s3_tables, spark):
    """The source's options catalog and tableDir (the s3:// URI with its credentials):
    Spark's Python tasks read the snapshot's data files from the bucket through pyarrow.fs
    (the server sends none of the records the table holds) and the rows are the source's
    without a table. read_table's driver finds the same files (checked in the bucket) and
    hands Spark their s3a:// URIs without the credentials (Spark's hadoop-aws, not installed
    here, would read them)."""
    from riverlog.tables.iceberg import TableSnapshot
    from riverlog.tables.storage import spark_uri

    def rows(df):
        return sorted(df.collect(), key=lambda r: r.offset)

    config, server = s3_server(tmp_path, s3_tables, "reads3", 16384)
    try:
        send(server, "reads3", varied(0, 800))
        send(server, "reads3", varied(800, 1))  # the newest chunk, which offset lookups read
        wait_iceberg(server, "reads3")
        ending = json.dumps({"reads3": {"0": 801}})
        before = delivered("reads3")
        got = rows(reader(spark, server.servers, "reads3", catalog=config.catalog,
                          tableDir=config.directory, endingOffsets=ending).load())
        assert delivered("reads3") - before < 100  # only the planner's offset lookups
        want = rows(reader(spark, server.servers, "reads3", endingOffsets=ending).load())
        assert len(got) == 801 and got == want
        # read_table's driver: what the snapshot holds, each file checked in the bucket
        # through the folder's credentials, handed to Spark by its s3a:// URI
        lo, hi, files = TableSnapshot(config.directory, config.catalog, "reads3").held(
            0, 0, 801)
        assert (lo, hi) == (0, 801) and files
        uris = [spark_uri(location, "")[:-1] for location, _, _ in files]
        assert all(u.startswith(f"s3a://riverlog-tables/{tmp_path.name}/tables/riverlog/")
                   and SECRET not in u for u in uris)
    finally:
        server.stop()


def test_an_archived_parquet_table_in_a_bucket_is_converted(tmp_path, s3_tables):
    """A Parquet-mirror table in the bucket that archived offsets the log dropped: the server
    started with Iceberg tables on the same folder (and a catalog) carries them over from
    the old files in the bucket, writes the rest from the log, then removes the old folder
    from the bucket."""
    from .conftest import partition_of, wait_table
    from .test_iceberg_table import assert_converted

    config = s3_config(tmp_path, s3_tables, archive=True)
    data = str(tmp_path / "data")
    old = ThreadServer(data, tables=dataclasses.replace(config, format="parquet")).start()
    try:
        with old.client() as c:
            c.create_stream("legacy", {"stream-max-segment-size-bytes": "8192",
                                       "max-length-bytes": "20000"})
        start = 0
        while partition_of(old, "legacy").first_offset == 0:  # until retention dropped some
            assert start < 3000, "retention never removed a segment"
            send(old, "legacy", varied(start, 100))
            m = wait_table(old, "legacy")
            start += 100
        assert m.first == 0
    finally:
        old.stop()
    server = ThreadServer(data, tables=config).start()
    try:
        assert_converted(server, config.directory)
    finally:
        server.stop()
