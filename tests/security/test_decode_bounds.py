# Bombs in stored records (issue 15, items 7-10): what reading a record may cost is bounded by
# the record, whoever wrote it. AMQP 1.0 values that would decode into far more objects than
# their octets are handed over as raw bytes; compressed sub-entry batches inflate at most to
# their declared size (and a hard cap), and one that cannot be read is skipped alone; the
# internal streams (__cursors, __activity) can be written by the server only, on every door.
# Real servers in this process (_sec.running), real rstream / grpcio / nats-py clients; memory
# is the peak resident set of this process (_memory), with bounds far from both outcomes.
from __future__ import annotations

import asyncio
import contextlib
import gzip

import grpc
import nats
import pytest
import zstandard
from rstream import CompressionType, Producer, exceptions
from rstream.compression import NoneCompressionCodec, StreamCompressionCodecs

from _memory import MIB, peak_growth
from _sec import running
from riverlog.config import SecurityConfig
from riverlog.config_file import build, load
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc

GUEST = {"username": "guest", "password": "guest"}


def nested_array_bomb(arrays: int) -> bytes:
    """An AMQP 1.0 message whose amqp-value is an array32 of ``arrays`` array8 elements, each
    claiming 255 list0 elements under 64 null descriptors: 131 octets per inner array that a
    decoder without bounds turns into 255 x 65 objects."""
    inner_body = bytes([255]) + b"\x00\x40" * 64 + b"\x45"
    inner = bytes([len(inner_body)]) + inner_body
    body = arrays.to_bytes(4, "big") + b"\xe0" + inner * arrays
    return b"\x00\x53\x77" + b"\xf0" + len(body).to_bytes(4, "big") + body


class ForgedCodec(NoneCompressionCodec):
    """An rstream codec that sends ``body`` as the compressed sub-batch of any messages, with
    ``declared`` as its uncompressed size: what a hostile publisher can put on the wire."""

    def __init__(self, kind: CompressionType, body: bytes, declared: int) -> None:
        super().__init__()
        self.kind, self.body, self.declared = kind, body, declared

    def compress(self, messages) -> None:
        super().compress(messages)  # the record count
        self.buffer, self.compressed_data_size = self.body, len(self.body)
        self.uncompressed_data_size = self.declared

    def compression_type(self) -> int:
        return self.kind.value


@contextlib.contextmanager
def forged(kind: CompressionType, body: bytes, declared: int):
    """rstream sends ``body`` for sub-entry batches of ``kind`` inside the block."""
    table = StreamCompressionCodecs.available_compress_codecs
    saved = dict(table)
    StreamCompressionCodecs.register_codec(kind, ForgedCodec(kind, body, declared))
    try:
        yield
    finally:
        table.clear()
        table.update(saved)


async def send_forged(producer: Producer, stream: str, kind: CompressionType, body: bytes,
                      declared: int, records: int) -> int:
    """Publish one forged sub-entry batch of ``records`` records; its confirm's response
    code (0: confirmed)."""
    confirmed = asyncio.get_running_loop().create_future()
    with forged(kind, body, declared):
        await producer.send_sub_entry(stream, [b"x"] * records, compression_type=kind,
                                      on_publish_confirm=confirmed.set_result)
    status = await asyncio.wait_for(confirmed, 10)
    return 0 if status.is_confirmed else status.response_code


async def subscribe_all(app, stream: str, stop_offset: int | None = None) -> list[pb.Message]:
    """Every message of ``stream`` through gRPC Subscribe, from EARLIEST to STOP_LATEST (or
    to ``stop_offset``)."""
    unlimited = [("grpc.max_receive_message_length", -1)]  # the server alone decides sizes
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}", unlimited) as channel:
        call = api_pb2_grpc.APIStub(channel).Subscribe(pb.SubscribeRequest(
            stream=stream, startPosition=pb.StartPosition.EARLIEST,
            stopPosition=pb.StopPosition.STOP_LATEST if stop_offset is None
            else pb.StopPosition.STOP_OFFSET, stopOffset=stop_offset or 0), timeout=30)
        got = []
        try:
            async for message in call:
                got.append(message)
        except grpc.aio.AioRpcError as exc:  # Liftbridge ends STOP_LATEST with this status
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
    return got[1:]  # the first message is the empty "subscription created"


