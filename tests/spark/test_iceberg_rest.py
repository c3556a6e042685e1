# Streams as Apache Iceberg tables in a REST catalog (streams.table.catalog http://...):
# a real server (the App with its real table worker process) whose catalog is Apache
# Iceberg's own REST catalog server (RESTCatalogServer from Maven Central, the server of the
# iceberg-rest-fixture image: tests/spark/_rest_catalog.py) on a free loopback port. The
# stream's table is created and committed through REST (no embedded catalog is made), the
# server names the REST URI to clients, pyiceberg's scan through a catalog client of its
# own returns exactly the stream's records, and read_table through REST gives the source's
# rows.
from __future__ import annotations

import asyncio
import os

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")
pytest.importorskip("pyiceberg")

from riverlog.config import TableConfig  # noqa: E402
from riverlog.tables import iceberg as ice  # noqa: E402

from ._server import ThreadServer  # noqa: E402
from .conftest import partition_of, send, varied, wait_iceberg  # noqa: E402
from .test_iceberg_table import COLUMNS, SMALL_SEGMENTS, by_offset, source_rows  # noqa: E402


def test_a_rest_catalog_holds_the_table_and_read_table_reads_it(tmp_path, rest_catalog, spark):
    """The REST catalog gets the stream's table (created, then one snapshot per pass,
    each summary saying the offsets it holds); a pyiceberg RestCatalog of the test's own
    scans the stream's records; read_table with catalog= the REST URI, and with the
    catalog the server names, gives what the source reads (the table's files and, with the
    table writer stopped, the newest records from the log)."""
    import riverlog.spark
    from pyiceberg.catalog.rest import RestCatalog

    server = ThreadServer(str(tmp_path / "data"), tables=TableConfig(
        lag_ms=300, format="iceberg", catalog=rest_catalog)).start()
    try:
        with server.client() as c:
            assert c.table_catalog == rest_catalog  # named to clients as it is
            c.create_stream("rest", SMALL_SEGMENTS)
        for start in range(0, 600, 200):  # separate chunks, sealed segments
            send(server, "rest", varied(start, 200), batch=20)
        wait_iceberg(server, "rest")
        end = partition_of(server, "rest").committed_offset + 1
        assert end == 600
        table_dir = server.app.config.table_dir
        assert not os.path.exists(os.path.join(table_dir, ice.CATALOG_FILE))  # REST only
        table = RestCatalog("check", uri=rest_catalog).load_table(ice.identifier("rest"))
        assert table.metadata.format_version == 2
        assert table.location() == f"file://{table_dir}/riverlog/rest"
        # the catalog wrote the metadata file there (Hadoop's form of the URI: file:/...)
        assert table.metadata_location.startswith(f"file:{table_dir}/riverlog/rest/metadata/")
        assert ice.snapshot_offsets(table.current_snapshot()) == {0: (0, end)}
        expected = source_rows(server, "rest", 0, end)
        assert by_offset(table.scan().to_arrow()).cast(expected.schema).equals(expected)

        app = server.app
        asyncio.run_coroutine_threadsafe(app.tables.stop(), server.loop).result(60)
        try:
            send(server, "rest", varied(600, 40))  # only in the log
            want = (spark.read.format("riverlog").option("servers", server.servers)
                    .option("stream", "rest").load().select(*COLUMNS).orderBy("offset")
                    .collect())
            assert [r.offset for r in want] == list(range(640))
            for catalog in (rest_catalog, None):  # given, and the one the server names
                got = riverlog.spark.read_table(spark, "rest", catalog=catalog,
                                                servers=server.servers)
                assert any(f.endswith(".parquet") for f in got.inputFiles())  # the table's
                assert got.select(*COLUMNS).orderBy("offset").collect() == want
            got = (spark.read.format("riverlog").option("servers", server.servers)
                   .option("stream", "rest").option("catalog", rest_catalog).load())
            assert got.select(*COLUMNS).orderBy("offset").collect() == want
        finally:
            server.loop.call_soon_threadsafe(app.tables.start)
    finally:
        server.stop()
