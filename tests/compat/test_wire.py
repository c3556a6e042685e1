"""The RabbitMQ Stream protocol at the frame level, against the `stream_server` fixture, for
what the real clients rely on without checking loudly: the chunk header and CRC in Deliver,
sub-batches stored as sent, credit counting chunks, response codes, advertised host/port,
heartbeats. Checked against RabbitMQ 3.10; the riverlog_only tests cover commands 3.10 lacks
(ExchangeCommandVersions, StreamStats, Deliver v2, Publish v2 filter values)."""
from __future__ import annotations

import asyncio
import gzip
import struct
import time

import pytest

from riverlog.protocol.rabbitmq_stream import frames as f
from riverlog.protocol.rabbitmq_stream import encode, simple_entry

from ._helpers import stream_name
from ._raw import Chunk, RawPeer

pytestmark = pytest.mark.timeout(60)

OK, NO_STREAM, SUB_EXISTS, NO_SUB, STREAM_EXISTS = 0x01, 0x02, 0x03, 0x04, 0x05
PRECONDITION, NO_PUBLISHER, NO_OFFSET = 0x11, 0x12, 0x13


@pytest.fixture
async def peer(stream_server):
    p = await RawPeer.open(stream_server.host, stream_server.port)
    yield p
    p.close()


@pytest.fixture
async def stream(stream_server, peer):
    name = stream_name("wire")
    assert await peer.create(name) == OK
    yield name
    if stream_server.alive():
        admin = await RawPeer.open(stream_server.host, stream_server.port)
        await admin.delete(name)
        admin.close()


async def publish(peer: RawPeer, pub_id: int, entries: list[tuple[int, bytes]]) -> tuple[int, ...]:
    """One Publish frame; returns the confirmed ids once all of them are confirmed."""
    peer.send(f.Publish(pub_id, tuple(entries)))
    await peer.drain()
    want, got = {pid for pid, _ in entries}, set()
    while not want <= got:
        frame = await peer.recv_until((f.PublishConfirm, f.PublishError))
        assert isinstance(frame, f.PublishConfirm), frame
        got.update(frame.publishing_ids)
    return tuple(sorted(got))


async def declare(peer: RawPeer, pub_id: int, stream: str, ref: str = "") -> None:
    r = await peer.request(f.DeclarePublisher(peer.next_corr(), pub_id, ref, stream))
    assert r.response_code == OK


async def deliveries(peer: RawPeer, n: int, timeout: float = 10) -> list[Chunk]:
    out = []
    for _ in range(n):
        d = await peer.recv_until(f.Deliver, timeout)
        out.append(Chunk.parse(d.chunk))
    return out


async def no_delivery(peer: RawPeer, wait: float = 0.5) -> None:
    try:
        frame = await peer.recv_until((f.Deliver, f.DeliverV2), wait)
    except asyncio.TimeoutError:
        return
    raise AssertionError(f"unexpected delivery: {frame}")


def sub_batch(records: list[bytes], codec: int = 0) -> bytes:
    body = b"".join(struct.pack(">I", len(r)) + r for r in records)
    data = gzip.compress(body) if codec == 1 else body
    return struct.pack(">BHII", 0x80 | codec << 4, len(records), len(body), len(data)) + data


async def test_deliver_chunks_header_crc_and_contents(stream_server, peer, stream):
    await declare(peer, 1, stream)
    t0 = int(time.time() * 1000)
    assert await publish(peer, 1, [(i, simple_entry(b"a%d" % i)) for i in (1, 2, 3)]) == (1, 2, 3)
    assert await publish(peer, 1, [(i, simple_entry(b"b%d" % i)) for i in (4, 5)]) == (4, 5)
    t1 = int(time.time() * 1000)
    reader = await RawPeer.open(stream_server.host, stream_server.port)
    r = await reader.request(f.Subscribe(reader.next_corr(), 7, stream, 1, None, 10, None))
    assert r.response_code == OK
    frames = []
    for _ in range(2):
        frames.append(await reader.recv_until((f.Deliver, f.DeliverV2)))
    assert all(type(d) is f.Deliver and d.subscription_id == 7 for d in frames), "Deliver v1 unless asked"
    c1, c2 = (Chunk.parse(d.chunk) for d in frames)
    for c in (c1, c2):
        assert c.magic_version == 0x50 and c.chunk_type == 0
        assert c.data_length == len(c.data), "Deliver carries header + exactly data length bytes"
        assert c.crc_ok()
        assert t0 - 2000 <= c.timestamp <= t1 + 2000
    assert (c1.chunk_id, c1.entries, c1.records) == (0, 3, 3)
    assert (c2.chunk_id, c2.entries, c2.records) == (3, 2, 2)
    assert c1.simple_records() == [b"a1", b"a2", b"a3"] and c2.simple_records() == [b"b4", b"b5"]
    await no_delivery(reader)
    reader.close()


