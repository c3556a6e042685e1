"""Issue 30 item 1 over real clients: a stream `orders` in `/` and one in `v2` (rstream's
vhost argument) are two streams in every listing and metric, each naming its virtual host
and showing the name its clients use, never the hidden broker name (riverlog.vhost_names):
the management API's queues, connections, publishers and consumers, `riverlog stats`'s
tables, the Prometheus metrics (`vhost` label), the rate history's counts and the Liftbridge
door's FetchMetadata (on `/` only). And the race of a stream created while its virtual host
is deleted: the create is refused, no stream outlives its virtual host."""
from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid

import aiohttp
import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer

from riverlog.config import GrpcConfig, MetricsConfig
from riverlog.errors import NoSuchVhostError
from riverlog.ops import stats_tables
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.api_pb2_grpc import APIStub
from riverlog.server.management.history import counted
from riverlog.server.management.queues import create
from riverlog.vhost_names import MARK, internal
from server.test_management import GUEST, _app, call, eventually

# The counters are the process's (prometheus_client's registry): names no other test uses
ORDERS = f"orders-{uuid.uuid4().hex[:8]}"
GONE = f"gone-{uuid.uuid4().hex[:8]}"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def app(tmp_path):
    app = await _app(tmp_path, grpc=GrpcConfig(port=0), metrics=MetricsConfig(port=0))
    yield app
    await app.stop()


def _client(kind, app, vhost: str, **kwargs):
    return kind("127.0.0.1", app.rabbitmq_stream.port, username="guest", password="guest",
                vhost=vhost, **kwargs)


async def _scrape(app) -> tuple[str, dict[str, list[tuple[dict, float]]]]:
    """(the exposition text, {sample name: [(labels, value)]}) of ``app``'s /metrics."""
    def get() -> str:
        with urllib.request.urlopen(app.metrics.url, timeout=10) as answer:
            return answer.read().decode()
    text = await asyncio.to_thread(get)
    samples: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return text, samples


def _of(samples, name: str, **labels) -> dict[str, float]:
    """vhost -> value of the samples ``name`` whose labels include ``labels``."""
    return {lab["vhost"]: value for lab, value in samples.get(name, ())
            if all(lab.get(k) == v for k, v in labels.items())}


async def test_orders_in_two_vhosts_is_two_of_everything(app):
    assert (await call(app, "PUT", "/api/vhosts/v2"))[0] == 201
    consumer = _client(Consumer, app, "v2")
    got: list[bytes] = []
    async with _client(Producer, app, "/") as root, _client(Producer, app, "v2") as v2:
        await root.create_stream(ORDERS)
        await v2.create_stream(ORDERS)
        await root.send_wait(ORDERS, AMQPMessage(body=b"root"))
        for body in (b"v2-a", b"v2-b"):
            await v2.send_wait(ORDERS, AMQPMessage(body=body))
        await consumer.start()
        try:
            await consumer.subscribe(ORDERS, lambda msg, ctx: got.append(msg),
                                     subscriber_name="reader",
                                     offset_specification=ConsumerOffsetSpecification(
                                         OffsetType.FIRST))
            await eventually(lambda: asyncio.sleep(0, len(got) >= 2))
            await consumer.store_offset(ORDERS, "reader", 0)
            await eventually(lambda: asyncio.sleep(0, app.broker.streams[
                internal("v2", ORDERS)].partitions[0].offsets.query("reader") == 0))
            await _listings(app)
            await _metrics(app)
        finally:
            await consumer.close()
    published, _ = counted()  # the rate history's counts, keyed by broker name
    assert (published[ORDERS], published[internal("v2", ORDERS)]) == (1, 2)
    # the Liftbridge door is on "/": it lists "/"'s orders, never v2's hidden name
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
        meta = await APIStub(channel).FetchMetadata(pb.FetchMetadataRequest(), timeout=10)
    names = [s.name for s in meta.streamMetadata]
    assert ORDERS in names and not [n for n in names if MARK in n]


def _v2_orders(app):
    """Partition 0 of v2's orders."""
    return app.broker.streams[internal("v2", ORDERS)].partitions[0]


async def _listings(app) -> None:
    """Every management listing names the virtual host and the client's name."""
    for path in ("/api/queues", "/api/stream/connections", "/api/stream/publishers",
                 "/api/stream/consumers", "/api/connections", "/api/overview",
                 "/api/riverlog/stream/consumer-groups"):
        async with aiohttp.ClientSession(headers=GUEST) as session:
            url = f"http://127.0.0.1:{app.management.port}{path}"
            async with session.get(url) as resp:
                assert resp.status == 200, path
                assert MARK not in await resp.text(), path
    kept = _v2_orders(app).committed_offset + 1  # 2 messages, and the offset stored
    queues = (await call(app, "GET", "/api/queues"))[1]
    assert sorted((q["vhost"], q["name"], q["messages"]) for q in queues) == [
        ("/", ORDERS, 1), ("v2", ORDERS, kept)]
    publishers = (await call(app, "GET", "/api/stream/publishers"))[1]
    assert sorted((p["queue"]["vhost"], p["queue"]["name"]) for p in publishers) == [
        ("/", ORDERS), ("v2", ORDERS)]
    consumers = (await call(app, "GET", "/api/stream/consumers"))[1]
    assert [(c["queue"]["vhost"], c["queue"]["name"]) for c in consumers] == [("v2", ORDERS)]
    connections = (await call(app, "GET", "/api/stream/connections"))[1]
    assert {c["vhost"] for c in connections} == {"/", "v2"}  # rstream: one or more each
    assert [q["name"] for q in (await call(app, "GET", "/api/queues/v2"))[1]] == [ORDERS]
    status, one = await call(app, "GET", f"/api/queues/v2/{ORDERS}")
    assert status == 200 and (one["vhost"], one["name"], one["messages"]) == (
        "v2", ORDERS, kept)


