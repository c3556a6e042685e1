# The super stream transitions of riverlog.cluster.state_super, without Raft: a super stream
# created with its partition streams, deleted with them, or bound to one more stream is one
# change, all of it or nothing (every refusal leaves the state as it was), placed exactly as
# the separate create_stream entries of older versions placed it; the commands those wrote
# (create_super_stream, delete_super_stream) still apply; a property over random sequences.
from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverlog.cluster import state as s
from riverlog.cluster import state_super as ss
from riverlog.cluster.access import COMMANDS

CONFIG = {"subject": "", "partitions": 1, "min_isr": 1, "created_ns": 7}


def cluster(*ids: str) -> s.ClusterState:
    state = s.ClusterState()
    for i in ids:
        state, _ = s.add_server(state, s.Server(i, {"rabbitmq-stream": s.Door("h-" + i, 5552)}))
    return state


def names(n: int, base: str = "r") -> tuple[str, ...]:
    return tuple(f"{base}-{i}" for i in range(n))


def test_the_old_commands_are_still_applied_by_name():
    for name in ("create_super_stream", "delete_super_stream", "create_stream",
                 "delete_stream", "create_super_stream_with_streams",
                 "delete_super_stream_with_streams", "bind_super_stream", "change_access"):
        assert name in COMMANDS  # what Raft applies (metadata._Replicated)
    state = cluster("a")
    for name in ("r-eu", "r-us", "other"):
        state, _ = COMMANDS["create_stream"](state, name=name, subject=name)
    state, created = COMMANDS["create_super_stream"](
        state, name="r", partitions=("r-eu", "r-us"), binding_keys=("eu", "us"))
    assert created.route("us") == ["r-us"] and state.super_streams["r"] == created
    with pytest.raises(ss.SuperStreamExists):
        ss.create_super_stream(state, "r", ("other",), ("x",))
    with pytest.raises(s.NoSuchStream):
        ss.create_super_stream(state, "q", ("missing",), ("x",))
    with pytest.raises(s.MetadataError):
        ss.create_super_stream(state, "q", ("other", "other"), ("x", "y"))
    with pytest.raises(s.MetadataError):
        ss.create_super_stream(state, "q", ("other",), ())
    state, _ = s.delete_stream(state, "r-eu")  # its binding goes, as RabbitMQ's
    assert (state.super_streams["r"].partitions, state.super_streams["r"].binding_keys) == (
        ("r-us",), ("us",))
    assert pickle.loads(pickle.dumps(state)) == state  # Raft snapshots pickle the state
    state, _ = COMMANDS["delete_super_stream"](state, name="r")
    assert not state.super_streams and "r-us" in state.streams  # its streams stay
    with pytest.raises(s.NoSuchStream):
        ss.delete_super_stream(state, "r")


@pytest.mark.parametrize("factor", [1, 2, s.ALL_SERVERS])
def test_one_create_places_the_partitions_as_separate_creates_did(factor):
    state, _ = s.create_stream(cluster("c", "a", "b"), "before", "before", partitions=2)
    partitions, keys = names(7), tuple(map(str, range(7)))
    one, created = ss.create_super_stream_with_streams(
        state, "r", partitions, keys, "", 1, factor, CONFIG)
    steps = state  # what an older riverlog did: one entry per partition, then the record
    for partition in partitions:
        steps, _ = s.create_stream(steps, partition, "", 1, factor, CONFIG)
    steps, _ = ss.create_super_stream(steps, "r", partitions, keys)
    assert pickle.dumps(one) == pickle.dumps(steps)
    assert created == one.super_streams["r"] and created.binding_keys == keys
    assert [one.streams[p].partitions[0].leader for p in partitions[:3]] == ["c", "a", "b"]
    assert one.streams["r-0"].config == CONFIG and "r-0" not in state.streams


def test_every_refused_create_changes_nothing():
    state, _ = s.create_stream(cluster("a", "b"), "r-4", "r-4")
    state, _ = ss.create_super_stream(state, "taken", ("r-4",), ("k",))
    frozen = pickle.dumps(state)
    refusals = [
        (s.StreamExists, dict(name="r", partitions=names(6))),  # the 5th partition is taken
        (s.NotEnoughServers, dict(name="q", partitions=names(3, "q"), replication_factor=3)),
        (ss.SuperStreamExists, dict(name="taken", partitions=names(2, "t"))),
        (s.MetadataError, dict(name="", partitions=names(2, "e"))),
        (s.MetadataError, dict(name="d", partitions=("d-0", "d-0"))),
        (s.MetadataError, dict(name="c", partitions=names(2, "c"), binding_keys=("x",))),
        (s.MetadataError, dict(name="z", partitions=names(2, "z"), stream_partitions=0)),
        (s.MetadataError, dict(name="e", partitions=("e-0", "")))]
    for error, arguments in refusals:
        arguments.setdefault("binding_keys", tuple(map(str, range(len(arguments["partitions"])))))
        with pytest.raises(error):
            COMMANDS["create_super_stream_with_streams"](state, **arguments)
        assert pickle.dumps(state) == frozen, arguments
    # the super stream name is checked before any partition (RabbitMQ answers 0x05 either way)
    with pytest.raises(ss.SuperStreamExists):
        ss.create_super_stream_with_streams(state, "taken", ("r-4",), ("k",))


