# Streams as Apache Iceberg tables in a cluster (issue 23, "Bad input and faults"): three real
# Apps of one cluster (_apps.py), each with its real table worker process, sharing one
# catalog (SQLite in a shared table folder, as `riverlog cluster up` makes it, or a real
# PostgreSQL server, _postgres.py). Each partition's leader writes that partition's files and
# commits to the stream's one table; concurrent commits succeed through Iceberg's optimistic
# concurrency (riverlog.tables.iceberg_commit retries on conflict, summary merged); a former
# leader never commits for its partition after the new leader did (leader epochs in the
# snapshot summary); a writer's orphan cleanup leaves other writers' files in flight alone.
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")
pytest.importorskip("pyiceberg")

from _apps import created, started, stopped, until  # noqa: E402
from _postgres import missing, postgres  # noqa: E402
from riverlog.config import TableConfig  # noqa: E402
from riverlog.tables import iceberg as ice  # noqa: E402

CONFLICT = "another writer committed first"
"""What a table worker logs when it commits again after a conflict (iceberg_commit)."""


def tables(tmp_path, catalog: str | None = None, lag_ms: int = 300,
           directory: str | None = None) -> TableConfig:
    """Every member's TableConfig: Iceberg, one table folder for all (``directory``, else
    ``tmp_path/tables``; its SQLite catalog the shared one unless ``catalog``), a short lag
    (``lag_ms``)."""
    return TableConfig(lag_ms=lag_ms, format="iceberg", catalog=catalog,
                       directory=directory or str(tmp_path / "tables"))


@contextlib.contextmanager
def catalog_of(kind: str, tmp_path, request):
    """The catalog URL of ``kind``: the shared table folder's SQLite (None), a SQLite file
    on local disk beside a table folder in a bucket ("s3"), a PostgreSQL server's."""
    if kind in ("sqlite", "s3"):
        yield None if kind == "sqlite" else f"sqlite:///{tmp_path}/catalog.db"
        return
    if missing():
        pytest.skip(missing())
    with postgres() as url:
        yield url


def leader_of(apps, stream: str, index: int):
    leader = apps[0].broker.placement.of(stream, index).leader
    return next(a for a in apps if a.config.cluster.server_id == leader)


async def publish(app, stream: str, index: int, start: int, n: int) -> None:
    """Records ``start .. start + n - 1`` (values ``p<index>-<number>``) on ``app``, the
    partition's leader; return once committed (replicated to the ISR)."""
    part = app.broker.streams[stream].partitions[index]
    last = part.write_records([b"p%d-%06d" % (index, k) for k in range(start, start + n)])[-1]
    await asyncio.wait_for(part.wait_committed(last), 60)


def load(config: TableConfig, stream: str):
    return ice.load_table(ice.load_catalog(config.directory, config.catalog), stream)


async def table_holding(config: TableConfig, stream: str, offsets: dict, epochs: dict):
    """The table once its current snapshot holds ``offsets`` (partition -> [first, end))
    written under ``epochs`` (partition -> leader epoch)."""
    async def check():
        table = await asyncio.to_thread(load, config, stream)
        snap = table.current_snapshot() if table is not None else None
        if ice.snapshot_offsets(snap) == offsets and ice.snapshot_epochs(snap) == epochs:
            return table
    return await until(f"the table of {stream} holding {offsets} under {epochs}", check)


def assert_exactly_once(table, counts: dict) -> None:
    """Every partition's records ``0 .. counts[p] - 1`` are in the table exactly once."""
    rows = table.scan().to_arrow()
    for p, n in counts.items():
        mine = rows.filter(pa.compute.equal(rows["partition"], p)).sort_by("offset")
        assert mine["offset"].to_pylist() == list(range(n)), f"partition {p}"
        assert mine["value"].to_pylist() == [b"p%d-%06d" % (p, k) for k in range(n)]


def run_worker(request: dict) -> dict:
    """One request to a new table worker process (``python -m riverlog.tables.writer``, as
    the server starts it); its reply."""
    done = subprocess.run([sys.executable, "-m", "riverlog.tables.writer"],
                          input=json.dumps(request) + "\n", capture_output=True, text=True,
                          timeout=180, check=True)
    return json.loads(done.stdout)


def request_of(app, stream: str, index: int, leader_epoch: int) -> dict:
    """The worker request ``app``'s table service makes for partition ``index`` of
    ``stream`` when it leads it under ``leader_epoch``."""
    config, p = app.config.tables, app.broker.streams[stream].partitions[index]
    return {"table_dir": app.config.table_dir, "archive": config.archive,
            "compression": config.compression, "format": config.format,
            "catalog": config.catalog, "expiry_ms": config.expiry_ms, "drop": [],
            "partitions": [{
                "stream": stream, "partition": index,
                "created_ns": app.broker.placement.created_ns(stream),
                "log_dir": p.log.directory,
                "segments": [(s.base_offset, s.next_offset) for s in p.log.segments],
                "first": p.first_offset, "committed": p.committed_offset,
                "leader_epoch": leader_epoch}]}


