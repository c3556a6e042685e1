# The feature table (riverlog/cluster/features.py, issue 31 item 3): each server announces its
# cluster version in its add_server registration, the cluster's version is the lowest, and
# the forwarded PublishAsync batches and the one-entry super stream commands are used only
# once every server has them; before, the older ways. The cluster tests run three real Apps
# (real Raft, real nats-servers); "an older server" is one of them registered again as a
# riverlog before versions registers (a Server with no version: 1), which is all the others
# ever see of a server's version. No mocks.
from __future__ import annotations

import asyncio
import dataclasses
import pickle

import pytest

from _apps import stub_of, until
from riverlog.broker import StreamConfig
from riverlog.cluster import features
from riverlog.cluster import state as s
from riverlog.cluster.metadata import TRANSITIONS  # every command Raft applies
from riverlog.errors import ClusterUnavailableError, StreamExistsError
from riverlog.protocol.liftbridge import api_pb2 as pb
from test_forward_batch import _publish, _roles, _stored


def _state(**versions: int) -> s.ClusterState:
    state = s.ClusterState()
    for server_id, version in versions.items():
        state, _ = s.add_server(state, s.Server(server_id, {}, version))
    return state


def test_the_cluster_version_is_the_lowest_announced():
    assert features.cluster_version(s.ClusterState()) == features.VERSION
    assert features.cluster_version(_state(a=2, b=2, c=2)) == 2
    mixed = _state(a=2, b=1, c=2)
    assert features.cluster_version(mixed) == 1
    assert not features.active(mixed, features.FORWARD_BATCH)
    assert not features.active(mixed, features.SUPER_STREAM_COMMANDS)
    with pytest.raises(features.FeatureNotActive, match="cluster version 2.*at 1: a 2, b 1"):
        features.check_command(mixed, "bind_super_stream")
    features.check_command(mixed, "create_stream")  # version 1: any cluster
    upgraded, _ = s.add_server(mixed, s.Server("b", {}, 2))  # b registers again, upgraded
    assert features.table(upgraded)["features"] == {  # a cluster at 2 lacks those of 3
        name: {"version": need, "active": need <= 2} for name, need in features.FEATURES.items()}
    assert not features.active(upgraded, features.POLICIES)
    with pytest.raises(KeyError):
        features.active(upgraded, "no such feature")


def test_every_versioned_command_is_a_command_and_every_feature_has_a_version():
    assert set(features.COMMAND_VERSIONS) <= set(TRANSITIONS)
    assert all(1 < v <= features.VERSION for v in features.FEATURES.values())
    assert all(v in features.FEATURES.values() for v in features.COMMAND_VERSIONS.values())


def test_a_registration_without_a_version_is_version_1_and_newer_fields_are_dropped():
    """The pickled Server of a riverlog before versions holds (id, doors); a newer one's may
    hold fields after the version: read, those are dropped (its registration still counts)."""
    older = s.Server.__new__(s.Server)
    older.__setstate__(["old", {"raft": s.Door("h", 1)}])
    assert older.version == 1 and older.doors == {"raft": s.Door("h", 1)}
    newer = s.Server.__new__(s.Server)
    newer.__setstate__(["new", {}, 3, "a field of version 3"])
    assert (newer.id, newer.version) == ("new", 3)
    state, added = s.add_server(s.ClusterState(), pickle.loads(pickle.dumps(
        s.Server("x", {}, 2))))
    assert added.version == 2 and state.servers["x"].version == 2


def test_metadata_with_fields_this_riverlog_does_not_know_is_refused():
    """A Raft snapshot of a newer riverlog's ClusterState with fields its features wrote is
    refused, never read without them (empty ones, as while an upgrade is under way, are
    dropped); one of an older riverlog (fewer fields) takes the defaults."""
    state = _state(a=2)
    values = [getattr(state, f.name) for f in dataclasses.fields(state)]
    fresh = s.ClusterState.__new__(s.ClusterState)
    with pytest.raises(s.NewerMetadata, match="a newer riverlog's feature wrote them"):
        fresh.__setstate__(values + [{"vhost": "written by a feature"}])
    fresh.__setstate__(values + [{}, 0, None])  # a newer one's fields, still empty: read
    assert fresh == state
    fresh.__setstate__(values[:2])
    assert fresh.servers == state.servers and fresh.super_streams == {}


