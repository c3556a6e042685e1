# Starting a Raft member from its files (riverlog.cluster.raft_files, metadata): damaged
# files stop the start with RaftFileCorrupt naming the file, in process, as the exit of a
# member process and as `riverlog serve`'s one-line error, never a crash loop in pysyncobj's
# thread; an intact journal and a snapshot restart with their metadata; watchers see changes
# until stopped; a multi-server Raft without a password and a taken Raft port are refused
# with clear errors.
from __future__ import annotations

import asyncio
import gzip
import os
import socket
import struct

import pytest

from _members import Member, wait_for
from compat._servers import HOST, free_port
from riverlog.cluster.metadata import (RaftBindError, RaftConfigError, RaftMetadata,
                                       RaftSettings)
from riverlog.cluster.raft_files import JOURNAL, MEMBERS, META, SNAPSHOT, RaftFileCorrupt
from riverlog.cluster.state import Server

FIRST_RECORD = 40  # pysyncobj 0.3.17's journal header size


def settings(raft_dir: str) -> RaftSettings:
    return RaftSettings(f"{HOST}:{free_port()}", raft_dir, password="secret")


@pytest.fixture
def raft_dir(tmp_path) -> str:
    """A one-member Raft's files holding a server and a stream."""
    path = str(tmp_path / "raft")

    async def write() -> None:
        metadata = await asyncio.to_thread(RaftMetadata, settings(path))
        await metadata.submit("add_server", server=Server("a"))
        await metadata.submit("create_stream", name="orders", subject="orders")
        metadata.close()
    asyncio.run(write())
    return path


def last_record_offset(journal: str) -> int:
    with open(journal, "rb") as f:
        data = f.read()
    (end,) = struct.unpack_from("<I", data, 36)
    offset = last = FIRST_RECORD
    while offset < end:
        last = offset
        offset += struct.unpack_from("<I", data, offset)[0] + 8
    return last


def patch(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_intact_files_restart_with_their_metadata(raft_dir):
    metadata = RaftMetadata(settings(raft_dir))
    try:
        wait_for("the journal replayed", lambda: "orders" in metadata.state.streams)
        assert list(metadata.state.servers) == ["a"]
    finally:
        metadata.close()


def _bad_record_size(raft_dir):
    journal = os.path.join(raft_dir, JOURNAL)
    patch(journal, last_record_offset(journal), struct.pack("<I", 10_000_000))
    return journal


def _bad_command(raft_dir):
    journal = os.path.join(raft_dir, JOURNAL)
    patch(journal, last_record_offset(journal) + 4 + 16 + 1, b"\xff")  # the pickle's start
    return journal


def _short_journal(raft_dir):
    journal = os.path.join(raft_dir, JOURNAL)
    os.truncate(journal, 20)
    return journal


def _bad_meta(raft_dir):
    meta = os.path.join(raft_dir, META)
    with open(meta, "wb") as f:
        f.write(b"\x80\x02}q\x00(X")  # a pickle cut short
    return meta


def _bad_snapshot(raft_dir):
    snapshot = os.path.join(raft_dir, SNAPSHOT)
    with open(snapshot, "wb") as f:
        f.write(gzip.compress(b"snapshot bytes")[:-6] + b"\0" * 6)  # the gzip CRC is wrong
    return snapshot


def _bad_members(raft_dir):
    members = os.path.join(raft_dir, MEMBERS)
    with open(members, "w") as f:
        f.write('{"a": 1}')  # JSON, but no list of Raft addresses
    return members


@pytest.mark.parametrize("damage", [_bad_record_size, _bad_command, _short_journal, _bad_meta,
                                    _bad_snapshot, _bad_members])
def test_damaged_file_is_named_at_start(raft_dir, damage):
    path = damage(raft_dir)
    with pytest.raises(RaftFileCorrupt) as info:
        RaftMetadata(settings(raft_dir))
    assert info.value.path == path and path in str(info.value)


def test_member_process_with_damaged_journal_exits_with_the_error(raft_dir):
    journal = _bad_command(raft_dir)
    member = Member(f"{HOST}:{free_port()}", raft_dir, "secret", [])
    try:
        answer = member.start()
        assert answer["error"] == "RaftFileCorrupt" and journal in answer["message"]
        assert member.proc.wait(timeout=60) == 2
    finally:
        member.kill()


@pytest.mark.parametrize("peers", [(), (f"{HOST}:2",)])
def test_member_without_password_refused(tmp_path, peers):
    with pytest.raises(RaftConfigError, match="needs a password"):
        RaftSettings(f"{HOST}:1", str(tmp_path), peers=peers)


def test_snapshot_and_journal_restart_and_watchers(tmp_path):
    """Restarted on the same Raft address: the snapshot keeps the members (pysyncobj's
    dynamic membership), and a member is known by its address."""
    path = str(tmp_path / "raft")
    same = settings(path)

    async def before() -> None:
        metadata = await asyncio.to_thread(RaftMetadata, same)
        seen: list[int] = []
        stop = metadata.watch(asyncio.get_running_loop(), lambda st: seen.append(len(st.streams)))
        await metadata.submit("add_server", server=Server("a"))
        await metadata.submit("create_stream", name="orders", subject="orders")
        assert seen == [0, 1]  # each change reached the loop before its submit returned
        metadata._raft.forceLogCompaction()  # pysyncobj's snapshot, now rather than in 5 min
        await asyncio.to_thread(wait_for, "a snapshot", lambda: os.path.exists(
            os.path.join(path, SNAPSHOT)))
        stop()
        await metadata.submit("create_stream", name="audit", subject="audit")  # journal only
        assert seen == [0, 1]
        metadata.close()
    asyncio.run(before())

    metadata = RaftMetadata(same)
    try:
        wait_for("snapshot and journal replayed", lambda: sorted(metadata.state.streams) == [
            "audit", "orders"])
    finally:
        metadata.close()


def test_taken_raft_port_is_a_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        address = f"{HOST}:{taken.getsockname()[1]}"
        with pytest.raises(RaftBindError, match=f"cannot listen for Raft on {address}"):
            RaftMetadata(RaftSettings(address, str(tmp_path / "raft"), password="secret",
                                      bind_retries=1))


def test_riverlog_serve_with_a_damaged_journal_says_so_and_exits(raft_dir, tmp_path):
    # `riverlog serve` (one member of `cluster up`'s layout) whose DATA/raft holds a damaged
    # journal: a one-line error naming the file and exit status 1, no traceback, no retries
    import shutil
    import subprocess

    from riverlog.cluster.local import layout, serve_command
    journal = _bad_command(raft_dir)
    directory = str(tmp_path / "cluster")
    (member,) = layout(directory, 1, HOST)
    shutil.copytree(raft_dir, os.path.join(directory, member.id, "raft"))
    command, env = serve_command(member, [member], directory)
    done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("Error:")]
    assert os.path.basename(journal) in line and "raft" in line
