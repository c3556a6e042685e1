"""The management API in a cluster: any server answers /api/queues and /api/nodes for the
whole cluster from the Raft metadata (leader, members, ISR), its own replica's figures where
it holds one; connections and publishers are per server, as RabbitMQ lists them per node."""
from __future__ import annotations

import asyncio

import pytest
from rstream import Producer

from riverlog.broker import StreamConfig
from riverlog.cluster.node import ClusterPlacement
from riverlog.errors import ReservedStreamError

from _apps import created, until
from server.test_management import call


async def test_any_server_answers_for_the_cluster(cluster):
    placement = await created(cluster, "one", replication_factor=1)
    holder = next(x for x in cluster if x.broker.placement.server_id == placement.leader)
    other = next(x for x in cluster if x is not holder)
    host, port = holder.rabbitmq_stream.advertised
    async with Producer(host, port, username="guest", password="guest",
                        connection_name="cluster-producer") as producer:
        for i in range(5):
            await producer.send_wait("one", b"m%d" % i)

        status, nodes = await call(other, "GET", "/api/nodes")
        assert status == 200
        names = sorted(n["name"] for n in nodes)
        assert [n.split("@")[0] for n in names] == ["a", "b", "c"]
        assert all(n["running"] for n in nodes)

        async def listed():
            status, queue = await call(other, "GET", "/api/queues/%2F/one")
            return queue if status == 200 else None
        queue = await until("'one' listed on a server without its replica", listed)
        leader_node = next(n for n in names if n.startswith(f"{placement.leader}@"))
        assert queue["leader"] == queue["node"] == leader_node
        assert queue["members"] == [leader_node] and queue["online"] == [leader_node]
        assert "messages" not in queue  # no replica here: the holder's figures are its own

        async def committed():
            status, queue = await call(holder, "GET", "/api/queues/%2F/one")
            return queue.get("messages") == 5 and queue
        assert (await until("5 messages on the holder", committed))["segments"] == 1

        status, here = await call(holder, "GET", "/api/stream/publishers")
        assert [p["queue"]["name"] for p in here] == ["one"]
        assert (await call(other, "GET", "/api/stream/publishers"))[1] == []


async def test_the_placement_refuses_the_reserved_streams():
    """No caller of the cluster placement (the management API, a door) creates or deletes
    __cursors or __activity: deleting __cursors would wipe every stored cursor. The
    cluster's own creation of its internal streams (``internal=True``) is not refused."""
    placement = ClusterPlacement("a")  # no Raft: the check comes before any submit
    for name in ("__cursors", "__activity"):
        with pytest.raises(ReservedStreamError, match="reserved"):
            await placement.create_stream(name, StreamConfig())
        with pytest.raises(ReservedStreamError, match="reserved"):
            await placement.delete_stream(name)
    with pytest.raises(Exception) as raised:
        await placement.create_stream("__cursors", StreamConfig(), internal=True)
    assert not isinstance(raised.value, ReservedStreamError)


async def test_without_a_raft_leader_changes_are_503(cluster):
    """With two of three servers stopped the last has no Raft leader: declaring a queue or
    an exchange and binding answer 503 service_unavailable with the reason (after the
    metadata's wait for an outcome), not a 500 with a traceback."""
    survivor = cluster[0]
    await created(cluster, "one", replication_factor=3)
    assert (await call(survivor, "PUT", "/api/exchanges/%2F/sup", json={}))[0] == 201
    await until("'sup' applied everywhere", lambda: all(
        "sup" in x.broker.placement.super_streams() for x in cluster))
    await asyncio.gather(*(x.stop() for x in cluster[1:]))
    answers = await asyncio.gather(
        call(survivor, "PUT", "/api/queues/%2F/two", json={"arguments": {}}),
        call(survivor, "PUT", "/api/exchanges/%2F/sup2", json={}),
        call(survivor, "POST", "/api/bindings/%2F/e/sup/q/one", json={"routing_key": "k"}),
        call(survivor, "DELETE", "/api/queues/%2F/one"))
    for status, error in answers:
        assert status == 503 and error["error"] == "service_unavailable", (status, error)
        assert "Raft" in error["reason"]


async def test_exchange_and_bindings_are_one_raft_entry_each(cluster):
    """The management API's super stream path in a cluster (issue 31 item 4): declaring the
    exchange is one create_super_stream entry and each binding one bind_super_stream entry
    that inserts at the binding's x-stream-partition-order (never a delete and a create of
    the super stream, between which it was missing); every server lists the same order."""
    for name in ("p0", "p1", "p2"):
        await created(cluster, name)
    server = cluster[1]
    raft = server.cluster.metadata
    before = raft.applied_commands()
    assert (await call(server, "PUT", "/api/exchanges/%2F/ordered", json={}))[0] == 201
    for queue, order in (("p2", 2), ("p0", 0), ("p1", 1)):
        status, _ = await call(server, "POST", f"/api/bindings/%2F/e/ordered/q/{queue}",
                               json={"routing_key": f"k{order}",
                                     "arguments": {"x-stream-partition-order": order}})
        assert status == 201
    assert (await call(server, "POST", "/api/bindings/%2F/e/ordered/q/p1",
                       json={"routing_key": "again"}))[0] == 400  # bound already
    await until("the bindings everywhere", lambda: all(
        (found := x.broker.placement.super_streams().get("ordered")) is not None
        and found.partitions == ("p0", "p1", "p2") for x in cluster))
    assert cluster[0].broker.placement.super_streams()["ordered"].binding_keys == (
        "k0", "k1", "k2")
    after = raft.applied_commands()
    counts = {name: after.get(name, 0) - before.get(name, 0) for name in (
        "create_super_stream", "bind_super_stream", "delete_super_stream")}
    assert counts == {"create_super_stream": 1, "bind_super_stream": 3,  # the refused
                      "delete_super_stream": 0}  # bind was refused before Raft
