"""One log for every door, with the real clients: nats-py -> rstream and the Node.js client
(an AMQP 1.0 message: value as body, headers as application properties, subject/reply/
correlation id as properties), rstream -> gufo-liftbridge (raw and AMQP 1.0 bodies), gRPC ->
rbfly, and a RabbitMQ-created stream served to Liftbridge readers. Header values and keys
that are UTF-8 reach RabbitMQ clients as strings, the others as binary, while Liftbridge
readers get every byte back."""
from __future__ import annotations

import asyncio
import contextlib

import pytest
import rbfly.streams as rbs
from _lb import create, read_all, wait_for_offset
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer
from rstream import amqp_decoder

from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.envelope import encode_publish

pytestmark = pytest.mark.timeout(60)
GUEST = {"username": "guest", "password": "guest"}
FIRST = ConsumerOffsetSpecification(OffsetType.FIRST, None)


def _s(value):
    return value.decode() if isinstance(value, bytes) else value


async def rstream_read(port: int, stream: str, n: int, decoder=None, timeout: float = 20):
    got = []

    async def on_message(msg, ctx):
        got.append((ctx.offset, msg))

    async with Consumer("127.0.0.1", port, **GUEST) as consumer:
        await consumer.subscribe(stream, on_message, offset_specification=FIRST, decoder=decoder)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(got) < n:
            assert loop.time() < deadline, f"rstream got {len(got)} of {n}"
            await asyncio.sleep(0.02)
    return got


async def test_nats_to_rstream(server, stub, nc):
    await create(stub, "n2r", "n2r.subject")
    await nc.publish("n2r.subject", b"plain payload", reply="the.reply")
    await nc.publish("n2r.subject", encode_publish(pb.Message(
        key=b"key-1", value=b"enveloped", headers={"color": b"blue"}, correlationId="corr-7")))
    await wait_for_offset(server, "n2r", 1)
    got = await rstream_read(server.stream_port, "n2r", 2, decoder=amqp_decoder)
    plain, enveloped = (m for _, m in got)
    assert [o for o, _ in got] == [0, 1]
    assert b"".join(plain.body) if isinstance(plain.body, list) else plain.body == b"plain payload"
    body = enveloped.body
    assert (b"".join(body) if isinstance(body, list) else body) == b"enveloped"
    props = {_s(k): _s(v) for k, v in enveloped.application_properties.items()}
    assert props == {"color": "blue", "subject": "n2r.subject"}  # the empty one annotated:
    assert _s(enveloped.properties.subject) == "n2r.subject"
    assert _s(enveloped.properties.correlation_id) == "corr-7"
    assert _s(plain.properties.reply_to) == "the.reply"
    annotations = {_s(k): v for k, v in enveloped.message_annotations.items()}
    assert annotations["x-opt-empty-headers"] == b'["reply"]'
    assert annotations["x-opt-key"] == b"key-1"
    stamps = [m.timestamp for m in await read_all(stub, "n2r")]  # Liftbridge's, in ns
    assert [m.message_annotations[b"x-opt-timestamp-ns"] for _, m in got] == stamps


async def test_nats_records_decode_in_the_node_client(server, stub, nc, node_client):
    """The Node client reads no AMQP long and no binary application property: the timestamp
    is a ulong, UTF-8 keys and header values are strings."""
    await create(stub, "n2node", "n2node.subject")
    await nc.publish("n2node.subject", b"plain payload", reply="the.reply")
    await nc.publish("n2node.subject", encode_publish(pb.Message(
        key=b"key-1", value=b"enveloped", correlationId="corr-7",
        headers={"color": b"blue", "city": "Zürich".encode()})), reply="r2")
    await wait_for_offset(server, "n2node", 1)
    stamps = [str(m.timestamp) for m in await read_all(stub, "n2node")]
    result = await node_client.run("consume", "127.0.0.1", server.stream_port,
                                   stream="n2node", count=2)
    assert result["messages"] == [
        {"content": b"plain payload".hex(),
         "applicationProperties": {"subject": "n2node.subject", "reply": "the.reply"},
         "messageAnnotations": {"x-opt-timestamp-ns": stamps[0]},
         "messageProperties": {"subject": "n2node.subject", "replyTo": "the.reply"}},
        {"content": b"enveloped".hex(),
         "applicationProperties": {"color": "blue", "city": "Zürich",
                                   "subject": "n2node.subject", "reply": "r2"},
         "messageAnnotations": {"x-opt-timestamp-ns": stamps[1], "x-opt-key": "key-1"},
         "messageProperties": {"subject": "n2node.subject", "replyTo": "r2",
                               "correlationId": "corr-7"}}]


