"""The Prometheus endpoint of a running App, scraped over HTTP while real clients work:
rstream on the RabbitMQ Stream door, nats-py on the NATS door, riverlog's gRPC stub on the
Liftbridge API. Checks per-stream published/delivered counters, confirm latency, connections,
subscriptions, disk usage against the files on disk, consumer lag of stored offsets and
Liftbridge cursors, errors by door and code, and that a deleted stream's series go away."""
from __future__ import annotations

import asyncio
import os
import urllib.request
import uuid

import grpc
import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families
from compat._raw import RawPeer
from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer

from riverlog.config import (GrpcConfig, LogConfig, MetricsConfig, NatsConfig,
                             RabbitStreamConfig, ServerConfig)
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.api_pb2_grpc import APIStub
from riverlog.protocol.rabbitmq_stream import frames as f, simple_entry
from riverlog.server.app import App

pytestmark = pytest.mark.timeout(60)
GUEST = {"username": "guest", "password": "guest"}
CLUSTER_ONLY = ("riverlog_raft_", "riverlog_follower_", "riverlog_leader_elections",
                "riverlog_isr_", "riverlog_partition_isr", "riverlog_partition_replica",
                "riverlog_partition_under_", "riverlog_partition_leader",
                "riverlog_partition_high_watermark")


@pytest.fixture
async def app(tmp_path):
    config = ServerConfig(data_dir=str(tmp_path / "data"), log=LogConfig(),
                          rabbitmq_stream=RabbitStreamConfig(port=0), nats=NatsConfig(port=0),
                          grpc=GrpcConfig(port=0, replication_max_bytes=10_000),
                          metrics=MetricsConfig(port=0))
    app = App(config)
    await app.start()
    yield app
    await app.stop()


