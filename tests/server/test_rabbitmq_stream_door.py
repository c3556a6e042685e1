"""The RabbitMQ Stream door at the frame level, with an in-process server and a raw socket
client built on the codec: handshake and auth errors, credit accounting, heartbeats and
dead-peer detection, publisher back-pressure, deduplication confirms, bad frames."""
import asyncio
import struct
import zlib

import pytest

from riverlog.config import Durability, LogConfig, RabbitStreamConfig, ServerConfig
from riverlog.protocol.rabbitmq_stream import FrameDecoder, ResponseCode, encode, simple_entry
from riverlog.protocol.rabbitmq_stream import frames as f
from riverlog.broker.tracking import decode_writer_trailer
from riverlog.log.chunk import iter_records, trailer_of
from riverlog.server.app import App
from riverlog.server.rabbitmq_stream import CHUNK_MAX_ENTRIES
from riverlog.security.users import is_loopback


class RawClient:
    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder(max_frame_size=0)
        self.frames = []
        self.corr = 0

    @classmethod
    async def connect(cls, port):
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, frame):
        self.writer.write(encode(frame))

    def next_corr(self):
        self.corr += 1
        return self.corr

    async def recv(self, kind, timeout=5.0):
        """Next frame of type ``kind`` (others are kept in ``frames``)."""
        async def read():
            while True:
                for i, frame in enumerate(self.frames):
                    if isinstance(frame, kind):
                        return self.frames.pop(i)
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError("closed by the server")
                self.frames.extend(self.decoder.feed(data))
        return await asyncio.wait_for(read(), timeout)

    async def handshake(self, user="guest", password="guest", heartbeat=0):
        self.send(f.PeerProperties(self.next_corr(), {"product": "raw"}))
        await self.recv(f.PeerPropertiesResponse)
        self.send(f.SaslHandshake(self.next_corr()))
        assert "PLAIN" in (await self.recv(f.SaslHandshakeResponse)).mechanisms
        self.send(f.SaslAuthenticate(self.next_corr(), "PLAIN",
                                     b"\0" + user.encode() + b"\0" + password.encode()))
        auth = await self.recv(f.SaslAuthenticateResponse)
        if auth.response_code != ResponseCode.OK:
            return auth.response_code
        tune = await self.recv(f.Tune)
        self.send(f.TuneResponse(tune.frame_max, heartbeat))
        self.send(f.Open(self.next_corr(), "/"))
        opened = await self.recv(f.OpenResponse)
        assert opened.properties["advertised_host"] == "127.0.0.1"
        return opened.response_code

    async def call(self, frame, kind):
        self.send(frame)
        return await self.recv(kind)

    async def closed(self, timeout=5.0):
        """True once the server closes the socket (frames before that are kept)."""
        async def drain():
            while True:
                data = await self.reader.read(65536)
                if not data:
                    return True
                try:
                    self.frames.extend(self.decoder.feed(data))
                except Exception:
                    pass
        return await asyncio.wait_for(drain(), timeout)

    def close(self):
        self.writer.close()


async def client_for(app, **kw):
    client = await RawClient.connect(app.rabbitmq_stream.port)
    assert await client.handshake(**kw) == ResponseCode.OK
    return client


async def test_wrong_password_is_refused_and_closed(app):
    client = await RawClient.connect(app.rabbitmq_stream.port)
    assert await client.handshake(password="nope") == ResponseCode.AUTHENTICATION_FAILURE
    assert await client.closed()
    assert not [fr for fr in client.frames if isinstance(fr, f.Close)]  # as RabbitMQ: none


def test_guest_is_loopback_only():
    assert is_loopback("127.0.0.1") and is_loopback("::1")
    assert not is_loopback("10.1.2.3") and not is_loopback(None)


async def test_commands_before_open_close_the_connection(app):
    client = await RawClient.connect(app.rabbitmq_stream.port)
    client.send(f.Create(1, "s", {}))
    assert await client.closed()
    assert "s" not in app.broker.streams


async def test_unknown_and_oversized_frames_close_only_that_connection(app):
    bad = await client_for(app)
    bad.writer.write(struct.pack(">IHH", 4, 0x0077, 1))       # unknown key
    assert await bad.closed()
    assert any(isinstance(fr, f.Close) and fr.code == ResponseCode.UNKNOWN_FRAME
               for fr in bad.frames)
    big = await client_for(app)
    big.writer.write(struct.pack(">I", 2 * 1024 * 1024) + b"\0" * 100)
    assert await big.closed()
    assert any(isinstance(fr, f.Close) and fr.code == ResponseCode.FRAME_TOO_LARGE
               for fr in big.frames)
    good = await client_for(app)
    resp = await good.call(f.Create(good.next_corr(), "still-fine", {}), f.CreateResponse)
    assert resp.response_code == ResponseCode.OK


