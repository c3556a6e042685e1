# The metadata transitions of riverlog.cluster.state, without Raft: placement, leader
# changes from the ISR only (no unclean election), ISR shrink/expand under leader epochs,
# consumer groups, and properties over random command sequences (hypothesis).
from __future__ import annotations

import dataclasses
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverlog.cluster import state as s


def cluster(*ids: str) -> s.ClusterState:
    st_ = s.ClusterState()
    for i in ids:
        st_, _ = s.add_server(st_, s.Server(i, {"rabbitmq-stream": s.Door("h-" + i, 5552)}))
    return st_


def test_create_stream_spreads_replicas_and_leaders():
    st0 = cluster("c", "a", "b")
    st1, stream = s.create_stream(st0, "orders", "orders", partitions=3, replication_factor=2)
    assert [p.replicas for p in stream.partitions] == [("a", "b"), ("b", "c"), ("c", "a")]
    assert [p.leader for p in stream.partitions] == ["a", "b", "c"]
    assert all(p.isr == p.replicas and p.leader_epoch == 1 for p in stream.partitions)
    assert st0.streams == {}  # the old state is untouched
    _, other = s.create_stream(st1, "more", "more", replication_factor=s.ALL_SERVERS)
    assert other.partitions[0].replicas == ("a", "b", "c")  # starts after the 3 placed


def test_create_stream_keeps_its_settings_for_every_replica():
    config = {"subject": "orders", "partitions": 1, "min_isr": 2, "retention_max_bytes": 10}
    st1, stream = s.create_stream(cluster("a", "b"), "orders", "orders", replication_factor=2,
                                  config=config)
    config["min_isr"] = 1  # the caller's dict changing later changes nothing stored
    assert st1.streams["orders"].config == {"subject": "orders", "partitions": 1,
                                            "min_isr": 2, "retention_max_bytes": 10}
    assert pickle.loads(pickle.dumps(st1)) == st1  # Raft snapshots pickle the state


@pytest.mark.parametrize("kwargs, error", [
    ({"replication_factor": 4}, s.NotEnoughServers),
    ({"replication_factor": 0}, s.MetadataError),
    ({"partitions": 0}, s.MetadataError),
])
def test_create_stream_refuses_bad_counts(kwargs, error):
    with pytest.raises(error):
        s.create_stream(cluster("a", "b", "c"), "x", "x", **kwargs)


def test_create_existing_and_delete_missing_stream_refused():
    st1, _ = s.create_stream(cluster("a"), "x", "x")
    with pytest.raises(s.StreamExists):
        s.create_stream(st1, "x", "x")
    st2, removed = s.delete_stream(st1, "x")
    assert removed.name == "x" and "x" not in st2.streams and "x" in st1.streams
    with pytest.raises(s.NoSuchStream):
        s.delete_stream(st2, "x")


def test_change_leader_takes_next_isr_member_and_bumps_epoch():
    st1, _ = s.create_stream(cluster("a", "b", "c"), "x", "x", replication_factor=3)
    st2, p = s.change_leader(st1, "x", 0, leader_epoch=1)
    assert (p.leader, p.isr, p.leader_epoch) == ("b", ("b", "c"), 2)
    with pytest.raises(s.StaleLeaderEpoch):  # a second report of the same failure
        s.change_leader(st2, "x", 0, leader_epoch=1)


def test_change_leader_never_picks_a_replica_outside_the_isr():
    st1, _ = s.create_stream(cluster("a", "b", "c"), "x", "x", replication_factor=3)
    st2, _ = s.shrink_isr(st1, "x", 0, "b", leader_epoch=1)
    with pytest.raises(s.NotAReplica):
        s.change_leader(st2, "x", 0, leader="b")
    _, p = s.change_leader(st2, "x", 0)
    assert p.leader == "c"


def test_last_isr_member_lost_leaves_partition_unavailable_until_it_returns():
    st1, _ = s.create_stream(cluster("a", "b"), "x", "x", replication_factor=2)
    st2, _ = s.shrink_isr(st1, "x", 0, "b")
    st3, p = s.change_leader(st2, "x", 0)  # a fails, b is not in sync: no unclean election
    assert (p.leader, p.isr, p.leader_epoch) == (None, ("a",), 2)
    with pytest.raises(s.MetadataError):  # b cannot catch up with nobody
        s.expand_isr(st3, "x", 0, "b")
    with pytest.raises(s.NotAReplica):
        s.change_leader(st3, "x", 0, leader="b")
    _, p = s.change_leader(st3, "x", 0, leader="a")  # a is back
    assert (p.leader, p.isr, p.leader_epoch) == ("a", ("a",), 3)


