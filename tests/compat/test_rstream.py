"""rstream (the RabbitMQ team's Python client), unmodified, against the `stream_server`
fixture: riverlog by default, or a real RabbitMQ with RIVERLOG_TEST_PEER=rabbitmq:PORT.

Covers: create with arguments, 100k messages with confirms, every offset spec with exact
contents and order, named-publisher deduplication (also across a restart), stored offsets,
delete with MetadataUpdate, consuming while publishers append, AMQP 1.0 bodies, sub-entry
batches, filtering, the code snippets of rstream's README, and the publish path as real
programs drive it: publishing id 0 of a new named publisher, two publishers interleaved on
one connection (raw frames: rstream has one publisher per stream), a Publish frame larger
than frame_max, and one frame of more than 65,535 messages."""
from __future__ import annotations

import asyncio

import pytest
from rstream import (
    AMQPMessage,
    CompressionType,
    ConfirmationStatus,
    Consumer,
    ConsumerOffsetSpecification,
    FilterConfiguration,
    OffsetType,
    OnClosedErrorInfo,
    Producer,
    Properties,
    RawMessage,
    amqp_decoder,
)
from rstream import exceptions as rexc
from rstream.recovery import BackOffRecoveryStrategy

from riverlog.protocol.rabbitmq_stream import OffsetType as WireOffsetType
from riverlog.protocol.rabbitmq_stream import encode, simple_entry
from riverlog.protocol.rabbitmq_stream import frames as f

from ._helpers import GUEST, Collector, now_ms, payload, stream_name, wait_stream_ready, wait_until
from ._raw import RawPeer

pytestmark = pytest.mark.timeout(120)

FIRST = ConsumerOffsetSpecification(OffsetType.FIRST, None)
LAST = ConsumerOffsetSpecification(OffsetType.LAST, None)
NEXT = ConsumerOffsetSpecification(OffsetType.NEXT, None)


def at(offset: int) -> ConsumerOffsetSpecification:
    return ConsumerOffsetSpecification(OffsetType.OFFSET, offset)


def since(ts_ms: int) -> ConsumerOffsetSpecification:
    return ConsumerOffsetSpecification(OffsetType.TIMESTAMP, ts_ms)


def producer(server, **kw) -> Producer:
    kw.setdefault("recovery_strategy", BackOffRecoveryStrategy(False))
    return Producer(server.host, server.port, **GUEST, **kw)


def consumer(server, **kw) -> Consumer:
    return Consumer(server.host, server.port, **GUEST, **kw)


async def publish_confirmed(p: Producer, stream: str, messages: list, batch: int = 1000,
                            publisher_name: str | None = None) -> list[ConfirmationStatus]:
    """send_batch in batches of ``batch`` and wait until every message is confirmed."""
    statuses: list[ConfirmationStatus] = []

    def on_confirm(status: ConfirmationStatus) -> None:
        statuses.append(status)

    for i in range(0, len(messages), batch):
        await p.send_batch(stream, messages[i:i + batch], publisher_name=publisher_name,
                           on_publish_confirm=on_confirm)
    await wait_until(lambda: len(statuses) >= len(messages), 60,
                     lambda: f"{len(messages)} confirms (got {len(statuses)})")
    return statuses


async def consume(server, stream: str, spec: ConsumerOffsetSpecification, n: int,
                  decoder=None, timeout: float = 30) -> Collector:
    got = Collector()
    async with consumer(server) as c:
        await c.subscribe(stream, got, offset_specification=spec, decoder=decoder)
        await got.wait_for(n, timeout)
    return got


async def publish_batches(server, stream: str, sizes: list[int]) -> tuple[list[bytes], list[int]]:
    """Publish batches of the given sizes, each confirmed before the next is sent (so each is
    its own chunk on RabbitMQ and riverlog); returns the messages and each batch's first offset."""
    messages, starts = [], []
    async with producer(server) as p:
        for size in sizes:
            starts.append(len(messages))
            batch = [payload(len(messages) + k) for k in range(size)]
            await publish_confirmed(p, stream, batch, batch=size)
            messages += batch
    return messages, starts


# -- streams -------------------------------------------------------------------------------------


