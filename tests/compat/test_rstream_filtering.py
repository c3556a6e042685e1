"""Stream filtering (RabbitMQ 3.13+) against the `stream_server` fixture, with rstream
unmodified: a producer with ``filter_value_extractor`` (Publish v2), consumers with
``FilterConfiguration`` (Subscribe properties ``filter.N``, ``match-unfiltered``); and rbfly's
``filter_extract`` publisher and ``MessageFilter`` subscription.

The server's part is to skip chunks that certainly hold no wanted entry, without sending
them and without spending credit on them; the client filters each message of the chunks it
gets with its predicate. The tests publish one chunk per filter value, so a consumer
*without* a predicate shows exactly which chunks the server sent."""
from __future__ import annotations

import asyncio

import pytest
import rbfly.streams as rbs
from rstream import (AMQPMessage, Consumer, ConsumerOffsetSpecification, FilterConfiguration,
                     OffsetType, Producer, amqp_decoder)
from rstream.recovery import BackOffRecoveryStrategy

from riverlog.protocol.rabbitmq_stream import OffsetType as WireOffsetType
from riverlog.protocol.rabbitmq_stream import frames as f
from riverlog.protocol.rabbitmq_stream import encode, simple_entry

from ._helpers import GUEST, Collector, wait_until
from ._raw import Chunk, RawPeer

pytestmark = [pytest.mark.timeout(120), pytest.mark.riverlog_only]

FIRST = ConsumerOffsetSpecification(OffsetType.FIRST, None)
REGIONS = ["eu", "us", "ap", "sa", "af"]