def test_isr_shrink_and_expand():
    st1, _ = s.create_stream(cluster("a", "b", "c"), "x", "x", replication_factor=3)
    with pytest.raises(s.MetadataError):
        s.shrink_isr(st1, "x", 0, "a")  # the leader
    st2, p = s.shrink_isr(st1, "x", 0, "b")
    assert p.isr == ("a", "c")
    st3, p = s.expand_isr(st2, "x", 0, "b", leader_epoch=1)
    assert p.isr == ("a", "b", "c")  # in replica order
    assert s.expand_isr(st3, "x", 0, "b")[0] is st3  # already in: no change
    with pytest.raises(s.NotAReplica):
        s.expand_isr(st3, "x", 0, "z")
    with pytest.raises(s.StaleLeaderEpoch):
        s.shrink_isr(st3, "x", 0, "c", leader_epoch=7)
    with pytest.raises(s.NoSuchPartition):
        s.shrink_isr(st3, "x", 1, "c")


def test_flags_and_groups():
    st1, _ = s.create_stream(cluster("a"), "x", "x", partitions=3)
    st2, x = s.set_partition_flags(st1, "x", (1, 2), paused=True, resume_all=True)
    assert [(p.paused, p.read_only) for p in x.partitions] == [
        (False, False), (True, False), (True, False)]
    assert x.resume_all and not st1.streams["x"].resume_all
    _, x = s.set_partition_flags(st2, "x", read_only=True)  # no partitions: all of them
    assert [(p.paused, p.read_only) for p in x.partitions] == [
        (False, True), (True, True), (True, True)]
    assert x.resume_all  # None: unchanged
    with pytest.raises(s.NoSuchPartition):
        s.set_partition_flags(st2, "x", (0, 3), paused=False)
    with pytest.raises(s.NoSuchStream):
        s.set_partition_flags(st2, "y", paused=False)


def test_consumer_groups_as_liftbridge_keeps_them():
    st0, _ = s.create_stream(cluster("a", "b", "c"), "x", "x", partitions=3)
    st0, _ = s.create_stream(st0, "y", "y")
    with pytest.raises(s.GroupRefused, match="stream does not exist"):
        s.join_group(st0, "g", "c1", ("nope",))
    st1, g = s.join_group(st0, "g", "c1", ("x",))
    assert (g.coordinator, g.epoch, g.assignments) == ("a", 0, {"c1": {"x": (0, 1, 2)}})
    with pytest.raises(s.GroupRefused, match="already a member"):
        s.join_group(st1, "g", "c1", ("x",))
    st2, g = s.join_group(st1, "g", "c2", ("x", "y"))  # balanced as broker.groups does
    assert (g.epoch, g.assignments) == (1, {"c1": {"x": (0, 2)}, "c2": {"x": (1,), "y": (0,)}})
    _, other = s.join_group(st2, "h", "c9", ("y",))
    assert other.coordinator == "b"  # the server coordinating the fewest groups
    st3, g = s.leave_group(st2, "g", "c1")
    assert (g.epoch, g.assignments) == (2, {"c2": {"x": (0, 1, 2), "y": (0,)}})
    st4, _ = s.delete_stream(st3, "x")
    g = st4.groups["g"]
    assert (g.epoch, g.members, g.assignments) == (3, {"c2": ("y",)}, {"c2": {"y": (0,)}})
    with pytest.raises(s.GroupRefused, match="not a member"):
        s.leave_group(st4, "g", "c1")
    st5, g = s.leave_group(st4, "g", "c2")
    assert g is None and "g" not in st5.groups
    with pytest.raises(s.GroupNotFound):
        s.leave_group(st5, "g", "c2")
    st6, again = s.join_group(st5, "g", "c1", ("y",))
    _, again = s.join_group(st6, "g", "c2", ("y",))
    assert again.epoch == 4  # made again, the group never reuses an epoch


