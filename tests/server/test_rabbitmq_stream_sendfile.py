"""Chunks served with os.sendfile from the segment file (RabbitStreamConfig.sendfile, issue 30
item 5): a real rstream consumer on a real socket gets exactly what was published, as one on
the copying path does; after a restart a chunk is checked (CRC) before it is ever sent by
sendfile, so a byte flipped on disk is still caught and never delivered as good. In-process
server; the TLS fallback is tests/security/test_rabbitmq_security.py."""
from __future__ import annotations

import asyncio
import glob
import os
import socket
import zlib

from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer

from riverlog.config import RabbitStreamConfig, ServerConfig
from riverlog.config_file import build, load
from riverlog.log.chunk import HEADER_SIZE, chunk_extent, parse_header
from riverlog.protocol.rabbitmq_stream import OffsetType as WireOffset, ResponseCode
from riverlog.protocol.rabbitmq_stream import frames as f
from riverlog.server.app import App

from test_rabbitmq_stream_door import RawClient, client_for

GUEST = {"username": "guest", "password": "guest"}
BATCHES, PER_BATCH = 12, 600  # one chunk per batch: ~600 x 200 B, above SENDFILE_MIN_BYTES


async def start(data_dir: str, sendfile: bool) -> App:
    app = App(ServerConfig(data_dir=data_dir,
                           rabbitmq_stream=RabbitStreamConfig(port=0, sendfile=sendfile)))
    await app.start()
    return app


def bodies() -> list[bytes]:
    return [f"m{i:06d}-".encode() + bytes([i % 251]) * 190 for i in range(BATCHES * PER_BATCH)]


async def publish(app: App, stream: str) -> None:
    """Large batches (a chunk each, sent by sendfile) with single small messages between
    (small chunks: the copying path), all confirmed."""
    async with Producer("127.0.0.1", app.rabbitmq_stream.port, **GUEST) as producer:
        await producer.create_stream(stream)
        sent = bodies()
        for i in range(BATCHES):
            batch = sent[i * PER_BATCH:(i + 1) * PER_BATCH]
            await send_confirmed(producer, stream, batch[:-1])  # a chunk, then a small one
            await producer.send_wait(stream, batch[-1])


async def send_confirmed(producer: Producer, stream: str, batch: list[bytes]) -> None:
    """Publish ``batch`` in one frame and wait until every message of it is confirmed."""
    left = [len(batch)]
    done = asyncio.Event()

    def on_confirm(status) -> None:
        left[0] -= 1
        if not left[0]:
            done.set()

    await producer.send_batch(stream, batch, on_publish_confirm=on_confirm)
    await asyncio.wait_for(done.wait(), 10)


async def consume(app: App, stream: str, count: int) -> tuple[list[bytes], int]:
    """The first ``count`` message bodies (rstream) and the data bytes its connection got by
    sendfile."""
    got: list[bytes] = []
    done = asyncio.Event()
    before = app.rabbitmq_stream.sendfile_bytes

    async def on_message(msg, ctx):
        got.append(bytes(msg.body) if isinstance(msg, AMQPMessage) else bytes(msg))
        if len(got) >= count:
            done.set()

    async with Consumer("127.0.0.1", app.rabbitmq_stream.port, **GUEST) as consumer:
        await consumer.start()
        await consumer.subscribe(stream, on_message, offset_specification=
                                 ConsumerOffsetSpecification(OffsetType.FIRST))
        await asyncio.wait_for(done.wait(), 30)
    return got, app.rabbitmq_stream.sendfile_bytes - before


async def test_sendfile_consumer_gets_what_the_copying_path_gets(tmp_path):
    data = str(tmp_path / "data")
    app = await start(data, sendfile=True)
    try:
        await publish(app, "big")
        # written by this process: checked, so served by sendfile at once
        got, by_sendfile = await consume(app, "big", BATCHES * PER_BATCH)
        assert got == bodies()
        assert by_sendfile > (BATCHES - 1) * PER_BATCH * 190
    finally:
        await app.stop()
    app = await start(data, sendfile=False)  # the copying path, same data
    try:
        copied, none = await consume(app, "big", BATCHES * PER_BATCH)
        assert (copied, none) == (got, 0)
    finally:
        await app.stop()
    app = await start(data, sendfile=True)
    try:  # reopened: the first reader checks every chunk (copying), the next one sendfiles
        first, unchecked = await consume(app, "big", BATCHES * PER_BATCH)
        again, by_sendfile = await consume(app, "big", BATCHES * PER_BATCH)
        assert first == again == got and unchecked == 0 and by_sendfile > 0
    finally:
        await app.stop()