def _s(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def region_of(m: AMQPMessage) -> str | None:
    props = m.application_properties or {}
    value = props.get(b"region", props.get("region"))
    return None if value is None else _s(value)


def body_of(m: AMQPMessage) -> bytes:
    return b"".join(m.body) if isinstance(m.body, list) else m.body


async def publish_chunks(server, stream: str, plan: list[str | None], per_chunk: int = 20) -> list:
    """One chunk per item of ``plan``: ``per_chunk`` messages with that region as filter
    value (None: published by a producer without filter values). Each batch waits for its
    confirms, so it becomes a chunk of its own. Returns the messages in offset order."""
    async def extract(m: AMQPMessage) -> str:
        return region_of(m)

    sent = []
    filtering = Producer(server.host, server.port, **GUEST, filter_value_extractor=extract,
                         recovery_strategy=BackOffRecoveryStrategy(False))
    plain = Producer(server.host, server.port, **GUEST,
                     recovery_strategy=BackOffRecoveryStrategy(False))
    async with filtering, plain:
        for c, region in enumerate(plan):
            props = {"region": region} if region else {"chunk": str(c)}
            batch = [AMQPMessage(body=b"c%d-m%d" % (c, i), application_properties=props)
                     for i in range(per_chunk)]
            confirmed = []
            await (filtering if region else plain).send_batch(
                stream, batch, on_publish_confirm=confirmed.append)
            await wait_until(lambda: len(confirmed) == per_chunk, 20, f"confirms of chunk {c}")
            sent += [(region, body_of(m)) for m in batch]
    return sent


async def consume(server, stream: str, want: int, config: FilterConfiguration,
                  settle: float = 0.5) -> Collector:
    got = Collector()
    async with Consumer(server.host, server.port, **GUEST) as c:
        await c.subscribe(stream, got, offset_specification=FIRST, decoder=amqp_decoder,
                          filter_input=config)
        await got.wait_for(want, 20, settle=settle)
    return got


async def test_only_chunks_that_may_match_are_sent(stream_server, stream):
    plan = [REGIONS[i % 5] for i in range(20)]
    sent = await publish_chunks(stream_server, stream, plan)
    # no predicate: rstream hands out every message of every chunk it receives
    got = await consume(stream_server, stream, 80, FilterConfiguration(["eu"]))
    assert {region_of(m) for m in got.messages} == {"eu"}
    assert [body_of(m) for m in got.messages] == [b for r, b in sent if r == "eu"]
    # offsets are the real ones: chunks 0, 5, 10, 15 of 20 messages each
    assert got.offsets == [c * 20 + i for c in (0, 5, 10, 15) for i in range(20)]


async def test_several_values_and_a_predicate(stream_server, stream):
    plan = ["eu", "us", "ap", "eu", "sa", "us", "af"]
    sent = await publish_chunks(stream_server, stream, plan)
    only_us = FilterConfiguration(["us", "ap"], predicate=lambda m: region_of(m) == "us")
    got = await consume(stream_server, stream, 40, only_us)
    assert [body_of(m) for m in got.messages] == [b for r, b in sent if r == "us"]
    two = await consume(stream_server, stream, 60, FilterConfiguration(["us", "ap"]))
    assert [body_of(m) for m in two.messages] == [b for r, b in sent if r in ("us", "ap")]


async def test_match_unfiltered(stream_server, stream):
    """Chunks published without filter values (plain producer) come only with
    match_unfiltered; chunks with filter values come only when a value may match."""
    plan = [None, "eu", None, "us", "eu", None]
    sent = await publish_chunks(stream_server, stream, plan)
    strict = await consume(stream_server, stream, 40, FilterConfiguration(["eu"]))
    assert [body_of(m) for m in strict.messages] == [b for r, b in sent if r == "eu"]
    lenient = await consume(stream_server, stream, 100,
                            FilterConfiguration(["eu"], match_unfiltered=True))
    assert [body_of(m) for m in lenient.messages] == [b for r, b in sent if r in ("eu", None)]
    # and the predicate narrows to unfiltered messages alone
    unfiltered = await consume(stream_server, stream, 60, FilterConfiguration(
        ["no-such-region"], predicate=lambda m: region_of(m) is None, match_unfiltered=True))
    assert [body_of(m) for m in unfiltered.messages] == [b for r, b in sent if r is None]


async def test_a_chunk_mixing_filtered_and_unfiltered_entries(stream_server, stream):
    """One Publish v2 frame carrying entries with and without a filter value: the chunk is
    sent to ``filter=eu`` and to ``match-unfiltered`` readers, not to ``filter=us``."""
    peer = await RawPeer.open(stream_server.host, stream_server.port)
    try:
        r = await peer.request(f.DeclarePublisher(peer.next_corr(), 1, "", stream))
        assert r.response_code == 1
        peer.send(f.PublishV2(1, ((1, "eu", simple_entry(b"a")), (2, None, simple_entry(b"b")))))
        await peer.recv_until(f.PublishConfirm)
        peer.send(f.PublishV2(1, ((3, "jp", simple_entry(b"c")),)))
        await peer.recv_until(f.PublishConfirm)
        for props, expected in (({"filter.0": "eu"}, [0]),
                                ({"filter.0": "us", "match-unfiltered": "true"}, [0]),
                                ({"filter.0": "us"}, []),
                                ({"filter.0": "jp", "filter.1": "eu"}, [0, 2])):
            sub_id = len(props) + 10 * len(expected)
            r = await peer.request(f.Subscribe(peer.next_corr(), sub_id, stream,
                                               WireOffsetType.FIRST, None, 10, props))
            assert r.response_code == 1
            got = await _chunks(peer, sub_id)
            assert [c.chunk_id for c in got] == expected, props
            r = await peer.request(f.Unsubscribe(peer.next_corr(), sub_id))
            assert r.response_code == 1
    finally:
        peer.close()


async def test_frames_with_other_filter_values_are_not_merged_into_one_chunk(stream_server,
                                                                               stream):
    """Publish frames that arrive together are written as one chunk, unless their filter
    values differ: then the staged chunk is written first (issue 20 item 6), so a chunk's
    bloom filter names one frame's values and a filtered consumer skips the others."""
    peer = await RawPeer.open(stream_server.host, stream_server.port)
    try:
        r = await peer.request(f.DeclarePublisher(peer.next_corr(), 1, "", stream))
        assert r.response_code == 1
        frames = [f.PublishV2(1, tuple((i * 2 + k, value, simple_entry(b"%s-%d" % (
                      value.encode(), k))) for k in (1, 2)))
                  for i, value in enumerate(["eu", "eu", "us", "eu", "us", "us"])]
        frames.insert(3, f.Publish(1, ((101, simple_entry(b"plain")),)))  # no filter value
        peer.send_bytes(b"".join(encode(frame) for frame in frames))  # one write: one read
        confirmed = 0
        while confirmed < 13:
            confirmed += len((await peer.recv_until(f.PublishConfirm)).publishing_ids)
        r = await peer.request(f.Subscribe(peer.next_corr(), 1, stream, WireOffsetType.FIRST,
                                           None, 20, None))
        assert r.response_code == 1
        got = await _chunks(peer, 1)
        # eu+eu | us | plain | eu | us+us: merged only while the values stay the same
        assert [(c.chunk_id, c.records) for c in got] == [(0, 4), (4, 2), (6, 1), (7, 2),
                                                          (9, 4)]
        r = await peer.request(f.Subscribe(peer.next_corr(), 2, stream, WireOffsetType.FIRST,
                                           None, 20, {"filter.0": "us"}))
        assert r.response_code == 1
        assert [c.chunk_id for c in await _chunks(peer, 2)] == [4, 9]
    finally:
        peer.close()


async def _chunks(peer: RawPeer, sub_id: int, quiet: float = 0.5) -> list[Chunk]:
    """The chunks delivered to ``sub_id`` until the server has been quiet for ``quiet`` s."""
    out = []
    while True:
        try:
            frame = await peer.recv(quiet)
        except (asyncio.TimeoutError, TimeoutError):
            return out
        if isinstance(frame, f.Deliver) and frame.subscription_id == sub_id:
            out.append(Chunk.parse(frame.chunk))


async def test_skipped_chunks_use_no_credit(stream_server, stream):
    """Credit 1, then 30 chunks that cannot match and 1 that does: the matching chunk
    arrives on that single credit, and it is the only Deliver."""
    plan = ["us"] * 30 + ["eu"]
    await publish_chunks(stream_server, stream, plan, per_chunk=3)
    peer = await RawPeer.open(stream_server.host, stream_server.port)
    try:
        r = await peer.request(f.Subscribe(peer.next_corr(), 7, stream, WireOffsetType.FIRST,
                                           None, 1, {"filter.0": "eu"}))
        assert r.response_code == 1
        got = await _chunks(peer, 7)
        assert [(c.chunk_id, c.records) for c in got] == [(90, 3)]
        assert got[0].crc_ok() and len(got[0].data) == got[0].data_length
        assert got[0].bloom_size == 16  # the header as stored; the filter bytes are not sent
        # new chunks after that: a match waits for credit, a non-match passes silently
        await publish_chunks(stream_server, stream, ["us", "eu"], per_chunk=3)
        assert await _chunks(peer, 7) == []
        peer.send(f.Credit(7, 1))
        assert [c.chunk_id for c in await _chunks(peer, 7)] == [96]
    finally:
        peer.close()


async def test_rbfly_filter_extract_and_message_filter(stream_server, stream):
    """rbfly (Cython client) too: a publisher with ``filter_extract`` (Publish v2) and a
    subscription with ``MessageFilter``; rbfly checks each chunk's CRC and drops by value."""
    def region(ctx) -> str:
        return ctx.app_properties["region"]

    server = stream_server
    c = rbs.streams_client(f"rabbitmq-stream://guest:guest@{server.host}:{server.port}")
    try:
        async with c.publisher(stream, filter_extract=region) as pub:
            for chunk, r in enumerate(["eu", "us", "eu", "ap"]):
                for i in range(5):  # each send waits for its confirm: one chunk per message
                    await pub.send(rbs.stream_message_ctx(f"{r}-{chunk}-{i}", app_properties={"region": r}))
        got = []

        async def run():
            it = c.subscribe(stream, offset=rbs.Offset.FIRST,
                             filter=rbs.MessageFilter(region, {"eu"}))
            async for body in it:
                got.append((rbs.get_message_ctx().stream_offset, body))
                if len(got) == 10:
                    return
        await asyncio.wait_for(run(), 20)
    finally:
        await c.disconnect()
    assert got == [(o, f"eu-{o // 5}-{o % 5}") for o in (*range(0, 5), *range(10, 15))]


async def test_a_tailing_filtered_consumer_gets_every_wanted_message_each_time(stream_server):
    """Issue 28's case, rstream's own ``test_consume_filtering`` (ten times): a consumer
    subscribes to a new stream with filter value "1" (match_unfiltered false), then a
    filtering producer sends 10 batches of 50 messages, filter values "0".."49", each
    ``send_batch`` awaited but not confirmed, so frames arrive together and share chunks.
    rstream's consumer gets offsets 1, 51, .., 451 every time, and so does a raw
    subscription beside it, which sees the chunks themselves.

    The bodies are bytes. rstream's own test passes ``str`` bodies, which rstream encodes as
    a data section whose length is the string's but whose content is longer (an encoded
    map), and its ``amqp_decoder`` raises on those of 9 characters ("hello: 10"..); the
    exception ends rstream's handling of the rest of that chunk, so its consumer loses the
    wanted messages of every batch but the first in each chunk (docs/rabbitmq-stream.md,
    Filtering)."""
    server = stream_server

    async def extract(m: AMQPMessage) -> str:
        return _s(m.application_properties["id"])

    wanted = [1 + 50 * k for k in range(10)]
    for run in range(10):
        stream = f"filter-tail-{run}-{id(server)}"
        producer = Producer(server.host, server.port, **GUEST, filter_value_extractor=extract)
        consumer = Consumer(server.host, server.port, **GUEST)
        raw = await RawPeer.open(server.host, server.port)
        async with producer, consumer:
            await producer.create_stream(stream, exists_ok=True)
            got = Collector()
            await consumer.subscribe(stream, got, decoder=amqp_decoder,
                                     filter_input=FilterConfiguration(
                                         ["1"], predicate=lambda m: _s(
                                             m.application_properties[b"id"]) == "1"))
            r = await raw.request(f.Subscribe(raw.next_corr(), 1, stream, WireOffsetType.FIRST,
                                              None, 1, {"filter.0": "1"}))
            assert r.response_code == 1
            for _ in range(10):
                await producer.send_batch(stream, [
                    AMQPMessage(body=b"hello: %d" % i, application_properties={"id": str(i)})
                    for i in range(50)])
            await got.wait_for(10, 10, settle=0.1)
            chunks = []
            while sum(c.records for c in chunks) < 500:  # credit 1, given back per chunk
                frame = await raw.recv_until(f.Deliver)
                chunks.append(Chunk.parse(frame.chunk))
                raw.send(f.Credit(1, 1))
            raw.close()
            await producer.delete_stream(stream)
        assert got.offsets == wanted, f"run {run}"
        assert [c.chunk_id + i for c in chunks for i, record in enumerate(c.simple_records())
                if _s(amqp_decoder(record).application_properties[b"id"]) == "1"] == wanted, \
            f"run {run}"