async def test_records_with_an_empty_reply_decode_in_the_node_client(server, stub, nc, lb,
                                                                      node_client):
    """Every gRPC publish and every NATS publish without a reply subject stores the header
    `reply` empty, which the Node client cannot read as an application property (it throws
    on any falsy value): the name goes to the `x-opt-empty-headers` annotation, and
    Liftbridge readers still get the header back."""
    await create(stub, "empty2node", "empty2node.subject")
    await nc.publish("empty2node.subject", b"nats, no reply")
    await nc.flush()
    await wait_for_offset(server, "empty2node", 0)
    await stub.Publish(pb.PublishRequest(stream="empty2node", value=b"grpcio",
                                         headers={"color": b"blue", "none": b""}), timeout=5)
    async for _ack in lb.publish_bulk([lb.get_publish_request(b"gufo", stream="empty2node")]):
        pass
    await wait_for_offset(server, "empty2node", 2)
    got = await read_all(stub, "empty2node")
    assert [dict(m.headers) for m in got] == [
        {"subject": b"empty2node.subject", "reply": b""},
        {"color": b"blue", "none": b"", "subject": b"empty2node.subject", "reply": b""},
        {"subject": b"empty2node.subject", "reply": b""}]
    result = await node_client.run("consume", "127.0.0.1", server.stream_port,
                                   stream="empty2node", count=3)
    # a unary Publish gets an ack inbox as in Liftbridge (<namespace>.ack.<id>)
    inbox = result["messages"][1]["messageAnnotations"].pop("x-opt-ack-inbox")
    assert inbox.startswith("liftbridge-default.ack.")

    def annotations(m: pb.Message, empty: str) -> dict:
        return {"x-opt-timestamp-ns": str(m.timestamp), "x-opt-empty-headers": empty}

    assert result["messages"] == [
        {"content": b"nats, no reply".hex(),
         "applicationProperties": {"subject": "empty2node.subject"},
         "messageAnnotations": annotations(got[0], '["reply"]'),
         "messageProperties": {"subject": "empty2node.subject"}},
        {"content": b"grpcio".hex(),
         "applicationProperties": {"color": "blue", "subject": "empty2node.subject"},
         "messageAnnotations": annotations(got[1], '["none","reply"]'),
         "messageProperties": {"subject": "empty2node.subject"}},
        {"content": b"gufo".hex(),
         "applicationProperties": {"subject": "empty2node.subject"},
         "messageAnnotations": annotations(got[2], '["reply"]'),
         "messageProperties": {"subject": "empty2node.subject"}}]


async def test_liftbridge_readers_get_header_and_key_bytes_back(server, stub):
    """Strings for RabbitMQ clients, exact bytes for Liftbridge readers: UTF-8, not UTF-8,
    empty; and the timestamp."""
    await create(stub, "exact", "exact.subject")
    headers = {"text": "värde".encode(), "binary": b"\xff\x00\x80", "empty": b""}
    for key in (b"\xc3\xa9t\xc3\xa9", b"\xff\xfe", b""):
        await stub.Publish(pb.PublishRequest(stream="exact", key=key, value=b"v",
                                             headers=headers), timeout=5)
    got = await read_all(stub, "exact")
    assert [m.key for m in got] == [b"\xc3\xa9t\xc3\xa9", b"\xff\xfe", b""]
    for m in got:
        assert {k: v for k, v in m.headers.items() if k in headers} == headers
    message = (await rstream_read(server.stream_port, "exact", 1, decoder=amqp_decoder))[0][1]
    assert message.message_annotations[b"x-opt-timestamp-ns"] == got[0].timestamp


async def test_rstream_to_gufo_liftbridge(server, lb):
    async with Producer("127.0.0.1", server.stream_port, **GUEST) as producer:
        await producer.create_stream("r2g")
        await producer.send_wait("r2g", b"raw bytes from rstream")
        await producer.send_wait("r2g", AMQPMessage(body=b"amqp body",
                                                    application_properties={"k": "v", "n": 7}))
    from gufo.liftbridge.types import StartPosition
    got = []
    async for msg in lb.subscribe("r2g", partition=0, start_position=StartPosition.EARLIEST):
        got.append(msg)
        if len(got) == 2:
            break
    assert [m.offset for m in got] == [0, 1]
    assert got[0].value == b"raw bytes from rstream" and got[0].headers == {}
    assert got[1].value == b"amqp body" and got[1].headers == {"k": b"v", "n": b"7"}
    meta = await lb.get_metadata("r2g")
    assert meta.metadata[0].partitions[0].newest_offset == 1


async def test_grpc_to_rbfly(server, lb):
    """Header values that are UTF-8 arrive as str, the others as bytes."""
    await lb.create_stream("g2r", subject="g2r.subject", wait_for_stream=True)
    acks = [a async for a in lb.publish_bulk(
        [lb.get_publish_request(b"grpc-%d" % i, stream="g2r",
                                headers={"i": b"%d" % i, "raw": b"\xff%d" % i})
         for i in range(5)])]
    assert len(acks) == 5
    client = rbs.streams_client(f"rabbitmq-stream://guest:guest@127.0.0.1:{server.stream_port}")
    got = []
    try:
        async def read():
            async with contextlib.aclosing(client.subscribe("g2r", offset=rbs.Offset.FIRST)) as it:
                async for body in it:
                    got.append((body, rbs.get_message_ctx()))
                    if len(got) == 5:
                        return
        await asyncio.wait_for(read(), 20)
    finally:
        await client.disconnect()
    assert [ctx.stream_offset for _, ctx in got] == list(range(5))
    assert [body for body, _ in got] == [b"grpc-%d" % i for i in range(5)]  # AMQP body = value
    props = got[2][1].app_properties
    assert props["i"] == "2" and props["raw"] == b"\xff2" and props["subject"] == "g2r.subject"


async def test_rabbitmq_stream_is_visible_in_liftbridge_metadata(server, stub):
    async with Producer("127.0.0.1", server.stream_port, **GUEST) as producer:
        await producer.create_stream("rmq-made")
        for i in range(3):
            await producer.send_wait("rmq-made", b"m%d" % i)
    meta = await stub.FetchMetadata(pb.FetchMetadataRequest(streams=["rmq-made"]), timeout=5)
    assert meta.streamMetadata[0].partitions[0].newestOffset == 2
    await stub.Publish(pb.PublishRequest(stream="rmq-made", value=b"from grpc"), timeout=5)
    assert [m.value for m in await read_all(stub, "rmq-made")] == [b"m0", b"m1", b"m2",
                                                                     b"from grpc"]
