# `riverlog cluster up`: three real `riverlog serve` processes on free ports, used through
# gufo-liftbridge and riverlog's generated gRPC stub: the printed table says where each door
# listens, a stream made through one server is on all three, the metadata survives a SIGKILL
# of the Raft leader's process (the two left still create streams), and SIGTERM stops every
# server. Waits are generous polls, never timed assertions.
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request

import grpc
import pytest

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


async def test_a_restarted_leader_leads_nothing_before_it_caught_up_with_raft(tmp_path):
    # A member starting again holds its streams' folders, and its Raft state (none yet, or
    # its journal replayed) names it the leader of the partition it led before its SIGKILL.
    # Until it has caught up with the Raft log it must take no write (the others elected
    # another leader meanwhile): here the two others are stopped, so it cannot catch up; a
    # LEADER publish it acked would be truncated once it follows the new leader.
    from riverlog.cluster.local import LocalCluster
    cluster = LocalCluster(str(tmp_path / "cluster"), 3)
    cluster.start()
    try:
        await asyncio.to_thread(cluster.wait_registered)
        grpc_of = {m.id: f"{m.host}:{m.ports['grpc']}" for m in cluster.members}
        async with grpc.aio.insecure_channel(grpc_of["s0"]) as channel:
            await api_pb2_grpc.APIStub(channel).CreateStream(pb.CreateStreamRequest(
                name="orders", subject="orders", replicationFactor=3), timeout=30)

        async def leader_seen_by(server_id: str) -> str | None:
            meta = await with_stream(grpc_of[server_id], "orders")
            return meta and [s for s in meta.streamMetadata
                             if s.name == "orders"][0].partitions[0].leader
        old = await until("a leader", lambda: leader_seen_by("s0"))
        index = [m.id for m in cluster.members].index(old)
        cluster.procs[index].kill()
        cluster.procs[index].wait()
        others = [m.id for m in cluster.members if m.id != old]

        async def new_leader():
            leader = await leader_seen_by(others[0])
            return leader if leader not in ("", old) else None
        await until("another leader", new_leader)
        for i, proc in enumerate(cluster.procs):
            if i != index:
                proc.send_signal(signal.SIGSTOP)
        cluster.restart(index)
        await until("the restarted server serving", lambda: with_stream(grpc_of[old], "orders"))
        async with grpc.aio.insecure_channel(grpc_of[old]) as channel:
            with pytest.raises(grpc.aio.AioRpcError):
                await api_pb2_grpc.APIStub(channel).Publish(pb.PublishRequest(
                    stream="orders", value=b"stale", ackPolicy=pb.LEADER), timeout=5)
        for i, proc in enumerate(cluster.procs):
            if i != index:
                proc.send_signal(signal.SIGCONT)

        async def follows():  # caught up: it names the leader the others elected
            leader = await leader_seen_by(old)
            return leader if leader not in ("", old) else None
        assert await until("the restarted server caught up", follows) in others
    finally:
        for proc in cluster.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
        cluster.stop()


def test_cluster_up_serves_metrics_where_its_table_says(tmp_path):
    # every door of a member listens on --host, /metrics too: on 127.0.0.2 (a loopback
    # address other than the default one) the table's metrics address answers
    proc = subprocess.Popen([sys.executable, "-m", "riverlog", "cluster", "up", "--servers",
                             "1", "-d", str(tmp_path / "cluster"), "--host", "127.0.0.2"],
                            stdout=subprocess.PIPE, text=True)
    try:
        rows = read_table(proc)
        assert rows["s0"]["metrics"].startswith("127.0.0.2:")
        with urllib.request.urlopen(f"http://{rows['s0']['metrics']}/metrics",
                                    timeout=WAIT_S) as response:
            assert b"riverlog_raft_leader" in response.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
