# Real clients against one real 3-server cluster (`riverlog cluster up`, ports picked free):
# rstream through the RabbitMQ Stream door (create on any server with RabbitMQ's
# initial-cluster-size, a confirming Producer that finds the leader in Metadata, a Consumer
# that rstream places on a replica), gufo-liftbridge (RF=3, ALL acks, subscribe), nats-py
# (an enveloped publish with ALL acks and a plain one, each on any server's NATS, each stored
# once), then a SIGKILL of a partition leader while two publishers seeded at a follower run
# (gRPC Publish with ALL acks, rstream with confirms): every acknowledged message is on the new
# leader exactly once, and an offset stored through a follower before the kill is the new
# leader's. Waits are generous polls, never timed assertions.
from __future__ import annotations

import asyncio
import itertools
import os
import signal

import grpc
import nats
from gufo.liftbridge.client import LiftbridgeClient
from gufo.liftbridge.types import AckPolicy, StartPosition
from rstream import (AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType,
                     Producer, amqp_decoder)
from rstream.exceptions import OffsetNotFound, ServerError

from _cluster import WAIT_S, cluster_up, read_table, until, values, with_stream
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc
from riverlog.protocol.liftbridge.envelope import decode_ack, encode_publish

__all__ = ["cluster_up"]  # the fixture, used by name
GUEST = {"username": "guest", "password": "guest"}


def host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


async def partition(address: str, stream: str) -> pb.PartitionMetadata:
    """Partition 0 of ``stream`` in ``address``'s FetchMetadata, once it lists it."""
    meta = await until(f"{stream} at {address}", lambda: with_stream(address, stream))
    (part,) = [s for s in meta.streamMetadata if s.name == stream][0].partitions.values()
    return part


async def test_rstream_gufo_and_nats_py_against_three_servers(cluster_up):
    rows = read_table(cluster_up)
    stream_of = {s: host_port(row["RabbitMQ Stream"]) for s, row in rows.items()}
    grpc_of = {s: row["Liftbridge gRPC"] for s, row in rows.items()}

    # rstream: create through s2's door, a Producer seeded at s0 confirms every message
    async with Producer(*stream_of["s2"], **GUEST) as producer:
        await producer.create_stream("events", arguments={"initial-cluster-size": 3})
    part = await partition(grpc_of["s0"], "events")
    assert sorted(part.replicas) == ["s0", "s1", "s2"]
    async with Producer(*stream_of["s0"], **GUEST) as producer:
        for i in range(20):
            await producer.send_wait("events", AMQPMessage(body=b"e%d" % i))
    # confirmed = committed (RabbitMQ confirms after a quorum): the leader's high watermark
    assert (await partition(grpc_of[part.leader], "events")).highWatermark == 19
    received: list[bytes] = []
    got_all = asyncio.Event()

    async def on_message(message, context):
        received.append(bytes(message.body))
        if len(received) == 20:
            got_all.set()

    async with Consumer(*stream_of["s1"], **GUEST) as consumer:
        await consumer.start()
        await consumer.subscribe("events", on_message, decoder=amqp_decoder,
                                 offset_specification=ConsumerOffsetSpecification(
                                     OffsetType.FIRST))
        await asyncio.wait_for(got_all.wait(), WAIT_S)
    assert received == [b"e%d" % i for i in range(20)]

    # gufo-liftbridge: RF=3, ALL acks, subscribe
    async with LiftbridgeClient([grpc_of["s1"]]) as client:
        await client.create_stream("orders", subject="orders", replication_factor=3,
                                   minisr=2, wait_for_stream=True)
        acks = [r async for r in client.publish_bulk(  # PublishResponses
            client.get_publish_request(b"o%d" % i, stream="orders",
                                       ack_policy=AckPolicy.ALL) for i in range(10))]
        assert sorted(r.ack.offset for r in acks) == list(range(10))
        got = []
        async for message in client.subscribe("orders", partition=0, allow_isr=True,
                                              start_position=StartPosition.EARLIEST):
            got.append(message.value)
            if len(got) == 10:
                break
    assert got == [b"o%d" % i for i in range(10)]

    # nats-py: an enveloped ALL-ack publish and a plain one, on every server's NATS
    for server_id, row in rows.items():
        nc = await nats.connect(f"nats://{row['NATS']}")
        try:
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            await nc.publish("orders", encode_publish(pb.Message(
                value=b"n-" + server_id.encode(), ackInbox=inbox,
                ackPolicy=pb.AckPolicy.ALL)))
            ack = decode_ack((await sub.next_msg(timeout=WAIT_S)).data)
            assert ack.stream == "orders" and ack.offset >= 10
            await nc.publish("orders", b"plain-" + server_id.encode())
            await nc.flush()
        finally:
            await nc.drain()
    total = 10 + 2 * len(rows)

    async def stored():
        return (await partition(grpc_of["s0"], "orders")).highWatermark == total - 1
    await until("every NATS publish committed", stored)
    stored_values = await values(grpc_of["s2"], "orders", total - 1)
    for server_id in rows:  # each stored once
        assert stored_values.count(b"n-" + server_id.encode()) == 1
        assert stored_values.count(b"plain-" + server_id.encode()) == 1


