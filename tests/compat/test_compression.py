"""Sub-entry batches with every codec RabbitMQ clients use (0 none, 1 gzip, 2 snappy, 3 lz4,
4 zstd), framed as the clients frame them: rstream's own None and Gzip codecs, and for the
others codecs registered in rstream (its extension point) that write what the Java client
writes (rabbitmq-stream-java-client CompressionUtils: xerial SnappyFramedOutputStream,
LZ4FrameOutputStream with 64 KiB independent blocks, ZstdOutputStream without a content
size), built with independent libraries (lz4, zstandard). The batches travel through a real
riverlog (in this process, every door on): stored as sent, delivered as sent to rstream,
and read record by record by the Liftbridge gRPC Subscribe and the Spark source's reader."""
from __future__ import annotations

import asyncio
import io

import cramjam
import crc32c
import grpc
import lz4.frame
import pytest
import zstandard
from rstream import CompressionType, Consumer, ConsumerOffsetSpecification, OffsetType, Producer
from rstream.compression import (GzipCompressionCodec, ICompressionCodec, NoneCompressionCodec,
                                 StreamCompressionCodecs)

from riverlog.client import AsyncClient
from riverlog.config import GrpcConfig, LogConfig, NatsConfig, RabbitStreamConfig, ServerConfig
from riverlog.log.chunk import (ChunkFormatError, encode_chunk, iter_entries, iter_records,
                                parse_header, split_sub_batch)
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc
from riverlog.server.app import App
from riverlog.spark.arrow import chunks_to_batch

from ._helpers import GUEST, wait_until

pytestmark = pytest.mark.timeout(120)


def _snappy_framed(plain: bytes) -> bytes:
    """The snappy framing format (stream identifier, then compressed chunks), as xerial's
    SnappyFramedOutputStream and golang/snappy's buffered writer write it."""
    return bytes(cramjam.snappy.compress(plain))


def _lz4_java(plain: bytes) -> bytes:
    """An LZ4 frame with 64 KiB independent blocks (the Java client's LZ4FrameOutputStream)."""
    return lz4.frame.compress(plain, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False,
                              content_checksum=False, store_size=False)


def _zstd_stream(plain: bytes) -> bytes:
    """A zstd frame written through a stream, so without a content size (ZstdOutputStream)."""
    out = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(out, closefd=False) as w:
        w.write(plain)
    frame = out.getvalue()
    assert zstandard.get_frame_parameters(frame).content_size == zstandard.CONTENTSIZE_UNKNOWN
    return frame


def _rstream_codec(codec: ICompressionCodec, records: list[bytes]) -> bytes:
    codec.compress(records)
    return codec.data()


COMPRESSORS = {2: _snappy_framed, 3: _lz4_java, 4: _zstd_stream}


class ClientFramedCodec(ICompressionCodec):
    """An rstream codec for snappy/lz4/zstd (registered with StreamCompressionCodecs).
    ``sent`` collects every compressed body it produced, to compare with what is stored."""

    sent: list[bytes] = []

    def __init__(self, kind: CompressionType) -> None:
        self.kind = kind
        self.buffer = b""
        self.count = self.plain_size = 0

    def compress(self, messages) -> None:
        plain = b"".join(len(b).to_bytes(4, "big") + b for b in (bytes(m) for m in messages))
        self.count, self.plain_size = len(messages), len(plain)
        self.buffer = COMPRESSORS[self.kind.value](plain)
        ClientFramedCodec.sent.append(self.buffer)

    def uncompress(self, compressed_data: bytes, uncompressed_data_size: int) -> bytes:
        if self.kind is CompressionType.Snappy:
            plain = bytes(cramjam.snappy.decompress(compressed_data))
        elif self.kind is CompressionType.Lz4:
            plain = lz4.frame.decompress(compressed_data)
        else:
            plain = zstandard.ZstdDecompressor().decompressobj().decompress(compressed_data)
        assert len(plain) == uncompressed_data_size
        return plain

    def compressed_size(self) -> int:
        return len(self.buffer)

    def uncompressed_size(self) -> int:
        return self.plain_size

    def messages_count(self) -> int:
        return self.count

    def compression_type(self) -> int:
        return self.kind.value

    def data(self) -> bytes:
        return self.buffer


def _records(n: int, tag: str) -> list[bytes]:
    return [(f"{tag}-{i:04d}|" + "x" * (i % 50)).encode() for i in range(n)]


def _body(records: list[bytes]) -> bytes:
    return b"".join(len(r).to_bytes(4, "big") + r for r in records)