async def test_sub_batches_are_stored_as_sent(stream_server, peer, stream):
    await declare(peer, 1, stream)
    plain = sub_batch([b"p0", b"p1", b"p2"])
    zipped = sub_batch([b"z%d" % i for i in range(20)], codec=1)
    await publish(peer, 1, [(1, plain), (2, zipped), (3, simple_entry(b"simple"))])
    await publish(peer, 1, [(4, simple_entry(b"next"))])
    reader = await RawPeer.open(stream_server.host, stream_server.port)
    await reader.request(f.Subscribe(reader.next_corr(), 0, stream, 1, None, 10, None))
    c1, c2 = await deliveries(reader, 2)
    assert c1.data == plain + zipped + simple_entry(b"simple")
    assert (c1.entries, c1.records) == (3, 24)  # records count the messages inside sub-batches
    assert c2.chunk_id == 24 and c2.simple_records() == [b"next"]
    # subscribing at an offset inside a sub-batch delivers the chunk that holds it
    await reader.request(f.Subscribe(reader.next_corr(), 1, stream, 4, 10, 10, None))
    (c,) = await deliveries(reader, 1)
    assert c.chunk_id == 0
    reader.close()


async def test_credit_counts_chunks(stream_server, peer, stream):
    await declare(peer, 1, stream)
    for k in range(5):
        await publish(peer, 1, [(k * 10 + i + 1, simple_entry(b"c%d-%d" % (k, i))) for i in range(3)])
    reader = await RawPeer.open(stream_server.host, stream_server.port)
    await reader.request(f.Subscribe(reader.next_corr(), 3, stream, 1, None, 2, None))
    got = await deliveries(reader, 2)
    await no_delivery(reader)  # never more chunks than credit
    reader.send(f.Credit(3, 1))
    got += await deliveries(reader, 1)
    await no_delivery(reader)
    reader.send(f.Credit(3, 10))
    got += await deliveries(reader, 2)
    assert [c.chunk_id for c in got] == [0, 3, 6, 9, 12]
    # remaining credit is used by new chunks as they are appended
    await publish(peer, 1, [(100, simple_entry(b"late"))])
    (late,) = await deliveries(reader, 1)
    assert late.chunk_id == 15 and late.simple_records() == [b"late"]
    # credit for an unknown subscription: an error response without correlation id
    reader.send(f.Credit(99, 1))
    await reader.drain()
    err = await reader.recv_until(f.CreditResponse)
    assert (err.response_code, err.subscription_id) == (NO_SUB, 99)
    reader.close()


@pytest.mark.parametrize("how", ["unsubscribe", "disconnect"])
async def test_subscriber_at_the_end_is_woken_after_another_one_left(stream_server, peer, stream, how):
    """A subscription waiting for new data must be woken by the next append even when an
    earlier subscription on the same stream waited and was then cancelled."""
    await declare(peer, 1, stream)
    await publish(peer, 1, [(1, simple_entry(b"a"))])
    first = await RawPeer.open(stream_server.host, stream_server.port)
    await first.request(f.Subscribe(first.next_corr(), 0, stream, 1, None, 10, None))
    await deliveries(first, 1)
    await asyncio.sleep(0.1)  # now it waits at the end of the stream
    if how == "unsubscribe":
        assert (await first.request(f.Unsubscribe(first.next_corr(), 0))).response_code == OK
    first.close()
    await asyncio.sleep(0.1)
    second = await RawPeer.open(stream_server.host, stream_server.port)
    await second.request(f.Subscribe(second.next_corr(), 0, stream, 3, None, 10, None))  # next
    await asyncio.sleep(0.1)
    await publish(peer, 1, [(2, simple_entry(b"b"))])
    (c,) = await deliveries(second, 1, timeout=5)
    assert (c.chunk_id, c.simple_records()) == (1, [b"b"])
    second.close()


