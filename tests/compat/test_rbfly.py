"""rbfly (Cython RabbitMQ Streams client), unmodified, against the `stream_server` fixture:
riverlog by default, or a real RabbitMQ with RIVERLOG_TEST_PEER=rabbitmq:PORT.

rbfly always declares a named publisher (DeclarePublisher + QueryPublisherSequence, then
starts at sequence + 1), waits for every confirm, subscribes with credit 128, checks the
chunk magic and CRC (a bad chunk is dropped with a warning, so it shows up here as missing
messages) and speaks AMQP 1.0 by default."""
from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import aclosing, asynccontextmanager
from datetime import datetime, timezone

import pytest
import rbfly.streams as rbs
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer, amqp_decoder

from ._helpers import GUEST, Collector, stream_name, wait_stream_ready

pytestmark = pytest.mark.timeout(120)


def uri(server) -> str:
    return f"rabbitmq-stream://guest:guest@{server.host}:{server.port}"


@asynccontextmanager
async def client(server):
    c = rbs.streams_client(uri(server))
    try:
        yield c
    finally:
        await c.disconnect()


async def read(c: rbs.StreamsClient, stream: str, offset: rbs.Offset, n: int, timeout: float = 20,
               amqp: bool = True) -> list[rbs.MessageCtx]:
    """The first ``n`` messages from ``offset`` as message contexts (body, stream_offset, ...)."""
    out = []

    async def run():
        async with aclosing(c.subscribe(stream, offset=offset, amqp=amqp)) as it:
            async for _ in it:
                out.append(rbs.get_message_ctx())
                if len(out) == n:
                    return

    try:
        await asyncio.wait_for(run(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"got {len(out)} of {n} messages from {offset} within {timeout}s") from None
    return out


async def read_nothing(c: rbs.StreamsClient, stream: str, offset: rbs.Offset, wait: float = 0.5) -> list:
    out = []

    async def run():
        async with aclosing(c.subscribe(stream, offset=offset)) as it:
            async for _ in it:
                out.append(rbs.get_message_ctx())

    try:
        await asyncio.wait_for(run(), wait)
    except asyncio.TimeoutError:
        pass
    return out


def body(i: int) -> str:
    return f"rbfly message {i:06d}"


@pytest.fixture
async def stream(stream_server):
    name = stream_name("rbfly")
    async with client(stream_server) as c:
        await c.create_stream(name)
    yield name
    if stream_server.alive():
        async with client(stream_server) as c:
            await c.delete_stream(name)


async def test_batch_publish_100k_then_read_everything(stream_server, stream):
    n = 100_000
    async with client(stream_server) as c:
        async with c.publisher(stream, cls=rbs.PublisherBatchFast) as publisher:
            for i in range(n):
                publisher.batch(body(i))
                if i % 1000 == 999:
                    await publisher.flush()  # returns once every message of the batch is confirmed
            await publisher.flush()
        got = await read(c, stream, rbs.Offset.FIRST, n, timeout=60)
    assert [m.stream_offset for m in got] == list(range(n))
    assert [m.body for m in got] == [body(i) for i in range(n)]


async def test_single_and_limited_batch_publishers(stream_server, stream):
    async with client(stream_server) as c:
        async with c.publisher(stream) as publisher:
            for i in range(50):
                await publisher.send(body(i))
        async with c.publisher(stream, name="limited", cls=rbs.PublisherBatchLimit) as publisher:
            async def producer():
                for i in range(50, 550):
                    await publisher.batch(body(i), max_len=100)

            async def flusher():
                while True:
                    await asyncio.sleep(0.01)
                    await publisher.flush()

            flushing = asyncio.create_task(flusher())
            await producer()
            flushing.cancel()
            await publisher.flush()
        got = await read(c, stream, rbs.Offset.FIRST, 550)
    assert [m.body for m in got] == [body(i) for i in range(550)]


async def test_every_offset_spec(stream_server, stream):
    async with client(stream_server) as c:
        chunks = [100, 100, 300]  # each flush is confirmed before the next: one chunk each
        async with c.publisher(stream, cls=rbs.PublisherBatchFast) as publisher:
            i = 0
            for size in chunks:
                for _ in range(size):
                    publisher.batch(body(i))
                    i += 1
                await publisher.flush()
                await asyncio.sleep(0.05)
        total = sum(chunks)

        got = await read(c, stream, rbs.Offset.FIRST, total)
        assert [m.body for m in got] == [body(i) for i in range(total)]

        for start in (0, 1, 150, 199, 200, 201, 499):
            got = await read(c, stream, rbs.Offset.offset(start), total - start)
            assert [m.stream_offset for m in got] == list(range(start, total)), start
            assert [m.body for m in got] == [body(i) for i in range(start, total)], start

        got = await read(c, stream, rbs.Offset.LAST, 1)  # the first message of the last chunk
        assert 200 <= got[0].stream_offset <= total - 1
        assert got[0].body == body(got[0].stream_offset)

        assert await read_nothing(c, stream, rbs.Offset.NEXT) == []

        # timestamps: rbfly's are seconds (float), the wire's milliseconds
        await asyncio.sleep(1.1)
        t_mid = time.time()
        await asyncio.sleep(1.1)
        async with c.publisher(stream, cls=rbs.PublisherBatchFast) as publisher:
            for i in range(total, total + 100):
                publisher.batch(body(i))
            await publisher.flush()
        got = await read(c, stream, rbs.Offset.timestamp(t_mid), 100)
        assert [m.stream_offset for m in got] == list(range(total, total + 100))
        assert all(t_mid <= m.stream_timestamp <= time.time() + 1 for m in got)
        got = await read(c, stream, rbs.Offset.timestamp(t_mid - 3600), total + 100)
        assert [m.body for m in got] == [body(i) for i in range(total + 100)]

        # next: only what is published after subscribing
        received = []

        async def tail():
            async with aclosing(c.subscribe(stream, offset=rbs.Offset.NEXT)) as it:
                async for msg in it:
                    received.append(msg)
                    if len(received) == 3:
                        return

        task = asyncio.create_task(tail())
        await asyncio.sleep(0.3)
        async with c.publisher(stream) as publisher:
            for k in range(3):
                await publisher.send(f"after-{k}")
        try:
            await asyncio.wait_for(task, 10)
        except asyncio.TimeoutError:
            raise AssertionError(f"Offset.NEXT subscriber got {received} of 3 new messages") from None
        assert received == ["after-0", "after-1", "after-2"]


async def test_named_publisher_deduplication(stream_server, stream):
    n = 300
    async with client(stream_server) as c:
        async with c.publisher(stream, name="dedup", cls=rbs.PublisherBatchFast) as publisher:
            assert publisher.message_id == 1  # nothing stored yet: sequence 0 + 1
            for i in range(n):
                publisher.batch(body(i))
            await publisher.flush()
            # republish old publishing ids with other contents: confirmed (flush returns), not stored
            for pid in (1, 2, 150, n):
                publisher.batch(rbs.stream_message_ctx("duplicate", publish_id=pid))
            await publisher.flush()
        async with c.publisher(stream, name="dedup") as publisher:
            # QueryPublisherSequence: a new publisher with the same name continues after n
            assert publisher.message_id == n + 1
            await publisher.send("next")
            await publisher.send(rbs.stream_message_ctx("dup-again", publish_id=10))
        async with c.publisher(stream, name="another") as publisher:
            assert publisher.message_id == 1
        got = await read(c, stream, rbs.Offset.FIRST, n + 1)
        assert [m.body for m in got] == [body(i) for i in range(n)] + ["next"]
        assert await read_nothing(c, stream, rbs.Offset.offset(n + 1)) == []


@pytest.mark.restart
async def test_deduplication_survives_a_restart(stream_server_factory):
    server = stream_server_factory()
    name = stream_name("rbfly-restart")
    async with client(server) as c:
        await c.create_stream(name)
        async with c.publisher(name, name="durable", cls=rbs.PublisherBatchFast) as publisher:
            for i in range(1000):
                publisher.batch(body(i))
            await publisher.flush()
    server.restart()
    await wait_stream_ready(server, name)
    async with client(server) as c:
        async with c.publisher(name, name="durable", cls=rbs.PublisherBatchFast) as publisher:
            assert publisher.message_id == 1001
            publisher.batch(rbs.stream_message_ctx("dup", publish_id=500))
            publisher.batch(rbs.stream_message_ctx("new", publish_id=1001))
            await publisher.flush()
        got = await read(c, name, rbs.Offset.FIRST, 1001)
        assert [m.body for m in got] == [body(i) for i in range(1000)] + ["new"]
        await c.delete_stream(name)


async def test_offset_reference(stream_server, stream):
    ref = f"reader-{uuid.uuid4().hex[:6]}"
    async with client(stream_server) as c:
        async with c.publisher(stream, cls=rbs.PublisherBatchFast) as publisher:
            for i in range(20):
                publisher.batch(body(i))
            await publisher.flush()
        # no stored offset (0x13): rbfly starts at offset 0
        got = await read(c, stream, rbs.Offset.reference(ref), 5)
        assert [m.stream_offset for m in got] == [0, 1, 2, 3, 4]
        await c.write_offset(stream, ref, got[-1].stream_offset)  # 4
        await asyncio.sleep(0.2)  # StoreOffset has no reply
        got = await read(c, stream, rbs.Offset.reference(ref), 3)
        assert [m.stream_offset for m in got] == [5, 6, 7]
        await c.write_offset(stream, ref, 16)
        await asyncio.sleep(0.2)
        got = await read(c, stream, rbs.Offset.reference(ref), 3)
        assert [m.body for m in got] == [body(17), body(18), body(19)]


async def test_consume_while_publishing(stream_server, stream):
    total = 20_000
    async with client(stream_server) as c:
        async with c.publisher(stream, cls=rbs.PublisherBatchFast) as publisher:
            for i in range(1000):
                publisher.batch(body(i))
            await publisher.flush()

        async def publish_rest():
            async with client(stream_server) as pc:
                async with pc.publisher(stream, name="appender", cls=rbs.PublisherBatchFast) as p:
                    for i in range(1000, total):
                        p.batch(body(i))
                        if i % 250 == 249:
                            await p.flush()
                    await p.flush()

        reading = asyncio.create_task(read(c, stream, rbs.Offset.offset(600), total - 600, timeout=60))
        await asyncio.sleep(0.05)
        await publish_rest()
        got = await reading
    assert [m.stream_offset for m in got] == list(range(600, total))
    assert [m.body for m in got] == [body(i) for i in range(600, total)]


async def test_amqp_bodies_and_properties_round_trip(stream_server, stream):
    when = datetime(2024, 5, 17, 12, 30, tzinfo=timezone.utc)
    bodies = [
        "text", b"\x00binary\xff", 42, -7, 3.5, True, None, when, uuid.UUID(int=7),
        ["a", 1, [b"nested"]], {"k": "v", "n": 1, "list": [1, 2]}, "z\u00fcrich \u2603", b"x" * 70_000,
    ]
    async with client(stream_server) as c:
        async with c.publisher(stream) as publisher:
            for b in bodies:
                await publisher.send(b)
            await publisher.send(rbs.stream_message_ctx("with props", app_properties={"region": "eu", "n": 5}))
        got = await read(c, stream, rbs.Offset.FIRST, len(bodies) + 1)
    assert [m.body for m in got[:-1]] == bodies
    assert got[-1].body == "with props" and got[-1].app_properties == {"region": "eu", "n": 5}


async def test_rbfly_and_rstream_read_each_others_messages(stream_server, stream):
    async with client(stream_server) as c:
        async with c.publisher(stream) as publisher:
            await publisher.send("from rbfly")
            await publisher.send(b"bytes from rbfly")
    async with Producer(stream_server.host, stream_server.port, **GUEST) as p:
        await p.send_wait(stream, AMQPMessage(body=b"from rstream"))
    got = Collector()
    async with Consumer(stream_server.host, stream_server.port, **GUEST) as consumer:
        await consumer.subscribe(stream, got, decoder=amqp_decoder,
                                 offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        await got.wait_for(3)
    # rbfly sends str as an amqp-value string and bytes as a data section
    assert got.messages[0].value in ("from rbfly", b"from rbfly")
    assert got.messages[1].body in (b"bytes from rbfly", [b"bytes from rbfly"])
    async with client(stream_server) as c:
        msgs = await read(c, stream, rbs.Offset.FIRST, 3)
    assert [m.body for m in msgs] == ["from rbfly", b"bytes from rbfly", b"from rstream"]


async def test_delete_and_recreate(stream_server):
    name = stream_name("rbfly-del")
    async with client(stream_server) as c:
        await c.create_stream(name)
        await c.create_stream(name)  # exists: rbfly ignores 0x05
        async with c.publisher(name) as publisher:
            await publisher.send("gone soon")
        await c.delete_stream(name)
        await c.create_stream(name)
        async with c.publisher(name) as publisher:
            assert publisher.message_id == 1  # deduplication state went with the stream
            await publisher.send("fresh")
        got = await read(c, name, rbs.Offset.FIRST, 1)
        assert (got[0].stream_offset, got[0].body) == (0, "fresh")
        await c.delete_stream(name)


async def test_binary_publisher_and_raw_subscriber(stream_server, stream):
    """rbfly's non-AMQP publishers (PublisherBin, PublisherBinBatch) and amqp=False reads."""
    from rbfly.streams._client import PublisherBin, PublisherBinBatch

    async with client(stream_server) as c:
        async with c.publisher(stream, cls=PublisherBin) as publisher:
            await publisher.send(b"raw-0")
        async with c.publisher(stream, name="bin-batch", cls=PublisherBinBatch) as publisher:
            for i in range(1, 100):
                publisher.batch(b"raw-%d" % i)
            await publisher.flush()
        got = await read(c, stream, rbs.Offset.FIRST, 100, amqp=False)
    assert [m.body for m in got] == [b"raw-%d" % i for i in range(100)]


async def test_docs_getting_started(stream_server):
    """rbfly's README on PyPI has no code; this is the usage its documentation shows (a
    client from a URI, the `connection` decorator, create, publish, subscribe), host and
    port being the only changes."""
    stream = stream_name("rbfly-demo-stream")
    received = []

    @rbs.connection
    async def send_data(client: rbs.StreamsClient) -> None:
        await client.create_stream(stream)
        async with client.publisher(stream) as publisher:
            for i in range(10):
                await publisher.send('hello {}'.format(i))

    @rbs.connection
    async def receive_data(client: rbs.StreamsClient) -> None:
        async for msg in client.subscribe(stream, offset=rbs.Offset.FIRST, timeout=10):
            received.append(msg)
            if len(received) == 10:
                break

    client = rbs.streams_client(uri(stream_server))
    await asyncio.wait_for(send_data(client), 20)
    await asyncio.wait_for(receive_data(client), 20)
    assert received == ['hello {}'.format(i) for i in range(10)]
    async with aclosing_client(client) as c:
        await c.delete_stream(stream)


@asynccontextmanager
async def aclosing_client(c):
    try:
        yield c
    finally:
        await c.disconnect()