async def stored_offset(consumer: Consumer, stream: str, reference: str) -> int | None:
    """QueryOffset (rstream raises for "no offset"): None when none is stored."""
    try:
        return await consumer.query_offset(stream, reference)
    except OffsetNotFound:
        return None


async def test_nothing_acknowledged_is_lost_when_the_leader_is_killed(cluster_up):
    rows = read_table(cluster_up)
    grpc_of = {s: row["Liftbridge gRPC"] for s, row in rows.items()}
    async with grpc.aio.insecure_channel(grpc_of["s0"]) as channel:
        await api_pb2_grpc.APIStub(channel).CreateStream(pb.CreateStreamRequest(
            name="kill", subject="kill", replicationFactor=3,
            minIsr=pb.NullableInt32(value=2)), timeout=WAIT_S)
    leader = (await partition(grpc_of["s0"], "kill")).leader
    publisher_id = next(s for s in rows if s != leader)  # a follower, forwarding to the leader
    acked: dict[str, list[bytes]] = {"grpc": [], "rstream": []}
    stop = asyncio.Event()

    async def publish_grpc():
        async with grpc.aio.insecure_channel(grpc_of[publisher_id]) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            for attempt in itertools.count():
                if stop.is_set():
                    return
                value = b"g%d" % attempt  # a retry is a new value: each is acked at most once
                try:
                    await stub.Publish(pb.PublishRequest(
                        stream="kill", value=value, ackPolicy=pb.AckPolicy.ALL), timeout=10)
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.1)
                    continue
                acked["grpc"].append(value)

    async def publish_rstream():
        # rstream reads the leader in Metadata and, on a MetadataUpdate or a lost
        # connection, recovers to the new one
        async with Producer(*host_port(rows[publisher_id]["RabbitMQ Stream"]),
                            **GUEST) as producer:
            for attempt in itertools.count():
                if stop.is_set():
                    return
                value = b"r%d" % attempt
                try:
                    await asyncio.wait_for(producer.send_wait("kill", value), 10)
                except (asyncio.TimeoutError, OSError, ServerError):
                    await asyncio.sleep(0.1)
                    continue
                acked["rstream"].append(value)

    def counts(at_least: dict[str, int]):
        return asyncio.sleep(0, all(len(acked[k]) >= n for k, n in at_least.items()))

    tasks = [asyncio.create_task(publish_grpc()), asyncio.create_task(publish_rstream())]
    reader = Consumer(*host_port(rows[publisher_id]["RabbitMQ Stream"]), **GUEST)
    await reader.start()
    try:
        await until("acks before the kill", lambda: counts({"grpc": 50, "rstream": 50}))
        # a stored offset, through a follower: the leader writes it in its log; the acks
        # after it (committed, so on the ISR) say it is committed too
        await reader.store_offset("kill", "reader", 42)
        await until("the leader holds the offset", lambda: stored_offset(reader, "kill",
                                                                         "reader"))
        stored = {k: len(v) + 10 for k, v in acked.items()}
        await until("acks after the offset", lambda: counts(stored))
        os.kill(int(rows[leader]["pid"]), signal.SIGKILL)
        after = {k: len(v) + 50 for k, v in acked.items()}

        async def new_leader():
            part = await partition(grpc_of[publisher_id], "kill")
            return part.leader if part.leader not in ("", leader) else None
        elected = await until("a new leader", new_leader)
        await until("acks after the kill", lambda: counts(after))
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await reader.close()
    survivors = [s for s in rows if s != leader]

    async def named_everywhere():
        return [(await partition(grpc_of[s], "kill")).leader for s in survivors] == [
            elected] * len(survivors)
    await until("the new leader named by both survivors", named_everywhere)
    for server_id in survivors:  # the new leader's log answers, through either
        async with Consumer(*host_port(rows[server_id]["RabbitMQ Stream"]),
                            **GUEST) as consumer:
            assert await consumer.query_offset("kill", "reader") == 42
    part = await partition(grpc_of[elected], "kill")
    stored = await values(grpc_of[elected], "kill", part.highWatermark)
    for value in acked["grpc"] + acked["rstream"]:
        assert stored.count(value) == 1, value