def _sub_batch_entry(codec: int, records: list[bytes], body: bytes) -> bytes:
    """``1|codec|0000, records u16, uncompressed length u32, length u32, body``."""
    return (bytes((0x80 | codec << 4,)) + len(records).to_bytes(2, "big")
            + len(_body(records)).to_bytes(4, "big") + len(body).to_bytes(4, "big") + body)


# -- the codecs, offline -------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_split_sub_batch_reads_what_clients_write(codec):
    records = _records(300, f"c{codec}")
    plain = _body(records)
    if codec < 2:  # rstream's own codecs
        body = _rstream_codec((NoneCompressionCodec, GzipCompressionCodec)[codec](), records)
    else:
        body = COMPRESSORS[codec](plain)
    assert (body == plain) is (codec == 0)
    assert split_sub_batch(codec, body, len(records), len(plain)) == records
    # inside a chunk, between simple entries: one offset per record
    entry = _sub_batch_entry(codec, records, body)
    data = b"\x00\x00\x00\x01A" + entry + b"\x00\x00\x00\x01Z"
    raw = encode_chunk(data, 3, 302, first_offset=10, timestamp_ms=1)
    h = parse_header(raw)
    got = list(iter_records(h, raw[48:48 + h.data_length]))
    assert got == list(zip(range(10, 312), [b"A", *records, b"Z"]))
    assert [e.codec for e in iter_entries(raw[48:48 + h.data_length])] == [None, codec, None]