async def test_response_codes(stream_server, peer, stream):
    p, c = peer, peer.next_corr
    missing = stream_name("missing")
    assert await p.create(stream) == STREAM_EXISTS
    assert await p.delete(missing) == NO_STREAM
    md = await p.request(f.Metadata(c(), (stream, missing)))
    by_name = {m.name: m for m in md.streams}
    assert by_name[stream].response_code == OK and by_name[stream].leader_reference != 0xFFFF
    assert (by_name[missing].response_code, by_name[missing].leader_reference) == (NO_STREAM, 0xFFFF)
    assert (await p.request(f.DeclarePublisher(c(), 1, "", missing))).response_code == NO_STREAM
    assert (await p.request(f.DeclarePublisher(c(), 1, "ref", stream))).response_code == OK
    assert (await p.request(f.DeclarePublisher(c(), 1, "other", stream))).response_code == PRECONDITION
    assert (await p.request(f.DeclarePublisher(c(), 2, "ref", stream))).response_code == PRECONDITION
    assert (await p.request(f.DeletePublisher(c(), 9))).response_code == NO_PUBLISHER
    qps = await p.request(f.QueryPublisherSequence(c(), "unknown-ref", stream))
    assert (qps.response_code, qps.sequence) == (OK, 0)
    assert (await p.request(f.QueryOffset(c(), "unknown-ref", stream))).response_code == NO_OFFSET
    assert (await p.request(f.QueryOffset(c(), "ref", missing))).response_code == NO_STREAM
    assert (await p.request(f.Subscribe(c(), 1, missing, 1, None, 1, None))).response_code == NO_STREAM
    assert (await p.request(f.Subscribe(c(), 1, stream, 3, None, 1, {}))).response_code == OK
    assert (await p.request(f.Subscribe(c(), 1, stream, 1, None, 1, None))).response_code == SUB_EXISTS
    assert (await p.request(f.Unsubscribe(c(), 1))).response_code == OK
    assert (await p.request(f.Unsubscribe(c(), 1))).response_code == NO_SUB
    p.send(f.Publish(42, ((1, simple_entry(b"x")),)))
    await p.drain()
    err = await p.recv_until(f.PublishError)
    assert (err.publisher_id, err.errors) == (42, ((1, NO_PUBLISHER),))
    assert (await p.request(f.DeletePublisher(c(), 1))).response_code == OK
    assert (await p.request(f.Close(c(), 1, "bye"))).response_code == OK


async def test_deduplication_confirms_without_storing(stream_server, peer, stream):
    await declare(peer, 1, stream, ref="dedup")
    assert await publish(peer, 1, [(i, simple_entry(b"v%d" % i)) for i in range(1, 6)]) == (1, 2, 3, 4, 5)
    assert await publish(peer, 1, [(i, simple_entry(b"w%d" % i)) for i in range(3, 8)]) == (3, 4, 5, 6, 7)
    qps = await peer.request(f.QueryPublisherSequence(peer.next_corr(), "dedup", stream))
    assert qps.sequence == 7
    reader = await RawPeer.open(stream_server.host, stream_server.port)
    await reader.request(f.Subscribe(reader.next_corr(), 0, stream, 1, None, 10, None))
    records = []
    while len(records) < 7:
        (c,) = await deliveries(reader, 1)
        records += c.simple_records()
    await no_delivery(reader)
    assert records == [b"v1", b"v2", b"v3", b"v4", b"v5", b"w6", b"w7"]
    reader.close()


async def test_advertised_broker_is_reachable(stream_server, peer, stream):
    props = peer.open_properties
    assert {"advertised_host", "advertised_port"} <= set(props)
    md = await peer.request(f.Metadata(peer.next_corr(), (stream,)))
    leader = {b.reference: b for b in md.brokers}[md.streams[0].leader_reference]
    assert (leader.host, str(leader.port)) == (props["advertised_host"], props["advertised_port"])
    other = await RawPeer.open(leader.host, leader.port)  # rstream opens its publisher connection here
    other.close()
    assert peer.tune.frame_max >= 32 and peer.tune.heartbeat > 0


async def test_heartbeats_when_idle(stream_server):
    p = await RawPeer.connect(stream_server.host, stream_server.port)
    await p.request(f.PeerProperties(p.next_corr(), {}))
    await p.request(f.SaslHandshake(p.next_corr()))
    r = await p.request(f.SaslAuthenticate(p.next_corr(), "PLAIN", b"\0guest\0guest"))
    assert r.response_code == OK
    tune = await p.recv_until(f.Tune)
    p.send(f.Tune(tune.frame_max, 1))  # the client asks for 1 s
    await p.request(f.Open(p.next_corr(), "/"))
    beats = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + 3.5
    while loop.time() < end:
        await p.recv_until(f.Heartbeat, timeout=3)
        beats += 1
        p.send(f.Heartbeat())  # stay alive
    assert beats >= 2
    p.close()