async def test_create_with_arguments_exists_and_delete(stream_server):
    name = stream_name("create")
    args = {"max-length-bytes": 200_000_000, "max-age": "24h",
            "stream-max-segment-size-bytes": 50_000_000}
    async with producer(stream_server) as p:
        assert not await p.stream_exists(name)
        await p.create_stream(name, arguments=args)
        assert await p.stream_exists(name)
        with pytest.raises(rexc.StreamAlreadyExists):
            await p.create_stream(name, arguments=args)  # same arguments: 0x05
        await p.create_stream(name, arguments=args, exists_ok=True)
        await p.send_wait(name, b"one")
        await p.delete_stream(name)
        assert not await p.stream_exists(name)
        with pytest.raises(rexc.StreamDoesNotExist):
            await p.delete_stream(name)
        # the name is free again, and the new stream starts empty at offset 0
        await p.create_stream(name, arguments={"max-age": "30s"})
        await p.send_wait(name, b"two")
    got = await consume(stream_server, name, FIRST, 1)
    assert got.items[0][:2] == (0, b"two") and len(got.items) == 1
    async with producer(stream_server) as p:
        await p.delete_stream(name)


async def test_max_length_bytes_is_applied(stream_server):
    """Retention by size removes whole old segments: with 2 MB max and 256 kB segments, most of
    20 MB published goes (RabbitMQ 3.10 keeps up to ~6 MB here, riverlog applies it within its
    housekeeping period), and what is left reads from `first` without a gap to the end."""
    name = stream_name("retention")
    size, n = 1000, 20_000
    async with producer(stream_server) as p:
        await p.create_stream(name, arguments={"max-length-bytes": 2_000_000,
                                               "stream-max-segment-size-bytes": 256_000})
        await publish_confirmed(p, name, [b"%06d" % i + bytes(size - 6) for i in range(n)], batch=100)

    async def read_from_first() -> Collector:
        got = Collector()
        async with consumer(stream_server) as c:
            await c.subscribe(name, got, offset_specification=FIRST)
            await wait_until(lambda: got.items and got.offsets[-1] == n - 1, 30, "the last message")
        return got

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while True:
        got = await read_from_first()
        first = got.offsets[0]
        if (0 < first and (n - first) * size <= 8_000_000) or loop.time() > deadline:
            break
        await asyncio.sleep(0.5)
    assert 0 < first and (n - first) * size <= 8_000_000, f"{n - first} of {n} messages kept"
    assert got.offsets == list(range(first, n))
    assert [m[:6] for m in got.messages] == [b"%06d" % i for i in range(first, n)]
    async with producer(stream_server) as p:
        await p.delete_stream(name)


async def test_unknown_stream_errors(stream_server):
    name = stream_name("missing")
    async with producer(stream_server) as p:
        with pytest.raises(rexc.StreamDoesNotExist):
            await p.send_wait(name, b"x")
    async with consumer(stream_server) as c:
        with pytest.raises(rexc.StreamDoesNotExist):
            await c.query_offset(name, "ref")


# -- publishing and consuming ---------------------------------------------------------------------


async def test_publish_100k_with_confirms_then_consume_from_first(stream_server, stream):
    n = 100_000
    messages = [payload(i) for i in range(n)]
    async with producer(stream_server) as p:
        statuses = await publish_confirmed(p, stream, messages)
    assert all(s.is_confirmed for s in statuses)
    assert sorted(s.message_id for s in statuses) == list(range(1, n + 1))
    got = await consume(stream_server, stream, FIRST, n, timeout=60)
    assert got.offsets == list(range(n))
    assert got.messages == messages


async def test_send_send_wait_and_callbacks(stream_server, stream):
    confirmed: list[ConfirmationStatus] = []
    async with producer(stream_server) as p:
        first = await p.send_wait(stream, b"wait-1")
        for i in range(10):
            await p.send(stream, b"async-%d" % i, on_publish_confirm=confirmed.append)
        await wait_until(lambda: len(confirmed) == 10, 15, "10 confirms of send()")
        last = await p.send_wait(stream, b"wait-2")
    assert (first, last) == (1, 12)
    assert sorted(s.message_id for s in confirmed) == list(range(2, 12))
    assert all(s.is_confirmed and s.response_code == 0 for s in confirmed)
    got = await consume(stream_server, stream, FIRST, 12)
    assert got.messages == [b"wait-1"] + [b"async-%d" % i for i in range(10)] + [b"wait-2"]


async def test_offset_spec_first_and_offset_inside_a_chunk(stream_server, stream):
    messages, starts = await publish_batches(stream_server, stream, [100, 250, 1, 500])
    got = await consume(stream_server, stream, FIRST, len(messages))
    assert got.messages == messages and got.offsets == list(range(len(messages)))
    for n in (1, 100, 175, 351, len(messages) - 1):  # chunk ends, middles, the last message
        got = await consume(stream_server, stream, at(n), len(messages) - n)
        assert got.offsets == list(range(n, len(messages))), n
        assert got.messages == messages[n:], n