def flip_a_data_byte(data_dir: str, chunk: int) -> None:
    """Flip one byte in the middle of the data section of chunk ``chunk`` (0: the first) of
    the stream's only segment file."""
    (path,) = glob.glob(os.path.join(data_dir, "**", "*.segment"), recursive=True)
    with open(path, "r+b") as segment:
        raw = segment.read()
        pos = 0
        for _ in range(chunk):
            pos += chunk_extent(raw, parse_header(raw, pos), pos)
        at = pos + HEADER_SIZE + parse_header(raw, pos).data_length // 2
        segment.seek(at)
        segment.write(bytes([raw[at] ^ 0xFF]))


async def delivered_until_failure(app: App, stream: str) -> tuple[list[bytes], list]:
    """The chunks a raw client is sent from ``stream``'s start until the server gives up on
    the subscription (MetadataUpdate), and that MetadataUpdate."""
    client = await client_for(app)
    try:
        await client.call(f.Subscribe(client.next_corr(), 1, stream, WireOffset.FIRST, None,
                                      1000), f.SubscribeResponse)
        update = await client.recv(f.MetadataUpdate, timeout=10)
        chunks = [fr.chunk for fr in client.frames if isinstance(fr, f.Deliver)]
        return chunks, [update]
    finally:
        client.close()


async def test_a_byte_flipped_on_disk_is_never_sent_as_good(tmp_path):
    data = str(tmp_path / "data")
    app = await start(data, sendfile=True)
    try:
        await publish(app, "big")
    finally:
        await app.stop()
    flip_a_data_byte(data, 6)  # the 4th large one, offsets 1800.. (large and small alternate)
    app = await start(data, sendfile=True)
    try:
        for _ in range(2):  # the second reader must not take the chunk as checked either
            chunks, (update,) = await delivered_until_failure(app, "big")
            assert update.response_code == ResponseCode.STREAM_NOT_AVAILABLE
            for chunk in chunks:  # every chunk sent (those read before it) is whole and good
                h = parse_header(chunk)
                assert len(chunk) == HEADER_SIZE + h.data_length
                assert zlib.crc32(chunk[HEADER_SIZE:]) == h.crc
                assert h.first_offset + h.num_records <= 3 * PER_BATCH
    finally:
        await app.stop()


def test_sendfile_is_a_configuration_key_and_a_flag_off_by_default(tmp_path):
    cfg = tmp_path / "riverlog.yaml"
    cfg.write_text("riverlog:\n  stream.sendfile: true\n")
    assert build(load(str(cfg), {}), {})[0].rabbitmq_stream.sendfile
    assert build(load(None, {}), {"sendfile": True})[0].rabbitmq_stream.sendfile
    assert not build(load(None, {}), {})[0].rabbitmq_stream.sendfile
    cfg.write_text("riverlog:\n  stream.sendfile: false\n  stream.validate.sub.batches: true\n")
    stream = build(load(str(cfg), {}), {})[0].rabbitmq_stream
    assert (stream.sendfile, stream.validate_sub_batches) == (False, True)


async def test_a_slow_reader_gets_whole_frames_in_order_when_the_socket_fills(tmp_path):
    """A consumer that reads slowly through a small receive buffer: os.sendfile stops short
    and the rest of each frame goes through the transport; every frame still arrives whole,
    in order, and the Deliver after a short one too."""
    app = await start(str(tmp_path / "data"), sendfile=True)
    try:
        await publish(app, "big")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", app.rabbitmq_stream.port))
        client = RawClient(*await asyncio.open_connection(sock=sock))
        assert await client.handshake() == ResponseCode.OK
        (conn,) = app.rabbitmq_stream.connections  # its send buffer small, not autotuned
        conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET,
                                                           socket.SO_SNDBUF, 16384)
        await client.call(f.Subscribe(client.next_corr(), 1, "big", WireOffset.FIRST, None,
                                      100), f.SubscribeResponse)
        chunks: list[bytes] = []
        while sum(parse_header(c).num_records for c in chunks) < BATCHES * PER_BATCH:
            await asyncio.sleep(0.002)
            data = await asyncio.wait_for(client.reader.read(4096), 10)
            assert data, "closed by the server"
            chunks += [fr.chunk for fr in client.decoder.feed(data) if isinstance(fr, f.Deliver)]
        client.close()
        offset = 0
        for chunk in chunks:
            h = parse_header(chunk)
            assert (h.first_offset, len(chunk)) == (offset, HEADER_SIZE + h.data_length)
            assert zlib.crc32(chunk[HEADER_SIZE:]) == h.crc
            offset += h.num_records
        large = sum(len(c) - HEADER_SIZE for c in chunks if len(c) > 64 * 1024)
        assert 0 < app.rabbitmq_stream.sendfile_bytes < large  # some by sendfile, not all
    finally:
        await app.stop()
