# `riverlog cluster up`: three real `riverlog serve` processes on free ports, used through
# gufo-liftbridge and riverlog's generated gRPC stub: the printed table says where each door
# listens, a stream made through one server is on all three, the metadata survives a SIGKILL
# of the Raft leader's process (the two left still create streams), and SIGTERM stops every
# server. Waits are generous polls, never timed assertions.
from __future__ import annotations

import asyncio
import os
import signal

import grpc

from _cluster import WAIT_S, cluster_up, metadata, raft_leader, read_table, until, with_stream
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc

__all__ = ["cluster_up"]  # the fixture, used by name


async def test_cluster_up_serves_and_survives_the_raft_leaders_kill(cluster_up, tmp_path):
    from gufo.liftbridge.client import LiftbridgeClient
    from gufo.liftbridge.types import AckPolicy
    rows = read_table(cluster_up)
    assert sorted(rows) == ["s0", "s1", "s2"]
    assert oct(os.stat(tmp_path / "cluster" / "raft-password").st_mode & 0o777) == "0o600"
    grpc_of = {s: row["Liftbridge gRPC"] for s, row in rows.items()}
    async with LiftbridgeClient([grpc_of["s1"]]) as client:
        await client.create_stream("orders", subject="orders", replication_factor=3,
                                   wait_for_stream=True)
        # at once: CreateStream returned once the leader said it leads (Liftbridge's
        # partition status request), so it listens. gufo publishes through its seed (s1): a
        # follower, unless s1 leads, sends it to the leader through NATS (no deadline, so no
        # ack is waited for)
        await client.publish(b"first", stream="orders", ack_policy=AckPolicy.LEADER)
        # cursors are each server's own (outside the metadata): the server asked leads them
        # (gufo retries for ever a cursor stream without a leader: bounded here)
        await asyncio.wait_for(client.set_cursor(stream="orders", partition=0,
                                                 cursor_id="c", offset=0), WAIT_S)
        assert await asyncio.wait_for(client.get_cursor(
            stream="orders", partition=0, cursor_id="c"), WAIT_S) == 1
    leaders = set()
    for address in grpc_of.values():
        meta = await until("orders everywhere", lambda a=address: with_stream(a, "orders"))
        assert len(meta.brokers) == 3
        (part,) = [s for s in meta.streamMetadata if s.name == "orders"][0].partitions.values()
        leaders.add(part.leader)
    assert len(leaders) == 1 and leaders <= set(rows)
    leader_address = grpc_of[leaders.pop()]

    async def stored():
        meta = await metadata(leader_address)
        (part,) = [s for s in meta.streamMetadata if s.name == "orders"][0].partitions.values()
        return part.newestOffset == 0
    await until("gufo's publish stored on the leader", stored)

    leader = await until("a Raft leader", lambda: asyncio.to_thread(raft_leader, rows))
    os.kill(int(rows[leader]["pid"]), signal.SIGKILL)
    left = [s for s in rows if s != leader]

    async def created() -> bool:
        async with grpc.aio.insecure_channel(grpc_of[left[0]]) as channel:
            try:
                await api_pb2_grpc.APIStub(channel).CreateStream(pb.CreateStreamRequest(
                    name="after", subject="after", replicationFactor=2), timeout=10)
            except grpc.aio.AioRpcError as exc:
                return exc.code() == grpc.StatusCode.ALREADY_EXISTS
            return True
    await until("a stream created without the old Raft leader", created)
    for server_id in left:
        meta = await until("after on the servers left",
                           lambda a=grpc_of[server_id]: with_stream(a, "after"))
        assert {s.name for s in meta.streamMetadata} >= {"orders", "after"}

    cluster_up.send_signal(signal.SIGTERM)
    assert cluster_up.wait(60) == 0
    for server_id in left:  # every server stopped with it
        assert await metadata(grpc_of[server_id]) is None
