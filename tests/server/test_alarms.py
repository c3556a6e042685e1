"""Resource alarms (riverlog.alarms, docs/operations.md "Resource alarms") on a running App
with every door, with real clients: rstream on the RabbitMQ Stream door, riverlog's gRPC stub
on the Liftbridge API, nats-py on the NATS door. The disk alarm is raised by filling a real
size-limited tmpfs that holds the data folder (the test runs as root to mount it), the memory
alarm by growing this process' resident memory (the server runs in it) over a watermark in
bytes. While an alarm holds, a publishing RabbitMQ connection is not read (its publishes are
neither stored nor confirmed), a new publisher is refused (PRECONDITION_FAILED, as RabbitMQ),
gRPC Publish gets RESOURCE_EXHAUSTED and plain NATS messages are dropped and counted; consumers
read on. The alarm shows in the metrics and `riverlog stats`, and clears by itself: the held
publishes are then stored and confirmed, once."""
from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid

import grpc
import nats
import pytest
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer
from rstream.exceptions import PreconditionFailed

from riverlog.alarms import DISK, MEMORY
from riverlog.config import (AlarmConfig, GrpcConfig, LogConfig, MetricsConfig, NatsConfig,
                             RabbitStreamConfig, ServerConfig, Threshold)
from riverlog.config_file import ConfigError, build, threshold
from riverlog.metrics import REGISTRY
from riverlog.ops import scrape, stats_tables
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.api_pb2_grpc import APIStub
from riverlog.server.app import App
from riverlog.server.rabbitmq_stream.flow import ALARM

pytestmark = pytest.mark.timeout(90)
GUEST = {"username": "guest", "password": "guest"}
MIB = 1024 * 1024


async def until(condition, timeout: float = 20.0, what: str = "condition") -> None:
    """Poll ``condition()`` until it is true (generous: the machine is shared)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
def tmpfs(tmp_path):
    """A real 32 MiB tmpfs mounted for the test (root only), unmounted after it."""
    if os.geteuid() != 0:
        pytest.fail("the alarm tests mount a tmpfs: run them as root")
    mount = tmp_path / "fs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


async def start_app(data_dir: str, alarms: AlarmConfig) -> App:
    app = App(ServerConfig(
        data_dir=data_dir, log=LogConfig(), metrics=MetricsConfig(port=0), alarms=alarms,
        rabbitmq_stream=RabbitStreamConfig(port=0, heartbeat_s=1),
        nats=NatsConfig(port=0), grpc=GrpcConfig(port=0)))
    await app.start()
    return app


def causes(exc: BaseException | None) -> list[type]:
    """The types of ``exc`` and the exceptions it was raised while handling."""
    found = []
    while exc is not None:
        found.append(type(exc))
        exc = exc.__context__
    return found


async def samples(app: App) -> dict:
    """The server's metrics over HTTP, scraped off the event loop (which serves them)."""
    return await asyncio.to_thread(scrape, app.metrics.url)


def alarm_table(all_samples) -> list[list[str]]:
    return next(rows for title, _, rows in stats_tables(all_samples) if title == "alarms")


async def read_stream(port: int, stream: str, count: int) -> list[bytes]:
    """The first ``count`` messages of ``stream``, read by an rstream Consumer."""
    got: list[bytes] = []
    done = asyncio.Event()

    async def on_message(msg, ctx):
        got.append(bytes(msg.body) if isinstance(msg, AMQPMessage) else bytes(msg))
        if len(got) >= count:
            done.set()

    async with Consumer("127.0.0.1", port, **GUEST) as consumer:
        await consumer.start()
        await consumer.subscribe(stream, on_message, offset_specification=
                                 ConsumerOffsetSpecification(OffsetType.FIRST))
        await asyncio.wait_for(done.wait(), 20)
    return got


