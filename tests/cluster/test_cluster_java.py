"""RabbitMQ's Java stream client (tests/compat/java, the `java_client` fixture) against one
real 3-server cluster (`riverlog cluster up`, shared by the module): where the client connects
(the locator where it is told, the producer on the partition's leader, the consumer on a
replica, as it picks them from Metadata and the servers' advertised host and port), then a
SIGKILL of the leader while it publishes and consumes: no confirmed message is lost and the
client goes on with the new leader. Waits are generous polls, never timed assertions."""
from __future__ import annotations

import os
import signal

import pytest

from _cluster import WAIT_S, read_table, start_cluster_up, stop_cluster_up, until, with_stream
from compat._helpers import stream_name
from compat._java import assert_recovered

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """`riverlog cluster up`'s table (server id -> column -> value) of a cluster kept for
    the module."""
    proc = start_cluster_up(tmp_path_factory.mktemp("java-cluster") / "cluster")
    try:
        yield read_table(proc)
    finally:
        stop_cluster_up(proc)


async def leader_of(rows, stream: str, asked: str) -> str | None:
    """The server id leading partition 0 of ``stream`` per ``asked``'s FetchMetadata."""
    meta = await until(f"{stream} at {asked}",
                       lambda: with_stream(rows[asked]["Liftbridge gRPC"], stream))
    (part,) = [s for s in meta.streamMetadata if s.name == stream][0].partitions.values()
    return part.leader or None


def stream_address(rows, server_id: str) -> str:
    return rows[server_id]["RabbitMQ Stream"]


async def test_the_client_finds_the_leader_and_a_replica(rows, java_client):
    host, port = stream_address(rows, "s0").rsplit(":", 1)
    stream = stream_name("java-placement")
    r = await java_client.run("placement", host, int(port), stream=stream, replicas=3)
    leader = await leader_of(rows, stream, "s0")
    followers = {stream_address(rows, s) for s in rows if s != leader}
    assert r["locator"] == [stream_address(rows, "s0")]
    assert set(r["producer"]) == {stream_address(rows, leader)}  # publishers: the leader only
    # the client prefers a replica for consumers; the servers advertise where they listen
    assert r["consumer"] and set(r["consumer"]) <= followers, (r["consumer"], followers)
    assert r["confirmed"] == 100
    assert r["bodies"] == [f"m-{i}" for i in range(100)]


async def test_nothing_confirmed_is_lost_when_the_leader_is_killed(rows, java_client):
    stream = stream_name("java-kill")
    host, port = stream_address(rows, "s0").rsplit(":", 1)
    session = await java_client.start("through_fault", host, int(port), stream=stream,
                                      replicas=3,
                                      addresses=[stream_address(rows, s) for s in sorted(rows)])
    try:
        await session.event("publishing")
        leader = await leader_of(rows, stream, "s0")
        os.kill(int(rows[leader]["pid"]), signal.SIGKILL)
        survivor = next(s for s in sorted(rows) if s != leader)

        async def new_leader():
            elected = await leader_of(rows, stream, survivor)
            return elected if elected not in (None, leader) else None
        elected = await until("a new leader", new_leader)
        await session.send("done")
        r = await session.result(timeout=WAIT_S + 60)
    finally:
        await session.close()
    assert_recovered(r)
    # the producer went on with the new leader, found through Metadata
    assert stream_address(rows, elected) in r["addresses_after"], (elected, r["addresses_after"])