async def _publish(client, stream, count, per_frame=10, publisher_id=1, reference="",
                   one_by_one=False):
    """Publish ``count`` messages in frames of ``per_frame``; with ``one_by_one`` each frame
    waits for its confirm (so each becomes its own chunk)."""
    resp = await client.call(f.DeclarePublisher(client.next_corr(), publisher_id, reference,
                                                stream), f.DeclarePublisherResponse)
    assert resp.response_code == ResponseCode.OK
    pid = 0
    confirmed = set()
    for _ in range(count // per_frame):
        client.send(f.Publish(publisher_id, tuple(
            (pid + i + 1, simple_entry(b"m%d" % (pid + i))) for i in range(per_frame))))
        pid += per_frame
        while one_by_one and len(confirmed) < pid:
            confirmed.update((await client.recv(f.PublishConfirm)).publishing_ids)
    while len(confirmed) < count:
        confirmed.update((await client.recv(f.PublishConfirm)).publishing_ids)
    return confirmed


async def test_publish_frames_received_together_become_one_chunk(app):
    client = await client_for(app)
    await client.call(f.Create(client.next_corr(), "merged", {}), f.CreateResponse)
    await client.call(f.DeclarePublisher(client.next_corr(), 1, "", "merged"),
                      f.DeclarePublisherResponse)
    frames = b"".join(encode(f.Publish(1, tuple((n * 10 + i, simple_entry(b"x"))
                                                for i in range(10)))) for n in range(5))
    client.writer.write(frames)            # five frames in one write
    confirmed = set()
    while len(confirmed) < 50:
        confirmed.update((await client.recv(f.PublishConfirm)).publishing_ids)
    log = app.broker.get("merged").partitions[0].log
    assert log.next_offset == 50
    assert len(log.read_chunks(0)) < 5


async def test_a_frame_split_into_chunks_records_each_chunks_own_last_id(app):
    """One frame of 10,000 messages of a named publisher, after another publisher's frame:
    chunks of at most CHUNK_MAX_ENTRIES, and each chunk's trailer holds, for every named
    publisher with messages in it, the highest id written in that chunk (never a later one:
    a crash between the chunks must not make unwritten ids duplicates)."""
    client = await client_for(app)
    await client.call(f.Create(client.next_corr(), "split", {}), f.CreateResponse)
    for pid, ref in ((1, "early"), (2, "big")):
        await client.call(f.DeclarePublisher(client.next_corr(), pid, ref, "split"),
                          f.DeclarePublisherResponse)
    client.writer.write(encode(f.Publish(1, ((0, simple_entry(b"early 0")),))) + encode(
        f.Publish(2, tuple((i, simple_entry(b"big %d" % i)) for i in range(10_000)))))
    confirmed = set()
    while len(confirmed) < 10_001:
        confirm = await client.recv(f.PublishConfirm)
        confirmed.update((confirm.publisher_id, i) for i in confirm.publishing_ids)
    chunks = app.broker.get("split").partitions[0].log.read_chunks(0, 1 << 24)
    assert len(chunks) > 1 and max(c.header.num_entries for c in chunks) <= CHUNK_MAX_ENTRIES
    stored = []
    for chunk in chunks:
        highest = {}
        for _, record in iter_records(chunk.header, chunk.data):
            ref, publishing_id = record.split()
            highest[ref.decode()] = int(publishing_id)
            stored.append(record)
        records, legacy = trailer_of(chunk.header, chunk.raw)
        assert not legacy
        trailer = decode_writer_trailer(records)
        assert dict(trailer) == highest
    assert stored == [b"early 0"] + [b"big %d" % i for i in range(10_000)]


async def test_credit_counts_chunks_and_is_never_exceeded(app):
    client = await client_for(app)
    await client.call(f.Create(client.next_corr(), "s", {}), f.CreateResponse)
    await _publish(client, "s", 50, per_frame=10, one_by_one=True)   # 5 chunks
    resp = await client.call(f.Subscribe(client.next_corr(), 7, "s", 1, None, 2),
                             f.SubscribeResponse)
    assert resp.response_code == ResponseCode.OK
    chunks = [await client.recv(f.Deliver), await client.recv(f.Deliver)]
    with pytest.raises(asyncio.TimeoutError):
        await client.recv(f.Deliver, timeout=0.5)               # credit used up
    client.send(f.Credit(7, 3))
    chunks += [await client.recv(f.Deliver) for _ in range(3)]
    offsets = [struct.unpack_from(">Q", c.chunk, 24)[0] for c in chunks]
    assert offsets == [0, 10, 20, 30, 40]
    for c in chunks:                                           # header + data, CRC right
        (crc, dlen) = struct.unpack_from(">II", c.chunk, 32)
        assert len(c.chunk) == 48 + dlen and zlib.crc32(c.chunk[48:]) == crc
    client.send(f.Credit(99, 1))                               # unknown subscription
    err = await client.recv(f.CreditResponse)
    assert err.response_code == ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST


async def test_deduplication_confirms_but_does_not_store(app):
    client = await client_for(app)
    await client.call(f.Create(client.next_corr(), "d", {}), f.CreateResponse)
    assert await _publish(client, "d", 20, reference="app-1") == set(range(1, 21))
    client.send(f.Publish(1, tuple((i, simple_entry(b"dup")) for i in range(15, 25))))
    confirmed = set()
    while len(confirmed) < 10:
        confirmed.update((await client.recv(f.PublishConfirm)).publishing_ids)
    assert confirmed == set(range(15, 25))
    part = app.broker.get("d").partitions[0]
    assert part.next_offset == 24                               # 20 + the 4 new ones
    seq = await client.call(f.QueryPublisherSequence(client.next_corr(), "app-1", "d"),
                            f.QueryPublisherSequenceResponse)
    assert seq.sequence == 24


async def test_a_duplicate_is_confirmed_only_once_its_original_is_committed(tmp_path,
                                                                          monkeypatch):
    """Under ``always`` a publish is confirmed after its fsync; a duplicate of it arriving
    while that fsync is still running must wait for it too (it was confirmed at once: a
    client could then lose a message it was told was stored). The disk is made slow by
    holding the fsync until the test lets it go."""
    import threading
    from riverlog.log import syncer

    disk = threading.Event()
    real_fsync_all = syncer._fsync_all
    monkeypatch.setattr(syncer, "_fsync_all", lambda fds: (disk.wait(10), real_fsync_all(fds)))
    app = App(ServerConfig(data_dir=str(tmp_path), log=LogConfig(durability=Durability.ALWAYS),
                           rabbitmq_stream=RabbitStreamConfig(port=0, silent_close_delay_ms=0)))
    await app.start()
    try:
        client = await client_for(app)
        await client.call(f.Create(client.next_corr(), "dup", {}), f.CreateResponse)
        await client.call(f.DeclarePublisher(client.next_corr(), 1, "app-1", "dup"),
                          f.DeclarePublisherResponse)
        client.send(f.Publish(1, ((1, simple_entry(b"original")),)))
        part = app.broker.get("dup").partitions[0]
        for _ in range(100):  # the original is written; its fsync is held
            if part.next_offset == 1:
                break
            await asyncio.sleep(0.02)
        client.send(f.Publish(1, ((1, simple_entry(b"duplicate")),)))
        with pytest.raises(asyncio.TimeoutError):
            await client.recv(f.PublishConfirm, timeout=0.5)
        assert part.committed_offset == -1
        disk.set()
        confirmed = []
        while len(confirmed) < 2:
            confirmed += (await client.recv(f.PublishConfirm)).publishing_ids
        assert confirmed == [1, 1] and part.next_offset == 1 and part.committed_offset == 0
    finally:
        disk.set()
        await app.stop()


async def test_publish_to_unknown_publisher_gets_publish_error(app):
    client = await client_for(app)
    client.send(f.Publish(9, ((1, simple_entry(b"x")),)))
    err = await client.recv(f.PublishError)
    assert err.errors == ((1, ResponseCode.PUBLISHER_DOES_NOT_EXIST),)


async def test_server_heartbeats_and_detects_a_dead_peer(tmp_path):
    app = App(ServerConfig(data_dir=str(tmp_path),
                           rabbitmq_stream=RabbitStreamConfig(port=0, heartbeat_s=1)))
    await app.start()
    try:
        client = await client_for(app, heartbeat=1)
        await client.recv(f.Heartbeat, timeout=3)               # idle: the server beats
        assert await client.closed(timeout=6)                  # we never beat back
    finally:
        await app.stop()


async def test_slow_confirms_pause_reading_the_publisher(tmp_path):
    app = App(ServerConfig(
        data_dir=str(tmp_path), log=LogConfig(durability=Durability.ALWAYS),
        rabbitmq_stream=RabbitStreamConfig(port=0, max_unconfirmed=100, resume_unconfirmed=20)))
    await app.start()
    try:
        client = await client_for(app)
        await client.call(f.Create(client.next_corr(), "bp", {}), f.CreateResponse)
        conn = next(iter(app.rabbitmq_stream.connections))
        paused = []
        real_pause = conn.transport.pause_reading
        conn.transport.pause_reading = lambda: (paused.append(conn.unconfirmed), real_pause())
        confirmed = await _publish(client, "bp", 2000, per_frame=50)
        assert len(confirmed) == 2000
        assert paused and all(n > 100 for n in paused)
        assert not conn.reading_paused and conn.unconfirmed == 0
    finally:
        await app.stop()


async def test_delete_sends_metadata_update_to_consumers(app):
    client = await client_for(app)
    await client.call(f.Create(client.next_corr(), "gone", {}), f.CreateResponse)
    await client.call(f.Subscribe(client.next_corr(), 1, "gone", 3, None, 10), f.SubscribeResponse)
    other = await client_for(app)
    resp = await other.call(f.Delete(other.next_corr(), "gone"), f.DeleteResponse)
    assert resp.response_code == ResponseCode.OK
    update = await client.recv(f.MetadataUpdate)
    assert update.stream == "gone" and update.response_code == ResponseCode.STREAM_NOT_AVAILABLE
    md = await client.call(f.Metadata(client.next_corr(), ("gone",)), f.MetadataResponse)
    assert md.streams[0].response_code == ResponseCode.STREAM_DOES_NOT_EXIST
    assert md.streams[0].leader_reference == 0xFFFF


async def test_publish_to_a_read_only_stream_is_refused(app):
    client = await client_for(app)
    await client.call(f.Create(client.next_corr(), "ro", {}), f.CreateResponse)
    await client.call(f.DeclarePublisher(client.next_corr(), 1, "", "ro"),
                      f.DeclarePublisherResponse)
    app.broker.get("ro").partitions[0].readonly = True    # Liftbridge's SetStreamReadonly
    client.send(f.Publish(1, ((1, simple_entry(b"x")), (2, simple_entry(b"y")))))
    err = await client.recv(f.PublishError)
    assert err.errors == ((1, ResponseCode.ACCESS_REFUSED), (2, ResponseCode.ACCESS_REFUSED))
    assert app.broker.get("ro").partitions[0].next_offset == 0


async def _resolve(client, stream, offset_type, offset=None, properties=None):
    r = await client.call(f.ResolveOffsetSpec(client.next_corr(), stream, offset_type, offset,
                                              properties), f.ResolveOffsetSpecResponse)
    assert r.offset_type == 4  # RabbitMQ always answers with type OFFSET
    return r.response_code, r.offset


async def test_resolve_offset_spec(app):
    """ResolveOffsetSpec (0x1f) answers where a Subscribe with the same spec starts (the
    cases of RabbitMQ's rabbit_stream_SUITE:test_resolve_offset_spec, and more)."""
    client = await client_for(app)
    versions = await client.call(f.ExchangeCommandVersions(client.next_corr(), ()),
                                 f.ExchangeCommandVersionsResponse)
    assert any(v.key == 0x1F for v in versions.versions)
    await client.call(f.Create(client.next_corr(), "ros", {}), f.CreateResponse)
    OK = ResponseCode.OK
    for kind in (1, 2, 3):                                     # empty: first, last, next
        assert await _resolve(client, "ros", kind) == (OK, 0)
    await _publish(client, "ros", 30, per_frame=10, one_by_one=True)     # chunks 0, 10, 20
    stamps = [c.header.timestamp_ms for c in app.broker.get("ros").partitions[0].read_chunks(0)]
    assert await _resolve(client, "ros", 1) == (OK, 0)
    assert await _resolve(client, "ros", 2) == (OK, 20)        # the last chunk's first offset
    assert await _resolve(client, "ros", 3) == (OK, 30)
    assert await _resolve(client, "ros", 4, 17) == (OK, 17)
    assert await _resolve(client, "ros", 4, 1000) == (OK, 30)  # clamped like Subscribe
    assert await _resolve(client, "ros", 5, stamps[0] - 60_000) == (OK, 0)
    assert await _resolve(client, "ros", 5, stamps[-1] + 3_600_000) == (OK, 30)  # next
    # properties are accepted (filters, a name): the answer stays the position of the spec
    assert await _resolve(client, "ros", 2, None, {"filter.0": "eu", "name": "x"}) == (OK, 20)
    assert await _resolve(client, "nope", 1) == (ResponseCode.STREAM_DOES_NOT_EXIST, 0)
