# A table worker whose server is SIGKILLed (riverlog.tables.lifeline): a real `riverlog
# serve` process with its real table worker in the middle of a long first pass (a backlog of
# many segments, each written as one data file), killed; the worker exits without committing
# that pass, and the restarted server's table lists only files that exist and reads the same
# rows as the source. And a worker started for a server that is already gone exits.
from __future__ import annotations

import glob
import os
import subprocess
import sys
import time

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")
pytest.importorskip("pyiceberg")

from riverlog.config import TableConfig  # noqa: E402
from riverlog.tables import iceberg as ice  # noqa: E402

from ._server import ThreadServer  # noqa: E402
from .conftest import partition_of, varied, wait_iceberg  # noqa: E402
from .test_iceberg_table import by_offset, source_rows  # noqa: E402

WAIT_S = 90


def worker_of(server: int) -> int | None:
    """The pid of the table worker process whose parent is ``server``; None: none yet."""
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(") ", 1)[1].split()
            with open(stat[:-len("stat")] + "cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == server and b"riverlog.tables.writer" in cmdline:
            return int(stat.split("/")[2])
    return None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def snapshots(table_dir: str, stream: str) -> list[int]:
    table = ice.load_table(ice.load_catalog(table_dir), stream)
    return [] if table is None else [s.snapshot_id for s in table.snapshots()]


def test_a_killed_servers_worker_commits_nothing(tmp_path):
    """The server is SIGKILLed while its worker writes a backlog's data files: the worker
    exits without committing them (before, it finished the pass and committed, possibly
    after the restarted server's worker removed those files as leftovers: a snapshot
    listing missing files); the restarted server writes the table whole, every file a
    snapshot lists exists, and it reads the source's rows."""
    data = str(tmp_path / "data")
    table_dir = os.path.join(data, "tables")
    server = ThreadServer(data).start()  # no tables yet: the backlog waits in the log
    try:
        with server.client() as c:
            c.create_stream("backlog", {"stream-max-segment-size-bytes": "4096"})
        values = varied(0, 6_000)
        with server.client() as c, c.publisher("backlog") as pub:
            for i in range(0, len(values), 150):  # a chunk each, about a segment
                pub.publish(values[i:i + 150])
                pub.flush()
        segments = len(partition_of(server, "backlog").log.segments)
    finally:
        server.stop()
    assert segments >= 30  # a data file each in the first pass: a pass of seconds

    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "riverlog", "serve", "-d", data, "--stream-port", "0",
             "--port", "0", "--nats-port", "0", "--metrics-port", "0",
             "--management-port", "0", "--tables", "--level", "info"],
            stdout=out, stderr=out, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + WAIT_S
        worker = None
        written = os.path.join(table_dir, "riverlog", "backlog", "data", "**", "*.parquet")
        while worker is None or not glob.glob(written, recursive=True):
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, f"no pass began:\n{log_path.read_text()}"
            worker = worker or worker_of(proc.pid)
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait()
    killed = snapshots(table_dir, "backlog")
    deadline = time.monotonic() + WAIT_S
    while alive(worker):
        assert time.monotonic() < deadline, "the worker outlived its server"
        time.sleep(0.05)
    assert snapshots(table_dir, "backlog") == killed, (
        f"the worker committed after its server was killed:\n{log_path.read_text()}")

    server = ThreadServer(data, tables=TableConfig(lag_ms=300, format="iceberg",
                                                   enabled=True)).start()
    try:
        table = wait_iceberg(server, "backlog", wait_s=WAIT_S)
        files = {ice.fs_path(e.data_file.file_path) for s in table.snapshots()
                 for m in s.manifests(table.io) for e in m.fetch_manifest_entry(table.io)}
        assert files and all(os.path.exists(f) for f in files)
        assert by_offset(table.scan().to_arrow()).cast(
            source_rows(server, "backlog", 0, 1).schema).equals(
            source_rows(server, "backlog", 0, 6_000))
    finally:
        server.stop()


def test_a_worker_whose_server_is_gone_at_start_exits():
    """A worker started for a server that is not its parent any more (it died before the
    worker asked to die with it; the worker was given another parent) exits at once with
    EXIT_ORPHANED, reading no request."""
    from riverlog.tables.lifeline import EXIT_ORPHANED
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    done = subprocess.run([sys.executable, "-m", "riverlog.tables.writer", str(gone.pid)],
                          input="", capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == EXIT_ORPHANED, done.stderr
    assert "is gone" in done.stderr
