"""A Liftbridge stream with several partitions on the RabbitMQ Stream door, with the real
clients: a super stream whose partition i is the stream `<name>-<i>` (bound with key "i"),
never the whole stream shown as partition 0. rstream's SuperStreamProducer and
SuperStreamConsumer against gRPC Publish/Subscribe on the same partitions, and the answers of
Metadata, Subscribe, Create, Delete, Partitions, Route and DeleteSuperStream."""
from __future__ import annotations

import asyncio
import os
import sys

import mmh3
import pytest
from _lb import create, read_all, wait_for_offset
from rstream import (Consumer, ConsumerOffsetSpecification, OffsetType, RouteType,
                     SuperStreamConsumer, SuperStreamProducer)

from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.rabbitmq_stream import frames as f

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # tests/, for compat._raw
from compat._raw import RawPeer  # noqa: E402

pytestmark = pytest.mark.timeout(90)
GUEST = {"username": "guest", "password": "guest"}
FIRST = ConsumerOffsetSpecification(OffsetType.FIRST, None)
OK, STREAM_DOES_NOT_EXIST, STREAM_EXISTS, PRECONDITION_FAILED = 0x01, 0x02, 0x05, 0x11


def rstream_partition(key: str, n: int) -> int:
    """The partition rstream's hash routing picks (murmur3 of the UTF-16 key, seed 104729)."""
    return int.from_bytes(mmh3.hash_bytes(bytes(key, "UTF-16"), 104729), "little") % n


async def test_partitions_are_the_members_of_a_super_stream(server, stub):
    await create(stub, "orders", "orders.subject", partitions=3)
    members = ("orders-0", "orders-1", "orders-2")
    port = server.stream_port
    peer = await RawPeer.open("127.0.0.1", port)
    try:
        corr = peer.next_corr
        r = await peer.request(f.Partitions(corr(), "orders"))
        assert (r.response_code, r.streams) == (OK, members)
        r = await peer.request(f.Route(corr(), "2", "orders"))
        assert (r.response_code, r.streams) == (OK, ("orders-2",))
        r = await peer.request(f.Route(corr(), "orders-2", "orders"))
        assert (r.response_code, r.streams) == (OK, ())
        # the stream itself is no stream on this door; its partitions are, 3 and on are not
        r = await peer.request(f.Metadata(corr(), ("orders", *members, "orders-3", "orders-01")))
        assert [s.response_code for s in r.streams] == [STREAM_DOES_NOT_EXIST] + [OK] * 3 + [
            STREAM_DOES_NOT_EXIST] * 2
        sub = await peer.request(f.Subscribe(corr(), 1, "orders", 1, None, 10, None))
        assert sub.response_code == STREAM_DOES_NOT_EXIST
        assert await peer.create("orders-1") == STREAM_EXISTS
        assert await peer.create("orders") == STREAM_EXISTS
        r = await peer.request(f.CreateSuperStream(corr(), "orders", ("x-0",), ("0",), {}))
        assert r.response_code == STREAM_EXISTS
        assert await peer.delete("orders-1") == PRECONDITION_FAILED
        assert await peer.delete("orders") == STREAM_DOES_NOT_EXIST
    finally:
        peer.close()

    # rstream routes by hash over Partitions: each message lands in the Liftbridge partition
    # of its member stream, where gRPC Subscribe reads it
    keys = [f"customer-{i % 23}" for i in range(90)]

    async def key_of(message: bytes) -> str:
        return message.split(b"|")[0].decode()

    async with SuperStreamProducer("127.0.0.1", port, **GUEST, super_stream="orders",
                                   routing=RouteType.Hash, routing_extractor=key_of) as p:
        for i, key in enumerate(keys):
            await p.send(b"%s|%d" % (key.encode(), i))
    expected = [[b"%s|%d" % (k.encode(), i) for i, k in enumerate(keys)
                 if rstream_partition(k, 3) == n] for n in range(3)]
    assert all(expected)
    for n in range(3):
        await wait_for_offset(server, "orders", len(expected[n]) - 1, partition=n)
        got = await read_all(stub, "orders", n)
        assert [m.value for m in got] == expected[n]

    # a Liftbridge publish to partition 2 reaches rstream's consumer of orders-2
    await stub.Publish(pb.PublishRequest(stream="orders", partition=2, value=b"from gRPC"),
                       timeout=10)
    got: dict[str, list[bytes]] = {m: [] for m in members}

    async def on_message(msg, ctx):
        got[ctx.stream].append(bytes(msg))

    async with SuperStreamConsumer("127.0.0.1", port, **GUEST, super_stream="orders") as c:
        await c.subscribe(on_message, offset_specification=FIRST)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while sum(map(len, got.values())) < 91:
            assert loop.time() < deadline, f"91 messages (got {[len(v) for v in got.values()]})"
            await asyncio.sleep(0.05)
    assert [got[m] for m in members[:2]] == expected[:2]
    assert got["orders-2"][:-1] == expected[2] and got["orders-2"][-1].endswith(b"from gRPC")

    # offsets stored per member are the partitions' own
    async with Consumer("127.0.0.1", port, **GUEST) as c:
        await c.store_offset("orders-1", "app", 7)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while server.app.broker.streams["orders"].partitions[1].offsets.query("app") != 7:
            assert loop.time() < deadline, "offset 7 of app not stored on partition 1"
            await asyncio.sleep(0.05)
        assert server.app.broker.streams["orders"].partitions[0].offsets.query("app") is None

    # DeleteSuperStream deletes the Liftbridge stream
    peer = await RawPeer.open("127.0.0.1", port)
    try:
        r = await peer.request(f.DeleteSuperStream(peer.next_corr(), "orders"))
        assert r.response_code == OK
        assert "orders" not in server.app.broker.streams
        r = await peer.request(f.Partitions(peer.next_corr(), "orders"))
        assert r.response_code == STREAM_DOES_NOT_EXIST
    finally:
        peer.close()
