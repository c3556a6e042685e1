"""The 2020 draft dialect on the RabbitMQ Stream door, end to end: an in-process server, the
draft client of draft_client.py (written from the seed, sharing no code with riverlog's codec)
and rstream, unmodified, on the same streams. Covers the handshake, create and delete,
publishing with confirms, subscribing with credit and every 0-based offset type, CommitOffset
and QueryOffset, error codes, reading in both directions between the dialects, and bad draft
frames closing only their own connection with the draft's codes."""
from __future__ import annotations

import asyncio
import struct
import time
import zlib

import pytest
from draft_client import (
    ACCESS_REFUSED,
    AUTHENTICATION_FAILURE,
    FIRST,
    FRAME_TOO_LARGE,
    LAST,
    NEXT,
    OFFSET,
    OK,
    PEER_PROPERTIES,
    STREAM_ALREADY_EXISTS,
    STREAM_DOES_NOT_EXIST,
    STREAM_NOT_AVAILABLE,
    SUBSCRIPTION_ID_DOES_NOT_EXIST,
    TIMESTAMP,
    UNKNOWN_FRAME,
    DraftClient,
    frame,
    string,
    string_map,
)
from rstream import (AMQPMessage, CompressionType, Consumer, ConsumerOffsetSpecification,
                     OffsetType, Producer)
from rstream.recovery import BackOffRecoveryStrategy

from riverlog.broker import StreamConfig
from riverlog.metrics import RABBITMQ_STREAM, REGISTRY
from riverlog.protocol.rabbitmq_stream.constants import MAX_METADATA_NAMES
from riverlog.server.rabbitmq_stream import PUBLISH_FRAME_MAX

pytestmark = pytest.mark.timeout(60)
GUEST = {"username": "guest", "password": "guest"}


async def draft_for(app) -> DraftClient:
    client = await DraftClient.connect("127.0.0.1", app.rabbitmq_stream.port)
    assert await client.handshake() == OK
    return client


def rstream_producer(app) -> Producer:
    return Producer("127.0.0.1", app.rabbitmq_stream.port, **GUEST,
                    recovery_strategy=BackOffRecoveryStrategy(False))


async def rstream_read(app, stream: str, n: int, **subscribe) -> list:
    got: list = []
    done = asyncio.Event()

    async def on_message(msg, ctx):
        got.append((ctx.offset, msg))
        if len(got) >= n:
            done.set()

    async with Consumer("127.0.0.1", app.rabbitmq_stream.port, **GUEST) as consumer:
        await consumer.subscribe(stream, on_message, offset_specification=ConsumerOffsetSpecification(
            OffsetType.FIRST, None), **subscribe)
        await asyncio.wait_for(done.wait(), 20)
    return got


async def test_handshake_as_the_seed_has_it(app):
    client = await DraftClient.connect("127.0.0.1", app.rabbitmq_stream.port)
    assert await client.handshake() == OK
    assert client.server_properties["product"] == "riverlog"
    assert client.sasl_data is None  # SaslOpaqueData is there, null: no challenge
    assert client.tuned == (1_048_576, 60)
    brokers, streams = await client.metadata("nope")
    assert brokers == [(0, "127.0.0.1", app.rabbitmq_stream.port)]
    assert streams == [("nope", STREAM_DOES_NOT_EXIST, -1, [])]
    assert await client.close() == OK


async def test_wrong_password_is_refused_with_the_draft_code(app):
    client = await DraftClient.connect("127.0.0.1", app.rabbitmq_stream.port)
    assert await client.handshake(password="nope") == AUTHENTICATION_FAILURE
    await client.wait_closed()
    assert client.closed_with is None  # the socket closes without a Close frame


