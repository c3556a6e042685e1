# What consumers keep on the servers, in a cluster of three real Apps (the `cluster` fixture),
# driven by real clients: RabbitMQ stored offsets (rstream store_offset / query_offset) are
# tracking chunks replicated with the data, so a new leader after a failover answers them and
# a consumer never receives them; a server that does not lead the partition passes them to the
# leader, as RabbitMQ does. A super stream made through one server is in the Raft metadata: every
# server lists its partitions and routes its keys alike; a refused one leaves nothing. Liftbridge cursors live in the
# replicated `__cursors` stream of the metadata, and a new cursor leader serves them (gufo).
# No mocks; waits are polls.
from __future__ import annotations

import asyncio
import json

import pytest
from gufo.liftbridge.client import LiftbridgeClient
from rstream import (AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer,
                     SuperStreamProducer, amqp_decoder)
from rstream import exceptions as rexc

from _apps import IDS, WAIT_S, until
from compat._servers import HOST
from riverlog.broker import StreamConfig
from riverlog.broker.broker import CURSORS_STREAM
from riverlog.cluster.offsets import tracking_subject
from riverlog.log.chunk import CHUNK_TRACKING_DELTA

GUEST = {"username": "guest", "password": "guest"}


def door(app) -> tuple[str, int]:
    return HOST, app.rabbitmq_stream.port


async def new_leader_everywhere(apps, stream: str, old: str) -> str:
    """The id of partition 0's new leader, once every one of ``apps`` names it (clients
    connect to the leader a server names, and a server passes requests to it)."""
    def named():
        leaders = {app.broker.placement.of(stream, 0).leader for app in apps}
        return len(leaders) == 1 and leaders.isdisjoint({None, old}) and leaders.pop()
    return await until(f"one new leader of {stream} everywhere", named)


async def test_stored_offsets_survive_a_leader_failover(cluster):
    async with Producer(*door(cluster[0]), **GUEST) as producer:
        await producer.create_stream("offs", arguments={"initial-cluster-size": 3})
        for i in range(10):
            await producer.send_wait("offs", AMQPMessage(body=b"m%d" % i))
    leader_id = cluster[0].broker.placement.of("offs", 0).leader
    leader = cluster[IDS.index(leader_id)]
    followers = [app for app in cluster if app is not leader]

    # stored through a follower's door: it goes to the leader, which writes it in its log
    async with Consumer(*door(followers[0]), **GUEST) as consumer:
        await consumer.store_offset("offs", "app", 4)
        assert await until("the leader holds app's offset", lambda: leader.broker.streams[
            "offs"].partitions[0].offsets.query("app") == 4)
        assert await consumer.query_offset("offs", "app") == 4  # asked of the leader
    async with Consumer(*door(leader), **GUEST) as consumer:
        await consumer.store_offset("offs", "app", 7)
        await consumer.store_offset("offs", "other", 2)
        assert await consumer.query_offset("offs", "app") == 7
    part = leader.broker.streams["offs"].partitions[0]
    tracking = [c.header.first_offset for c in part.read_chunks(0, 1 << 20)
                if c.header.chunk_type == CHUNK_TRACKING_DELTA]
    assert len(tracking) == 3 and min(tracking) >= 10  # one offset each, after the data
    await until("every replica holds the stored offsets", lambda: all(
        (app.broker.streams["offs"].partitions[0].offsets.query("app"),
         app.broker.streams["offs"].partitions[0].offsets.query("other")) == (7, 2)
        for app in followers))

    await leader.stop()
    new_leader = cluster[IDS.index(await new_leader_everywhere(followers, "offs", leader_id))]
    other = next(app for app in followers if app is not new_leader)
    for app in (new_leader, other):  # through the new leader, and a follower asking it
        async with Consumer(*door(app), **GUEST) as consumer:
            assert await consumer.query_offset("offs", "app") == 7
            assert await consumer.query_offset("offs", "other") == 2

    # bad requests between servers get an error answer and change nothing
    nc, ns = new_leader.nats_link.nc, new_leader.nats_link.config.namespace
    for server, request, error in (
            (new_leader.config.cluster.server_id, b"not json", "bad-request"),
            (other.config.cluster.server_id, b'{"stream": "offs", "partition": 0, '
             b'"reference": "app", "offset": 1}', "not-leader"),
            (new_leader.config.cluster.server_id, b'{"stream": "offs", "partition": 0, '
             b'"reference": "app", "offset": -1}', "refused")):
        reply = await nc.request(tracking_subject(ns, server), request, timeout=10)
        assert json.loads(reply.data) == {"error": error}
    assert new_leader.broker.streams["offs"].partitions[0].offsets.query("app") == 7

    # a consumer receives the messages, never a tracking chunk (those lie between them)
    async with Consumer(*door(new_leader), **GUEST) as consumer:
        await consumer.store_offset("offs", "app", 9)  # the new leader stores on
        assert await consumer.query_offset("offs", "app") == 9
    async with Producer(*door(other), **GUEST) as producer:
        await producer.send_wait("offs", AMQPMessage(body=b"last"))
    received: list[tuple[int, bytes]] = []

    async def on_message(message, context):
        received.append((context.offset, bytes(message.body)))

    async with Consumer(*door(other), **GUEST) as consumer:
        await consumer.start()
        await consumer.subscribe("offs", on_message, decoder=amqp_decoder,
                                 offset_specification=ConsumerOffsetSpecification(
                                     OffsetType.FIRST))
        await until("the last message", lambda: received and received[-1][1] == b"last")
    assert received == [(i, b"m%d" % i) for i in range(10)] + [(14, b"last")]