async def test_disk_alarm_blocks_publishers_on_every_door_and_clears(tmpfs):
    app = await start_app(str(tmpfs / "data"), AlarmConfig(
        disk_free_limit=Threshold(12 * MIB), interval_ms=100))
    port = app.rabbitmq_stream.port
    stream = f"a-{uuid.uuid4().hex[:8]}"
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}")
    stub = APIStub(channel)
    nc = await nats.connect(app.nats.url)
    filler = tmpfs / "filler"
    try:
        await stub.CreateStream(pb.CreateStreamRequest(name=stream, subject=stream), timeout=10)
        assert not app.broker.alarms.raised
        confirmed: list[int] = []
        async with Producer("127.0.0.1", port, **GUEST) as producer:
            await producer.send_wait(stream, b"before-0")
            await producer.send_wait(stream, b"before-1")

            # fill the real filesystem: less than 12 MiB left of 32
            with open(filler, "wb") as out:
                out.write(os.urandom(24 * MIB))
            await until(lambda: DISK in app.broker.alarms.raised, what="the disk alarm")
            conns = [c for c in app.rabbitmq_stream.connections if c.publishers]
            assert conns and all(c.flow.holds(ALARM) for c in conns)

            # RabbitMQ door: the publishing connection is not read, nothing is confirmed
            def on_confirm(status):  # rstream also reports failures (a closed connection)
                if status.is_confirmed:
                    confirmed.append(status.message_id)
            await producer.send_batch(stream, [b"held-0", b"held-1"],
                                      on_publish_confirm=on_confirm)
            # a new publisher is refused, as rabbit_stream_reader refuses declare_publisher
            async with Producer("127.0.0.1", port, **GUEST) as other:
                with pytest.raises(Exception) as declare:  # rstream's clean-up raises last
                    await asyncio.wait_for(other.send_wait(stream, b"refused"), 20)
            assert PreconditionFailed in causes(declare.value)
            # gRPC: RESOURCE_EXHAUSTED, nothing stored
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Publish(pb.PublishRequest(stream=stream, value=b"grpc",
                                                     ackPolicy=pb.AckPolicy.LEADER), timeout=10)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "disk alarm" in refused.value.details()
            # gRPC PublishAsync: that message answered with an error, the stream stays open
            call = stub.PublishAsync()
            await call.write(pb.PublishRequest(stream=stream, value=b"async", correlationId="c1",
                                               ackPolicy=pb.AckPolicy.LEADER))
            answer = await asyncio.wait_for(call.read(), 20)
            assert answer.correlationId == "c1"
            assert "resource alarm" in answer.asyncError.message
            await call.done_writing()
            # NATS: plain messages are dropped, and counted
            await nc.publish(stream, b"nats-dropped")
            await nc.flush()
            await until(lambda: (REGISTRY.get_sample_value(
                "riverlog_dropped_messages_total", {"door": "nats", "reason": "alarm"}) or 0)
                >= 1, what="the NATS message dropped")
            # consumers go on: what was confirmed before reads back during the alarm
            assert await read_stream(port, stream, 2) == [b"before-0", b"before-1"]
            # the alarm in the metrics and in `riverlog stats`
            now = await samples(app)
            assert now["riverlog_alarms_free_disk_space_watermark"] == [({}, 1.0)]
            assert now["riverlog_disk_space_available_limit_bytes"] == [({}, 12.0 * MIB)]
            assert ["disk", "yes"] == alarm_table(now)[0][:2]
            assert ["nats dropped (alarm)", "-"] == alarm_table(now)[2][:2]
            # a held connection outlives its heartbeat period (1 s): no "missed heartbeats"
            await asyncio.sleep(3)
            assert not confirmed, "a publish was confirmed during the alarm"
            partition = app.broker.streams[stream].partitions[0]
            assert partition.committed_offset == 1
            assert all(c in app.rabbitmq_stream.connections for c in conns)

            filler.unlink()  # space returns: the alarm clears by itself
            await until(lambda: not app.broker.alarms.raised, what="the alarm to clear")
            await until(lambda: len(confirmed) == 2, what="the held publishes confirmed")
            await producer.send_wait(stream, b"after")
        await stub.Publish(pb.PublishRequest(stream=stream, value=b"grpc-after",
                                             ackPolicy=pb.AckPolicy.LEADER), timeout=10)
        got = await read_stream(port, stream, 6)  # stored once each, in order
        assert got[:5] == [b"before-0", b"before-1", b"held-0", b"held-1", b"after"]
        assert len(got) == 6 and got[5].endswith(b"grpc-after")  # its AMQP message
        assert app.broker.streams[stream].partitions[0].committed_offset == 5
        after = await samples(app)
        assert after["riverlog_alarms_free_disk_space_watermark"] == [({}, 0.0)]
        assert ["disk", "no"] == alarm_table(after)[0][:2]
    finally:
        await nc.close()
        await channel.close()
        await app.stop()