async def committing_nothing(config: TableConfig, stream: str, request: dict) -> dict:
    """Run ``request`` in a new table worker and check ``stream``'s table has the same
    current snapshot after it; the worker's status of the request's first partition."""
    before = (await asyncio.to_thread(load, config, stream)).current_snapshot()
    reply = await asyncio.to_thread(run_worker, request)
    after = (await asyncio.to_thread(load, config, stream)).current_snapshot()
    assert after.snapshot_id == before.snapshot_id
    return reply["statuses"][0]


@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "s3"])
async def test_partition_leaders_commit_to_one_table_concurrently(tmp_path, capfd, request,
                                                                  kind):
    """A 3-partition stream, each partition led by another server: the three table workers
    commit to the one table at once; their conflicts are retried on the new snapshot (the
    summary keeps every partition's offsets), so each partition's records are in the table
    exactly once and each leader reports its partition's table, the followers none. With
    each catalog, and with the table folder in an S3 bucket (moto; the catalog a SQLite file on local disk)."""
    directory = (request.getfixturevalue("s3_tables")(f"{tmp_path.name}/tables")
                 if kind == "s3" else None)
    with catalog_of(kind, tmp_path, request) as url:
        # a pass every 50 ms: conflicts soon
        config = tables(tmp_path, url, lag_ms=150, directory=directory)
        apps = await started(tmp_path, tables=config)
        try:
            await created(apps, "events", partitions=3, replication_factor=3, table=True)
            leaders = [leader_of(apps, "events", i) for i in range(3)]
            assert len({a.config.cluster.server_id for a in leaders}) == 3
            sent, seen, rounds = 0, "", 0
            deadline = time.monotonic() + 120
            while rounds < 10 or CONFLICT not in seen:  # until a conflict was retried
                assert time.monotonic() < deadline, "the leaders' commits never conflicted"
                await asyncio.gather(*(publish(app, "events", i, sent, 20)
                                       for i, app in enumerate(leaders)))
                sent += 20
                rounds += 1
                seen += capfd.readouterr().err
            table = await table_holding(config, "events", {i: (0, sent) for i in range(3)},
                                        {0: 1, 1: 1, 2: 1})
            await asyncio.to_thread(assert_exactly_once, table, {i: sent for i in range(3)})
            # a leader's status is its worker's last reply: a pass refused by a conflict
            # reports it until the next pass's reply, which may come after the table holds
            # everything (that pass committed nothing new)
            deadline = time.monotonic() + 60
            while any(leader.tables.status[("events", i)].error is not None
                      for i, leader in enumerate(leaders)):
                assert time.monotonic() < deadline, [
                    leader.tables.status[("events", i)].error for i, leader in enumerate(leaders)]
                await asyncio.sleep(0.1)
            for i, leader in enumerate(leaders):
                for other in apps:
                    if other is not leader:
                        assert ("events", i) not in other.tables.status
                        stream = other.broker.streams["events"]
                        assert other.tables.lag(stream, i) == (0, 0.0)  # the leader's to say
        finally:
            await stopped(apps)


async def test_a_former_leader_never_commits_after_the_new_leader(tmp_path):
    """Leadership of a partition moves (epoch 1 -> 2): the new leader claims the partition in
    the table; the former leader's server stops asking its worker about it, and a worker
    still holding the former leader's request (its records newer than the table) is refused:
    no snapshot is committed under the old epoch once the new one is in the table."""
    config = tables(tmp_path)
    apps = await started(tmp_path, tables=config)
    try:
        await created(apps, "moving", partitions=1, replication_factor=3, table=True)
        old = leader_of(apps, "moving", 0)
        await publish(old, "moving", 0, 0, 100)
        await table_holding(config, "moving", {0: (0, 100)}, {0: 1})
        new = next(a for a in apps if a is not old)
        new_id = new.config.cluster.server_id
        await old.broker.placement.submit("change_leader", stream="moving", index=0,
                                          leader=new_id)
        await until("the new leader everywhere", lambda: all(
            a.broker.placement.of("moving", 0).leader == new_id for a in apps))
        await publish(new, "moving", 0, 100, 100)
        await table_holding(config, "moving", {0: (0, 200)}, {0: 2})
        await until("the former leader no longer tracking the table", lambda: (
            ("moving", 0) not in old.tables.status))
        pid = new.tables.worker_pid
        os.kill(pid, signal.SIGSTOP)  # the new leader's writer paused: the table lags
        try:
            await publish(new, "moving", 0, 200, 100)
            part = old.broker.streams["moving"].partitions[0]
            await until("the former leader's replica holding 300 records",
                        lambda: part.committed_offset == 299)
            status = await committing_nothing(config, "moving", request_of(old, "moving", 0, 1))
            assert "leader epoch 1 is older than the table's 2" in (status["error"] or "")
        finally:
            os.kill(pid, signal.SIGCONT)
        table = await table_holding(config, "moving", {0: (0, 300)}, {0: 2})
        await asyncio.to_thread(assert_exactly_once, table, {0: 300})
        claimed = False  # every snapshot after the new leader's claim is under epoch 2
        for snapshot in table.snapshots():
            claimed = claimed or ice.snapshot_epochs(snapshot) == {0: 2}
            assert not claimed or ice.snapshot_epochs(snapshot) == {0: 2}
    finally:
        await stopped(apps)


