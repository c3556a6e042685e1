# Adding a server to a running cluster (Liftbridge's Raft join, riverlog/cluster/join.py):
# three real Apps bootstrapped with static peers, a fourth with neither seed nor peers that
# asks to join on `<namespace>.raft.metadata.join` over the shared NATS cluster, becomes a
# Raft member, holds a replica of a stream created afterwards with replicationFactor -1 and
# receives its records; restarted, it starts from its journal and members file without
# asking again, and a bootstrapped member restarted with its static peers knows it from its
# journal. A join request that fails its authentication changes nothing; a server no leader
# answers stops with the reason. `riverlog cluster remove-server` takes a server out of the
# Raft and the metadata again. No mocks.
from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import time

import pytest

from _apps import IDS, joiner_config, replica_bytes, stub_of, until
from riverlog.broker import StreamConfig
from riverlog.cluster import join
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.envelope import decode_internal, encode_message, MsgType
from riverlog.server.app import App

NAMESPACE = "liftbridge-default"


async def _publish_all(stub, stream: str, values: list[bytes]) -> list[int]:
    """Publish ``values`` to partition 0 of ``stream`` with AckPolicy.ALL; their offsets."""
    offsets = []
    for value in values:
        response = await stub.Publish(pb.PublishRequest(
            stream=stream, value=value, ackPolicy=pb.AckPolicy.ALL), timeout=30)
        offsets.append(response.ack.offset)
    return offsets


async def test_a_server_joins_a_running_cluster_and_rejoins_from_its_journal(cluster, tmp_path):
    asked: list[bytes] = []  # join requests, as a member's own NATS connection sees them

    async def seen(msg) -> None:
        asked.append(msg.data)
    await cluster[0].nats_link.nc.subscribe(join.subject(NAMESPACE), cb=seen)
    config = joiner_config(tmp_path, cluster)
    joiner = App(config)
    await joiner.start()
    try:
        everyone = [*cluster, joiner]
        await until("d registered on every server and caught up", lambda: all(
            a.broker.placement.servers() == (*IDS, "d") for a in everyone)
            and joiner.broker.placement.caught_up)
        members = tuple(sorted(a.config.cluster.raft_address for a in everyone))
        await until("four Raft members everywhere", lambda: all(
            a.cluster.metadata.members() == members for a in everyone))
        assert len(asked) >= 1
        decoded = decode_internal(asked[-1], MsgType.RaftJoinRequest)
        assert (decoded.nodeID, decoded.nodeAddr) == ("d", config.cluster.raft_address)

        channel, stub = stub_of(cluster[1])
        async with channel:
            await stub.CreateStream(pb.CreateStreamRequest(
                name="everywhere", subject="everywhere", replicationFactor=-1), timeout=30)
            placed = await until("the stream applied on the first member",
                                 lambda: cluster[0].broker.placement.of("everywhere", 0))
            assert sorted(placed.replicas) == [*IDS, "d"]
            await until("d holds its replica", lambda: "everywhere" in joiner.broker.streams)
            assert await _publish_all(stub, "everywhere", [b"one", b"two"]) == [0, 1]
            leader = everyone[[*IDS, "d"].index(placed.leader)]
            await until("d committed both records", lambda: joiner.broker.streams[
                "everywhere"].partitions[0].committed_offset == 1)
            assert replica_bytes(joiner, "everywhere") == replica_bytes(leader, "everywhere")

            # restarted, d starts from its journal and members file: no join request
            await joiner.stop()
            before = len(asked)
            if placed.leader != "d":
                assert await _publish_all(stub, "everywhere", [b"three"]) == [2]
            joiner = App(config)
            await joiner.start()
            everyone[-1] = joiner
            await until("d caught up again", lambda: joiner.broker.placement.caught_up)
            assert joiner.cluster.metadata.members() == members
            assert joiner.broker.placement.of("everywhere", 0).replicas == placed.replicas
            leader = None
            await until("one leader holds everything committed", lambda: all(
                a.broker.placement.of("everywhere", 0).leader is not None for a in everyone))
            leader_id = cluster[0].broker.placement.of("everywhere", 0).leader
            leader = everyone[[*IDS, "d"].index(leader_id)]
            end = leader.broker.streams["everywhere"].partitions[0].committed_offset
            await until("d holds what the leader committed", lambda: joiner.broker.streams[
                "everywhere"].partitions[0].committed_offset == end)
            assert replica_bytes(joiner, "everywhere") == replica_bytes(leader, "everywhere")
            assert len(asked) == before

            # a bootstrapped member restarted with its static peers learns of d from its
            # own journal
            member = cluster[2]
            await member.stop()
            cluster[2] = App(member.config)
            await cluster[2].start()
            await until("c caught up", lambda: cluster[2].broker.placement.caught_up)
            assert cluster[2].cluster.metadata.members() == members
    finally:
        await joiner.stop()


