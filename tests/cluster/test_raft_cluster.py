# Cluster metadata through a real 3-member Raft (riverlog.cluster.metadata), each member in a
# process of its own (_raft_node.py) on free ports: changes made on any member apply on all,
# the Raft leader's SIGKILL elects another and the killed member catches up from its
# journal; a member with the wrong password gets and changes nothing; unauthenticated bytes
# never reach pickle. Waits are generous polls, never timed assertions.
from __future__ import annotations

import pickle
import socket
import struct
import zlib

import pytest

from _members import WAIT_S, Member, wait_for
from compat._servers import HOST, free_port

def members(tmp_path, passwords: list[str]) -> list[Member]:
    addresses = [f"{HOST}:{free_port()}" for _ in passwords]
    return [Member(a, str(tmp_path / f"m{i}" / "raft"), pw, [p for p in addresses if p != a])
            for i, (a, pw) in enumerate(zip(addresses, passwords))]


@pytest.fixture
def cluster(tmp_path):
    made: list[Member] = []

    def make(passwords: list[str]) -> list[Member]:
        made.extend(members(tmp_path, passwords))
        for m in made:
            assert m.start() == {"ready": True}
        return made
    yield make
    for m in made:
        m.kill()


def leader_of(ms: list[Member]) -> Member | None:
    """The Raft leader once every member of ``ms`` knows it (commands submitted before that
    may go to a former leader and end RaftUnavailable, as documented), else None."""
    states = [m.state() for m in ms]
    leaders = [m for m, st in zip(ms, states) if st["is_leader"]]
    if len(leaders) != 1 or any(st["leader"] != leaders[0].address for st in states):
        return None
    return leaders[0]


def test_changes_on_any_member_apply_everywhere_and_survive_a_leader_kill(cluster):
    ms = cluster(["secret"] * 3)
    leader = wait_for("one Raft leader", lambda: leader_of(ms))
    followers = [m for m in ms if m is not leader]
    for i, m in enumerate(ms):  # each member registers a server, leader and followers alike
        assert m.submit("add_server", server={"id": f"s{i}", "doors": {
            "rabbitmq-stream": [HOST, 5552 + i]}}) == {"ok": True}
    assert followers[0].submit("create_stream", name="orders", subject="orders",
                               partitions=2, replication_factor=3) == {"ok": True}
    refused = followers[1].submit("create_stream", name="orders", subject="orders")
    assert refused["ok"] is False and refused["error"] == "StreamExists"
    expected = {"servers": ["s0", "s1", "s2"], "streams": {"orders": [
        ["s0", ["s0", "s1", "s2"], 1], ["s1", ["s1", "s2", "s0"], 1]]}}
    wait_for("every member applied the changes", lambda: all(
        {k: m.state()[k] for k in expected} == expected for m in ms))
    assert all(m.state()["changes"] >= 4 for m in ms)  # the event loop saw the changes

    leader.kill()
    survivors = followers
    wait_for("a new Raft leader among the survivors", lambda: leader_of(survivors))
    assert survivors[1].submit("change_leader", stream="orders", index=0,
                               leader_epoch=1) == {"ok": True}
    assert survivors[0].submit("create_stream", name="audit", subject="audit") == {"ok": True}
    after = {"servers": ["s0", "s1", "s2"], "streams": {
        "audit": [["s2", ["s2"], 1]],
        "orders": [["s1", ["s1", "s2"], 2], ["s1", ["s1", "s2", "s0"], 1]]}}
    wait_for("the survivors applied the changes made without the old leader", lambda: all(
        {k: m.state()[k] for k in after} == after for m in survivors))

    assert leader.start() == {"ready": True}  # same raft dir: its journal, then catching up
    wait_for("the restarted member caught up", lambda: {
        k: leader.state()[k] for k in after} == after)
    assert leader.submit("delete_stream", name="audit") == {"ok": True}
    wait_for("a change made on the restarted member applied everywhere", lambda: all(
        "audit" not in m.state()["streams"] for m in ms))


class _RunsCode:
    """Unpickling this creates the file at ``path``: proof that pickle ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_wrong_password_member_gets_and_changes_nothing(cluster, tmp_path):
    good_a, good_b, intruder = cluster(["secret", "secret", "guess"])
    wait_for("the two members with the password elect a leader",
             lambda: leader_of([good_a, good_b]))
    assert good_a.submit("add_server", server={"id": "a"}) == {"ok": True}
    assert good_b.submit("create_stream", name="orders", subject="orders") == {"ok": True}
    wait_for("both applied", lambda: all(
        "orders" in m.state()["streams"] for m in (good_a, good_b)))

    refused = intruder.submit("create_stream", name="evil", subject="evil", timeout=10)
    assert refused["ok"] is False and refused["error"] == "RaftUnavailable"
    seen = intruder.state()
    assert (seen["servers"], seen["streams"], seen["leader"]) == ([], {}, None)
    assert good_a.submit("create_stream", name="later", subject="later") == {"ok": True}
    for m in (good_a, good_b):
        wait_for("the later change applied", lambda: "later" in m.state()["streams"])
        assert "evil" not in m.state()["streams"]

    # bytes without the password: a pickle that would create a file if it were loaded
    marker = tmp_path / "pickle-ran"
    payload = zlib.compress(pickle.dumps(_RunsCode(str(marker))))
    host, port = good_a.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        sock.sendall(struct.pack("i", len(payload)) + payload)
        assert sock.recv(1024) == b""  # closed without an answer
    assert not marker.exists()
    assert good_a.submit("add_server", server={"id": "b"}) == {"ok": True}  # still serving
