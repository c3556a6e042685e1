"""Super streams with rstream, unmodified, against the `stream_server` fixture, plus the wire
answers of CreateSuperStream, DeleteSuperStream, Partitions and Route with the raw peer.

Covers: SuperStreamProducer with hash routing (murmur3 in the client over the Partitions
order) and key routing (Route), SuperStreamConsumer reading every partition, create/delete
errors as rstream sees them, the super stream surviving a restart, and the response codes
RabbitMQ gives (0x05 exists, 0x11 bad lists, 0x02 unknown super stream, OK with no stream
when no binding key matches). RabbitMQ 3.10 has no CreateSuperStream: riverlog only."""
from __future__ import annotations

import mmh3
import pytest
from rstream import (
    Consumer,
    ConsumerOffsetSpecification,
    OffsetType,
    RouteType,
    SuperStreamConsumer,
    SuperStreamCreationOption,
    SuperStreamProducer,
)
from rstream import exceptions as rexc

from ._helpers import GUEST, Collector, stream_name, wait_stream_ready, wait_until
from ._raw import RawPeer
from riverlog.protocol.rabbitmq_stream import frames as f

pytestmark = [pytest.mark.timeout(120), pytest.mark.riverlog_only]

FIRST = ConsumerOffsetSpecification(OffsetType.FIRST, None)
OK, STREAM_DOES_NOT_EXIST, STREAM_EXISTS, PRECONDITION_FAILED = 0x01, 0x02, 0x05, 0x11


async def routing_key(message: bytes) -> str:
    return message.split(b"|")[0].decode()


def super_producer(server, name: str, **kw) -> SuperStreamProducer:
    return SuperStreamProducer(server.host, server.port, **GUEST, super_stream=name,
                               routing_extractor=routing_key, **kw)


def rstream_partition(key: str, n: int) -> int:
    """The partition rstream 1.x's HashRoutingMurmurStrategy picks (murmur3 x64 128-bit of
    the UTF-16 key, seed 104729, little-endian, modulo the partition count)."""
    return int.from_bytes(mmh3.hash_bytes(bytes(key, "UTF-16"), 104729), "little") % n


async def send_confirmed(p: SuperStreamProducer, messages: list[bytes]) -> None:
    confirmed = []
    for m in messages:
        await p.send(m, on_publish_confirm=confirmed.append)
    await wait_until(lambda: len(confirmed) == len(messages), 30,
                     lambda: f"{len(messages)} confirms (got {len(confirmed)})")
    assert all(s.is_confirmed for s in confirmed)


async def read_partition(server, stream: str, n: int) -> list[bytes]:
    got = Collector()
    async with Consumer(server.host, server.port, **GUEST) as c:
        await c.subscribe(stream, got, offset_specification=FIRST)
        await got.wait_for(n, settle=0.5 if n else 1.0)
    assert got.offsets == list(range(n))
    return got.messages


async def partitions(server, name: str) -> f.PartitionsResponse:
    peer = await RawPeer.open(server.host, server.port)
    try:
        return await peer.request(f.Partitions(peer.next_corr(), name))
    finally:
        peer.close()


async def test_hash_routing_producer_and_super_stream_consumer(stream_server):
    name, n = stream_name("super-hash"), 600
    messages = [b"customer-%d|order-%d" % (i % 37, i) for i in range(n)]
    async with super_producer(stream_server, name, routing=RouteType.Hash,
                              super_stream_creation_option=SuperStreamCreationOption(3)) as p:
        await send_confirmed(p, messages)
    parts = [f"{name}-{i}" for i in range(3)]
    assert (await partitions(stream_server, name)).streams == tuple(parts)
    expected = {s: [m for m in messages if parts[rstream_partition(m.split(b"|")[0].decode(), 3)] == s]
                for s in parts}
    assert all(expected.values()), "the 37 keys should reach every partition"
    for stream in parts:
        assert await read_partition(stream_server, stream, len(expected[stream])) == expected[stream]

    # SuperStreamConsumer subscribes to every partition and gets everything, each message
    # from the partition it was routed to, in order within the partition
    got: dict[str, list[bytes]] = {s: [] for s in parts}

    async def on_message(msg, ctx):
        got[ctx.stream].append(msg)

    async with SuperStreamConsumer(stream_server.host, stream_server.port, **GUEST,
                                   super_stream=name) as c:
        await c.subscribe(on_message, offset_specification=FIRST)
        await wait_until(lambda: sum(map(len, got.values())) >= n, 30,
                         lambda: f"{n} messages (got {sum(map(len, got.values()))})")
    assert got == expected

    async with super_producer(stream_server, name) as p:
        await p.delete_super_stream(name)
    assert (await partitions(stream_server, name)).response_code == STREAM_DOES_NOT_EXIST
    async with Consumer(stream_server.host, stream_server.port, **GUEST) as c:
        for stream in parts:
            assert not await c.stream_exists(stream)


