# A table folder URI as pyiceberg takes it (riverlog.tables.iceberg_io): the warehouse without
# credentials or options, an s3:// URI's credentials, endpoint and region as FileIO
# properties, and what pyiceberg cannot be told refused, at start (riverlog.config).
from __future__ import annotations

import os

import pytest

from riverlog.config import TableConfig
from riverlog.tables.iceberg_io import io_properties, warehouse


def test_an_s3_table_folder_becomes_a_warehouse_and_fileio_properties():
    uri = ("s3://AKIA:se%2Fcret@bucket/p/tables/?region=eu-west-1&endpoint_override="
           "minio:9000&scheme=http&allow_bucket_creation=true")
    assert warehouse(uri) == "s3://bucket/p/tables"
    assert io_properties(uri) == {
        "s3.access-key-id": "AKIA", "s3.secret-access-key": "se/cret",
        "s3.region": "eu-west-1", "s3.endpoint": "http://minio:9000"}
    assert io_properties("s3://bucket/t?endpoint_override=s3.example:443") == {
        "s3.endpoint": "https://s3.example:443"}
    assert io_properties("s3://bucket/t") == {}  # credentials from the environment
    assert io_properties("/data/tables") == io_properties("file:///data/tables") == {}
    assert warehouse("rel/tables") == "file://" + os.path.abspath("rel/tables")
    assert warehouse("hdfs://namenode:8020/t") == "hdfs://namenode:8020/t"
    assert io_properties("abfs://box@account.dfs.core.windows.net/t") == {}
    assert warehouse("abfs://box@account.dfs.core.windows.net/t") == \
        "abfs://box@account.dfs.core.windows.net/t"


@pytest.mark.parametrize("uri, problem", [
    ("s3://bucket/t?tls_ca_file_path=/ca.pem", "no property for the option.*tls_ca_file_path"),
    ("s3://bucket/t?scheme=http", "scheme= without endpoint_override="),
    ("gs://key:secret@bucket/t", "only in s3:// URIs"),
    ("abfs://box@account.dfs.core.windows.net/t?x=1", "only in s3:// URIs"),
])
def test_what_pyiceberg_cannot_be_told_is_refused_at_start(uri, problem):
    with pytest.raises(ValueError, match=problem) as caught:
        TableConfig(directory=uri, catalog="sqlite:////var/lib/riverlog/catalog.db")
    assert "secret" not in str(caught.value)
    TableConfig(directory=uri, format="parquet")  # pyarrow's own options: fine for Parquet


def test_object_storage_needs_a_catalog_off_the_bucket():
    with pytest.raises(ValueError, match="the embedded SQLite catalog cannot live in a "
                                         "bucket") as caught:
        TableConfig(directory="s3://key:s3cr3t@bucket/t?region=x")
    assert "s3cr3t" not in str(caught.value) and "s3://bucket/t" in str(caught.value)
    config = TableConfig(directory="s3://key:s3cr3t@bucket/t?region=x",
                         catalog="sqlite:////var/lib/riverlog/catalog.db")
    assert config.catalog.startswith("sqlite:")