async def test_an_unauthenticated_join_request_adds_no_member(cluster):
    """A join request without the HMAC of the Raft password, with a wrong one, or signed
    right but sent too long ago (replayed) is dropped by the Raft leader: no answer, the
    membership stays the same."""
    nc = cluster[0].nats_link.nc
    request = encode_message(pb.RaftJoinRequest(nodeID="x", nodeAddr="127.0.0.1:1"))
    members = cluster[0].cluster.metadata.members()
    replayed = join.request_headers("pw", request, now=time.time() - 2 * join.JOIN_FRESH_S)
    for headers in (None, {join.NONCE_HEADER: "n", join.AUTH_HEADER: "00" * 32}, replayed):
        with pytest.raises(asyncio.TimeoutError):
            await nc.request(join.subject(NAMESPACE), request, timeout=2, headers=headers)
    assert all(a.cluster.metadata.members() == members for a in cluster)
    assert len(members) == 3


async def _remove_server(address: str, member: str, password: str) -> tuple[int, str]:
    """`riverlog cluster remove-server ADDRESS --member MEMBER`, the password in the
    environment; (exit code, output)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "riverlog", "cluster", "remove-server", address, "--member",
        member, env={**os.environ, "LIFTBRIDGE_RIVERLOG_RAFT_PASSWORD": password},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode, out.decode()


async def test_remove_server_takes_a_server_out_of_raft_and_metadata(cluster, tmp_path):
    """`riverlog cluster remove-server` takes the joined server out of every member's Raft
    (pysyncobj's admin request, with the Raft password) and the Raft leader takes it out of
    the metadata: a stream made afterwards with replicationFactor -1 leaves it out. A wrong
    password and the Raft leader's own address are refused with a clear error."""
    joiner = App(joiner_config(tmp_path, cluster))
    await joiner.start()
    try:
        await until("d registered on every server", lambda: all(
            a.broker.placement.servers() == (*IDS, "d") for a in cluster))
        d = joiner.config.cluster.raft_address
        first = cluster[0].config.cluster.raft_address
        code, out = await _remove_server(d, first, "wrong")
        assert code != 0 and f"no answer from the Raft member at {first}" in out
        leader = next(a for a in cluster if a.cluster.metadata.is_leader)
        other = next(a for a in cluster if a is not leader)
        code, out = await _remove_server(leader.config.cluster.raft_address,
                                         other.config.cluster.raft_address, "pw")
        assert code != 0 and "the Raft did not remove" in out
        code, out = await _remove_server(d, other.config.cluster.raft_address, "pw")
        assert code == 0, out
        three = tuple(sorted(a.config.cluster.raft_address for a in cluster))
        await until("d out of every member's Raft and metadata", lambda: all(
            a.cluster.metadata.members() == three and a.broker.placement.servers() == IDS
            for a in cluster))
        await cluster[0].broker.placement.create_stream(
            "after", StreamConfig(subject="after", replication_factor=-1))
        assert sorted(cluster[0].broker.placement.of("after", 0).replicas) == list(IDS)
    finally:
        await joiner.stop()


async def test_a_server_that_cannot_join_stops_with_the_reason(cluster, tmp_path):
    """With another Raft password its nats-server's routes are refused (their password
    derives from it) and no leader hears it: after its attempts it stops with RaftJoinError
    naming the subject and what to check; the cluster is unchanged."""
    joiner = App(joiner_config(tmp_path, cluster, password="other"))
    joiner.cluster.join_attempts = 2
    with pytest.raises(join.RaftJoinError, match=r"could not join the cluster on "
                       r"liftbridge-default\.raft\.metadata\.join after 2 attempts: no Raft "
                       r"leader answered"):
        await joiner.start()
    assert not os.path.exists(tmp_path / "d" / "raft" / "members")
    assert all(a.broker.placement.servers() == IDS and len(a.cluster.metadata.members()) == 3
               for a in cluster)


async def test_servers_join_a_seed_alone(tmp_path):
    """Liftbridge's usual start: one server with --raft-bootstrap-seed, the others join it.
    The seed's Raft cannot commit the second member's addition without that member (a
    majority of two is both), so the leader answers once it holds the addition, and the
    joiner's start commits it; a third server then joins the two."""
    seed_config = joiner_config(tmp_path, [], server_id="a")
    seed_config = dataclasses.replace(seed_config, cluster=dataclasses.replace(
        seed_config.cluster, bootstrap_seed=True))
    apps = [App(seed_config)]
    try:
        await apps[0].start()
        for server_id in ("b", "c"):
            apps.append(App(joiner_config(tmp_path, apps, server_id=server_id)))
            await apps[-1].start()
        members = tuple(sorted(a.config.cluster.raft_address for a in apps))
        await until("three members, registered and caught up everywhere", lambda: all(
            a.cluster.metadata.members() == members and a.broker.placement.caught_up
            and a.broker.placement.servers() == ("a", "b", "c") for a in apps))
    finally:
        await asyncio.gather(*(a.stop() for a in apps), return_exceptions=True)