def test_a_majority_of_members_reporting_the_coordinator_replaces_it():
    st0, _ = s.create_stream(cluster("a", "b", "c"), "x", "x")
    st0, g = s.join_group(st0, "g", "c1", ("x",))
    for consumer in ("c2", "c3"):
        st0, g = s.join_group(st0, "g", consumer, ("x",))
    with pytest.raises(s.GroupRefused, match="Coordinator generation mismatch"):
        s.report_group_coordinator(st0, "g", "c1", "a", 0, now=1.0, window=15.0)
    st1, g = s.report_group_coordinator(st0, "g", "c1", "a", 2, now=1.0, window=15.0)
    assert (g.coordinator, g.witnesses) == ("a", (("c1", 1.0),))  # one of three
    st2, g = s.report_group_coordinator(st1, "g", "c2", "a", 2, now=30.0, window=15.0)
    assert g.coordinator == "a"  # the first report is too old to count with it
    st3, g = s.report_group_coordinator(st2, "g", "c3", "a", 2, now=31.0, window=15.0)
    assert (g.coordinator, g.epoch, g.witnesses) == ("b", 3, ())
    assert g.assignments == st0.groups["g"].assignments


SERVERS = ("a", "b", "c", "d")
commands = st.one_of(
    st.tuples(st.just("create_stream"), st.fixed_dictionaries({
        "name": st.sampled_from("xyz"), "subject": st.just("subj"),
        "partitions": st.integers(0, 3), "replication_factor": st.integers(-1, 4)})),
    st.tuples(st.just("delete_stream"), st.fixed_dictionaries({"name": st.sampled_from("xyz")})),
    *(st.tuples(st.just(name), st.fixed_dictionaries({
        "stream": st.sampled_from("xyz"), "index": st.integers(0, 2),
        "replica": st.sampled_from(SERVERS)}))
      for name in ("shrink_isr", "expand_isr")),
    *(st.tuples(st.just(name), st.fixed_dictionaries({
        "stream": st.sampled_from("xyz"), "index": st.integers(0, 2),
        "server": st.sampled_from(SERVERS)}))
      for name in ("add_replica", "delete_replica")),
    st.tuples(st.just("change_leader"), st.fixed_dictionaries({
        "stream": st.sampled_from("xyz"), "index": st.integers(0, 2),
        "leader": st.none() | st.sampled_from(SERVERS)})),
    st.tuples(st.just("set_partition_flags"), st.fixed_dictionaries({
        "stream": st.sampled_from("xyz"), "partitions": st.lists(st.integers(0, 2)).map(tuple),
        "paused": st.none() | st.booleans(), "read_only": st.none() | st.booleans()})),
    st.tuples(st.just("join_group"), st.fixed_dictionaries({
        "group": st.sampled_from("gh"), "consumer": st.sampled_from(("c1", "c2", "c3")),
        "streams": st.lists(st.sampled_from("xyz"), min_size=1, max_size=3).map(tuple)})),
    st.tuples(st.just("leave_group"), st.fixed_dictionaries({
        "group": st.sampled_from("gh"), "consumer": st.sampled_from(("c1", "c2", "c3"))})),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(commands, max_size=40))
def test_any_command_sequence_keeps_partitions_consistent(sequence):
    state = cluster(*SERVERS)
    for name, args in sequence:
        old = state
        frozen = pickle.dumps(old)
        try:
            state, _ = s.TRANSITIONS[name](state, **args)
        except s.MetadataError:
            assert pickle.dumps(state) == frozen  # a refused command changes nothing
            continue
        assert pickle.dumps(old) == frozen  # the old state is never changed
        for stream in state.streams.values():
            for p in stream.partitions:
                assert set(p.isr) <= set(p.replicas) and p.replicas
                if name == "delete_replica" and stream.name in old.streams:  # never the last
                    assert p.isr or not old.partition(p.stream, p.index).isr  # in sync
                assert len(set(p.replicas)) == len(p.replicas)
                assert p.leader is None or p.leader in p.isr
                if stream.name not in old.streams:
                    continue
                was = old.partition(p.stream, p.index)
                assert p.leader_epoch >= was.leader_epoch
                if p.leader != was.leader:  # only from the ISR, and always with a new epoch
                    assert p.leader_epoch == was.leader_epoch + 1
                    assert p.leader is None or p.leader in was.isr
                if name == "change_leader":  # the old leader is out of sync until it rejoins
                    assert p.leader is None or was.leader not in p.isr or p.leader == was.leader
        for group in state.groups.values():  # each partition read by the group goes to one
            assert 0 <= group.epoch <= state.group_epoch and group.members
            assert set(group.assignments) == set(group.members)
            for stream in {x for streams in group.members.values() for x in streams}:
                given = [p for c, a in group.assignments.items() for p in a.get(stream, ())
                         if stream in group.members[c]]
                assert sorted(given) == list(range(len(state.streams[stream].partitions)))
            old_group = old.groups.get(group.id)
            if old_group is not None and old_group != group:
                assert group.epoch > old_group.epoch