async def test_create_publish_subscribe_commit_query_delete(app):
    client = await draft_for(app)
    assert await client.create("orders", {"max-age": "1h"}) == OK
    assert await client.create("orders", {"max-age": "1h"}) == STREAM_ALREADY_EXISTS
    _, streams = await client.metadata("orders")
    assert streams == [("orders", OK, 0, [])]

    # five Publish frames, each waiting for its confirms: five chunks of ten
    for batch in range(5):
        client.publish("orders", 3, [(batch * 10 + i, b"order-%d" % (batch * 10 + i))
                                     for i in range(10)])
        assert await client.wait_confirmed(3, (batch + 1) * 10) == list(range((batch + 1) * 10))
    assert not client.errors

    # credit counts chunks: with credit 2, two chunks come and no more until Credit
    assert await client.subscribe(1, "orders", FIRST, credit=2) == OK
    await asyncio.sleep(0.3)
    assert len(client.chunks[1]) == 2
    chunk = client.chunks[1][0]
    assert (chunk.magic_version, chunk.entries, chunk.records, chunk.first_offset) == (0x50, 10, 10, 0)
    assert chunk.crc & 0xFFFFFFFF == zlib.crc32(chunk.data)  # int32 on the wire: CRC-32 (IEEE)
    client.credit(1, 3)
    await asyncio.sleep(0.3)
    assert [c.first_offset for c in client.chunks[1]] == [0, 10, 20, 30, 40]
    assert [m for c in client.chunks[1] for m in c.messages] == [
        (i, b"order-%d" % i) for i in range(50)]

    # offsets: CommitOffset then QueryOffset; unknown references answer OK with 0
    client.commit_offset("billing", "orders", 42)
    await asyncio.sleep(0.1)
    assert await client.query_offset("billing", "orders") == (OK, 42)
    assert await client.query_offset("nobody", "orders") == (OK, 0)
    assert await client.query_offset("billing", "nope") == (STREAM_DOES_NOT_EXIST, 0)

    assert await client.unsubscribe(1) == OK
    assert await client.unsubscribe(1) == SUBSCRIPTION_ID_DOES_NOT_EXIST
    client.credit(9, 1)
    await asyncio.sleep(0.1)
    assert client.credit_errors == [(SUBSCRIPTION_ID_DOES_NOT_EXIST, 9)]
    assert await client.delete("orders") == OK
    assert await client.delete("orders") == STREAM_DOES_NOT_EXIST
    assert "orders" not in app.broker.streams


async def test_every_offset_type_is_zero_based(app):
    client = await draft_for(app)
    await client.create("s")
    for batch in range(3):  # chunks at 0, 5 and 10
        client.publish("s", 1, [(batch * 5 + i, b"%d" % (batch * 5 + i)) for i in range(5)])
        await client.wait_confirmed(1, (batch + 1) * 5)
    await asyncio.sleep(0.05)
    middle = time.time() * 1000
    await asyncio.sleep(0.05)
    client.publish("s", 1, [(15, b"15")])
    await client.wait_confirmed(1, 16)

    async def first_offset(sub: int, offset_type: int, offset=None) -> int:
        assert await client.subscribe(sub, "s", offset_type, offset, credit=1) == OK
        return (await client.messages(sub, 1))[0][0]

    assert await first_offset(1, FIRST) == 0
    assert await first_offset(2, LAST) == 15  # the last chunk
    assert await first_offset(3, OFFSET, 7) == 5  # the chunk holding offset 7
    assert await first_offset(4, TIMESTAMP, int(middle)) == 15
    assert await client.subscribe(5, "s", NEXT, credit=1) == OK
    client.publish("s", 1, [(16, b"16")])
    assert await client.messages(5, 1) == [(16, b"16")]


def _errors_counted(code: str) -> float:
    labels = {"door": RABBITMQ_STREAM, "code": code}
    return REGISTRY.get_sample_value("riverlog_errors_total", labels) or 0.0


async def test_errors_use_the_draft_codes(app):
    client = await draft_for(app)
    assert await client.subscribe(1, "missing", FIRST) == STREAM_DOES_NOT_EXIST
    counted = _errors_counted("0x02")  # the current protocol's code: the door counts those
    client.publish("missing", 2, [(1, b"x"), (2, b"y")])
    await client.wait_confirmed(2, 2)
    assert client.errors[2] == [(1, STREAM_DOES_NOT_EXIST), (2, STREAM_DOES_NOT_EXIST)]
    assert _errors_counted("0x02") == counted + 1  # one PublishError frame, one error
    # a stream deleted under a subscription: MetadataUpdate with "stream not available" (5)
    await client.create("gone")
    assert await client.subscribe(1, "gone", FIRST) == OK
    other = await draft_for(app)
    assert await other.delete("gone") == OK
    await asyncio.sleep(0.2)
    assert client.metadata_updates == [(STREAM_NOT_AVAILABLE, "gone")]