async def scrape(app: App) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted label items): value}`` read over HTTP (off the event loop:
    the endpoint reads server state on it)."""
    def get() -> str:
        with urllib.request.urlopen(app.metrics.url, timeout=10) as resp:
            assert resp.status == 200
            return resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(await asyncio.to_thread(get)):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name: str, **labels) -> float:
    """The sample ``name`` with exactly ``labels`` (a stream's on ``/`` unless ``vhost``);
    0 when absent."""
    if "stream" in labels:
        labels.setdefault("vhost", "/")
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def name() -> str:
    return f"m-{uuid.uuid4().hex[:8]}"


async def test_rabbitmq_stream_door_counts_publish_consume_and_state(app):
    stream = name()
    port = app.rabbitmq_stream.port
    before = await scrape(app)
    confirms_before = value(before, "riverlog_confirm_latency_seconds_count",
                            door="rabbitmq_stream")
    bodies = [b"message-%04d" % i for i in range(500)]
    confirmed = []
    async with Producer("127.0.0.1", port, **GUEST) as producer:
        await producer.create_stream(stream)
        for i in range(0, len(bodies), 100):
            await producer.send_batch(stream, bodies[i:i + 100],
                                      on_publish_confirm=lambda s: confirmed.append(s))
        for _ in range(500):
            if len(confirmed) == len(bodies):
                break
            await asyncio.sleep(0.01)
        assert len(confirmed) == len(bodies)

        got = []
        async with Consumer("127.0.0.1", port, **GUEST) as consumer:
            async def on_message(msg, ctx):
                got.append(ctx.offset)
            await consumer.subscribe(stream, on_message, subscriber_name="reader",
                                     offset_specification=ConsumerOffsetSpecification(
                                         OffsetType.FIRST, None))
            for _ in range(500):
                if len(got) == len(bodies):
                    break
                await asyncio.sleep(0.01)
            assert sorted(got) == list(range(len(bodies)))
            await consumer.store_offset(stream, "reader", 199)
            await asyncio.sleep(0.1)  # StoreOffset has no answer
            during = await scrape(app)
            open_connections = len(app.rabbitmq_stream.connections)
    for _ in range(100):  # the server sees the sockets close a moment later
        after = await scrape(app)
        if value(after, "riverlog_connections", door="rabbitmq_stream") == 0:
            break
        await asyncio.sleep(0.05)

    assert value(during, "riverlog_published_messages_total", stream=stream,
                 door="rabbitmq_stream") == 500
    # rstream wraps each body in an AMQP 1.0 message: more bytes than the bodies, not many
    published = value(during, "riverlog_published_bytes_total", stream=stream,
                      door="rabbitmq_stream")
    assert sum(map(len, bodies)) < published < sum(map(len, bodies)) + 500 * 64
    assert value(during, "riverlog_delivered_messages_total", stream=stream,
                 door="rabbitmq_stream") == 500
    assert value(during, "riverlog_delivered_bytes_total", stream=stream,
                 door="rabbitmq_stream") > published
    confirms = value(during, "riverlog_confirm_latency_seconds_count",
                     door="rabbitmq_stream") - confirms_before
    assert 1 <= confirms <= 5  # one per PublishConfirm frame, not one per message
    assert value(during, "riverlog_confirm_latency_seconds_sum", door="rabbitmq_stream") > 0
    # the producer's and the consumer's connections (rstream opens a locator connection
    # too), one subscription
    assert open_connections >= 2
    assert value(during, "riverlog_connections", door="rabbitmq_stream") == open_connections
    assert value(during, "riverlog_subscriptions", door="rabbitmq_stream") == 1
    assert value(during, "riverlog_subscription_lag_messages", stream=stream) == 0
    assert value(during, "riverlog_consumer_lag_messages", stream=stream, partition="0",
                 consumer="reader", source="offset") == 499 - 199
    # the high watermark: the stored offset is a tracking chunk at 500, no message (the lag
    # above counts messages)
    assert value(during, "riverlog_partition_committed_offset", stream=stream,
                 partition="0") == 500
    folder = app.broker.streams[stream].partitions[0].log.directory
    on_disk = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)
                  if n.endswith(".segment"))
    assert on_disk > published
    assert value(during, "riverlog_stream_disk_bytes", stream=stream) == on_disk
    # a single server shows none of a cluster member's series (docs/clustering.md)
    assert not [n for n, _ in during if n.startswith(CLUSTER_ONLY)]
    assert value(after, "riverlog_connections", door="rabbitmq_stream") == 0
    assert value(after, "riverlog_subscriptions", door="rabbitmq_stream") == 0


async def test_errors_are_counted_by_door_and_code(app):
    def count(samples, door, code):
        return value(samples, "riverlog_errors_total", door=door, code=code)

    before = await scrape(app)
    port = app.rabbitmq_stream.port
    # RabbitMQ Stream: a Publish before the connection is opened closes it with
    # ACCESS_REFUSED (0x10); a publish from an undeclared publisher gets PublishError 0x12
    early = await RawPeer.connect("127.0.0.1", port)
    early.send(f.Publish(1, ((1, simple_entry(b"x")),)))
    close = await early.recv_until(f.Close)
    assert close.code == 0x10
    early.writer.close()
    peer = await RawPeer.open("127.0.0.1", port)
    peer.send(f.Publish(200, ((1, simple_entry(b"orphan")),)))
    error = await peer.recv_until(f.PublishError)
    assert error.errors == ((1, 0x12),)
    peer.writer.close()
    # gRPC: CreateStream of an existing stream is ALREADY_EXISTS
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
        stub = APIStub(channel)
        await stub.CreateStream(pb.CreateStreamRequest(name="g", subject="g"), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.CreateStream(pb.CreateStreamRequest(name="g", subject="g"), timeout=5)
        # a message above clustering.replication.max.bytes: a TOO_LARGE ack, INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Publish(pb.PublishRequest(stream="g", value=bytes(20_000),
                                                 ackPolicy=pb.AckPolicy.LEADER), timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = await scrape(app)
    assert count(after, "rabbitmq_stream", "0x10") == count(before, "rabbitmq_stream", "0x10") + 1
    assert count(after, "rabbitmq_stream", "0x12") == count(before, "rabbitmq_stream", "0x12") + 1
    assert count(after, "grpc", "ALREADY_EXISTS") == count(before, "grpc", "ALREADY_EXISTS") + 1
    assert count(after, "grpc", "TOO_LARGE") == count(before, "grpc", "TOO_LARGE") + 1
    assert count(after, "grpc", "INVALID_ARGUMENT") == count(before, "grpc", "INVALID_ARGUMENT") + 1
    assert count(after, "grpc", "OK") == 0


async def test_liftbridge_doors_count_nats_and_grpc(app):
    stream = name()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
        stub = APIStub(channel)
        await stub.CreateStream(pb.CreateStreamRequest(name=stream, subject=stream), timeout=5)
        before = await scrape(app)
        nc = await nats.connect(app.nats.url)
        try:
            for i in range(10):  # plain NATS messages: stored, no ack
                await nc.publish(stream, b"nats-%d" % i)
            await nc.flush()
        finally:
            await nc.close()
        for i in range(5):  # gRPC Publish with a deadline and ack policy ALL: waits for the ack
            resp = await stub.Publish(pb.PublishRequest(
                stream=stream, value=b"grpc-%d" % i, ackPolicy=pb.AckPolicy.ALL), timeout=5)
            assert resp.ack.offset >= 0
        part = app.broker.streams[stream].partitions[0]
        for _ in range(500):
            if part.committed_offset >= 14:
                break
            await asyncio.sleep(0.01)
        await stub.SetCursor(pb.SetCursorRequest(stream=stream, partition=0, cursorId="c1",
                                                 offset=3), timeout=5)
        call = stub.Subscribe(pb.SubscribeRequest(
            stream=stream, startPosition=pb.StartPosition.EARLIEST,
            stopPosition=pb.StopPosition.STOP_LATEST), timeout=5)
        received = []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for msg in call:
                received.append(msg)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert len(received) == 16  # the empty handshake and 15 messages
        after = await scrape(app)

    def delta(metric, **labels):
        return value(after, metric, **labels) - value(before, metric, **labels)

    assert delta("riverlog_published_messages_total", stream=stream, door="nats") == 10
    assert delta("riverlog_published_bytes_total", stream=stream, door="nats") == 10 * 6
    assert delta("riverlog_published_messages_total", stream=stream, door="grpc") == 5
    assert delta("riverlog_published_bytes_total", stream=stream, door="grpc") == 5 * 6
    assert delta("riverlog_confirm_latency_seconds_count", door="grpc") == 5
    assert delta("riverlog_confirm_latency_seconds_count", door="nats") == 0  # no acks asked
    assert delta("riverlog_delivered_messages_total", stream=stream, door="grpc") == 15
    assert delta("riverlog_delivered_bytes_total", stream=stream, door="grpc") == 10 * 6 + 5 * 6
    # the STOP_LATEST end is RESOURCE_EXHAUSTED: Liftbridge's normal end, still a status
    assert delta("riverlog_errors_total", door="grpc", code="RESOURCE_EXHAUSTED") == 1
    assert value(after, "riverlog_consumer_lag_messages", stream=stream, partition="0",
                 consumer="c1", source="cursor") == 14 - 3
    assert value(after, "riverlog_nats_connected") == 1
    assert value(after, "riverlog_connections", door="grpc") == 0  # no call in progress now


async def test_deleted_stream_leaves_the_scrape(app):
    stream = name()
    async with Producer("127.0.0.1", app.rabbitmq_stream.port, **GUEST) as producer:
        await producer.create_stream(stream)
        await producer.send_wait(stream, b"one")
        present = await scrape(app)
        await producer.delete_stream(stream)
    gone = await scrape(app)
    assert value(present, "riverlog_published_messages_total", stream=stream,
                 door="rabbitmq_stream") == 1
    assert (("riverlog_stream_disk_bytes", (("stream", stream), ("vhost", "/")))) in present
    assert not [k for k in gone if ("stream", stream) in k[1]]