def test_one_delete_takes_the_super_stream_and_its_streams():
    state = cluster("a", "b")
    state, _ = ss.create_super_stream_with_streams(state, "r", names(4), ("0", "1", "2", "3"))
    state, _ = s.create_stream(state, "kept", "kept")
    state, _ = ss.create_super_stream(state, "other", ("r-1", "kept"), ("x", "y"))
    state, group = s.join_group(state, "g", "c1", ("r-2", "kept"))
    state, _ = s.delete_stream(state, "r-3")  # gone on its own before: skipped
    frozen = pickle.dumps(state)
    after, removed = COMMANDS["delete_super_stream_with_streams"](state, name="r")
    assert removed.partitions == ("r-0", "r-1", "r-2")
    assert "r" not in after.super_streams and set(after.streams) == {"kept"}
    assert after.super_streams["other"].partitions == ("kept",)  # its binding went too
    assert after.groups["g"].members == {"c1": ("kept",)}
    assert after.groups["g"].epoch > group.epoch
    assert pickle.dumps(state) == frozen  # the old state is untouched
    with pytest.raises(s.NoSuchStream):
        ss.delete_super_stream_with_streams(after, "r")


def test_bind_inserts_at_its_position_in_one_change():
    state = cluster("a")
    for name in ("p0", "p1", "p2", "p3"):
        state, _ = s.create_stream(state, name, name)
    state, _ = ss.create_super_stream(state, "x", (), ())  # an exchange declared first
    state, bound = COMMANDS["bind_super_stream"](state, name="x", partition="p2",
                                                 binding_key="k2", index=0)
    state, _ = ss.bind_super_stream(state, "x", "p0", "k0", 0)
    state, _ = ss.bind_super_stream(state, "x", "p3", "k3", 99)  # the end
    state, bound = ss.bind_super_stream(state, "x", "p1", "k1", 1)
    assert (bound.partitions, bound.binding_keys) == (("p0", "p1", "p2", "p3"),
                                                      ("k0", "k1", "k2", "k3"))
    assert state.super_streams["x"] == bound
    frozen = pickle.dumps(state)
    for error, arguments in [(s.NoSuchStream, ("missing", "p0", "k", 0)),
                             (s.NoSuchStream, ("x", "nope", "k", 0)),
                             (s.MetadataError, ("x", "p1", "again", 0))]:
        with pytest.raises(error):
            ss.bind_super_stream(state, *arguments)
        assert pickle.dumps(state) == frozen


SERVERS = ("a", "b", "c")
part = st.sampled_from(("p0", "p1", "p2", "p3"))
commands = st.one_of(
    st.tuples(st.just("create_super_stream_with_streams"), st.fixed_dictionaries({
        "name": st.sampled_from("xy"), "partitions": st.lists(part, max_size=3).map(tuple),
        "binding_keys": st.just(None), "replication_factor": st.integers(1, 4)})),
    st.tuples(st.just("delete_super_stream_with_streams"),
              st.fixed_dictionaries({"name": st.sampled_from("xy")})),
    st.tuples(st.just("bind_super_stream"), st.fixed_dictionaries({
        "name": st.sampled_from("xy"), "partition": part, "binding_key": st.just("k"),
        "index": st.integers(-1, 4)})),
    st.tuples(st.just("create_stream"), st.fixed_dictionaries({
        "name": part, "subject": st.just("s")})),
    st.tuples(st.just("delete_stream"), st.fixed_dictionaries({"name": part})),
    st.tuples(st.just("create_super_stream"), st.fixed_dictionaries({
        "name": st.sampled_from("xy"), "partitions": st.lists(part, max_size=3).map(tuple),
        "binding_keys": st.just(None)})),
    st.tuples(st.just("delete_super_stream"),
              st.fixed_dictionaries({"name": st.sampled_from("xy")})),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(commands, max_size=30))
def test_any_sequence_keeps_every_binding_on_a_stream(sequence):
    state = cluster(*SERVERS)
    for name, args in sequence:
        if args.get("binding_keys", 0) is None:
            args = {**args, "binding_keys": tuple("k" * len(args["partitions"]))}
        frozen = pickle.dumps(state)
        try:
            new, _ = COMMANDS[name](state, **args)
        except s.MetadataError:
            assert pickle.dumps(state) == frozen  # a refused command changes nothing
            continue
        assert pickle.dumps(state) == frozen  # the old state is never changed
        state = new
        for found in state.super_streams.values():
            assert set(found.partitions) <= set(state.streams)
            assert len(found.partitions) == len(found.binding_keys)
            assert len(set(found.partitions)) == len(found.partitions)