@pytest.mark.parametrize("arguments, code", [
    ({"stream-max-segment-size-bytes": "1"}, OK),
    ({"stream-max-segment-size-bytes": "1000"}, OK),
    ({"stream-max-segment-size-bytes": "3000000000"}, OK),
    ({"stream-max-segment-size-bytes": "3000000001"}, PRECONDITION),
    ({"stream-filter-size-bytes": "16"}, OK),
    ({"stream-filter-size-bytes": "255"}, OK),
    # RabbitMQ checks the filter size from 3.13 on (filtering came then)
    pytest.param({"stream-filter-size-bytes": "15"}, PRECONDITION,
                 marks=pytest.mark.riverlog_only),
    pytest.param({"stream-filter-size-bytes": "256"}, PRECONDITION,
                 marks=pytest.mark.riverlog_only),
    ({"initial-cluster-size": "3"}, OK),
    ({"initial-cluster-size": "0"}, PRECONDITION),
    ({"queue-leader-locator": "client-local"}, OK),
    ({"queue-leader-locator": "least-leaders"}, OK),
    ({"queue-leader-locator": "nearest"}, PRECONDITION),
    ({"an-argument-nobody-knows": "x"}, OK),
])
async def test_create_arguments_are_checked_as_rabbitmq_does(peer, arguments, code):
    """What RabbitMQ takes is taken, what it refuses is refused with 0x11
    (rabbit_stream_manager:validate_stream_queue_arguments, rabbit_stream_queue:declare)."""
    name = stream_name("args")
    assert await peer.create(name, arguments) == code
    if code == OK:
        assert await peer.delete(name) == OK


async def test_pipelined_close_frames_are_each_answered(peer):
    """Two Close frames in one write (the Node client closing a consumer and the client at
    once): a CloseResponse for each, then the socket closes. RabbitMQ 3.10 answers both."""
    peer.send_bytes(encode(f.Close(7, OK, "consumer closed")) + encode(f.Close(8, OK, "bye")))
    await peer.drain()
    frames = await peer.wait_closed()
    assert [(type(x), x.correlation_id, x.response_code) for x in frames
            if not isinstance(x, f.Heartbeat)] == [(f.CloseResponse, 7, OK),
                                                   (f.CloseResponse, 8, OK)]


# -- riverlog-only: commands RabbitMQ 3.10 does not have --------------------------------------


@pytest.mark.riverlog_only
async def test_exchange_command_versions(peer):
    r = await peer.request(f.ExchangeCommandVersions(peer.next_corr(), (f.CommandVersion(2, 1, 2), f.CommandVersion(8, 1, 2))))
    assert r.response_code == OK
    versions = list(r.versions)
    # rstream reads the server's list at index key - 1: key order, starting with DeclarePublisher
    assert [v.key for v in versions[:2]] == [0x01, 0x02]
    assert versions[0x02 - 1].max_version == 2  # Publish v2 (filtering)
    # (RabbitMQ's own list names only commands a client sends: Deliver v2 is chosen by the
    # client announcing Deliver max 2, which test_deliver_v2_only_when_announced covers)


@pytest.mark.riverlog_only
async def test_deliver_v2_only_when_announced(stream_server, peer, stream):
    await declare(peer, 1, stream)
    await publish(peer, 1, [(1, simple_entry(b"x"))])
    reader = await RawPeer.open(stream_server.host, stream_server.port)
    await reader.request(f.ExchangeCommandVersions(reader.next_corr(), (f.CommandVersion(8, 1, 2),)))
    await reader.request(f.Subscribe(reader.next_corr(), 0, stream, 1, None, 10, None))
    d = await reader.recv_until(f.DeliverV2)
    assert d.committed_chunk_id == 0 and Chunk.parse(d.chunk).simple_records() == [b"x"]
    reader.close()


@pytest.mark.riverlog_only
async def test_stream_stats(peer, stream):
    r = await peer.request(f.StreamStats(peer.next_corr(), stream))
    assert r.response_code == OK
    assert {"first_chunk_id", "committed_chunk_id", "last_chunk_id"} <= set(r.stats)
    await declare(peer, 1, stream)
    await publish(peer, 1, [(1, simple_entry(b"a")), (2, simple_entry(b"b"))])
    await publish(peer, 1, [(3, simple_entry(b"c"))])
    r = await peer.request(f.StreamStats(peer.next_corr(), stream))
    assert (r.stats["first_chunk_id"], r.stats["committed_chunk_id"], r.stats["last_chunk_id"]) == (0, 2, 2)
    r = await peer.request(f.StreamStats(peer.next_corr(), stream_name("missing")))
    assert r.response_code == NO_STREAM


@pytest.mark.riverlog_only
async def test_publish_v2_filter_values_are_accepted(stream_server, peer, stream):
    await declare(peer, 1, stream)
    peer.send(f.PublishV2(1, ((1, "eu", simple_entry(b"e")), (2, None, simple_entry(b"n")))))
    await peer.drain()
    confirm = await peer.recv_until(f.PublishConfirm)
    assert confirm.publishing_ids == (1, 2)
    reader = await RawPeer.open(stream_server.host, stream_server.port)
    await reader.request(f.Subscribe(reader.next_corr(), 0, stream, 1, None, 10, None))
    (c,) = await deliveries(reader, 1)
    assert c.simple_records() == [b"e", b"n"] and c.crc_ok()
    reader.close()