async def _metrics(app) -> None:
    """Every per-stream series has `vhost`, and `stream` is the client's name."""
    text, samples = await _scrape(app)
    assert MARK not in text
    for name, rows in samples.items():
        for labels, _ in rows:
            if "stream" in labels:
                assert "vhost" in labels, (name, labels)
    door = {"stream": ORDERS, "door": "rabbitmq_stream"}
    assert _of(samples, "riverlog_published_messages_total", **door) == {"/": 1, "v2": 2}
    assert set(_of(samples, "riverlog_published_bytes_total", **door)) == {"/", "v2"}
    assert _of(samples, "riverlog_delivered_messages_total", **door) == {"/": 0, "v2": 2}
    assert set(_of(samples, "riverlog_stream_disk_bytes", stream=ORDERS)) == {"/", "v2"}
    assert set(_of(samples, "riverlog_stream_segments", stream=ORDERS)) == {"/", "v2"}
    part = {"stream": ORDERS, "partition": "0"}
    v2 = _v2_orders(app)
    assert _of(samples, "riverlog_partition_committed_offset", **part) == {
        "/": 0, "v2": v2.committed_offset}
    assert _of(samples, "riverlog_partition_first_offset", **part) == {"/": 0, "v2": 0}
    assert _of(samples, "riverlog_consumer_lag_messages", **part, consumer="reader",
               source="offset") == {"v2": v2.last_message_offset}
    assert _of(samples, "riverlog_subscription_lag_messages", stream=ORDERS) == {"v2": 0}
    # `riverlog stats` shows both, each with its virtual host
    tables = {title: (header, rows) for title, header, rows in stats_tables(samples)}
    header, rows = tables["streams"]
    assert header[:2] == ["vhost", "stream"]
    assert sorted((r[0], r[1], r[5]) for r in rows if r[1] == ORDERS) == [
        ("/", ORDERS, "1"), ("v2", ORDERS, "2")]
    header, rows = tables["consumers"]
    assert header[:2] == ["vhost", "stream"] and [r[:2] for r in rows] == [["v2", ORDERS]]


async def test_deleted_stream_of_a_vhost_leaves_the_scrape(app):
    assert (await call(app, "PUT", "/api/vhosts/v2"))[0] == 201
    async with _client(Producer, app, "v2") as v2:
        await v2.create_stream(GONE)
        await v2.send_wait(GONE, AMQPMessage(body=b"x"))
        _, samples = await _scrape(app)
        assert _of(samples, "riverlog_published_messages_total", stream=GONE) == {"v2": 1}
        await v2.delete_stream(GONE)
    _, samples = await _scrape(app)
    assert not [lab for rows in samples.values() for lab, _ in rows
                if lab.get("stream") == GONE]


async def test_create_after_the_vhost_is_deleted_is_refused(app):
    """The create step itself checks the virtual host: a create that passed the request's
    check before the deletion and runs after it leaves no orphan stream."""
    assert (await call(app, "PUT", "/api/vhosts/v2"))[0] == 201
    await app.access.change("delete_vhost", name="v2")
    with pytest.raises(NoSuchVhostError):
        await create(app, internal("v2", ORDERS), {}, None)
    assert internal("v2", ORDERS) not in app.broker.streams


async def test_put_queue_racing_the_vhost_deletion_leaves_no_stream(app):
    """PUT /api/queues/v2/orders checks v2, then reads its body; DELETE /api/vhosts/v2
    completes meanwhile: the PUT answers 404 and v2 has no stream (it had one, orphaned,
    before the create step checked the virtual host)."""
    assert (await call(app, "PUT", "/api/vhosts/v2"))[0] == 201
    headers_sent, go_on = asyncio.Event(), asyncio.Event()

    async def body():
        yield b" "  # aiohttp sends the headers with the first chunk (JSON's leading space)
        headers_sent.set()
        await go_on.wait()
        yield json.dumps({"arguments": {}}).encode()

    put = asyncio.ensure_future(call(app, "PUT", f"/api/queues/v2/{ORDERS}", data=body(),
                                     headers={"Content-Type": "application/json"}))
    await asyncio.wait_for(headers_sent.wait(), 30)
    await asyncio.sleep(0.2)  # the request's vhost check is done; its body is awaited
    assert (await call(app, "DELETE", "/api/vhosts/v2"))[0] == 204
    go_on.set()
    status, _ = await asyncio.wait_for(put, 30)
    assert status == 404, status
    assert internal("v2", ORDERS) not in app.broker.streams
    assert [q["name"] for q in (await call(app, "GET", "/api/queues"))[1]] == []