async def test_offset_spec_offset_beyond_the_end_waits_for_new_messages(stream_server, stream):
    messages, _ = await publish_batches(stream_server, stream, [10])
    got = Collector()
    async with consumer(stream_server) as c:
        await c.subscribe(stream, got, offset_specification=at(12))
        async with producer(stream_server) as p:
            # one Publish frame, so one chunk on both servers: rstream moves its "skip below"
            # mark to the end of every chunk it receives, so with one chunk per message the
            # chunks 10 and 11 (which the server rightly sends: it starts at the next offset)
            # would leak offset 11 through rstream's filter on RabbitMQ too
            await publish_confirmed(p, stream, [payload(i) for i in range(10, 20)], batch=10)
        await got.wait_for(8)
    assert got.offsets == list(range(12, 20))
    assert got.messages == [payload(i) for i in range(12, 20)]


async def test_offset_spec_last_starts_at_the_last_chunk(stream_server, stream):
    messages, starts = await publish_batches(stream_server, stream, [300, 200])
    got = Collector()
    async with consumer(stream_server) as c:
        await c.subscribe(stream, got, offset_specification=LAST)
        await wait_until(lambda: got.items and got.offsets[-1] == len(messages) - 1, 15, "the last message")
        first = got.offsets[0]
        # "last" = the first offset of the last chunk: inside the last batch, never earlier
        assert starts[-1] <= first < len(messages)
        assert got.messages == messages[first:]
        # and then everything published afterwards
        async with producer(stream_server) as p:
            await publish_confirmed(p, stream, [b"after-1", b"after-2"], batch=1)
        await got.wait_for(len(messages) - first + 2)
    assert got.offsets == list(range(first, len(messages) + 2))
    assert got.messages == messages[first:] + [b"after-1", b"after-2"]


async def test_offset_spec_last_passes_over_stored_offsets(stream_server, stream):
    """A stored offset is a tracking chunk after the messages (osiris); "last" is the last
    chunk of messages (osiris' last_user_chunk_location), not that tracking chunk."""
    messages, _ = await publish_batches(stream_server, stream, [50])
    got = Collector()
    async with consumer(stream_server) as c:
        await c.store_offset(stream, "app", 10)
        await wait_until_offset(c, stream, "app", 10)
        await c.subscribe(stream, got, offset_specification=LAST)
        await got.wait_for(50)
    assert got.offsets == list(range(50)) and got.messages == messages


async def test_offset_spec_last_on_an_empty_stream_gets_the_first_message(stream_server, stream):
    got = Collector()
    async with consumer(stream_server) as c:
        await c.subscribe(stream, got, offset_specification=LAST)
        async with producer(stream_server) as p:
            await p.send_wait(stream, b"only")
        await got.wait_for(1)
    assert got.items[0][:2] == (0, b"only") and len(got.items) == 1


async def test_offset_spec_next_gets_only_new_messages(stream_server, stream):
    messages, _ = await publish_batches(stream_server, stream, [50, 50])
    got = Collector()
    async with consumer(stream_server) as c:
        await c.subscribe(stream, got, offset_specification=NEXT)
        await asyncio.sleep(0.3)
        assert got.items == []
        async with producer(stream_server) as p:
            new = [b"new-%d" % i for i in range(30)]
            await publish_confirmed(p, stream, new, batch=10)
        await got.wait_for(30)
    assert got.offsets == list(range(100, 130))
    assert got.messages == new


async def test_offset_spec_timestamp(stream_server, stream):
    before = now_ms() - 1000
    async with producer(stream_server) as p:
        old = [payload(i) for i in range(100)]
        await publish_confirmed(p, stream, old, batch=50)
        await asyncio.sleep(1.2)
        t_mid = now_ms()
        await asyncio.sleep(1.2)
        new = [payload(i) for i in range(100, 250)]
        await publish_confirmed(p, stream, new, batch=50)
    after_all = now_ms()

    got = await consume(stream_server, stream, since(t_mid), len(new))
    assert got.offsets == list(range(100, 250))
    assert got.messages == new
    assert all(t_mid <= ts <= after_all + 1000 for _, _, ts in got.items)

    got = await consume(stream_server, stream, since(before), 250)
    assert got.messages == old + new

    # a timestamp after the newest chunk: nothing old, then the next new message
    got = Collector()
    async with consumer(stream_server) as c:
        await c.subscribe(stream, got, offset_specification=since(now_ms() + 500))
        await asyncio.sleep(0.3)
        async with producer(stream_server) as p:
            await asyncio.sleep(0.6)
            await p.send_wait(stream, b"future")
        await got.wait_for(1)
    assert [m for _, m, _ in got.items] == [b"future"]