def test_a_snapshot_of_an_earlier_version_loads_with_the_fields_added_since():
    """pickle restores a metadata object with the field values its snapshot holds, in
    order; an earlier riverlog's snapshot lacks the fields added since (at the end)."""
    st1, _ = s.create_stream(cluster("a"), "x", "x")
    state = s.ClusterState.__new__(s.ClusterState)
    state.__setstate__([st1.servers, st1.streams, {}])  # before group_epoch
    stream = s.Stream.__new__(s.Stream)
    stream.__setstate__(["x", "x", st1.streams["x"].partitions, {}])  # before resume_all
    assert (state.group_epoch, state.streams, stream.resume_all, state.super_streams) == (
        0, st1.streams, False, {})
    group = s.ConsumerGroup.__new__(s.ConsumerGroup)
    group.__setstate__(["g", "a", 3, {"c": ("x",)}])
    assert (group.assignments, group.witnesses) == ({}, ())


def test_state_survives_pickle():  # pysyncobj snapshots and journals it as pickles
    st1, _ = s.create_stream(cluster("a", "b"), "x", "x", replication_factor=2)
    st2, _ = s.join_group(st1, "g", "c", ("x",))
    assert pickle.loads(pickle.dumps(st2)) == st2


def test_report_leader_changes_it_once_a_majority_of_the_followers_reported():
    st0, _ = s.create_stream(cluster("a", "b", "c"), "x", "x", replication_factor=3)
    st1, part = s.report_leader(st0, "x", 0, "b", "a", 1, now=100.0, window=15.0)
    assert part.leader == "a" and part.witnesses == (("b", 100.0),)  # one of two followers
    # a report older than the timeout does not count with a new one
    st2, part = s.report_leader(st1, "x", 0, "c", "a", 1, now=200.0, window=15.0)
    assert part.leader == "a" and part.witnesses == (("c", 200.0),)
    st3, part = s.report_leader(st2, "x", 0, "b", "a", 1, now=210.0, window=15.0)
    assert (part.leader, part.leader_epoch, part.isr, part.witnesses) == ("b", 2, ("b", "c"), ())
    with pytest.raises(s.StaleLeaderEpoch):  # a report of the old leader changes nothing
        s.report_leader(st3, "x", 0, "c", "a", 1, now=211.0, window=15.0)
    with pytest.raises(s.NotAReplica):
        s.report_leader(st3, "x", 0, "a", "b", 2, now=211.0, window=15.0)
    st4, _ = s.create_stream(cluster("a", "b"), "y", "y", replication_factor=2)
    _, part = s.report_leader(st4, "y", 0, "b", "a", 1, now=1.0, window=15.0)
    assert part.leader == "b"  # of two replicas, the one follower's report is enough


def test_remove_server_leaves_new_streams_to_the_others():
    st1, _ = s.create_stream(cluster("a", "b", "c"), "before", "before",
                             replication_factor=s.ALL_SERVERS)
    st2, _ = s.remove_server(st1, "c")
    assert sorted(st2.servers) == ["a", "b"]
    assert st2.streams["before"].partitions[0].replicas == ("a", "b", "c")  # not reassigned
    _, after = s.create_stream(st2, "after", "after", replication_factor=s.ALL_SERVERS)
    assert sorted(after.partitions[0].replicas) == ["a", "b"]
    with pytest.raises(s.NoSuchServer, match="no server 'c'"):
        s.remove_server(st2, "c")


