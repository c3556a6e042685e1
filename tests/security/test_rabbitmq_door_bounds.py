# What one client may hold of the RabbitMQ Stream door before and outside its rights: the
# handshake timeout (a connection that has not opened a virtual host in time is closed, as
# rabbit_stream_reader's state_timeout), null and empty stream names answered with the
# protocol's codes (not INTERNAL_ERROR), and Partitions/Route only for super streams the
# user may see. Raw sockets for what no client library sends, rstream for the rest.
from __future__ import annotations

import asyncio
import time

from rstream import Producer, SuperStreamCreationOption

from _sec import PASSWORDS, running, security
from riverlog.protocol.rabbitmq_stream import FrameDecoder, ResponseCode, encode
from riverlog.protocol.rabbitmq_stream import frames as f

HANDSHAKE_MS = 400


class Raw:
    """A raw connection to the door: ``request(frame)`` sends a frame and returns the next
    frame the server sends (None when the server closed the socket)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder(max_frame_size=0)
        self.frames: list[f.Frame] = []

    @classmethod
    async def connect(cls, port: int) -> "Raw":
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def next_frame(self, timeout: float = 10) -> f.Frame | None:
        while not self.frames:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                return None
            self.frames += self.decoder.feed(data)
        return self.frames.pop(0)

    async def request(self, frame: f.Frame) -> f.Frame | None:
        self.writer.write(encode(frame))
        return await self.next_frame()

    async def login(self, user: str) -> None:
        """PeerProperties and SASL PLAIN as ``user``; leaves the server's Tune unread."""
        await self.request(f.PeerProperties(1, {}))
        await self.request(f.SaslHandshake(2))
        answer = await self.request(f.SaslAuthenticate(
            3, "PLAIN", f"\0{user}\0{PASSWORDS[user]}".encode()))
        assert answer.response_code == ResponseCode.OK, answer

    async def opened(self, user: str) -> "Raw":
        await self.login(user)
        assert type(await self.next_frame()) is f.Tune
        self.writer.write(encode(f.TuneResponse(1048576, 0)))
        answer = await self.request(f.Open(4, "/"))
        assert answer.response_code == ResponseCode.OK, answer
        return self

    async def closed_by_server(self, timeout: float = 20) -> bool:
        """Whether the server closes the socket within ``timeout`` s (frames before are
        read and dropped)."""
        try:
            while await self.next_frame(timeout) is not None:
                pass
        except (ConnectionResetError, asyncio.TimeoutError):
            return False
        return True


async def test_connections_that_do_not_open_in_time_are_closed(tmp_path, users):
    stream = {"handshake_timeout_ms": HANDSHAKE_MS}
    async with running(tmp_path, security(users), liftbridge=False, stream=stream) as app:
        port = app.rabbitmq_stream.port
        async with Producer("127.0.0.1", port=port, username="ops",
                            password=PASSWORDS["ops"]) as ops:
            await ops.create_stream("orders.eu")
            started = time.monotonic()
            idle = [await Raw.connect(port) for _ in range(20)]
            logged_in = await Raw.connect(port)  # authenticated, never opens
            await logged_in.login("alice")
            opened = await (await Raw.connect(port)).opened("alice")
            assert all(await asyncio.gather(*(raw.closed_by_server() for raw in idle),
                                            logged_in.closed_by_server()))
            assert time.monotonic() - started >= HANDSHAKE_MS / 1000
            # well past the timeout, the opened connections still work
            await asyncio.sleep(2 * HANDSHAKE_MS / 1000)
            answer = await opened.request(f.Metadata(5, ("orders.eu",)))
            assert answer.streams[0].response_code == ResponseCode.OK
            await ops.send_wait("orders.eu", b"still here")
            assert app.broker.streams["orders.eu"].partitions[0].next_offset == 1
            assert len(app.rabbitmq_stream.connections) == 2
            opened.writer.close()