async def test_memory_alarm_over_a_watermark_in_bytes(tmp_path):
    """The memory alarm raised by resident memory (this process: the server runs in it)
    growing 256 MiB over a watermark 128 MiB above what it was, and cleared when it is
    freed."""
    app = await start_app(str(tmp_path / "data"), AlarmConfig(interval_ms=100))
    port = app.rabbitmq_stream.port
    stream = f"m-{uuid.uuid4().hex[:8]}"
    try:
        alarms = app.broker.alarms
        alarms.check()
        assert alarms.memory_used is not None and not alarms.raised
        alarms.config = AlarmConfig(memory_high_watermark=Threshold(alarms.memory_used +
                                                                    128 * MIB),
                                    interval_ms=100)
        async with Producer("127.0.0.1", port, **GUEST) as producer:
            await producer.create_stream(stream)
            await producer.send_wait(stream, b"before")
            ballast = bytearray(256 * MIB)
            ballast[::4096] = b"x" * len(ballast[::4096])  # touch every page: resident
            await until(lambda: MEMORY in alarms.raised, what="the memory alarm")
            confirmed: list[int] = []
            await producer.send_batch(stream, [b"held"],
                                      on_publish_confirm=lambda s: s.is_confirmed and
                                      confirmed.append(1))
            await asyncio.sleep(1)
            assert not confirmed
            assert ["memory", "yes"] == alarm_table(await samples(app))[1][:2]
            del ballast
            await until(lambda: not alarms.raised, what="the memory alarm to clear")
            await until(lambda: confirmed == [1], what="the held publish confirmed")
        assert await read_stream(port, stream, 2) == [b"before", b"held"]
    finally:
        await app.stop()


def test_thresholds_parse_bytes_and_fractions_and_refuse_the_rest():
    assert threshold("k", "50MB") == Threshold(50_000_000)
    assert threshold("k", "2GiB") == Threshold(2 * 1024 ** 3)
    assert threshold("k", 1048576) == Threshold(1048576)
    assert threshold("k", "0.4") == Threshold(0.4, relative=True)
    assert Threshold(0.4, relative=True).of(1000) == 400
    assert AlarmConfig().disk_free_limit.of(10 ** 12) == 50_000_000  # RabbitMQ's default
    for bad in ("lots", "-5MB", "-1", "5 apples"):
        with pytest.raises(ConfigError, match="riverlog.disk.free.limit"):
            threshold("riverlog.disk.free.limit", bad)
    # the flags and the YAML keys reach ServerConfig.alarms
    config, _ = build({"riverlog.memory.high.watermark": "2GB"}, {"disk_free_limit": "0.05"})
    assert config.alarms == AlarmConfig(disk_free_limit=Threshold(0.05, relative=True),
                                        memory_high_watermark=Threshold(2_000_000_000))
    with pytest.raises(ConfigError, match="riverlog.memory.high.watermark"):
        build({}, {"memory_high_watermark": "plenty"})