def test_add_replica_joins_outside_the_isr_until_it_is_asked_in():
    state, _ = s.create_stream(cluster("a", "b", "c", "d"), "x", "x", partitions=2,
                               replication_factor=3)
    state, part = s.add_replica(state, "x", 1, "a")
    assert part.replicas == ("b", "c", "d", "a") and part.isr == ("b", "c", "d")
    assert state.partition("x", 0).replicas == ("a", "b", "c")  # the other partition as it was
    state, part = s.expand_isr(state, "x", 1, "a")
    assert part.isr == ("b", "c", "d", "a")


@pytest.mark.parametrize("args, error, words", [
    ({"stream": "nope", "index": 0, "server": "d"}, s.NoSuchStream, "no stream 'nope'"),
    ({"stream": "x", "index": 5, "server": "d"}, s.NoSuchPartition, "no partition 5"),
    ({"stream": "x", "index": 0, "server": "zz"}, s.NoSuchServer, "no server 'zz'"),
    ({"stream": "x", "index": 0, "server": "b"}, s.ReplicaExists, "holds a replica already"),
])
def test_add_replica_refusals_say_why(args, error, words):
    state, _ = s.create_stream(cluster("a", "b", "c", "d"), "x", "x", replication_factor=3)
    with pytest.raises(error, match=words):
        s.add_replica(state, **args)


def test_delete_replica_of_the_leader_moves_the_leadership_first():
    state, _ = s.create_stream(cluster("a", "b", "c"), "x", "x", replication_factor=3,
                               config={"min_isr": 2})
    state, part = s.delete_replica(state, "x", 0, "a")
    assert (part.replicas, part.isr, part.leader, part.leader_epoch) == (
        ("b", "c"), ("b", "c"), "b", 2)
    with pytest.raises(s.UnsafeReplicaChange, match="below the stream's minimum of 2"):
        s.delete_replica(state, "x", 0, "c")  # min_isr 2: two in sync stay
    with pytest.raises(s.NotAReplica, match="holds no replica"):
        s.delete_replica(state, "x", 0, "a")


def test_delete_replica_never_takes_the_last_in_sync_replica():
    state, _ = s.create_stream(cluster("a", "b"), "x", "x", replication_factor=2)
    state, _ = s.shrink_isr(state, "x", 0, "b")  # b lags: a is the last in-sync replica
    with pytest.raises(s.UnsafeReplicaChange, match="would leave 0 in-sync replicas"):
        s.delete_replica(state, "x", 0, "a")
    state, part = s.delete_replica(state, "x", 0, "b")  # one out of sync may go
    assert (part.replicas, part.isr, part.leader, part.leader_epoch) == (("a",), ("a",), "a", 1)
    with pytest.raises(s.UnsafeReplicaChange, match="the only replica"):
        s.delete_replica(state, "x", 0, "a")


def test_a_removed_server_replica_can_still_be_deleted():
    state, _ = s.create_stream(cluster("a", "b", "c"), "x", "x", replication_factor=3)
    state, _ = s.remove_server(state, "c")
    state, part = s.delete_replica(state, "x", 0, "c")
    assert part.replicas == ("a", "b")


def test_create_stream_of_a_deleted_vhost_is_refused():
    """The race of issue 30 item 1: a create of a stream of virtual host v ordered (in the
    Raft log) after v's deletion is refused in the transition, on every member."""
    from riverlog.security.access_table import delete_vhost, put_vhost
    from riverlog.vhost_names import internal
    st0 = cluster("a")
    table, _ = put_vhost(st0.access, "v")
    with_v = dataclasses.replace(st0, access=table)
    assert internal("v", "s") in s.create_stream(with_v, internal("v", "s"), "s")[0].streams
    without_v = dataclasses.replace(with_v, access=delete_vhost(table, "v")[0])
    with pytest.raises(s.NoSuchVhost):
        s.create_stream(without_v, internal("v", "s"), "s")
    with pytest.raises(s.NoSuchVhost):  # a super stream's partitions too
        s.create_stream(without_v, internal("nowhere", "p-0"), "p")
    assert s.create_stream(without_v, "s", "s")[1].name == "s"  # "/" always exists
