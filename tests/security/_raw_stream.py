# A raw RabbitMQ Stream connection for the security tests (imported as `_raw_stream`): frames
# no client library sends (null names, bare handshakes), through riverlog's own codec.
from __future__ import annotations

import asyncio

from _sec import PASSWORDS
from riverlog.protocol.rabbitmq_stream import FrameDecoder, ResponseCode, encode
from riverlog.protocol.rabbitmq_stream import frames as f


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