async def test_consumer_started_inside_a_chunk_while_publishers_append(stream_server, stream):
    """A consumer that starts at an offset inside a chunk gets that chunk's tail and then every
    later message exactly once and in order, while two publishers keep appending; a second
    consumer at `next` sees every message appended after it subscribed."""
    await publish_batches(stream_server, stream, [1000])  # offsets 0..999, one chunk
    start, per_publisher, batch = 500, 20_000, 200
    inside, tail = Collector(), Collector()
    names = ["a", "b"]

    async def run_publisher(name: str) -> None:
        async with producer(stream_server) as p:
            msgs = [b"%s-%06d" % (name.encode(), i) for i in range(per_publisher)]
            await publish_confirmed(p, stream, msgs, batch=batch)

    async with consumer(stream_server) as c1, consumer(stream_server) as c2:
        await c1.subscribe(stream, inside, offset_specification=at(start))
        await c2.subscribe(stream, tail, offset_specification=NEXT)
        await asyncio.gather(*(run_publisher(n) for n in names))
        total = 1000 + len(names) * per_publisher
        await inside.wait_for(total - start, timeout=60)
        await wait_until(lambda: tail.items and tail.offsets[-1] == total - 1, 30, "the tail consumer")
        await asyncio.sleep(0.3)
    assert inside.offsets == list(range(start, total))
    assert inside.messages[:500] == [payload(i) for i in range(500, 1000)]
    # each publisher's messages arrive in its own order
    for name in names:
        prefix = name.encode() + b"-"
        mine = [m for m in inside.messages if m.startswith(prefix)]
        assert mine == [b"%s%06d" % (prefix, i) for i in range(per_publisher)]
    t0 = tail.offsets[0]
    assert 1000 <= t0 and tail.offsets == list(range(t0, total))
    assert tail.messages == inside.messages[t0 - start:]


async def test_two_subscriptions_on_one_connection(stream_server):
    """A Consumer shares one connection between subscriptions to different streams (distinct
    subscription ids); deliveries must not be mixed up."""
    names = [stream_name("multi") for _ in range(3)]
    async with producer(stream_server) as p:
        for k, name in enumerate(names):
            await p.create_stream(name)
            await publish_confirmed(p, name, [b"%d-%d" % (k, i) for i in range(300)], batch=100)
    collectors = [Collector() for _ in names]
    async with consumer(stream_server) as c:
        for name, got in zip(names, collectors):
            await c.subscribe(name, got, offset_specification=FIRST)
        for got in collectors:
            await got.wait_for(300)
    for k, got in enumerate(collectors):
        assert got.messages == [b"%d-%d" % (k, i) for i in range(300)]
    async with producer(stream_server) as p:
        for name in names:
            await p.delete_stream(name)


# -- deduplication --------------------------------------------------------------------------------


async def test_named_publisher_deduplication(stream_server, stream):
    n = 1000
    ref = "dedup-producer"
    originals = [RawMessage(payload(i), publishing_id=i) for i in range(1, n + 1)]
    async with producer(stream_server) as p:
        statuses = await publish_confirmed(p, stream, originals, batch=100, publisher_name=ref)
        assert all(s.is_confirmed for s in statuses)
        # republish old ids with other contents: confirmed, not stored
        dups = [RawMessage(b"duplicate-%d" % i, publishing_id=i) for i in (1, 2, 500, 999, n)]
        statuses = await publish_confirmed(p, stream, dups, batch=5, publisher_name=ref)
        assert sorted(s.message_id for s in statuses) == [1, 2, 500, 999, n]
        assert all(s.is_confirmed for s in statuses)
        await p.send_wait(stream, RawMessage(b"dup-wait", publishing_id=7), publisher_name=ref)
    async with producer(stream_server) as p:
        # QueryPublisherSequence answers the last stored id; a new producer with the same
        # name continues after it
        assert await (await p.default_client).query_publisher_sequence(stream, ref) == n
        statuses = await publish_confirmed(p, stream, [b"next"], publisher_name=ref)
        assert [s.message_id for s in statuses] == [n + 1]
        await p.send_wait(stream, b"next-2", publisher_name=ref)
        assert await (await p.default_client).query_publisher_sequence(stream, ref) == n + 2
        assert await (await p.default_client).query_publisher_sequence(stream, "other-ref") == 0
    got = await consume(stream_server, stream, FIRST, n + 2)
    assert got.messages == [m.data for m in originals] + [b"next", b"next-2"]


