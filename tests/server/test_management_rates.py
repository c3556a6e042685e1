"""Message rates and consumer lag over time in the management API (history.py): a running App
sampling every 100 ms while rstream publishes, confirms and consumes; RabbitMQ's
`message_stats` shapes (`publish_details.rate`, `samples` with msg_rates_age and
msg_rates_incr); the ring's bound; the chart library served from the installed package."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer

from riverlog.config import LogConfig, ManagementConfig, RabbitStreamConfig, ServerConfig
from riverlog.server.app import App
from riverlog.metrics import RABBITMQ_STREAM, StreamCounters
from riverlog.server.management.history import PUBLISHED, RateHistory
from server.test_management import call, eventually

pytestmark = pytest.mark.timeout(120)


async def test_rates_and_lag_of_a_stream_and_the_server(tmp_path):
    config = ServerConfig(data_dir=str(tmp_path / "data"), log=LogConfig(),
                          rabbitmq_stream=RabbitStreamConfig(port=0),
                          management=ManagementConfig(port=0, sample_interval_ms=100))
    app = App(config)
    await app.start()
    try:
        port = app.rabbitmq_stream.port
        async with Producer("127.0.0.1", port, username="guest", password="guest") as producer:
            await producer.create_stream("rated")
            for i in range(50):
                await producer.send_wait("rated", b"r%d" % i)

            async def published():
                status, queue = await call(app, "GET", "/api/queues/%2F/rated")
                assert status == 200
                stats = queue["message_stats"]
                return stats if stats.get("publish") == 50 and stats.get("confirm") == 50 \
                    else None
            stats = await eventually(published)
            assert set(stats) >= {"publish", "publish_details", "confirm", "confirm_details",
                                  "deliver_get", "deliver_get_details"}
            assert stats["deliver_get"] == 0
            assert "samples" not in stats["publish_details"]  # only when asked
            # a consumer from the first offset, then 30 more messages it has not read: lag
            consumer = Consumer("127.0.0.1", port, username="guest", password="guest")
            await consumer.start()
            got = asyncio.Event()
            count = 0

            async def on_message(msg, ctx):
                nonlocal count
                count += 1
                if count == 50:
                    got.set()
            await consumer.subscribe("rated", on_message, offset_specification=
                                     ConsumerOffsetSpecification(OffsetType.FIRST))
            await asyncio.wait_for(got.wait(), 30)

            async def delivered():
                status, overview = await call(
                    app, "GET", "/api/overview?msg_rates_age=60&msg_rates_incr=1")
                stats = overview["message_stats"]
                enough = len(stats.get("publish_details", {}).get("samples", [])) >= 3
                return overview if stats.get("deliver_get", 0) >= 50 and enough else None
            overview = await eventually(delivered)
            details = overview["message_stats"]["publish_details"]
            samples = details["samples"]
            assert samples and all(set(s) == {"sample", "timestamp"} for s in samples)
            stamps = [s["timestamp"] for s in samples]
            assert stamps == sorted(stamps, reverse=True)  # newest first, as RabbitMQ's
            assert all(a - b == 1000 for a, b in zip(stamps, stamps[1:]))
            counts = [s["sample"] for s in samples]
            assert counts == sorted(counts, reverse=True)  # totals never go back
            assert overview["message_stats"]["publish"] >= max(counts[0], 50)


            async def stream_samples():  # the stream's own: its 50 messages, and no more
                status, queue = await call(
                    app, "GET", "/api/queues/%2F/rated?msg_rates_age=60&msg_rates_incr=1")
                samples = queue["message_stats"]["publish_details"]["samples"]
                assert max(s["sample"] for s in samples) <= 50
                return samples[0]["sample"] == 50
            await eventually(stream_samples)
            assert "avg_rate" in details and "avg" in details
            assert "riverlog_consumer_lag" in overview["queue_totals"]
            await consumer.close()
        status, body = await call(app, "GET", "/api/overview?msg_rates_age=x&msg_rates_incr=1")
        assert status == 400 and body["error"] == "bad_request"
        async with aiohttp.ClientSession() as session:  # no credentials: no data in it
            url = f"http://127.0.0.1:{app.management.port}/lib/plotly.min.js"
            async with session.get(url) as resp:
                assert resp.status == 200 and b"plotly" in (await resp.read())[:2000].lower()
    finally:
        await app.stop()


def test_ring_keeps_the_last_samples_and_only_changes():
    history = RateHistory(lambda: [], interval_s=5, size=4)
    counts = StreamCounters("ring-test", RABBITMQ_STREAM)  # as the doors count
    t0 = 1_000_000
    for k in range(10):
        counts.published(10, 100)  # 10 messages every 5 s: 2 msg/s
        history.sample(now_ms=t0 + k * 5000)
    ring = history.rings["ring-test"]
    assert len(ring) == 4 and [row[0] for row in ring] == [t0 + k * 5000 for k in (6, 7, 8, 9)]
    published = [row[PUBLISHED] for row in ring]
    assert [b - a for a, b in zip(published, published[1:])] == [10, 10, 10]
    assert history.message_stats("ring-test")["publish_details"]["rate"] == 2.0
    # idle for two samples: nothing appended, the rate falls to 0, the samples go on
    history.sample(now_ms=t0 + 10 * 5000)
    history.sample(now_ms=t0 + 11 * 5000)
    assert len(ring) == 4 and ring[-1][0] == t0 + 9 * 5000
    stats = history.message_stats("ring-test", age_s=30, incr_s=5)
    details = stats["publish_details"]
    assert details["rate"] == 0.0 and stats["publish"] == published[-1]
    assert [(s["timestamp"], s["sample"]) for s in details["samples"]] == [
        (t0 + 55_000, published[3]), (t0 + 50_000, published[3]),
        (t0 + 45_000, published[3]), (t0 + 40_000, published[2]),
        (t0 + 35_000, published[1]), (t0 + 30_000, published[0])]  # none before the ring
    assert details["avg_rate"] == 1.2  # 30 messages over 25 s
    assert history.message_stats("no-such-stream") == {}
    with pytest.raises(ValueError):
        RateHistory(lambda: [], interval_s=0)
