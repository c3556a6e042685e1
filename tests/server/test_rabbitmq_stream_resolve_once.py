"""The RabbitMQ Stream door resolves each request's stream name once (issue 22, "written
twice"): the handler resolves it (``Link.resolve``, SuperStreams.resolve underneath) and hands
the result to the placement, "missing" and authorization checks, which do not resolve again.
Counted at the real SuperStreams of a running server, with a real raw client."""
import pytest

from compat._raw import RawPeer
from riverlog.protocol.rabbitmq_stream import OffsetType, ResponseCode
from riverlog.protocol.rabbitmq_stream import frames as f


@pytest.fixture
def resolved(app) -> list[str]:
    """The names the door's SuperStreams.resolve is asked, in order."""
    super_streams = app.rabbitmq_stream.super_streams
    real = super_streams.resolve
    names: list[str] = []

    def resolve(name):
        names.append(name)
        return real(name)
    super_streams.resolve = resolve  # this instance only
    return names


async def test_each_request_resolves_its_stream_name_once(app, resolved):
    peer = await RawPeer.open("127.0.0.1", app.rabbitmq_stream.port)
    try:
        requests = [
            lambda c: f.Create(c, "s", {}),
            lambda c: f.StreamStats(c, "s"),
            lambda c: f.DeclarePublisher(c, 1, "ref", "s"),
            lambda c: f.QueryPublisherSequence(c, "ref", "s"),
            lambda c: f.Subscribe(c, 1, "s", OffsetType.FIRST, None, 10, {}),
            lambda c: f.ResolveOffsetSpec(c, "s", OffsetType.FIRST, None, {}),
            lambda c: f.QueryOffset(c, "ref", "s"),
            lambda c: f.Metadata(c, ("s",)),
            lambda c: f.StreamStats(c, "nowhere"),  # a name no server has
            lambda c: f.Delete(c, "s"),
        ]
        for make in requests:
            del resolved[:]
            frame = make(peer.next_corr())
            answer = await peer.request(frame)
            if isinstance(frame, f.Metadata):
                assert answer.streams[0].response_code == ResponseCode.OK
            elif isinstance(frame, f.StreamStats) and frame.stream == "nowhere":
                assert answer.response_code == ResponseCode.STREAM_DOES_NOT_EXIST
            else:
                assert answer.response_code in (ResponseCode.OK, ResponseCode.NO_OFFSET), frame
            assert resolved == [frame.stream if hasattr(frame, "stream") else "s"], frame
    finally:
        peer.close()
