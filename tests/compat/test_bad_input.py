"""Bad input over raw sockets against the `stream_server` fixture: each bad connection is
closed (with a Close frame carrying the code, or just closed, RabbitMQ style), the server
keeps serving everyone else, and everything confirmed before stays readable. Plus hostile
stream names, and a hypothesis-driven live fuzz of a few hundred random frames.

What RabbitMQ 3.10 does, for reference: before the handshake completes, any bad frame
closes the socket without a Close frame; after Open, an unknown key or version, a truncated
body or trailing bytes get Close(0x0d "unknown frame") and then the socket closes. It does
not check frame_max on incoming frames (it waits for the body), so "oversized after Open" is
riverlog-only (RabbitMQ 4.3 closes with 0x0e; riverlog takes a Publish frame up to 16 MiB)."""
from __future__ import annotations

import asyncio
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer

from riverlog.protocol.rabbitmq_stream import FrameError, encode, simple_entry
from riverlog.protocol.rabbitmq_stream import frames as f
from riverlog.server.rabbitmq_stream import PUBLISH_FRAME_MAX

from ._helpers import GUEST, Collector, stream_name
from ._raw import Chunk, Closed, RawPeer

pytestmark = pytest.mark.timeout(120)

UNKNOWN_FRAME, FRAME_TOO_LARGE, ACCESS_REFUSED = 0x0D, 0x0E, 0x10


def frame(key: int, version: int, body: bytes) -> bytes:
    return struct.pack(">IHH", 4 + len(body), key, version) + body


async def assert_closed(peer: RawPeer, codes: set[int], timeout: float = 10) -> None:
    """The server closes the connection, having sent nothing but (optionally) a Close with one
    of ``codes`` (and heartbeats)."""
    try:
        frames = await peer.wait_closed(timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"the server kept the connection open for {timeout}s") from None
    finally:
        peer.close()
    closes = [x for x in frames if isinstance(x, f.Close)]
    others = [x for x in frames if not isinstance(x, (f.Close, f.Heartbeat, f.Tune))]
    assert not others, f"unexpected frames before the close: {others}"
    for c in closes:
        assert c.code in codes, f"Close code 0x{c.code:02x} ({c.reason!r}), expected one of {sorted(codes)}"