async def _announce(cluster, index: int, version: int) -> None:
    """Register cluster[index] again announcing ``version``; wait until all applied it."""
    app = cluster[index]
    me = app.cluster.placement.state.servers[app.config.cluster.server_id]
    await app.cluster.placement.submit(
        "add_server", server=dataclasses.replace(me, version=version))
    await until(f"version {version} applied", lambda: all(
        x.cluster.placement.state.servers[me.id].version == version for x in cluster))


async def test_servers_announce_their_version_and_a_feature_waits_for_all(cluster):
    await until("all registered", lambda: all(
        len(x.cluster.placement.state.servers) == 3 for x in cluster))
    for app in cluster:
        assert features.table(app.cluster.placement.state)["servers"] == {
            x.config.cluster.server_id: features.VERSION for x in cluster}
        assert app.broker.placement.has_feature(features.FORWARD_BATCH)
    await _announce(cluster, 2, 1)
    for app in cluster:
        assert not app.broker.placement.has_feature(features.FORWARD_BATCH)
    with pytest.raises(features.FeatureNotActive):  # never submitted: older servers ignore it
        await cluster[0].cluster.metadata.submit(
            "bind_super_stream", name="x", partition="y", binding_key="k", index=0)


async def test_super_streams_use_the_older_commands_while_an_older_server_is_in(cluster):
    await until("all registered", lambda: all(
        len(x.cluster.placement.state.servers) == 3 for x in cluster))
    await _announce(cluster, 1, 1)
    app = cluster[0]
    placement = app.broker.placement
    raft = app.cluster.metadata
    config = StreamConfig(replication_factor=3)

    def counts(before: dict) -> dict:
        after = raft.applied_commands()
        return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}

    before = raft.applied_commands()
    await placement.create_super_stream_with_streams("old", ("o0", "o1"), ("a", "b"), config)
    assert counts(before) == {"create_stream": 2, "create_super_stream": 1}
    await until("old everywhere", lambda: all(
        x.broker.placement.super_streams().get("old") is not None for x in cluster))
    await placement.create_stream("o2", config)
    before = raft.applied_commands()
    await placement.bind_super_stream("old", "o2", "c", 1)
    assert counts(before) == {"delete_super_stream": 1, "create_super_stream": 1}
    assert placement.super_streams()["old"].partitions == ("o0", "o2", "o1")
    before = raft.applied_commands()
    await placement.delete_super_stream_with_streams("old")
    assert counts(before) == {"delete_super_stream": 1, "delete_stream": 3}
    await placement.create_stream("taken", config)  # a partition name taken: the older way
    with pytest.raises(StreamExistsError):  # deletes the partitions it made before
        await placement.create_super_stream_with_streams("bad", ("b0", "taken"), ("a", "b"),
                                                         config)
    assert "b0" not in placement.streams() and "bad" not in placement.super_streams()

    await _announce(cluster, 1, features.VERSION)  # upgraded: the one-entry commands
    before = raft.applied_commands()
    await placement.create_super_stream_with_streams("new", ("n0", "n1"), ("a", "b"), config)
    await placement.delete_super_stream_with_streams("new")
    assert counts(before) == {"create_super_stream_with_streams": 1,
                              "delete_super_stream_with_streams": 1}


