"""go-liftbridge v2.3.0 (tests/compat/go_liftbridge) against a real 3-server cluster
(`riverlog cluster up`): first the scenarios publish, positions, cursors and nats, as on one
server (compat/_go_checks.py; pause is not among them: docs/compatibility.md, a publish that
resumes a partition just paused timed out once in a cluster, not understood yet); then the `failover` scenario: a stream with 3 replicas
and minIsr 2, a subscriber from the earliest offset and a publisher with ALL acks, then a
SIGKILL of the partition's leader. The client's own machinery carries on: its subscription
ends with Unavailable and it resubscribes at the new leader from its last offset + 1; its
publishes wait (or time out) while there is no leader and go on after. Every acked message
was received exactly once, in offset order with no gap, and is stored once on the new
leader. Then what a follower, and the last server once the new leader is killed too, answer
(Liftbridge's errors)."""
from __future__ import annotations

import os
import signal

import pytest

from _cluster import cluster_up, read_table, values
from compat._go_checks import check_cursors, check_nats, check_positions, check_publish

__all__ = ["cluster_up"]  # the fixture, used by name
pytestmark = pytest.mark.timeout(300)
CHECKS = {"publish": check_publish, "positions": check_positions, "cursors": check_cursors,
          "nats": check_nats}
# what a server that does not lead the partition answers (Liftbridge's metadata.go, api.go)
NOT_LEADER = {
    "partition_metadata": {"code": "FailedPrecondition", "error": "rpc error: code = "
                           "FailedPrecondition desc = The request should be sent to "
                           "partition leader"},
    "subscribe": {"code": "FailedPrecondition", "error": "rpc error: code = "
                  "FailedPrecondition desc = Server not partition leader"},
    "subscribe_isr": None}


async def test_go_liftbridge_through_a_leader_kill(cluster_up, go_liftbridge):
    rows = read_table(cluster_up)
    addresses = [row["Liftbridge gRPC"] for row in rows.values()]
    pids = {server_id: int(row["pid"]) for server_id, row in rows.items()}
    # first the scenarios that run as on one server (streams of one replica; go-liftbridge
    # publishes through the server its hash ring picks, which hands them to the leader)
    nats = f"nats://{rows['s1']['NATS']}"
    for scenario, check in CHECKS.items():
        stream = f"go-cluster-{scenario}"
        check(await go_liftbridge.run(scenario, addresses, nats, stream=stream), stream)

    out = await go_liftbridge.run("failover", addresses, stream="go-failover", pids=pids,
                                  before=100, after=100, timeout=240)
    killed, elected = out["killed"], out["new_leader"]
    assert elected not in ("", killed)
    acked = out["acked"]
    assert len(acked) >= 200 and out["acked_before_kill"] >= 100
    received = out["received"]
    offsets = [m["offset"] for m in received]
    assert offsets == list(range(len(offsets))), "a gap or a duplicate in the subscription"
    got = [m["value"] for m in received]
    for value in acked:
        assert got.count(value) == 1, value
    stored = await values(rows[elected]["Liftbridge gRPC"], out["stream"], offsets[-1])
    assert [v.decode() for v in stored] == got

    # the survivors: a follower answers as Liftbridge's does (metadata.go, api.go); a publish
    # through it reaches the leader and is ALL-acked; go-liftbridge connects (the killed
    # server is no longer listed in FetchMetadata) and works
    survivors = {s: rows[s]["Liftbridge gRPC"] for s in rows if s != killed}
    follower = next(a for s, a in survivors.items() if s != elected)
    answers = await go_liftbridge.run("not_leader", list(survivors.values()),
                                      stream=out["stream"])
    assert answers[survivors[elected]] == {"partition_metadata": None, "subscribe": None,
                                           "subscribe_isr": None, "publish": None}
    assert answers[follower] == {**NOT_LEADER, "publish": None}
    assert answers["go_publish"] is None and answers["go_subscribe"] is None

    # the new leader gone too, and with it the Raft majority: no leader can be elected. The
    # last server's answers are Liftbridge's: a publish it passes on through NATS is never
    # acked (DEADLINE_EXCEEDED; go-liftbridge: ErrAckTimeout), the partition is led elsewhere
    # (FAILED_PRECONDITION); its committed records stay readable with readISRReplica;
    # go-liftbridge finds no leader among the servers listed
    os.kill(pids[elected], signal.SIGKILL)
    answers = await go_liftbridge.run("not_leader", follower, stream=out["stream"])
    last = answers[follower]
    # the deadline passes on both sides: the text is the client's or the server's
    assert last.pop("publish")["code"] == "DeadlineExceeded"
    assert last == NOT_LEADER
    assert answers["go_publish"]["is"] == "ErrAckTimeout"
    assert answers["go_subscribe"] == {"code": "Unknown",
                                       "error": "no known leader for partition"}