def _masked_crc32c(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_snappy_framing_with_uncompressed_chunks():
    """xerial writes a frame's chunk uncompressed (type 0x01) when snappy does not shrink it:
    a framing-format stream built by hand, chunk by chunk, with masked CRC-32C."""
    records = [bytes(range(256)) * 3, b"tail"]
    plain = _body(records)
    stream = b"\xff\x06\x00\x00sNaPpY"
    for part in (plain[:500], plain[500:]):
        chunk = _masked_crc32c(part).to_bytes(4, "little") + part
        stream += b"\x01" + len(chunk).to_bytes(3, "little") + chunk
    assert split_sub_batch(2, stream, 2, len(plain)) == records


def test_raw_snappy_and_bare_lz4_blocks_are_not_the_clients_framing():
    plain = _body(_records(50, "raw"))
    with pytest.raises(ChunkFormatError, match="codec 2"):
        split_sub_batch(2, bytes(cramjam.snappy.compress_raw(plain)), 50, len(plain))
    with pytest.raises(ChunkFormatError, match="codec 3"):
        split_sub_batch(3, bytes(cramjam.lz4.compress_block(plain)), 50, len(plain))
    with pytest.raises(ChunkFormatError, match="unknown sub-batch codec 5"):
        split_sub_batch(5, plain, 50, len(plain))
    with pytest.raises(ChunkFormatError, match="shorter"):
        split_sub_batch(0, plain, 51, len(plain))


# -- through a server -----------------------------------------------------------------------------


@pytest.fixture
def client_codecs():
    table = StreamCompressionCodecs.available_compress_codecs
    saved = dict(table)
    for kind in (CompressionType.Snappy, CompressionType.Lz4, CompressionType.Zstd):
        StreamCompressionCodecs.register_codec(kind, ClientFramedCodec(kind))
    ClientFramedCodec.sent = []
    yield
    table.clear()
    table.update(saved)


@pytest.fixture
async def app(tmp_path):
    running = App(ServerConfig(data_dir=str(tmp_path), log=LogConfig(),
                               rabbitmq_stream=RabbitStreamConfig(port=0),
                               nats=NatsConfig(port=0), grpc=GrpcConfig(port=0)))
    await asyncio.wait_for(running.start(), 30)
    yield running
    await asyncio.wait_for(running.stop(), 30)


BATCHES = [(CompressionType.No, 10), (CompressionType.Gzip, 100), (CompressionType.Snappy, 77),
           (CompressionType.Lz4, 300), (CompressionType.Zstd, 250), (CompressionType.Gzip, 1)]


async def test_every_codec_end_to_end(app, client_codecs):
    port = app.rabbitmq_stream.port
    stream = "compressed"
    sent: list[bytes] = []
    confirmed = []
    async with Producer("127.0.0.1", port, **GUEST) as producer:
        await producer.create_stream(stream)
        await producer.send_wait(stream, b"plain-before")
        sent.append(b"plain-before")
        for kind, n in BATCHES:
            records = _records(n, kind.name)
            sent += records
            await producer.send_sub_entry(stream, records, compression_type=kind,
                                          on_publish_confirm=confirmed.append)
        await wait_until(lambda: len(confirmed) == len(BATCHES), 20, "sub-entry confirms")
        await producer.send_wait(stream, b"plain-after")
        sent.append(b"plain-after")
    assert all(c.is_confirmed for c in confirmed)
    partition = app.broker.streams[stream].partitions[0]
    assert partition.next_offset == len(sent)

    # stored as sent: one sub-batch entry per send_sub_entry, codec and body untouched
    entries = [e for c in partition.read_chunks(0, 1 << 24) for e in iter_entries(c.data)]
    batches = [e for e in entries if e.codec is not None]
    assert [(e.codec, e.records) for e in batches] == [(k.value, n) for k, n in BATCHES]
    assert [e.payload for e in batches if e.codec in (2, 3, 4)] == ClientFramedCodec.sent

    # rstream: every record with its own offset, decompressed by the client's own codecs
    got = []

    async def on_message(msg, ctx):
        got.append((ctx.offset, bytes(msg)))

    async with Consumer("127.0.0.1", port, **GUEST) as consumer:
        first = ConsumerOffsetSpecification(OffsetType.FIRST)
        await consumer.subscribe(stream, on_message, offset_specification=first)
        await wait_until(lambda: len(got) >= len(sent), 20, f"{len(sent)} messages")
    assert [o for o, _ in got] == list(range(len(sent)))
    assert [m for _, m in got] == sent

    # Liftbridge gRPC Subscribe: record by record
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
        call = api_pb2_grpc.APIStub(channel).Subscribe(pb.SubscribeRequest(
            stream=stream, startPosition=pb.StartPosition.EARLIEST,
            stopPosition=pb.StopPosition.STOP_LATEST), timeout=20)
        lb = []
        try:
            async for m in call:
                lb.append(m)
        except grpc.aio.AioRpcError as exc:  # Liftbridge ends STOP_LATEST with this status
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
        lb = lb[1:]  # the first message is the empty handshake
    assert [(m.offset, m.value) for m in lb] == list(enumerate(sent))

    # the Spark source's path: whole chunks from riverlog.client, then Arrow batches
    client = await AsyncClient.connect("127.0.0.1", port)
    try:
        sub = await client.subscribe(stream, credit=16)
        chunks = []
        while not chunks or chunks[-1].next_offset < len(sent):
            more = await sub.next_chunks(16, timeout=10)
            assert more, "the Spark reader got no chunk"
            chunks += more
        await sub.close()
    finally:
        await client.close()
    batch = chunks_to_batch(chunks, stream, 0, 3, len(sent) - 1)
    assert batch.column("offset").to_pylist() == list(range(3, len(sent) - 1))
    assert batch.column("value").to_pylist() == sent[3:-1]


class GarbageCodec(ClientFramedCodec):
    """A buggy client codec: claims zstd, writes bytes no zstd decoder accepts."""

    def compress(self, messages) -> None:
        super().compress(messages)
        self.buffer = b"not a zstd frame" * 4


async def _lb_offsets(app, stream: str,
                      start_offset: int) -> tuple[list[int], grpc.StatusCode]:
    """Offsets a Liftbridge Subscribe from ``start_offset`` gets, and its closing status."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
        call = api_pb2_grpc.APIStub(channel).Subscribe(pb.SubscribeRequest(
            stream=stream, startPosition=pb.StartPosition.OFFSET, startOffset=start_offset,
            stopPosition=pb.StopPosition.STOP_LATEST), timeout=20)
        got = []
        try:
            async for m in call:
                got.append(m.offset)
        except grpc.aio.AioRpcError as exc:
            return got[1:], exc.code()
    raise AssertionError("Subscribe ended without a status")


async def test_undecodable_sub_batch_is_skipped_by_liftbridge_subscribe(app):
    """A sub-batch whose body its codec cannot undo is stored as sent (RabbitMQ does not
    check bodies either); a gRPC reader skips its offsets and goes on after it."""
    table = StreamCompressionCodecs.available_compress_codecs
    saved = dict(table)
    StreamCompressionCodecs.register_codec(CompressionType.Zstd, GarbageCodec(CompressionType.Zstd))
    stream, confirmed = "garbled", []
    try:
        async with Producer("127.0.0.1", app.rabbitmq_stream.port, **GUEST) as producer:
            await producer.create_stream(stream)
            await producer.send_wait(stream, b"before")
            await producer.send_sub_entry(stream, _records(5, "bad"),
                                          compression_type=CompressionType.Zstd,
                                          on_publish_confirm=confirmed.append)
            await wait_until(lambda: confirmed, 20, "the sub-entry confirm")
            await producer.send_wait(stream, b"after")
    finally:
        table.clear()
        table.update(saved)
    assert await _lb_offsets(app, stream, 0) == ([0, 6], grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert await _lb_offsets(app, stream, 6) == ([6], grpc.StatusCode.RESOURCE_EXHAUSTED)