async def _key(message: bytes) -> str:
    return message.decode()


def super_producer(app) -> SuperStreamProducer:
    return SuperStreamProducer(*door(app), **GUEST, super_stream="regions",
                               routing_extractor=_key)


async def test_a_super_stream_is_the_same_on_every_server(cluster):
    keys = ["eu", "us", "asia"]
    async with super_producer(cluster[0]) as producer:
        await producer.create_super_stream("regions", binding_keys=keys,
                                           arguments={"initial-cluster-size": 2})
    partitions = [f"regions-{k}" for k in keys]
    for app in cluster:
        async with super_producer(app) as producer:
            client = await producer.default_client

            async def listed():
                return await client.partitions("regions") == partitions
            await until(f"{app.config.cluster.server_id} lists the partitions", listed)
            for key in keys:
                assert await client.route(key, "regions") == [f"regions-{key}"]
            assert await client.route("mars", "regions") == []
    async with super_producer(cluster[2]) as producer:
        with pytest.raises(rexc.StreamAlreadyExists):  # made through another server
            await producer.create_super_stream("regions", binding_keys=keys)
    async with super_producer(cluster[1]) as producer:
        await producer.delete_super_stream("regions")
    for app in cluster:
        async with super_producer(app) as producer:  # rstream: no partitions for 0x02
            client = await producer.default_client

            async def gone():
                return await client.partitions("regions") == []
            await until(f"regions gone from {app.config.cluster.server_id}", gone)
        assert not any(p in app.broker.streams for p in partitions)


async def test_a_refused_super_stream_leaves_nothing_in_the_cluster(cluster):
    """A super stream and its partition streams are one Raft entry (issue 31 item 4); its
    refusals keep their codes and make nothing: a partition name taken on another server
    (seen only by the metadata's transition) 0x05, the super stream's name taken 0x05,
    counts that differ 0x11."""
    first = cluster[0]
    for i in range(3):  # one replica each, round robin: some on other servers than first
        await first.broker.placement.create_stream(f"taken-{i}", StreamConfig())
    elsewhere = next(f"taken-{i}" for i in range(3) if f"taken-{i}" not in first.broker.streams)
    async with super_producer(first) as producer:
        client = await producer.default_client
        await client.create_super_stream("ok", ["ok-0"], ["0"])
        with pytest.raises(rexc.StreamAlreadyExists):
            await client.create_super_stream("taken", ["fresh-0", "fresh-1", elsewhere],
                                             ["0", "1", "2"])
        with pytest.raises(rexc.StreamAlreadyExists):
            await client.create_super_stream("ok", ["new-0"], ["0"])
        with pytest.raises(rexc.PreconditionFailed):
            await client.create_super_stream("odd", ["odd-0", "odd-1"], ["0"])
    for app in cluster:
        placement = app.broker.placement
        await until(f"ok on {app.config.cluster.server_id}",
                    lambda p=placement: "ok" in p.super_streams())
        assert set(placement.super_streams()) == {"ok"}
        assert set(placement.streams()) - {CURSORS_STREAM} == {
            "ok-0", "taken-0", "taken-1", "taken-2"}


async def test_liftbridge_cursors_survive_a_cursor_leader_change(cluster):
    """``__cursors`` is a stream of the metadata with a replica on every server; gufo sets
    and fetches a cursor at its partition's leader, and after that leader stops, the new
    leader answers the same cursor and takes new ones."""
    async with LiftbridgeClient([f"{HOST}:{cluster[0].grpc.port}"]) as client:
        await client.wait_for_cursors()
        await asyncio.wait_for(client.set_cursor("orders", 0, "reader", 41), WAIT_S)
        assert await asyncio.wait_for(client.get_cursor("orders", 0, "reader"), WAIT_S) == 42
    placed = cluster[0].broker.placement.of(CURSORS_STREAM, 0)
    assert sorted(placed.replicas) == list(IDS)
    leader = cluster[IDS.index(placed.leader)]
    survivors = [app for app in cluster if app is not leader]
    await until("every replica holds the cursor", lambda: all(
        app.broker.streams[CURSORS_STREAM].partitions[0].committed_offset == 0
        for app in survivors))

    await leader.stop()
    await new_leader_everywhere(survivors, CURSORS_STREAM, placed.leader)
    for app in survivors:  # each asks the new leader
        async with LiftbridgeClient([f"{HOST}:{app.grpc.port}"]) as client:
            assert await asyncio.wait_for(client.get_cursor("orders", 0, "reader"),
                                          WAIT_S) == 42
    async with LiftbridgeClient([f"{HOST}:{survivors[1].grpc.port}"]) as client:
        await asyncio.wait_for(client.set_cursor("orders", 0, "reader", 99), WAIT_S)
        assert await asyncio.wait_for(client.get_cursor("orders", 0, "reader"), WAIT_S) == 100