async def test_a_writer_behind_on_the_high_watermark_rewrites_nothing(tmp_path):
    """A new leader learns the high watermark with its next fetch answer, so its first pass
    can be told a committed offset older than the table's end while its log holds those
    records. Its writer waits for the high watermark; before, it took the table for one
    running past the log and wrote the partition again from the log (losing what only an
    archive table holds). Here a worker gets the leader's request with an older committed
    offset while the leader's own worker is paused: the table is left as it is."""
    config = tables(tmp_path)
    apps = await started(tmp_path, tables=config)
    try:
        await created(apps, "behind", partitions=1, replication_factor=3, table=True)
        leader = leader_of(apps, "behind", 0)
        await publish(leader, "behind", 0, 0, 100)
        await table_holding(config, "behind", {0: (0, 100)}, {0: 1})
        pid = leader.tables.worker_pid
        os.kill(pid, signal.SIGSTOP)
        try:
            request = request_of(leader, "behind", 0, 1)
            request["partitions"][0]["committed"] = 49
            assert (await committing_nothing(config, "behind", request))["error"] is None
        finally:
            os.kill(pid, signal.SIGCONT)
        table = await table_holding(config, "behind", {0: (0, 100)}, {0: 1})
        await asyncio.to_thread(assert_exactly_once, table, {0: 100})
    finally:
        await stopped(apps)


async def test_orphan_cleanup_leaves_another_writers_files_in_flight(tmp_path):
    """Partition 1's writer is paused between writing a data file and committing it
    (SIGSTOP), and partition 0's worker starts again (killed, as after a crash) with a
    leftover of its own: its first visit removes its own leftover, never partition 1's file
    in flight."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    config = tables(tmp_path)
    apps = await started(tmp_path, tables=config)
    try:
        await created(apps, "shared", partitions=2, replication_factor=3, table=True)
        leaders = [leader_of(apps, "shared", i) for i in range(2)]
        assert leaders[0] is not leaders[1]
        await asyncio.gather(*(publish(app, "shared", i, 0, 50)
                               for i, app in enumerate(leaders)))
        table = await table_holding(config, "shared", {0: (0, 50), 1: (0, 50)}, {0: 1, 1: 1})
        rows = await asyncio.to_thread(lambda: table.scan().to_arrow())

        def written(partition: int) -> str:
            mine = rows.filter(pa.compute.equal(rows["partition"], partition))
            files = _dataframe_to_data_files(table_metadata=table.metadata, df=mine,
                                             io=table.io)
            return next(iter(files)).file_path

        paused = leaders[1].tables.worker_pid
        os.kill(paused, signal.SIGSTOP)
        try:
            in_flight = await asyncio.to_thread(written, 1)
            leftover = await asyncio.to_thread(written, 0)
            assert "/partition=1/" in in_flight and "/partition=0/" in leftover
            os.kill(leaders[0].tables.worker_pid, signal.SIGKILL)  # started again next tick
            await until("partition 0's leftover removed", lambda: not os.path.exists(
                leftover.removeprefix("file://")))
            assert os.path.exists(in_flight.removeprefix("file://"))
        finally:
            os.kill(paused, signal.SIGCONT)
        table = await asyncio.to_thread(table.refresh)
        await asyncio.to_thread(assert_exactly_once, table, {0: 50, 1: 50})
    finally:
        await stopped(apps)



def test_a_late_drop_leaves_the_table_of_the_names_newer_stream(tmp_path):
    """A stream deleted and made again: every replica server's table service sends its
    worker a drop, and a slow one can come after the new stream's leader made the name's new
    table in the shared catalog. A drop names the creation time of the table it means; the
    newer table stays (before, any table of the name was dropped with its files)."""
    directory = str(tmp_path / "tables")
    catalog = ice.load_catalog(directory, None)
    ice.create_table(catalog, directory, "again", 2)  # the newer stream's table
    request = {"table_dir": directory, "archive": False, "compression": "zstd",
               "format": "iceberg", "catalog": None, "expiry_ms": 3_600_000,
               "partitions": [], "drop": [["again", 1]]}
    run_worker(request)
    table = ice.load_table(catalog, "again")
    assert table is not None and table.properties[ice.CREATED_PROPERTY] == "2"
    run_worker(dict(request, drop=[["again", 2]]))
    assert ice.load_table(catalog, "again") is None