async def test_virtual_hosts_wait_until_every_server_has_them(cluster):
    """An older server refuses put_vhost (its access table would differ from the others'):
    while one is in, a virtual host change is refused before Raft (503 on the management
    API), permissions on "/" still change; once upgraded, the change goes through."""
    await until("all registered", lambda: all(
        len(x.cluster.placement.state.servers) == 3 for x in cluster))
    await _announce(cluster, 2, 1)
    access = cluster[0].access
    with pytest.raises(ClusterUnavailableError, match="finish the upgrade"):
        await access.change("put_vhost", name="v1")
    with pytest.raises(ClusterUnavailableError, match="finish the upgrade"):
        await access.change("set_permissions", user="guest", configure=".*", write=".*",
                            read=".*", vhost="v1")
    assert await access.change("put_user", name="ann", password_hash="")
    await _announce(cluster, 2, features.VERSION)
    assert await access.change("put_vhost", name="v1")
    await until("v1 everywhere", lambda: all(x.guard.runtime.has_vhost("v1")
                                             for x in cluster))


async def test_publish_async_goes_enveloped_while_an_older_server_is_in(cluster):
    """A follower forwards each request enveloped to its partition's subject (what an older
    leader takes) while any server is older, and in batches once all announce version 2:
    the same answers either way."""
    channels = [stub_of(app) for app in cluster]
    stubs = [stub for _, stub in channels]
    try:
        lead, follow = await _roles(cluster, stubs, "fo", minIsr=pb.NullableInt32(value=2))
        await _announce(cluster, lead, 1)  # the leader is the older one
        n = 600
        answers = await _publish(stubs[follow], [pb.PublishRequest(
            stream="fo", value=b"v%d" % i, correlationId=f"c{i}", ackPolicy=pb.AckPolicy.ALL)
            for i in range(n)], chunk=100)
        assert [(a.correlationId, a.ack.offset, a.HasField("asyncError")) for a in answers] == [
            (f"c{i}", i, False) for i in range(n)]
        assert cluster[lead].forwarded.batches == 0  # none sent on the forward subject
        await _announce(cluster, lead, features.VERSION)
        answers = await _publish(stubs[follow], [pb.PublishRequest(
            stream="fo", value=b"v%d" % i, correlationId=f"c{i}", ackPolicy=pb.AckPolicy.ALL)
            for i in range(n, 2 * n)], chunk=100)
        assert [(a.correlationId, a.ack.offset) for a in answers] == [
            (f"c{i}", i) for i in range(n, 2 * n)]
        assert cluster[lead].forwarded.batches > 0
        assert await _stored(stubs[lead], "fo", 2 * n) == [(i, b"v%d" % i) for i in range(2 * n)]
    finally:
        for channel, _ in channels:
            await channel.close()


async def test_a_call_that_began_enveloped_stays_so_when_the_feature_starts(cluster):
    """Requests of one PublishAsync call keep their order across the feature's start: a call
    that forwarded enveloped goes on so (a batch could overtake the enveloped requests still
    travelling); the next call uses batches."""
    channels = [stub_of(app) for app in cluster]
    stubs = [stub for _, stub in channels]
    try:
        lead, follow = await _roles(cluster, stubs, "fs", minIsr=pb.NullableInt32(value=2))
        await _announce(cluster, lead, 1)
        half = asyncio.Event()
        upgraded = asyncio.Event()

        async def requests():
            for i in range(400):
                if i == 200:
                    half.set()
                    await upgraded.wait()
                yield pb.PublishRequest(stream="fs", value=b"v%d" % i, correlationId=f"c{i}",
                                        ackPolicy=pb.AckPolicy.ALL)
                if i % 50 == 49:
                    await asyncio.sleep(0.01)

        async def upgrade():
            await half.wait()
            await _announce(cluster, lead, features.VERSION)
            upgraded.set()
        answers, _ = await asyncio.gather(
            _answers(stubs[follow].PublishAsync(requests(), timeout=60)), upgrade())
        assert [(a.correlationId, a.ack.offset) for a in answers] == [
            (f"c{i}", i) for i in range(400)]
        assert cluster[lead].forwarded.batches == 0
        await _publish(stubs[follow], [pb.PublishRequest(
            stream="fs", value=b"w", correlationId="next", ackPolicy=pb.AckPolicy.ALL)])
        assert cluster[lead].forwarded.batches == 1
    finally:
        for channel, _ in channels:
            await channel.close()


async def _answers(call) -> list:
    return [answer async for answer in call]
