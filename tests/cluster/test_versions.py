# Versioned state (issue 31 item 2): a newer riverlog reads what the previous one wrote, and
# what a newer one wrote is refused with a clear error, never misread. The data folder's
# layout file (riverlog/data_layout.py, checked by `riverlog serve` before it opens anything),
# the Raft journal's commands and the Raft snapshot (riverlog/cluster/raft_files.py, checked
# before pysyncobj opens them). Real Raft members and real `riverlog serve` processes; the
# newer riverlog's files are made by writing what it would write.
from __future__ import annotations

import asyncio
import dataclasses
import gzip
import os
import pickle
import subprocess
import sys

import pytest

from compat._servers import HOST, free_port
from riverlog import data_layout
from riverlog.cluster import state as s
from riverlog.cluster.metadata import RaftMetadata, RaftSettings
from riverlog.cluster.raft_files import JOURNAL, SNAPSHOT, RaftFileNewer, check


def settings(raft_dir: str) -> RaftSettings:
    return RaftSettings(f"{HOST}:{free_port()}", raft_dir, password="secret")


def test_a_folder_without_a_layout_file_is_layout_1_and_is_stamped(tmp_path):
    folder = str(tmp_path / "data")
    os.makedirs(os.path.join(folder, "streams", "orders"))  # as riverlog before layouts left it
    assert data_layout.read_layout(folder) is None
    assert data_layout.check_and_stamp(folder) == 1
    with open(os.path.join(folder, data_layout.LAYOUT_FILE)) as f:
        assert f.read() == "riverlog data layout 1\n"
    assert data_layout.check_and_stamp(folder) == 1  # read again as it is


def test_a_newer_or_unreadable_layout_is_refused(tmp_path):
    path = tmp_path / data_layout.LAYOUT_FILE
    path.write_text(f"riverlog data layout {data_layout.LAYOUT + 1}\n")
    with pytest.raises(data_layout.LayoutTooNew, match="written by a newer riverlog"):
        data_layout.check_and_stamp(str(tmp_path))
    path.write_text("something else")
    with pytest.raises(data_layout.LayoutError, match="not a riverlog layout file"):
        data_layout.check_and_stamp(str(tmp_path))
    assert path.read_text() == "something else"  # never stamped over


def test_serve_refuses_a_data_folder_of_a_newer_riverlog(tmp_path):
    (tmp_path / data_layout.LAYOUT_FILE).write_text("riverlog data layout 99\n")
    done = subprocess.run(
        [sys.executable, "-m", "riverlog", "serve", "-d", str(tmp_path), "--host", HOST,
         "--port", "0", "--stream-port", "0", "--nats-port", "0", "--metrics-port", "0",
         "--management-port", "0"], capture_output=True, text=True, timeout=120,
        cwd=str(tmp_path))
    assert done.returncode != 0
    assert "data layout 99 was written by a newer riverlog" in done.stderr, done.stderr
    assert not (tmp_path / "streams").exists()  # nothing opened


def test_a_journal_with_a_command_of_a_newer_riverlog_is_refused(tmp_path):
    """A command this riverlog does not know (a newer one's, had the feature table been
    bypassed) is not applied, and the journal holding it is refused at the next start."""
    path = str(tmp_path / "raft")

    async def write() -> None:
        metadata = await asyncio.to_thread(RaftMetadata, settings(path))
        try:
            await metadata.submit("add_server", server=s.Server("a"))
            future: asyncio.Future = asyncio.get_running_loop().create_future()
            loop = asyncio.get_running_loop()
            metadata._replicated.apply(  # what a newer server's submit would replicate
                "create_vhost", {"name": "v"},
                callback=lambda result, error: loop.call_soon_threadsafe(
                    future.set_result, result))
            result = await asyncio.wait_for(future, 30)
            assert isinstance(result, s.MetadataError) and "a newer riverlog's" in str(result)
            assert list(metadata.state.servers) == ["a"]  # nothing else applied
        finally:
            metadata.close()
    asyncio.run(write())
    with pytest.raises(RaftFileNewer, match="'create_vhost', which this riverlog does not"):
        check(path)
    with pytest.raises(RaftFileNewer):
        RaftMetadata(settings(path))


class _NewerState:
    """Pickles as a newer riverlog's ClusterState: the known fields and one more, written."""

    def __init__(self, extra) -> None:
        state = s.ClusterState()
        self.values = [getattr(state, f.name) for f in dataclasses.fields(state)] + [extra]

    def __reduce__(self):
        return object.__new__, (s.ClusterState,), self.values


def test_a_snapshot_of_a_newer_riverlog_is_refused_unless_its_new_fields_are_empty(tmp_path):
    path = tmp_path / SNAPSHOT
    with gzip.open(path, "wb") as f:
        pickle.dump(({"state": _NewerState({"v": "a vhost"})}, 0, 0), f)
    with pytest.raises(RaftFileNewer, match="a newer riverlog's feature wrote them"):
        check(str(tmp_path))
    with gzip.open(path, "wb") as f:
        pickle.dump(({"state": _NewerState({})}, 0, 0), f)
    check(str(tmp_path))  # its feature not used yet: nothing is misread
    assert not os.path.exists(tmp_path / JOURNAL)
