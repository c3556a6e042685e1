# riverlog.tables.iceberg.transaction: a pyiceberg transaction whose staged metadata is built
# once per change (pyiceberg's deep-copies the whole metadata on every read), against a real
# SQL catalog on SQLite: what it reads is what pyiceberg's own transaction reads, after a
# staged update and after another writer's commit and a refresh, and its commit lands both.
# And a table riverlog creates deletes its old metadata files at commits; a table another
# writer creates meanwhile is taken.
from __future__ import annotations

import os

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")
pytest.importorskip("pyiceberg")

from riverlog.tables import iceberg as ice  # noqa: E402


def test_the_staged_metadata_is_built_once_per_change(tmp_path):
    catalog = ice.load_catalog(str(tmp_path))
    table = ice.create_table(catalog, str(tmp_path), "s", 1)
    tx = ice.transaction(table)
    assert tx.table_metadata is table.metadata  # nothing staged: the table's own
    tx.set_properties(mine="1")
    staged = tx.table_metadata
    assert staged.properties["mine"] == "1"
    assert tx.table_metadata is staged  # read again: not built again
    theirs = table.transaction().set_properties(mine="1").table_metadata  # pyiceberg's
    assert staged.model_dump(exclude={"last_updated_ms"}) == theirs.model_dump(
        exclude={"last_updated_ms"})
    # another writer commits; a refresh (as a commit retry does) builds it again on top
    other = catalog.load_table(ice.identifier("s"))
    other.transaction().set_properties(theirs="2").commit_transaction()
    table.refresh()
    assert {k: tx.table_metadata.properties.get(k) for k in ("mine", "theirs")} == {
        "mine": "1", "theirs": "2"}
    tx.commit_transaction()
    assert {k: catalog.load_table(ice.identifier("s")).properties.get(k)
            for k in ("mine", "theirs")} == {"mine": "1", "theirs": "2"}



def test_old_metadata_files_are_deleted_at_commits(tmp_path):
    """A table riverlog creates keeps Iceberg's write.metadata.previous-versions-max metadata
    files (a commit per pass writes one, as large as all the snapshots kept), not all."""
    catalog = ice.load_catalog(str(tmp_path))
    table = ice.create_table(catalog, str(tmp_path), "s", 1)
    table = table.transaction().set_properties(
        {"write.metadata.previous-versions-max": "2"}).commit_transaction()
    for i in range(5):
        table = ice.transaction(table).set_properties(n=str(i)).commit_transaction()
    folder = table.location()[len("file://"):] + "/metadata"
    kept = [n for n in os.listdir(folder) if n.endswith(".metadata.json")]
    assert len(kept) == 3, kept  # the current one and two before it


def test_a_table_another_writer_creates_meanwhile_is_taken(tmp_path):
    """Two servers' writers create a stream's table at once (a cluster's partition leaders
    at their first pass): the other one's commit lands between this one staging its
    creation and committing it. This one takes the other's table (before, the SQL catalog's
    refusal, CommitFailedException 'Table already exists', failed its pass)."""
    from pyiceberg.catalog.sql import SqlCatalog

    directory = str(tmp_path)
    other = ice.load_catalog(directory)

    class Racing(SqlCatalog):  # the real catalog; the other writer commits first
        def create_table_transaction(self, *args, **kwargs):
            tx = super().create_table_transaction(*args, **kwargs)
            ice.create_table(other, directory, "s", 7)
            return tx

    mine = ice.load_catalog(directory)
    racing = Racing(ice.NAMESPACE, **mine.properties)
    table = ice.create_table(racing, directory, "s", 7)
    assert table.properties[ice.CREATED_PROPERTY] == "7"
    assert table.metadata.table_uuid == other.load_table(ice.identifier("s")).metadata.table_uuid
