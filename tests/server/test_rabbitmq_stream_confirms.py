"""How the RabbitMQ Stream door frames its PublishConfirms (issue 30 item 4), checked frame by
frame with raw sockets: as RabbitMQ 3.10.8 answers and osiris_writer orders them, the
duplicates of what was received together are confirmed in a PublishConfirm of their own
before the written ids' one, ids in arrival order, and no PublishConfirm names an id twice
(a client that takes each confirmed id out of a map fails on meeting one twice in a frame,
and its batch send then hangs)."""
from __future__ import annotations

import asyncio

import pytest

from compat._raw import RawPeer
from riverlog.protocol.rabbitmq_stream import encode, simple_entry
from riverlog.protocol.rabbitmq_stream import frames as f

pytestmark = pytest.mark.timeout(60)


async def _publisher(app, stream: str, reference: str) -> RawPeer:
    peer = await RawPeer.open("127.0.0.1", app.rabbitmq_stream.port)
    assert await peer.create(stream) == 1
    r = await peer.request(f.DeclarePublisher(peer.next_corr(), 1, reference, stream))
    assert r.response_code == 1
    return peer


async def _confirms(peer: RawPeer, n: int) -> list[tuple[int, ...]]:
    """The PublishConfirm frames' ids until ``n`` ids came, then 0.2 s more (none may)."""
    frames: list[tuple[int, ...]] = []
    while sum(map(len, frames)) < n:
        frames.append((await peer.recv_until(f.PublishConfirm)).publishing_ids)
    with pytest.raises((asyncio.TimeoutError, TimeoutError)):
        frames.append((await peer.recv_until(f.PublishConfirm, timeout=0.2)).publishing_ids)
    return frames


def _publish(peer: RawPeer, *frames: tuple[int, ...]) -> None:
    """Publish frames of publisher 1 with these publishing ids, all in one socket write."""
    peer.send_bytes(b"".join(encode(f.Publish(1, tuple((i, simple_entry(b"m%d" % i))
                                                       for i in ids))) for ids in frames))


@pytest.mark.parametrize("ids, expected, stored", [
    ((5, 3, 5, 7), [(3, 5), (5, 7)], 2),       # RabbitMQ 3.10.8's answer to a new publisher
    ((0, 0, 1, 1), [(0, 1), (0, 1)], 2),       # and this one's
    ((0, 0, 0), [(0,), (0,), (0,)], 1),        # a duplicate twice: never twice in one frame
    ((1, 2, 3), [(1, 2, 3)], 3),               # no duplicate: one frame, as before
])
async def test_a_named_publishers_duplicates_are_confirmed_first_in_a_frame_of_their_own(
        app, ids, expected, stored):
    peer = await _publisher(app, "dedup", "app-1")
    try:
        _publish(peer, ids)
        assert await _confirms(peer, len(ids)) == expected
        assert app.broker.get("dedup").partitions[0].next_offset == stored
    finally:
        peer.close()


async def test_frames_received_together_confirm_their_duplicates_first(app):
    """Two Publish frames in one write become one chunk; the second repeats an id of the
    first: that duplicate comes first, then the written ids of both frames in order."""
    peer = await _publisher(app, "together", "app-1")
    try:
        _publish(peer, (1, 2), (2, 3))
        assert await _confirms(peer, 4) == [(2,), (1, 2, 3)]
    finally:
        peer.close()


async def test_duplicates_of_committed_ids_are_confirmed_alone_and_first(app):
    """A publisher sending again what was stored before (after a reconnect): the old ids
    are duplicates, confirmed first, then the new ones."""
    peer = await _publisher(app, "again", "app-1")
    try:
        _publish(peer, (1, 2, 3))
        assert await _confirms(peer, 3) == [(1, 2, 3)]
        _publish(peer, (2, 3, 4, 5))
        assert await _confirms(peer, 4) == [(2, 3), (4, 5)]
        assert app.broker.get("again").partitions[0].next_offset == 5
    finally:
        peer.close()


async def test_a_publisher_without_a_reference_stores_every_id_and_confirms_none_twice_in_a_frame(
        app):
    """Without a reference there is no deduplication: every entry is stored, and an id sent
    again starts a new PublishConfirm."""
    peer = await _publisher(app, "plain", "")
    try:
        _publish(peer, (5, 3, 5, 7))
        assert await _confirms(peer, 4) == [(5, 3), (5, 7)]
        assert app.broker.get("plain").partitions[0].next_offset == 4
    finally:
        peer.close()