async def test_amqp_decode_bomb_is_served_as_raw_bytes(tmp_path):
    """Item 7: a 1.8 KB message of nested described arrays made 65 MB of objects (+280 MB RSS,
    a 3 s stall) for a gRPC Subscribe; now it is the value as stored, at a few MB at most."""
    bomb = nested_array_bomb(14)
    assert len(bomb) < 2000
    async with running(tmp_path, SecurityConfig()) as app:
        async with Producer("127.0.0.1", app.rabbitmq_stream.port, **GUEST) as producer:
            await producer.create_stream("bombs")
            await producer.send_wait("bombs", bomb)
            await producer.send_wait("bombs", b"after the bomb")
        with peak_growth() as peak:
            got = await subscribe_all(app, "bombs")
    assert peak.growth < 32 * MIB, f"reading a {len(bomb)}-byte record grew RSS by " \
                                   f"{peak.growth / MIB:.0f} MiB"
    assert [(m.offset, m.value) for m in got] == [(0, bomb), (1, b"after the bomb")]


async def wait_stored(app, stream: str, count: int) -> None:
    partition = app.broker.streams[stream].partitions[0]
    for _ in range(500):
        if partition.committed_offset + 1 >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{stream}: {partition.committed_offset + 1} stored, not {count}")


async def test_reserved_streams_are_reserved_on_every_door(tmp_path):
    """Item 8: __cursors could be written and even deleted through the RabbitMQ door (the
    gRPC door refused create and delete only, the NATS door stored what came on its
    subject). Now no door creates, deletes or publishes to a reserved stream; the RabbitMQ
    door answers precondition failed (0x11), as RabbitMQ does for its reserved amq.* names."""
    bomb = nested_array_bomb(14)
    async with running(tmp_path, SecurityConfig()) as app:
        cursors = app.broker.streams["__cursors"]
        async with Producer("127.0.0.1", app.rabbitmq_stream.port, **GUEST) as producer:
            for name in ("__cursors", "__activity"):  # __activity: off, so not there
                with pytest.raises(exceptions.PreconditionFailed):
                    await producer.create_stream(name)
                with pytest.raises(exceptions.PreconditionFailed):
                    await producer.delete_stream(name)
            with pytest.raises(exceptions.ServerError) as info:  # refused on DeclarePublisher
                await producer.send_wait("__cursors", bomb)
            assert isinstance(info.value, exceptions.PreconditionFailed) or isinstance(
                info.value.__context__, exceptions.PreconditionFailed), repr(info.value)
            await producer.create_stream("plain")
        assert app.broker.streams["__cursors"] is cursors

        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
            stub = api_pb2_grpc.APIStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Publish(pb.PublishRequest(stream="__cursors", value=bomb,
                                                     ackPolicy=pb.AckPolicy.LEADER), timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            call = stub.PublishAsync(timeout=10)
            await call.write(pb.PublishRequest(stream="__cursors", value=bomb,
                                               correlationId="c1", ackPolicy=pb.AckPolicy.LEADER))
            answer = await call.read()
            await call.done_writing()
            assert answer.asyncError.code == pb.PublishAsyncError.Code.BAD_REQUEST
            await stub.CreateStream(pb.CreateStreamRequest(name="nats-plain", subject="plain.in"),
                                    timeout=10)

        nc = await nats.connect(app.nats.url, allow_reconnect=False)
        try:
            await nc.publish(cursors.config.subject, bomb)
            await nc.publish("plain.in", b"after")  # same connection: handled after the first
            await nc.flush()
            await wait_stored(app, "nats-plain", 1)
        finally:
            await nc.close()
        assert [p.next_offset for p in cursors.partitions] == [0] * len(cursors.partitions)


async def test_a_bomb_already_in_cursors_costs_little_at_start(tmp_path):
    """Item 8: a cursors record is decoded at every start (a 1.8 KB bomb: +3 s, +278 MB).
    Written here the way only the server can now (its own appender), then read at restart."""
    bomb = nested_array_bomb(14)
    async with running(tmp_path, SecurityConfig()) as app:
        partition = app.broker.streams["__cursors"].partitions[0]
        app.liftbridge.appenders.get(partition).append(bomb)
        await wait_stored(app, "__cursors", 1)
    with peak_growth() as peak:
        async with running(tmp_path, SecurityConfig()) as app:
            assert app.broker.streams["__cursors"].partitions[0].next_offset == 1
    assert peak.growth < 32 * MIB, f"a start with a {len(bomb)}-byte cursor record grew RSS " \
                                   f"by {peak.growth / MIB:.0f} MiB"


def gzip_bomb() -> bytes:
    """gzip of 100 MiB of zeros: ~100 KB."""
    return gzip.compress(bytes(100 * MIB), 9)


def zstd_bomb() -> bytes:
    """zstd of 100 MiB of zeros without a content size (as a stream writes it): ~3 KB."""
    stream = zstandard.ZstdCompressor(level=19).compressobj()
    return stream.compress(bytes(100 * MIB)) + stream.flush()


@pytest.mark.parametrize("kind, bomb", [(CompressionType.Gzip, gzip_bomb),
                                        (CompressionType.Zstd, zstd_bomb)])
async def test_decompression_bomb_is_bounded_by_its_declared_size(tmp_path, kind, bomb):
    """Item 9: sub-batches were inflated without a limit on gRPC Subscribe (gzip 102 KB ->
    100 MB). Now inflation stops at the declared size; the batch is skipped, the stream goes
    on. Stored as sent by default, as RabbitMQ stores it."""
    body = bomb()
    async with running(tmp_path, SecurityConfig()) as app:
        async with Producer("127.0.0.1", app.rabbitmq_stream.port, **GUEST) as producer:
            await producer.create_stream("bombs")
            assert await send_forged(producer, "bombs", kind, body, 4 + 1, 1) == 0
            await producer.send_wait("bombs", b"after the bomb")
        with peak_growth() as peak:
            got = await subscribe_all(app, "bombs")
    assert peak.growth < 32 * MIB, f"a {len(body)}-byte sub-batch grew RSS by " \
                                   f"{peak.growth / MIB:.0f} MiB"
    assert [(m.offset, m.value) for m in got] == [(1, b"after the bomb")]


async def test_a_corrupt_sub_batch_spoils_only_its_own_records(tmp_path):
    """Item 10: a gzip sub-batch that is not gzip ended every gRPC Subscribe from earliest
    with DATA_LOSS, so the offsets after it could not be read. Now its 3 offsets are skipped
    (a gap, as compaction leaves; logged, counted in riverlog_errors) and the messages
    around it are delivered."""
    async with running(tmp_path, SecurityConfig()) as app:
        async with Producer("127.0.0.1", app.rabbitmq_stream.port, **GUEST) as producer:
            await producer.create_stream("poisoned")
            await producer.send_wait("poisoned", b"before")
            assert await send_forged(producer, "poisoned", CompressionType.Gzip,
                                     b"not gzip at all", 19, 3) == 0
            await producer.send_wait("poisoned", b"after")
        got = await subscribe_all(app, "poisoned")
        # a stop offset inside the gap ends the subscription at the gap
        stopped = await subscribe_all(app, "poisoned", stop_offset=2)
    assert [(m.offset, m.value) for m in got] == [(0, b"before"), (4, b"after")]
    assert [(m.offset, m.value) for m in stopped] == [(0, b"before")]


async def test_sub_batches_can_be_validated_on_publish(tmp_path):
    """Item 10: with riverlog.stream.validate.sub.batches a sub-batch that cannot be read
    (not gzip; a bomb past its declared size) is refused with 0x11 and nothing is stored;
    a good one is stored."""
    good = gzip.compress(b"".join(len(r).to_bytes(4, "big") + r for r in (b"a", b"bc")))
    async with running(tmp_path, SecurityConfig(), stream={"validate_sub_batches": True}) as app:
        async with Producer("127.0.0.1", app.rabbitmq_stream.port, **GUEST) as producer:
            await producer.create_stream("checked")
            assert await send_forged(producer, "checked", CompressionType.Gzip,
                                     b"not gzip at all", 19, 3) == 0x11
            assert await send_forged(producer, "checked", CompressionType.Gzip,
                                     gzip_bomb(), 5, 1) == 0x11
            assert await send_forged(producer, "checked", CompressionType.Gzip,
                                     good, 11, 2) == 0
        got = await subscribe_all(app, "checked")
    assert [(m.offset, m.value) for m in got] == [(0, b"a"), (1, b"bc")]


def test_validation_is_a_configuration_key_and_a_flag(tmp_path):
    cfg = tmp_path / "riverlog.yaml"
    cfg.write_text("riverlog:\n  stream.validate.sub.batches: true\n")
    assert build(load(str(cfg), {}), {})[0].rabbitmq_stream.validate_sub_batches
    flagged, _ = build(load(None, {}), {"validate_sub_batches": True})
    assert flagged.rabbitmq_stream.validate_sub_batches
    assert not build(load(None, {}), {})[0].rabbitmq_stream.validate_sub_batches