async def test_key_routing_follows_binding_keys(stream_server):
    """RouteType.Key asks the server (Route) for the partition of each routing key. rstream
    1.x caches the first answer of a producer for every later key, so each key gets its own
    producer here; a key without binding gets no partition and nothing is stored."""
    name = stream_name("super-key")
    keys = ["eu", "us", "asia"]
    sent: dict[str, list[bytes]] = {}
    async with super_producer(stream_server, name) as admin:
        await admin.create_super_stream(name, binding_keys=keys)
        with pytest.raises(rexc.StreamAlreadyExists):
            await admin.create_super_stream(name, binding_keys=keys)
        await admin.create_super_stream(name, binding_keys=keys, exists_ok=True)
    for key in keys:
        sent[key] = [b"%s|%d" % (key.encode(), i) for i in range(50)]
        async with super_producer(stream_server, name, routing=RouteType.Key) as p:
            await send_confirmed(p, sent[key])
    async with super_producer(stream_server, name, routing=RouteType.Key) as p:
        await p.send(b"mars|0")  # Route answers OK with no stream: rstream sends nothing
    assert (await partitions(stream_server, name)).streams == tuple(f"{name}-{k}" for k in keys)
    for key in keys:
        assert await read_partition(stream_server, f"{name}-{key}", 50) == sent[key]
    async with super_producer(stream_server, name) as admin:
        await admin.delete_super_stream(name)
        with pytest.raises(rexc.StreamDoesNotExist):
            await admin.delete_super_stream(name)
        await admin.delete_super_stream(name, missing_ok=True)


@pytest.mark.restart
async def test_super_stream_survives_a_restart(stream_server_factory):
    server = stream_server_factory()
    name = stream_name("super-restart")
    messages = [b"k%d|%d" % (i % 5, i) for i in range(100)]
    async with super_producer(server, name, routing=RouteType.Hash,
                              super_stream_creation_option=SuperStreamCreationOption(2)) as p:
        await send_confirmed(p, messages)
    server.restart()
    await wait_stream_ready(server, f"{name}-0")
    r = await partitions(server, name)
    assert (r.response_code, r.streams) == (OK, (f"{name}-0", f"{name}-1"))
    async with super_producer(server, name, routing=RouteType.Hash) as p:
        await send_confirmed(p, [b"k1|after"])
    after = f"{name}-{rstream_partition('k1', 2)}"
    before = [m for m in messages if f"{name}-{rstream_partition(m.split(b'|')[0].decode(), 2)}" == after]
    assert await read_partition(server, after, len(before) + 1) == before + [b"k1|after"]


async def test_wire_answers(stream_server):
    name = stream_name("super-wire")
    peer = await RawPeer.open(stream_server.host, stream_server.port)

    async def ask(frame):
        return (await peer.request(frame)).response_code

    try:
        corr = peer.next_corr
        parts = (f"{name}-a", f"{name}-b", f"{name}-c")
        # unknown super stream
        r = await peer.request(f.Partitions(corr(), name))
        assert (r.response_code, r.streams) == (STREAM_DOES_NOT_EXIST, ())
        r = await peer.request(f.Route(corr(), "a", name))
        assert (r.response_code, r.streams) == (STREAM_DOES_NOT_EXIST, ())
        assert await ask(f.DeleteSuperStream(corr(), name)) == STREAM_DOES_NOT_EXIST
        # bad lists: counts differ, a partition twice, an empty name
        assert await ask(f.CreateSuperStream(corr(), name, parts, ("a", "b"), {})) == PRECONDITION_FAILED
        assert await ask(f.CreateSuperStream(corr(), name, parts[:1] * 2, ("a", "b"), {})) == PRECONDITION_FAILED
        assert await ask(f.CreateSuperStream(corr(), "", parts, ("a", "b", "c"), {})) == PRECONDITION_FAILED
        assert await ask(f.CreateSuperStream(corr(), name, parts, ("a", "b", "c"),
                                             {"max-age": "forever"})) == PRECONDITION_FAILED
        # a partition that exists already as a stream: 0x05, nothing else created
        assert await peer.create(parts[2]) == OK
        assert await ask(f.CreateSuperStream(corr(), name, parts, ("a", "b", "c"), {})) == STREAM_EXISTS
        r = await peer.request(f.Metadata(corr(), parts))
        assert [s.response_code for s in r.streams] == [STREAM_DOES_NOT_EXIST] * 2 + [OK]
        assert await peer.delete(parts[2]) == OK
        # created: partitions in order, routes by exact binding key (two bound with "x")
        assert await ask(f.CreateSuperStream(corr(), name, parts, ("x", "b", "x"),
                                             {"max-age": "1h"})) == OK
        assert await ask(f.CreateSuperStream(corr(), name, parts, ("x", "b", "x"), {})) == STREAM_EXISTS
        r = await peer.request(f.Partitions(corr(), name))
        assert (r.response_code, r.streams) == (OK, parts)
        r = await peer.request(f.Route(corr(), "x", name))
        assert (r.response_code, r.streams) == (OK, (parts[0], parts[2]))
        r = await peer.request(f.Route(corr(), "b", name))
        assert (r.response_code, r.streams) == (OK, (parts[1],))
        r = await peer.request(f.Route(corr(), "nothing", name))
        assert (r.response_code, r.streams) == (OK, ())
        # a partition deleted on its own leaves the super stream (RabbitMQ drops its binding)
        assert await peer.delete(parts[1]) == OK
        r = await peer.request(f.Partitions(corr(), name))
        assert r.streams == (parts[0], parts[2])
        # delete: partitions go too, with MetadataUpdate to a consumer of one of them
        sub = await peer.request(f.Subscribe(corr(), 1, parts[0], 1, None, 10, None))  # first
        assert sub.response_code == OK
        peer.send(f.DeleteSuperStream(corr(), name))
        got = {type(frame): frame for frame in [await peer.recv(), await peer.recv()]}
        assert got[f.DeleteSuperStreamResponse].response_code == OK
        assert (got[f.MetadataUpdate].response_code, got[f.MetadataUpdate].stream) == (0x06, parts[0])
        r = await peer.request(f.Metadata(corr(), parts))
        assert [s.response_code for s in r.streams] == [STREAM_DOES_NOT_EXIST] * 3
        assert await ask(f.DeleteSuperStream(corr(), name)) == STREAM_DOES_NOT_EXIST
    finally:
        peer.close()
