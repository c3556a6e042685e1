"""The RabbitMQ Stream door's connection states (riverlog/server/rabbitmq_stream/state.py) at
the wire: before SASL only the handshake is answered (Tune and Open are refused "before
authentication"), after SASL Tune and Open are too, and every other command waits for Open;
a command that comes too early closes the connection with ACCESS_REFUSED (0x10) and says
why, as rabbit_stream_reader refuses commands before authentication and Open."""
import asyncio

import pytest

from riverlog.protocol.rabbitmq_stream import FrameDecoder, ResponseCode, encode
from riverlog.protocol.rabbitmq_stream import frames as f


class _Peer:
    """A raw connection: ``await step(frames, answers)`` sends ``frames`` and returns the
    next ``answers`` frames (fewer when the server closes the socket: then ``closed``)."""

    def __init__(self, reader, writer) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder(max_frame_size=0)
        self.closed = False

    @classmethod
    async def connect(cls, port: int) -> "_Peer":
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def step(self, frames: list, answers: int) -> list:
        for frame in frames:
            self.writer.write(encode(frame))
        got: list = []
        while len(got) < answers:
            data = await asyncio.wait_for(self.reader.read(65536), 5)
            if not data:
                self.closed = True
                break
            got += self.decoder.feed(data)
        return got

    async def authenticated(self) -> None:
        """PeerProperties, SASL PLAIN as guest, the server's Tune."""
        got = await self.step([f.PeerProperties(1, {}), f.SaslHandshake(2),
                               f.SaslAuthenticate(3, "PLAIN", b"\0guest\0guest")], 4)
        assert [type(x) for x in got] == [f.PeerPropertiesResponse, f.SaslHandshakeResponse,
                                          f.SaslAuthenticateResponse, f.Tune]
        assert got[2].response_code == ResponseCode.OK


def _refused(got: list, reason: str) -> bool:
    """Whether the last frame of ``got`` is a Close with ACCESS_REFUSED and ``reason``."""
    return bool(got) and type(got[-1]) is f.Close and \
        (got[-1].code, got[-1].reason) == (ResponseCode.ACCESS_REFUSED, reason)


@pytest.mark.parametrize("early, reason", [
    (f.Tune(1048576, 0), "Tune before authentication"),
    (f.Open(9, "/"), "Open before authentication"),
    (f.Metadata(9, ("s",)), "Metadata before the connection was opened"),
])
async def test_before_authentication_only_the_handshake_is_answered(app, early, reason):
    peer = await _Peer.connect(app.rabbitmq_stream.port)
    got = await peer.step([f.PeerProperties(1, {}), f.SaslHandshake(2), early], 9)
    assert [type(x) for x in got] == [f.PeerPropertiesResponse, f.SaslHandshakeResponse,
                                      f.Close]
    assert _refused(got, reason) and peer.closed


async def test_after_authentication_tune_and_open_are_answered_other_commands_wait(app):
    port = app.rabbitmq_stream.port
    early = await _Peer.connect(port)
    await early.authenticated()
    got = await early.step([f.TuneResponse(1048576, 0), f.Metadata(9, ("s",))], 9)
    assert _refused(got, "Metadata before the connection was opened") and early.closed
    peer = await _Peer.connect(port)
    await peer.authenticated()
    got = await peer.step([f.TuneResponse(1048576, 0), f.Open(4, "/"),
                           f.Metadata(5, ("s",))], 2)
    assert [type(x) for x in got] == [f.OpenResponse, f.MetadataResponse] and not peer.closed
    assert got[0].response_code == ResponseCode.OK
    assert got[1].streams[0].response_code == ResponseCode.STREAM_DOES_NOT_EXIST
    peer.writer.close()