async def still_serves(server, stream: str, before: list[bytes], create: bool = False) -> None:
    """A normal rstream client still works, and what was confirmed before is all there."""
    assert server.alive(), "the server died"
    async with Producer(server.host, server.port, **GUEST) as p:
        await p.send_wait(stream, b"after")
        if create:
            fresh = stream_name("after-bad")
            await p.create_stream(fresh)
            await p.send_wait(fresh, b"works")
            await p.delete_stream(fresh)
    got = Collector()
    async with Consumer(server.host, server.port, **GUEST) as c:
        await c.subscribe(stream, got, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        await got.wait_for(len(before) + 1, settle=0.05)
    assert got.messages[:len(before)] == before
    assert got.messages[-1] == b"after"


@pytest.fixture
async def stream_with_data(stream_server):
    name = stream_name("bad-input")
    data = [b"confirmed-%d" % i for i in range(100)]
    async with Producer(stream_server.host, stream_server.port, **GUEST) as p:
        await p.create_stream(name)
        await p.send_batch(name, data[:50])
        await p.send_wait(name, data[50])  # confirms come in order: 0..50 are stored
        for m in data[51:]:
            await p.send_wait(name, m)
    yield name, data
    if stream_server.alive():
        async with Producer(stream_server.host, stream_server.port, **GUEST) as p:
            await p.delete_stream(name, missing_ok=True)


async def open_peer(server, handshake: bool) -> RawPeer:
    if handshake:
        return await RawPeer.open(server.host, server.port)
    return await RawPeer.connect(server.host, server.port)


GARBAGE = b"\xde\xad\xbe\xef" * 16 + os.urandom(64)
CASES = {
    # name: (bytes, accepted Close codes)
    "unknown key": (frame(0x7777, 1, b"\0\0\0\1"), {UNKNOWN_FRAME}),
    "unknown version": (frame(0x000D, 9, b"\0\0\0\1"), {UNKNOWN_FRAME}),
    "response key from a client": (frame(0x800F, 1, b"\0\0\0\1\0\0\0\0"), {UNKNOWN_FRAME}),
    "truncated body": (frame(0x000F, 1, b"\0\0\0\1"), {UNKNOWN_FRAME}),  # Metadata, no array
    "string past the end": (frame(0x000D, 1, b"\0\0\0\1\0\x50abc"), {UNKNOWN_FRAME}),
    "trailing bytes": (frame(0x0017, 1, b"X"), {UNKNOWN_FRAME}),  # Heartbeat + 1 byte
    "small garbage frame": (struct.pack(">I", 12) + b"\xfe\xed" + os.urandom(10), {UNKNOWN_FRAME}),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_malformed_frame_after_open_closes_that_connection(stream_server, stream_with_data, case):
    name, data = stream_with_data
    bystander = await RawPeer.open(stream_server.host, stream_server.port)  # must not be affected
    peer = await open_peer(stream_server, handshake=True)
    raw, codes = CASES[case]
    peer.send_bytes(raw)
    await peer.drain()
    await assert_closed(peer, codes)
    r = await bystander.request(f.Metadata(bystander.next_corr(), (name,)))
    assert r.streams[0].response_code == 1
    bystander.close()
    await still_serves(stream_server, name, data)


@pytest.mark.parametrize("case", ["garbage", "oversized", "unknown key", "create before auth",
                                  "zero-length frame", "truncated then eof"])
async def test_bad_first_frames_close_the_connection(stream_server, stream_with_data, case):
    name, data = stream_with_data
    raw = {
        "garbage": GARBAGE,
        "oversized": struct.pack(">IHH", 2_000_000, 0x11, 1) + b"\0" * 1000,
        "unknown key": frame(0x7777, 1, b"\0\0\0\1"),
        "create before auth": encode(f.Create(1, "never-" + name, {})),
        "zero-length frame": b"\0\0\0\0",
        "truncated then eof": struct.pack(">IHH", 100, 0x11, 1) + b"\0\0\0\1",
    }[case]
    peer = await open_peer(stream_server, handshake=False)
    peer.send_bytes(raw)
    await peer.drain()
    if case == "truncated then eof":
        peer.writer.write_eof()
    await assert_closed(peer, {UNKNOWN_FRAME, FRAME_TOO_LARGE, ACCESS_REFUSED})
    await still_serves(stream_server, name, data, create=True)
    async with Producer(stream_server.host, stream_server.port, **GUEST) as p:
        assert not await p.stream_exists("never-" + name)


async def test_truncated_frame_then_close_after_open(stream_server, stream_with_data):
    name, data = stream_with_data
    peer = await open_peer(stream_server, handshake=True)
    r = await peer.request(f.DeclarePublisher(peer.next_corr(), 1, "", name))
    assert r.response_code == 1
    half = encode(f.Publish(1, ((1, simple_entry(b"never stored")),)))
    peer.send_bytes(half[:len(half) // 2])
    await peer.drain()
    await asyncio.sleep(0.1)
    peer.writer.write_eof()  # half-close: the server sees EOF in the middle of a frame
    await assert_closed(peer, set())
    await still_serves(stream_server, name, data)  # (and the half frame stored nothing)


async def test_wrong_password_is_refused(stream_server, stream_with_data):
    """SaslAuthenticateResponse 0x08, then the socket closes without a Close frame, as
    RabbitMQ's reader does (a client decoding a server Close there may fail)."""
    name, data = stream_with_data
    peer = await RawPeer.connect(stream_server.host, stream_server.port)
    with pytest.raises(PermissionError, match="0x08"):
        await peer.handshake("guest", "not-the-password")
    await assert_closed(peer, set())
    await still_serves(stream_server, name, data)


async def test_unknown_virtual_host_is_refused(stream_server, stream_with_data):
    """OpenResponse 0x0c, then the socket closes without a Close frame (RabbitMQ)."""
    name, data = stream_with_data
    peer = await RawPeer.connect(stream_server.host, stream_server.port)
    with pytest.raises(AssertionError, match="response_code=12"):
        await peer.handshake("guest", "guest", vhost="no-such-vhost")
    await assert_closed(peer, set())
    await still_serves(stream_server, name, data)


@pytest.mark.riverlog_only
async def test_oversized_frame_after_open_is_refused(stream_server, stream_with_data):
    """A command other than Publish above the negotiated frame_max, or a Publish frame above
    the door's 16 MiB bound: Close(0x0e) or just closing, as soon as the size and key have
    arrived, without waiting for (or buffering) the body. RabbitMQ 3.10 has no bound and
    waits for the body; a Publish between frame_max and the bound is taken (as RabbitMQ 3.10
    does: test_rstream.py, test_a_publish_frame_above_frame_max_is_stored)."""
    name, data = stream_with_data
    for size, key in ((None, 0x000D), (PUBLISH_FRAME_MAX + 1, 0x0002)):  # Create, Publish
        peer = await open_peer(stream_server, handshake=True)
        assert peer.tune.frame_max > 0
        peer.send_bytes(struct.pack(">IHH", size or peer.tune.frame_max + 1, key, 1) + b"\0" * 64)
        await peer.drain()
        await assert_closed(peer, {FRAME_TOO_LARGE})
    peer = await open_peer(stream_server, handshake=True)
    peer.send_bytes(GARBAGE)  # 0xdeadbeef bytes announced
    await peer.drain()
    await assert_closed(peer, {FRAME_TOO_LARGE})
    await still_serves(stream_server, name, data)


# (not 255 bytes: RabbitMQ 3.10 accepts such a name, then cannot create the stream's directory
# and its stream coordinator retries for ever, burning a CPU, until its data is wiped)
HOSTILE_NAMES = ["..", ".", "a/b", "../escape", "a\\b", "nul\0byte", "sp ace", "\u2603 snow", "x" * 200,
                 "-flag", "CON", "streams"]


async def _hostile_round_trip(server, peer: RawPeer, names: list[str]) -> None:
    for n in names:
        await peer.delete(n)  # ".." and "." have no suffix: clean up after an earlier run
        assert await peer.create(n) == 1, n
    for pub_id, n in enumerate(names):
        r = await peer.request(f.DeclarePublisher(peer.next_corr(), pub_id, "", n))
        assert r.response_code == 1, n
        peer.send(f.Publish(pub_id, ((1, simple_entry(("payload of %r" % n).encode())),)))
        await peer.drain()
        confirm = await peer.recv_until(f.PublishConfirm)
        assert (confirm.publisher_id, confirm.publishing_ids) == (pub_id, (1,)), n
    for n in names:
        reader = await RawPeer.open(server.host, server.port)
        r = await reader.request(f.Subscribe(reader.next_corr(), 0, n, 1, None, 10, None))
        assert r.response_code == 1, n
        deliver = await reader.recv_until(f.Deliver)
        assert Chunk.parse(deliver.chunk).simple_records() == [("payload of %r" % n).encode()], n
        reader.close()
    for n in names:
        assert await peer.delete(n) == 1, n
    r = await peer.request(f.Metadata(peer.next_corr(), tuple(names)))
    assert all(m.response_code == 2 for m in r.streams)


async def test_hostile_stream_names(stream_server, tmp_path):
    """Names RabbitMQ accepts must work (create, publish, consume, delete) and stay apart;
    on riverlog, nothing may be written outside the data directory. (Raw frames: rstream
    writes the character count, not the UTF-8 byte count, as a string's length, so it cannot
    name a stream "\u2603": both servers close that connection with 0x0d.)"""
    parent = os.path.dirname(getattr(stream_server, "data_dir", str(tmp_path)))
    before = set(os.listdir(parent))
    suffix = os.urandom(3).hex()
    names = [n if n in ("..", ".") else f"{n}-{suffix}" for n in HOSTILE_NAMES]
    peer = await RawPeer.open(stream_server.host, stream_server.port)
    try:
        await _hostile_round_trip(stream_server, peer, names)
        assert await peer.create("") != 1
    finally:
        peer.close()
        cleanup = await RawPeer.open(stream_server.host, stream_server.port)
        for n in names:
            await cleanup.delete(n)
        cleanup.close()
    assert set(os.listdir(parent)) == before, "files appeared outside the data directory"


# -- live fuzz --------------------------------------------------------------------------------

KEYS = [k for k in range(0x01, 0x20) if k not in (0x0D, 0x1D)]  # no Create: no junk streams
frame_key = st.one_of(st.sampled_from(KEYS), st.sampled_from(KEYS).map(lambda k: k | 0x8000),
                      st.integers(0, 0xFFFF))
fuzz_frame = st.builds(
    lambda key, version, corr, body, size_delta: struct.pack(
        ">IHH", max(0, 4 + 4 * (corr is not None) + len(body) + size_delta), key, version)
    + (struct.pack(">I", corr) if corr is not None else b"") + body,
    key=frame_key,
    version=st.sampled_from([1, 1, 1, 2, 0, 7]),
    corr=st.none() | st.integers(0, 2**32 - 1),
    body=st.binary(max_size=48),
    size_delta=st.sampled_from([0] * 12 + [-3, -1, 1, 5]),
)
PROBE_CORR = 0x7FFF_FFF0


@pytest.mark.timeout(180)
def test_live_fuzz_random_frames(stream_server):
    """A few hundred random frames, each on its own connection (most after a full handshake).
    Whatever the server makes of them, every byte it sends back must be well-framed, and it
    must keep answering: checked with a Metadata probe after each frame (answered, or the
    connection closed), and at the end with a real client."""
    server = stream_server
    counts = {"answered": 0, "closed": 0, "swallowed": 0}

    async def one(data: bytes, handshake: bool) -> None:
        peer = await open_peer(server, handshake)
        try:
            peer.send_bytes(data)
            peer.send(f.Metadata(PROBE_CORR, ("fuzz-probe",)))
            await peer.drain()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 0.2
            while True:
                try:
                    got = await peer.recv(max(0.01, deadline - loop.time()))
                except (Closed, ConnectionError):
                    counts["closed"] += 1
                    return
                except asyncio.TimeoutError:
                    counts["swallowed"] += 1  # e.g. a size field that announced more bytes
                    return
                except FrameError as exc:
                    raise AssertionError(f"the server sent bytes that are not a frame: {exc}") from None
                if isinstance(got, f.MetadataResponse) and got.correlation_id == PROBE_CORR:
                    counts["answered"] += 1
                    return
        finally:
            peer.close()

    @settings(max_examples=200, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(frames=st.lists(fuzz_frame, min_size=1, max_size=3),
           handshake=st.sampled_from([True, True, True, False]))
    def run(frames, handshake):
        asyncio.run(one(b"".join(frames), handshake))
        assert server.alive(), "the server died"

    run()
    assert counts["answered"] + counts["closed"] > 0

    async def check() -> None:
        name = stream_name("after-fuzz")
        async with Producer(server.host, server.port, **GUEST) as p:
            await p.create_stream(name)
            await p.send_wait(name, b"still here")
        got = Collector()
        async with Consumer(server.host, server.port, **GUEST) as c:
            await c.subscribe(name, got, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
            await got.wait_for(1, settle=0.05)
        async with Producer(server.host, server.port, **GUEST) as p:
            await p.delete_stream(name)
        assert got.messages == [b"still here"]

    asyncio.run(check())


@pytest.mark.parametrize("name", ["amq.stream", "amq."])
async def test_create_of_a_reserved_amq_name_is_refused(stream_server, name):
    """RabbitMQ refuses stream names starting with ``amq.`` with 0x11
    (rabbit_stream_utils:enforce_correct_name); riverlog created them (the Java client's
    ClientTest.createWithInvalidNameShouldReturnError)."""
    peer = await RawPeer.open(stream_server.host, stream_server.port)
    try:
        assert await peer.create(name) == 0x11
        r = await peer.request(f.Metadata(peer.next_corr(), (name,)))
        assert r.streams[0].response_code == 0x02  # not made
    finally:
        peer.close()