async def test_unnamed_publisher_is_not_deduplicated(stream_server, stream):
    async with producer(stream_server) as p:
        await p.send_batch(stream, [RawMessage(b"a", publishing_id=5)])
        await p.send_wait(stream, RawMessage(b"b", publishing_id=5))
        await p.send_wait(stream, RawMessage(b"c", publishing_id=1))
    got = await consume(stream_server, stream, FIRST, 3)
    assert got.messages == [b"a", b"b", b"c"]


@pytest.mark.restart
async def test_deduplication_and_data_survive_a_restart(stream_server_factory):
    server = stream_server_factory()
    name, ref, n = stream_name("restart"), "restart-producer", 5000
    messages = [RawMessage(payload(i), publishing_id=i) for i in range(1, n + 1)]
    async with producer(server) as p:
        await p.create_stream(name, arguments={"max-age": "1h"})
        await publish_confirmed(p, name, messages, batch=500, publisher_name=ref)
    server.restart()
    await wait_stream_ready(server, name)
    async with producer(server) as p:
        assert await (await p.default_client).query_publisher_sequence(name, ref) == n
        dups = [RawMessage(b"dup-%d" % i, publishing_id=i) for i in (1, n // 2, n)]
        statuses = await publish_confirmed(p, name, dups, batch=3, publisher_name=ref)
        assert all(s.is_confirmed for s in statuses)
        ids = await p.send_batch(name, [b"after-restart"], publisher_name=ref)
        assert ids == [n + 1]
        await p.send_wait(name, b"after-restart-2", publisher_name=ref)
    got = await consume(server, name, FIRST, n + 2)
    assert got.offsets == list(range(n + 2))
    assert got.messages == [m.data for m in messages] + [b"after-restart", b"after-restart-2"]
    async with producer(server) as p:
        await p.delete_stream(name)


# -- stored offsets ---------------------------------------------------------------------------


async def test_store_and_query_offset(stream_server, stream):
    await publish_batches(stream_server, stream, [100])
    async with consumer(stream_server) as c:
        with pytest.raises(rexc.OffsetNotFound):
            await c.query_offset(stream, "never-stored")
        await c.store_offset(stream, "app-1", 41)
        await wait_until_offset(c, stream, "app-1", 41)
        await c.store_offset(stream, "app-1", 99)
        await c.store_offset(stream, "app-2", 7)
        await wait_until_offset(c, stream, "app-1", 99)
        assert await c.query_offset(stream, "app-2") == 7
        with pytest.raises(rexc.OffsetNotFound):
            await c.query_offset(stream, "never-stored")
    async with consumer(stream_server) as c:  # another connection sees them too
        assert await c.query_offset(stream, "app-1") == 99
        # resuming after the stored offset, as an application does
        got = Collector()
        await c.subscribe(stream, got, offset_specification=at(await c.query_offset(stream, "app-2") + 1),
                          subscriber_name="app-2")
        await got.wait_for(92)
    assert got.offsets == list(range(8, 100))


async def wait_until_offset(c: Consumer, stream: str, ref: str, expected: int) -> None:
    """StoreOffset has no reply; RabbitMQ applies it in order with the next QueryOffset on the
    same connection, and so must riverlog, but allow a short delay either way."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while True:
        try:
            value = await c.query_offset(stream, ref)
        except rexc.OffsetNotFound:
            value = None
        if value == expected or loop.time() > deadline:
            assert value == expected
            return
        await asyncio.sleep(0.05)


@pytest.mark.restart
async def test_stored_offsets_survive_a_restart(stream_server_factory):
    server = stream_server_factory()
    name = stream_name("offsets")
    await publish_batches_on(server, name, 10)
    async with consumer(server) as c:
        await c.store_offset(name, "app", 6)
        await wait_until_offset(c, name, "app", 6)
    server.restart()
    await wait_stream_ready(server, name)
    async with consumer(server) as c:
        assert await c.query_offset(name, "app") == 6
        with pytest.raises(rexc.OffsetNotFound):
            await c.query_offset(name, "other")
    async with producer(server) as p:
        await p.delete_stream(name)


async def publish_batches_on(server, name: str, n: int) -> None:
    async with producer(server) as p:
        await p.create_stream(name)
        await publish_confirmed(p, name, [payload(i) for i in range(n)])


# -- delete -----------------------------------------------------------------------------------


async def test_delete_stream_notifies_consumer_and_producer(stream_server, stream):
    consumer_events: list[OnClosedErrorInfo] = []
    producer_events: list[OnClosedErrorInfo] = []
    got = Collector()
    async with consumer(stream_server, on_close_handler=consumer_events.append) as c, \
            producer(stream_server, on_close_handler=producer_events.append) as p:
        await p.send_wait(stream, b"before-delete")
        await c.subscribe(stream, got, offset_specification=FIRST)
        await got.wait_for(1)
        async with producer(stream_server) as admin:
            await admin.delete_stream(stream)
        await wait_until(lambda: consumer_events and producer_events, 10,
                         "MetadataUpdate to the consumer and the producer")
    assert consumer_events[0].reason == "Metadata Update" and consumer_events[0].streams == [stream]
    assert producer_events[0].reason == "Metadata Update" and producer_events[0].streams == [stream]
    async with producer(stream_server) as p:
        assert not await p.stream_exists(stream)


# -- AMQP 1.0 --------------------------------------------------------------------------------------


async def test_amqp_message_round_trip(stream_server, stream):
    sent = [
        AMQPMessage(body=b"hello amqp"),
        AMQPMessage(body="z\u00fcrich \u2603".encode(), application_properties={"k": "v", "n": 42}),
        AMQPMessage(body=bytes(range(256)) * 40,
                    properties=Properties(message_id="id-1", subject="subj", content_type="application/octet-stream",
                                          correlation_id="corr-9", reply_to="reply-q", creation_time=1_700_000_000_000)),
        AMQPMessage(body=b"", application_properties={"empty": True}),
    ]
    async with producer(stream_server) as p:
        await publish_confirmed(p, stream, sent, batch=len(sent))
    raw = await consume(stream_server, stream, FIRST, len(sent))
    assert raw.messages == [bytes(m) for m in sent]  # stored and delivered byte for byte
    decoded = [amqp_decoder(m) for m in raw.messages]
    assert [_body(m) for m in decoded[:3]] == [m.body for m in sent[:3]]
    ap = decoded[1].application_properties
    assert {_s(k): _s(v) for k, v in ap.items()} == {"k": "v", "n": 42}
    props = decoded[2].properties
    assert _s(props.message_id) == "id-1" and _s(props.subject) == "subj"
    assert _s(props.correlation_id) == "corr-9" and props.creation_time == 1_700_000_000_000


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def _body(m: AMQPMessage) -> bytes:
    """rstream's decoder gives the data section(s) as a list of bytes."""
    return b"".join(m.body) if isinstance(m.body, list) else m.body


# -- the README of rstream (PyPI metadata), host and port changed ---------------------------------


async def test_readme_publishing_snippets(stream_server):
    STREAM = stream_name("readme")
    try:
        await _readme_publishing(stream_server, STREAM)
    finally:
        async with Producer(stream_server.host, username="guest", password="guest", port=stream_server.port) as p:
            await p.delete_stream(STREAM, missing_ok=True)


async def _readme_publishing(stream_server, STREAM: str) -> None:
    async with Producer(stream_server.host, username="guest", password="guest", port=stream_server.port) as producer:
        await producer.create_stream(STREAM, exists_ok=True)
        # "By default you should use AMQP 1.0 codec" / "Client Performances": the send() loop
        # (1_000_000 in the README; 20_000 here to stay within the suite's time budget)
        for i in range(20_000):
            amqp_message = AMQPMessage(
                body=bytes("hello: {}".format(i), "utf-8"),
            )
            # send is asynchronous
            await producer.send(stream=STREAM, message=amqp_message)
        for i in range(20_000):
            # send is asynchronous
            await producer.send(stream=STREAM, message=b"hello")
        # "Sub-Entry Batching and Compression"
        messages = [AMQPMessage(body=bytes("sub-entry: {}".format(i), "utf-8")) for i in range(100)]
        # sending with compression
        await producer.send_sub_entry(
            STREAM, compression_type=CompressionType.Gzip, sub_entry_messages=messages
        )
        await producer.send_sub_entry(
            STREAM, compression_type=CompressionType.No, sub_entry_messages=messages[:10]
        )
        # (leaving the block flushes what send() buffered; nothing waits for the confirms)
    got = await consume(stream_server, STREAM, FIRST, 40_110, decoder=None, timeout=60)
    msgs = got.messages
    # every record of a sub-entry batch gets its own offset, in order
    assert got.offsets == list(range(40_110))
    assert [_body(amqp_decoder(m)) for m in msgs[:20_000]] == [b"hello: %d" % i for i in range(20_000)]
    assert all(m == b"hello" for m in msgs[20_000:40_000])
    sub = [_body(amqp_decoder(m)) for m in msgs[40_000:40_110]]
    assert sub == [b"sub-entry: %d" % i for i in range(100)] + [b"sub-entry: %d" % i for i in range(10)]


async def test_readme_managing_disconnections(stream_server, stream):
    """The README's on_connection_closed handler, fed by a stream deletion."""
    seen = []

    async def on_connection_closed(disconnection_info: OnClosedErrorInfo) -> None:
        print(
            "connection has been closed from stream: "
            + str(disconnection_info.streams)
            + " for reason: "
            + str(disconnection_info.reason)
        )
        seen.append(disconnection_info)

    consumer = Consumer(
        stream_server.host, stream_server.port, username="guest", password="guest",
        on_close_handler=on_connection_closed,
        recovery_strategy=BackOffRecoveryStrategy(False),
    )
    got = Collector()
    await consumer.start()
    try:
        await consumer.subscribe(stream, got, offset_specification=FIRST)
        async with producer(stream_server) as p:
            await p.delete_stream(stream)
        await wait_until(lambda: seen, 10, "on_connection_closed")
    finally:
        await consumer.close()
    assert seen[0].streams == [stream]


# -- riverlog-only (RabbitMQ 3.13+ features) ------------------------------------------------------


@pytest.mark.riverlog_only
async def test_filtering_publish_v2_and_filtered_consumer(stream_server, stream):
    """Publish v2 with filter values (rstream checks ExchangeCommandVersions for Publish max
    version 2 first) and a consumer with filter.N properties; rstream filters on the client with
    the predicate too, so the result is exact whether or not the server skips chunks."""

    async def extract(msg: AMQPMessage) -> str:
        return msg.application_properties["region"]

    sent = [AMQPMessage(body=b"m%d" % i, application_properties={"region": ("eu", "us")[i % 2]})
            for i in range(200)]
    async with producer(stream_server, filter_value_extractor=extract) as p:
        for i in range(0, len(sent), 20):
            await p.send_batch(stream, sent[i:i + 20])
        await p.send_wait(stream, AMQPMessage(body=b"last", application_properties={"region": "eu"}))
    got = Collector()

    def only_eu(m: AMQPMessage) -> bool:
        return _s(m.application_properties[b"region"] if b"region" in m.application_properties
                  else m.application_properties["region"]) == "eu"

    async with consumer(stream_server) as c:
        await c.subscribe(stream, got, decoder=amqp_decoder, offset_specification=FIRST,
                          filter_input=FilterConfiguration(values_to_filter=["eu"], predicate=only_eu,
                                                           match_unfiltered=False))
        await got.wait_for(101)
    assert [_body(m) for m in got.messages] == [b"m%d" % i for i in range(0, 200, 2)] + [b"last"]


# -- the publish path (issue 12): id 0, arrival order, frames over frame_max, huge frames ----------

# osiris' writer is a gen_batch_server: one chunk per batch, a batch of at most 8,192 commands
# (gen_batch_server's default max_batch_size), one command per published message
RABBITMQ_CHUNK_MAX_ENTRIES = 8192


async def test_publishing_id_0_of_a_new_named_publisher_is_stored(stream_server, stream):
    ref = "starts-at-zero"
    async with producer(stream_server) as p:
        # unknown: 0, as RabbitMQ
        assert await (await p.default_client).query_publisher_sequence(stream, ref) == 0
        first = [RawMessage(b"id-%d" % i, publishing_id=i) for i in (0, 1, 2)]
        statuses = await publish_confirmed(p, stream, first, batch=3, publisher_name=ref)
        assert sorted(s.message_id for s in statuses) == [0, 1, 2]
        assert all(s.is_confirmed for s in statuses)
        assert await (await p.default_client).query_publisher_sequence(stream, ref) == 2
        # now 0 has been seen: sent again it is a duplicate (confirmed, not stored)
        again = [RawMessage(b"again-%d" % i, publishing_id=i) for i in (0, 2)]
        statuses = await publish_confirmed(p, stream, again, batch=2, publisher_name=ref)
        assert all(s.is_confirmed for s in statuses)
    got = await consume(stream_server, stream, FIRST, 3)
    assert got.messages == [b"id-0", b"id-1", b"id-2"]


async def test_a_lone_publishing_id_0_is_remembered(stream_server, stream):
    """Id 0 alone in its own frame is stored, and then known: a second 0 is a duplicate."""
    ref = "only-zero"
    async with producer(stream_server) as p:
        await p.send_wait(stream, RawMessage(b"zero", publishing_id=0), publisher_name=ref)
        await p.send_wait(stream, RawMessage(b"zero again", publishing_id=0), publisher_name=ref)
        await p.send_wait(stream, RawMessage(b"one", publishing_id=1), publisher_name=ref)
    got = await consume(stream_server, stream, FIRST, 2)
    assert got.messages == [b"zero", b"one"]


async def test_interleaved_publishers_on_one_connection_keep_arrival_order(stream_server, stream):
    """Two publishers on one connection (one named, one not), 40 Publish frames alternating
    between them, all in one write: stored in the order the frames came."""
    peer = await RawPeer.open(stream_server.host, stream_server.port)
    try:
        for pid, ref in ((1, "order-a"), (2, "")):  # "": no reference (RabbitMQ refuses null)
            r = await peer.request(f.DeclarePublisher(peer.next_corr(), pid, ref, stream))
            assert r.response_code == 1, r
        expected, frames, unconfirmed = [], [], {1: set(), 2: set()}
        for i in range(40):
            pid = 1 + i % 2
            batch = [(i * 10 + k + 1, b"p%d-frame%02d-%d" % (pid, i, k)) for k in range(1 + i % 3)]
            frames.append(encode(f.Publish(pid, tuple((n, simple_entry(m)) for n, m in batch))))
            expected += [m for _, m in batch]
            unconfirmed[pid].update(n for n, _ in batch)
        peer.send_bytes(b"".join(frames))
        await peer.drain()
        while unconfirmed[1] or unconfirmed[2]:
            confirm = await peer.recv_until(f.PublishConfirm)
            unconfirmed[confirm.publisher_id].difference_update(confirm.publishing_ids)
    finally:
        peer.close()
    got = await consume(stream_server, stream, FIRST, len(expected))
    assert got.messages == expected


async def test_a_publish_frame_above_frame_max_is_stored(stream_server, stream):
    """rstream's send_batch sends its whole batch as one Publish frame: 100,000 messages make
    one of ~3.3 MB, over the 1 MiB frame_max both servers propose. RabbitMQ takes it."""
    messages = [b"over-frame-max-%06d" % i for i in range(100_000)]
    async with producer(stream_server) as p:
        assert (await p.default_client).frame_max <= 1024 * 1024
        statuses = await publish_confirmed(p, stream, messages, batch=len(messages))
    assert all(s.is_confirmed for s in statuses)
    got = await consume(stream_server, stream, FIRST, len(messages), timeout=60)
    assert got.offsets == list(range(len(messages)))
    assert got.messages == messages


async def test_one_frame_of_more_than_65535_messages_becomes_several_chunks(stream_server, stream):
    """70,000 empty messages fit one 1 MiB frame (12 bytes each); a chunk holds at most
    65,535 entries. Every message is confirmed and stored, in chunks of at most 8,192
    entries as on RabbitMQ, so a consumer starting at `last` replays only the newest ones."""
    n = 70_000
    async with producer(stream_server) as p:
        statuses = await publish_confirmed(p, stream, [b""] * n, batch=n)
    assert all(s.is_confirmed for s in statuses) and len(statuses) == n
    peer = await RawPeer.open(stream_server.host, stream_server.port)
    try:
        r = await peer.request(f.Subscribe(peer.next_corr(), 1, stream, WireOffsetType.FIRST,
                                           None, 1000))
        assert r.response_code == 1
        chunks = await peer.chunks_until(1, n)
    finally:
        peer.close()
    assert [c.chunk_id for c in chunks] == [0] + [sum(c.records for c in chunks[:i + 1])
                                                 for i in range(len(chunks) - 1)]
    assert sum(c.records for c in chunks) == n
    assert max(c.entries for c in chunks) <= RABBITMQ_CHUNK_MAX_ENTRIES
    got = await consume(stream_server, stream, LAST, 1)
    assert 0 < len(got.items) <= RABBITMQ_CHUNK_MAX_ENTRIES
    assert got.offsets[-1] == n - 1