async def test_a_publisher_id_can_move_between_streams(app):
    client = await draft_for(app)
    await client.create("a")
    await client.create("b")
    # one write: the same publisher id on two streams, then back
    client.publish("a", 1, [(1, b"a1")])
    client.publish("b", 1, [(2, b"b1")])
    client.publish("a", 1, [(3, b"a2")])
    assert sorted(await client.wait_confirmed(1, 3)) == [1, 2, 3]
    assert await client.subscribe(1, "a", FIRST) == OK
    assert await client.subscribe(2, "b", FIRST) == OK
    assert await client.messages(1, 2) == [(0, b"a1"), (1, b"a2")]
    assert await client.messages(2, 1) == [(0, b"b1")]


async def test_draft_reads_what_rstream_wrote(app):
    async with rstream_producer(app) as producer:
        await producer.create_stream("mixed")
        for i in range(20):
            await producer.send_wait("mixed", b"rstream-%d" % i)
        await producer.send_sub_entry("mixed", [b"sub-0", b"sub-1", b"sub-2"],
                                      compression_type=CompressionType.No)
        await asyncio.sleep(0.5)  # sub-entry batches are confirmed asynchronously
    client = await draft_for(app)
    assert await client.subscribe(1, "mixed", FIRST, credit=1) == OK
    got = await client.messages(1, 21)
    assert got[:20] == [(i, b"rstream-%d" % i) for i in range(20)]
    offset, (kind, codec, count, body) = got[20]
    assert (offset, kind, codec, count) == (20, "sub-batch", 0, 3)
    # an uncompressed sub-batch body is [size u32, record]... (rstream wraps records as AMQP 1.0)
    records, pos = [], 0
    while pos < len(body):
        (n,) = struct.unpack_from(">I", body, pos)
        records.append(body[pos + 4:pos + 4 + n])
        pos += 4 + n
    assert len(records) == 3 and all(b"sub-%d" % i in r for i, r in enumerate(records))
    last = client.chunks[1][-1]
    assert last.crc & 0xFFFFFFFF == zlib.crc32(last.data)  # redone after the sub-batch header rewrite


async def test_rstream_reads_what_draft_wrote_and_offsets_are_shared(app):
    client = await draft_for(app)
    assert await client.create("shared") == OK
    client.publish("shared", 0, [(i, b"draft-%d" % i) for i in range(30)])
    await client.wait_confirmed(0, 30)
    got = await rstream_read(app, "shared", 30)
    assert got == [(i, b"draft-%d" % i) for i in range(30)]
    client.publish("shared", 0, [(30, AMQPMessage(body=b"amqp").__bytes__())])
    await client.wait_confirmed(0, 31)
    # offsets committed in one dialect are read in the other
    client.commit_offset("from-draft", "shared", 17)
    async with Consumer("127.0.0.1", app.rabbitmq_stream.port, **GUEST) as consumer:
        await asyncio.sleep(0.1)
        assert await consumer.query_offset("shared", "from-draft") == 17
        await consumer.store_offset("shared", "from-rstream", 23)
    await asyncio.sleep(0.1)
    assert await client.query_offset("from-rstream", "shared") == (OK, 23)


async def test_both_dialects_at_once_on_one_server(app):
    client = await draft_for(app)
    await client.create("both")
    assert await client.subscribe(1, "both", NEXT, credit=5) == OK
    async with rstream_producer(app) as producer:
        await producer.send_wait("both", b"from rstream")
    client.publish("both", 0, [(1, b"from draft")])
    await client.wait_confirmed(0, 1)
    assert await client.messages(1, 2) == [(0, b"from rstream"), (1, b"from draft")]


# -- bad draft frames ---------------------------------------------------------------------------


