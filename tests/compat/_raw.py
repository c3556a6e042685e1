# A small raw-socket RabbitMQ Stream peer for black-box tests: open a TCP connection, run the
# handshake (PeerProperties, SASL PLAIN, Tune echo, Open), send frames built with riverlog's
# sans-IO codec and read the server's frames back, or send arbitrary bytes. It is a test tool,
# deliberately permissive: it never validates what the server says beyond framing, so tests
# can assert on exactly what came back.
from __future__ import annotations

import asyncio
import struct
import zlib
from dataclasses import dataclass, field
from typing import Optional

from riverlog.protocol.rabbitmq_stream import FrameDecoder, FrameError, encode
from riverlog.protocol.rabbitmq_stream import frames as f

TIMEOUT = 10.0


class Closed(Exception):
    """The server closed the connection (EOF or reset)."""


@dataclass
class RawPeer:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    decoder: FrameDecoder = field(default_factory=lambda: FrameDecoder(max_frame_size=0))
    pending: list = field(default_factory=list)
    corr: int = 0
    tune: Optional[f.Tune] = None
    open_properties: Optional[dict] = None

    @classmethod
    async def connect(cls, host: str, port: int) -> "RawPeer":
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), TIMEOUT)
        return cls(reader, writer)

    @classmethod
    async def open(cls, host: str, port: int, user: str = "guest", password: str = "guest",
                   vhost: str = "/") -> "RawPeer":
        """Connect and run the whole handshake; ``self.tune`` holds the server's Tune."""
        peer = await cls.connect(host, port)
        await peer.handshake(user, password, vhost)
        return peer

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr

    # -- sending ----------------------------------------------------------------------------

    def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)

    def send(self, frame: f.Frame) -> None:
        self.writer.write(encode(frame))

    async def drain(self) -> None:
        await self.writer.drain()

    # -- receiving --------------------------------------------------------------------------

    async def recv(self, timeout: float = TIMEOUT) -> f.Frame:
        """The next frame from the server; raises Closed at EOF, TimeoutError on silence."""
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(1 << 20), timeout)
            if not data:
                raise Closed("server closed the connection")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    async def recv_until(self, cls: type, timeout: float = TIMEOUT, keep: Optional[list] = None) -> f.Frame:
        """Skip frames (heartbeats, ...) until one of type ``cls``; skipped ones go to ``keep``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            frame = await self.recv(max(0.01, deadline - loop.time()))
            if isinstance(frame, cls):
                return frame
            if keep is not None:
                keep.append(frame)

    async def request(self, frame: f.Frame, timeout: float = TIMEOUT) -> f.Frame:
        """Send a request and return the response with its correlation id (other frames that
        arrive meanwhile are dropped, except that a Close from the server raises)."""
        self.send(frame)
        await self.drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            got = await self.recv(max(0.01, deadline - loop.time()))
            if getattr(got, "correlation_id", None) == frame.correlation_id and type(got) is not type(frame):
                return got
            if isinstance(got, f.Close):
                raise Closed(f"server sent Close code 0x{got.code:02x} {got.reason!r}")

    async def chunks_until(self, subscription_id: int, records: int,
                           timeout: float = TIMEOUT) -> list["Chunk"]:
        """The chunks delivered (Deliver v1) to ``subscription_id`` until they hold at least
        ``records`` records; other frames are dropped. Raises TimeoutError on silence."""
        chunks: list[Chunk] = []
        while sum(c.records for c in chunks) < records:
            frame = await self.recv_until(f.Deliver, timeout)
            if frame.subscription_id == subscription_id:
                chunks.append(Chunk.parse(frame.chunk))
        return chunks

    async def wait_closed(self, timeout: float = TIMEOUT) -> list:
        """Read until EOF; returns every frame received meanwhile (e.g. a Close). A Close from
        the server is answered, as a client would. Raises TimeoutError if the server keeps the
        connection open."""
        frames: list = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                frame = await self.recv(max(0.01, deadline - loop.time()))
            except (Closed, ConnectionError):
                return frames
            except FrameError:
                return frames  # the server wrote something unframeable and then, we hope, closed
            frames.append(frame)
            if isinstance(frame, f.Close):
                try:
                    self.send(f.CloseResponse(frame.correlation_id, 1))
                    await self.drain()
                except ConnectionError:
                    return frames

    def close(self) -> None:
        self.writer.close()

    # -- handshake --------------------------------------------------------------------------

    async def handshake(self, user: str, password: str, vhost: str = "/") -> None:
        r = await self.request(f.PeerProperties(self.next_corr(), {"product": "riverlog-tests"}))
        assert r.response_code == 1, r
        r = await self.request(f.SaslHandshake(self.next_corr()))
        assert "PLAIN" in r.mechanisms, r
        auth = f.SaslAuthenticate(self.next_corr(), "PLAIN", b"\0" + user.encode() + b"\0" + password.encode())
        r = await self.request(auth)
        if r.response_code != 1:
            raise PermissionError(f"authentication failed: 0x{r.response_code:02x}")
        tune = await self.recv_until(f.Tune)
        self.tune = tune
        self.send(f.Tune(tune.frame_max, tune.heartbeat))
        r = await self.request(f.Open(self.next_corr(), vhost))
        assert r.response_code == 1, r
        self.open_properties = r.properties or {}

    # -- conveniences -----------------------------------------------------------------------

    async def create(self, stream: str, arguments: Optional[dict] = None) -> int:
        r = await self.request(f.Create(self.next_corr(), stream, arguments or {}))
        return r.response_code

    async def delete(self, stream: str) -> int:
        r = await self.request(f.Delete(self.next_corr(), stream))
        return r.response_code


# -- Deliver chunks ------------------------------------------------------------------------------

CHUNK_HEADER = struct.Struct(">BBHIqQQIIIB3x")  # magic/version, type, entries, records, ts, epoch,
# chunk id, crc, data length, trailer length, bloom size, reserved


@dataclass(frozen=True)
class Chunk:
    magic_version: int
    chunk_type: int
    entries: int
    records: int
    timestamp: int
    epoch: int
    chunk_id: int
    crc: int
    data_length: int
    trailer_length: int
    bloom_size: int
    data: bytes

    @classmethod
    def parse(cls, raw: bytes) -> "Chunk":
        head = CHUNK_HEADER.unpack_from(raw, 0)
        return cls(*head, data=bytes(raw[CHUNK_HEADER.size:]))

    def crc_ok(self) -> bool:
        return zlib.crc32(self.data) & 0xFFFFFFFF == self.crc

    def simple_records(self) -> list[bytes]:
        """Record payloads of a chunk made of simple entries only."""
        out, o, d = [], 0, self.data
        for _ in range(self.entries):
            (n,) = struct.unpack_from(">I", d, o)
            assert not n & 0x80000000, "sub-batch entry"
            out.append(d[o + 4:o + 4 + n])
            o += 4 + n
        return out
