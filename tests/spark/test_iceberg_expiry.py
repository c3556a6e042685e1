# Snapshot expiry of a stream's Iceberg table (streams.table.snapshot.expiry) against a real
# server with its real table worker process and a real pyiceberg SQL catalog on SQLite: the
# files the expired snapshots alone referenced (manifest lists, manifests, data files) are
# deleted, the table still reads the same rows and is written on; and (riverlog.tables.
# iceberg_expiry with two pyiceberg writers of one table) another writer's commit in flight
# keeps its files and lands.
from __future__ import annotations

import os
import time

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")
pytest.importorskip("pyiceberg")

from riverlog.config import TableConfig  # noqa: E402
from riverlog.tables import iceberg as ice  # noqa: E402
from riverlog.tables import iceberg_expiry as expiry  # noqa: E402
from riverlog.tables.storage import Storage  # noqa: E402

from ._server import ThreadServer  # noqa: E402
from .conftest import catalog, send, varied, wait_iceberg  # noqa: E402
from .test_iceberg_table import SMALL_SEGMENTS, by_offset, written_on  # noqa: E402


def referenced(table) -> set[str]:
    """The manifest lists and manifests (paths) the snapshots of ``table`` reference, as
    pyiceberg lists them."""
    out = set()
    for snapshot in table.snapshots():
        out.add(ice.fs_path(snapshot.manifest_list))
        out |= {ice.fs_path(m.manifest_path) for m in snapshot.manifests(table.io)}
    return out


def avro_files(table) -> set[str]:
    folder = ice.fs_path(table.location().rstrip("/") + "/metadata")
    return {os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".avro")}


def data_files(table) -> set[str]:
    folder = ice.fs_path(table.location().rstrip("/") + "/data")
    return {os.path.join(d, n) for d, _, names in os.walk(folder) for n in names}


def listed(table) -> set[str]:
    return {ice.fs_path(e.data_file.file_path) for s in table.snapshots()
            for m in s.manifests(table.io) for e in m.fetch_manifest_entry(table.io)}


def test_expired_snapshots_leave_only_the_files_the_remaining_ones_reference(tmp_path):
    """A table of many passes (appends, and overwrites as sealed segments replace their
    pieces) then a server whose expiry is 0: every snapshot but the current one expires and
    the metadata folder's manifest lists and manifests are exactly those the current
    snapshot references (before, the expired snapshots' stayed forever), the data folder's
    files exactly those it lists; the table reads the same rows and is written on."""
    data = str(tmp_path / "data")
    server = ThreadServer(data, tables=TableConfig(lag_ms=300, format="iceberg")).start()
    try:
        with server.client() as c:
            c.create_stream("exp", SMALL_SEGMENTS)
        for i in range(6):
            send(server, "exp", varied(i * 100, 100))
            table = wait_iceberg(server, "exp")
    finally:
        server.stop()
    assert len(table.snapshots()) >= 6
    assert avro_files(table) == referenced(table)  # nothing expired yet: all referenced
    current = table.current_snapshot()
    kept = {ice.fs_path(current.manifest_list)} | {
        ice.fs_path(m.manifest_path) for m in current.manifests(table.io)}
    assert avro_files(table) - kept, "no snapshot-only manifest to delete: a weak test"
    rows = by_offset(table.scan().to_arrow())

    server = ThreadServer(data, tables=TableConfig(lag_ms=300, format="iceberg",
                                                   expiry_ms=0)).start()
    try:
        deadline = time.monotonic() + 60
        while True:
            table = ice.load_table(catalog(server), "exp")
            if len(table.snapshots()) == 1 and avro_files(table) == referenced(table):
                break
            assert time.monotonic() < deadline, (
                f"{len(table.snapshots())} snapshots; files no snapshot references: "
                f"{sorted(avro_files(table) - referenced(table))}")
            time.sleep(0.1)
        assert table.current_snapshot().snapshot_id == current.snapshot_id
        assert avro_files(table) == kept
        assert data_files(table) == listed(table)
        assert by_offset(table.scan().to_arrow()).equals(rows)
        written_on(server, "exp", 600, 100)
    finally:
        server.stop()


def test_another_writers_commit_in_flight_keeps_its_files(tmp_path):
    """Two writers of one table (as a cluster's leaders): one overwrites the table several
    times and expires the old snapshots while the other has a commit in flight (its data
    file, manifest and manifest list written, referenced by no snapshot yet). The expiry
    deletes only what the expired snapshots referenced; the commit in flight lands and
    every file a snapshot references exists."""
    directory = str(tmp_path)
    schema = pa.schema([pa.field("x", pa.int64())])
    cat = ice.load_catalog(directory)
    cat.create_namespace_if_not_exists("riverlog")
    mine = cat.create_table(("riverlog", "t"), schema=schema)
    mine.append(pa.table({"x": [0, 100]}, schema=schema))
    for i in range(1, 5):
        mine.overwrite(pa.table({"x": [i, i + 100]}, schema=schema))
    theirs = ice.load_catalog(directory).load_table(("riverlog", "t"))
    in_flight = theirs.transaction()
    in_flight.append(pa.table({"x": [-1]}, schema=schema))  # its files are written now
    unreferenced = avro_files(mine.refresh()) - referenced(mine)
    assert unreferenced, "the commit in flight wrote no manifest yet: a weak test"

    mine = expiry.expire(mine, time.time_ns() // 1_000_000, expiry.Listings(),
                         Storage(directory), "t")
    assert len(mine.snapshots()) == 1
    assert unreferenced <= avro_files(mine)  # the commit in flight's are kept
    in_flight.commit_transaction()
    table = theirs.refresh()
    assert sorted(table.scan().to_arrow()["x"].to_pylist()) == [-1, 4, 104]
    assert avro_files(table) == referenced(table)
    assert listed(table) <= data_files(table)