async def _closed_with(client: DraftClient) -> int:
    await client.wait_closed()
    assert client.closed_with is not None, "closed without a Close frame"
    return client.closed_with[0]


@pytest.mark.parametrize("wire, code", [
    (frame(18, b""), UNKNOWN_FRAME),  # no key 18 in the draft
    (frame(0, string("s") + struct.pack(">Bi", 1, 1) + struct.pack(">qi", 1, 9) + b"x"),
     UNKNOWN_FRAME),  # message shorter than its length
    (frame(2, struct.pack(">iB", 1, 1) + string("s") + struct.pack(">hh", 9, 1)),
     UNKNOWN_FRAME),  # offset type 9
    (frame(14, b"", version=1), UNKNOWN_FRAME),  # version 1: the draft has 0 only
    (frame(0x11, struct.pack(">ii", 1, 0), version=1), UNKNOWN_FRAME),  # a current frame
    (struct.pack(">iHH", 2 * 1024 * 1024, 2, 0) + b"\0" * 64, FRAME_TOO_LARGE),  # Subscribe
    (struct.pack(">iHH", PUBLISH_FRAME_MAX + 1, 0, 0) + b"\0" * 64, FRAME_TOO_LARGE),  # Publish
    (frame(8, struct.pack(">ii", 1, MAX_METADATA_NAMES + 1) + string("s") * (MAX_METADATA_NAMES + 1)),
     FRAME_TOO_LARGE),  # Metadata naming more streams than riverlog answers at once
])
async def test_bad_frames_close_only_that_connection(app, wire, code):
    good = await draft_for(app)
    await good.create("calm")
    bad = await draft_for(app)
    bad.send_raw(wire)
    assert await _closed_with(bad) == code
    good.publish("calm", 1, [(1, b"still here")])
    assert await good.wait_confirmed(1, 1) == [1]
    async with rstream_producer(app) as producer:
        await producer.send_wait("calm", b"and rstream too")


async def test_commands_before_open_are_refused(app):
    client = await DraftClient.connect("127.0.0.1", app.rabbitmq_stream.port)
    assert (await client.request(PEER_PROPERTIES, string_map({}))).take("h") == OK
    client.send_raw(frame(998, struct.pack(">i", 2) + string("early") + string_map({})))
    assert await _closed_with(client) == ACCESS_REFUSED
    assert "early" not in app.broker.streams


async def test_first_bytes_may_arrive_one_by_one(app):
    client = await DraftClient.connect("127.0.0.1", app.rabbitmq_stream.port)
    wire = frame(PEER_PROPERTIES, struct.pack(">i", 1) + string_map({"a": "b"}))
    future = client.pending[1] = asyncio.get_running_loop().create_future()
    client.corr = 1
    for i in range(len(wire)):
        client.send_raw(wire[i:i + 1])
        await client.writer.drain()
        await asyncio.sleep(0.005)
    key, body = await asyncio.wait_for(future, 5)
    assert key == PEER_PROPERTIES and body.take("h") == OK
    assert await client.close() == OK


async def test_a_partition_of_a_stream_with_several_is_a_stream_to_the_draft(app):
    """A stream with three partitions (as Liftbridge makes them): the draft publishes to and
    reads `parts-1`, which is partition 1; rstream reads the same records there."""
    parts = app.broker.create("parts", StreamConfig(partitions=3))
    client = await draft_for(app)
    for batch in range(2):
        client.publish("parts-1", 4, [(batch * 10 + i, b"p1-%d" % (batch * 10 + i))
                                      for i in range(10)])
        await client.wait_confirmed(4, (batch + 1) * 10)
    assert not client.errors
    assert [p.next_offset for p in parts.partitions] == [0, 20, 0]
    _, streams = await client.metadata("parts", "parts-1")
    assert [(name, code) for name, code, _, _ in streams] == [
        ("parts", STREAM_DOES_NOT_EXIST), ("parts-1", OK)]
    got = await rstream_read(app, "parts-1", 20)
    assert [(o, bytes(m)) for o, m in got] == [(i, b"p1-%d" % i) for i in range(20)]
    await client.close()
