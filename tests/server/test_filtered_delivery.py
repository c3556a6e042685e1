"""Filtered delivery on the RabbitMQ Stream door, as a property (issue 28): whatever the
filter values, the Publish frames per socket write, the chunk cap, the segment size, the
moment of the Subscribe and the credit, a filtered subscription's messages, once the
client applies its own predicate, equal those of an unfiltered subscription that match its
values (or, with ``match-unfiltered``, carry none), in order, each once.

A real server (an in-process App on its own event loop thread, uvloop when installed, as
``riverlog serve`` runs) and raw sockets built on the codec, so the test sees exactly the
chunks delivered. On a replica the same holds: chunks appended as replication appends them
(``Partition.append_replicated``) and committed a few chunks at a time."""
from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compat._raw import Chunk, RawPeer
from riverlog.broker import StreamConfig
from riverlog.config import RabbitStreamConfig, ServerConfig
from riverlog.protocol.rabbitmq_stream import OffsetType, encode, simple_entry
from riverlog.protocol.rabbitmq_stream import frames as f
from riverlog.server.app import App
from riverlog.server.rabbitmq_stream import publishing

pytestmark = pytest.mark.timeout(900)

HOST = "127.0.0.1"
VALUES = ("a", "b", "c", "d")
SETTLE = 0.05  # s: after the last expected message, time for an extra (duplicate) to show
_names = iter(range(1 << 30))  # stream names, new in every example


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """An App on an event loop of its own (a thread), so each example's clients can run in
    ``asyncio.run``; ``call(fn)`` runs ``fn`` on the server's loop and returns its result."""
    try:
        import uvloop
        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    app = App(ServerConfig(data_dir=str(tmp_path_factory.mktemp("filtered") / "data"),
                           rabbitmq_stream=RabbitStreamConfig(port=0)))
    asyncio.run_coroutine_threadsafe(app.start(), loop).result(60)

    def call(fn):
        async def run():
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), loop).result(30)

    yield SimpleNamespace(app=app, port=app.rabbitmq_stream.port, call=call)
    asyncio.run_coroutine_threadsafe(app.stop(), loop).result(60)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def body(seq: int, value: str | None) -> bytes:
    return b"%d|%s" % (seq, (value or "-").encode())


def value_of(record: bytes) -> str | None:
    value = record.split(b"|", 1)[1].decode()
    return None if value == "-" else value


# A frame: (Publish v1?, the filter values of its entries). v1 entries have no value.
frames = st.tuples(st.booleans(), st.lists(st.sampled_from(VALUES + (None,)), min_size=1,
                                           max_size=12))
# A write: the frames sent in one socket write (so read in one event-loop turn), and
# whether the publisher waits for their confirms before the next write.
writes = st.tuples(st.lists(frames, min_size=1, max_size=4), st.booleans())
wants = st.sets(st.sampled_from(VALUES + ("never-published",)), min_size=1, max_size=3)


class Filtered:
    """A subscription of ``peer`` with ``credit`` up front and ``refill`` credits sent back
    after every ``refill`` chunks (clients give credit back per chunk or in bulk); ``got``:
    ``(offset, record)`` of every record of every chunk delivered."""

    def __init__(self, peer: RawPeer, sub_id: int, credit: int, refill: int) -> None:
        self.peer, self.sub_id, self.credit = peer, sub_id, credit
        self.refill = min(refill, credit)  # more would never come back: a stalled consumer
        self.got: list[tuple[int, bytes]] = []
        self.chunks = 0
        self.task: asyncio.Task | None = None

    async def subscribe(self, stream: str, properties: dict | None) -> None:
        r = await self.peer.request(f.Subscribe(self.peer.next_corr(), self.sub_id, stream,
                                                OffsetType.FIRST, None, self.credit,
                                                properties))
        assert r.response_code == 1, r
        self.task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        while True:
            frame = await self.peer.recv(3600)
            if not isinstance(frame, f.Deliver) or frame.subscription_id != self.sub_id:
                continue
            chunk = Chunk.parse(frame.chunk)
            assert chunk.crc_ok()
            self.got += [(chunk.chunk_id + i, record)
                         for i, record in enumerate(chunk.simple_records())]
            self.chunks += 1
            if self.chunks % self.refill == 0:
                self.peer.send(f.Credit(self.sub_id, self.refill))

    async def wait_for(self, wanted, n: int, timeout: float = 5.0) -> list[tuple[int, bytes]]:
        """The wanted records received, once there are ``n`` (or after ``timeout`` s)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len([r for r in self.got if wanted(r[1])]) < n and loop.time() < deadline:
            await asyncio.sleep(0.005)
        await asyncio.sleep(SETTLE)
        self.task.cancel()
        return [r for r in self.got if wanted(r[1])]


def predicate(values: set[str], match_unfiltered: bool):
    """The client's own filter of each message (rstream's FilterConfiguration predicate)."""
    return lambda record: (value_of(record) in values if value_of(record) is not None
                           else match_unfiltered)


def properties(values: set[str], match_unfiltered: bool) -> dict[str, str]:
    props = {f"filter.{i}": v for i, v in enumerate(sorted(values))}
    if match_unfiltered:
        props["match-unfiltered"] = "true"
    return props


async def _unfiltered(port: int, stream: str, n: int) -> list[tuple[int, bytes]]:
    """Every record of ``stream`` (``n`` of them), as an unfiltered subscription gets them."""
    peer = await RawPeer.open(HOST, port)
    try:
        reader = Filtered(peer, 9, 10, 1)
        await reader.subscribe(stream, None)
        return await reader.wait_for(lambda record: True, n)
    finally:
        peer.close()


async def _publish_and_consume(port: int, stream: str, plan, subscribe_at: int,
                               want: set[str], match_unfiltered: bool, credit: int,
                               refill: int, segment_bytes: int):
    publisher = await RawPeer.open(HOST, port)
    consumer = await RawPeer.open(HOST, port)
    try:
        assert await publisher.create(stream, {
            "stream-max-segment-size-bytes": str(segment_bytes)}) == 1
        r = await publisher.request(f.DeclarePublisher(publisher.next_corr(), 1, "", stream))
        assert r.response_code == 1
        filtered = Filtered(consumer, 1, credit, refill)
        sent: list[bytes] = []
        confirmed: set[int] = set()
        for w, (write, await_confirms) in enumerate(plan):
            if w == subscribe_at:
                await filtered.subscribe(stream, properties(want, match_unfiltered))
            data = []
            for v1, values in write:
                first = len(sent)
                sent += [body(first + i, None if v1 else v) for i, v in enumerate(values)]
                if v1:
                    frame = f.Publish(1, tuple((first + i, simple_entry(sent[first + i]))
                                               for i in range(len(values))))
                else:
                    frame = f.PublishV2(1, tuple((first + i, v, simple_entry(sent[first + i]))
                                                 for i, v in enumerate(values)))
                data.append(encode(frame))
            publisher.send_bytes(b"".join(data))
            while await_confirms and len(confirmed) < len(sent):
                confirmed.update((await publisher.recv_until(f.PublishConfirm)).publishing_ids)
        while len(confirmed) < len(sent):
            confirmed.update((await publisher.recv_until(f.PublishConfirm)).publishing_ids)
        if subscribe_at >= len(plan):
            await filtered.subscribe(stream, properties(want, match_unfiltered))
        everything = await _unfiltered(port, stream, len(sent))
        assert [record for _, record in everything] == sent
        wanted = predicate(want, match_unfiltered)
        expected = [r for r in everything if wanted(r[1])]
        got = await filtered.wait_for(wanted, len(expected))
        return expected, got
    finally:
        publisher.close()
        consumer.close()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(plan=st.lists(writes, min_size=1, max_size=8), data=st.data(), want=wants,
       match_unfiltered=st.booleans(), credit=st.integers(1, 4), refill=st.integers(1, 3),
       chunk_cap=st.sampled_from([1, 2, 3, 5, 8, 13, 4096]),
       segment_bytes=st.sampled_from([4096, 8192, 1 << 26]))
def test_a_filtered_subscription_gets_every_message_it_asked_for(
        server, plan, data, want, match_unfiltered, credit, refill, chunk_cap, segment_bytes):
    subscribe_at = data.draw(st.integers(0, len(plan)), label="subscribe_at")
    stream = f"filtered-{next(_names)}"
    before = publishing.CHUNK_MAX_ENTRIES
    publishing.CHUNK_MAX_ENTRIES = chunk_cap  # read by the server's thread per Publish
    try:
        expected, got = asyncio.run(_publish_and_consume(
            server.port, stream, plan, subscribe_at, want, match_unfiltered, credit, refill,
            segment_bytes))
    finally:
        publishing.CHUNK_MAX_ENTRIES = before
        server.call(lambda: server.app.broker.delete(stream))
    assert got == expected


async def _consume_replica(port: int, stream: str, subscribe_at: int, want: set[str],
                           match_unfiltered: bool, credit: int, refill: int,
                           expected: list, steps) -> list:
    consumer = await RawPeer.open(HOST, port)
    try:
        filtered = Filtered(consumer, 1, credit, refill)
        for s, step in enumerate(steps):
            if s == subscribe_at:
                await filtered.subscribe(stream, properties(want, match_unfiltered))
            step()
            await asyncio.sleep(0)
        if subscribe_at >= len(steps):
            await filtered.subscribe(stream, properties(want, match_unfiltered))
        return await filtered.wait_for(predicate(want, match_unfiltered), len(expected))
    finally:
        consumer.close()


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(values=st.lists(st.lists(st.sampled_from(VALUES + (None,)), min_size=1, max_size=6),
                       min_size=1, max_size=40),
       data=st.data(), want=wants, match_unfiltered=st.booleans(),
       credit=st.integers(1, 4), refill=st.integers(1, 3))
def test_a_filtered_subscription_on_a_replica_gets_every_message_it_asked_for(
        server, values, data, want, match_unfiltered, credit, refill):
    """Chunks (one per item of ``values``: the filter values of its records) are appended
    to a replicated partition as a follower appends them, in runs of 1..8 chunks, and its
    high watermark moves on at chunk ends chosen at random, possibly behind the appends; the
    filtered subscription on that replica starts at a random step."""
    app = server.app
    leader_name, name = f"leader-{next(_names)}", f"replica-{next(_names)}"

    def setup():
        leader = app.broker.create(leader_name).partitions[0]
        replica = app.broker.create(name, StreamConfig(replicated=True)).partitions[0]
        seq = 0
        for chunk_values in values:
            records = [body(seq + i, v) for i, v in enumerate(chunk_values)]
            leader.write_entries([simple_entry(r) for r in records],
                                 filter_values=set(chunk_values))
            seq += len(records)
        return leader, replica, seq

    leader, replica, n = server.call(setup)
    chunks = server.call(lambda: [(bytes(c.raw), c.header.next_offset - 1)
                                  for c in leader.read_chunks(0, 1 << 26)])  # one segment
    raws, ends = [raw for raw, _ in chunks], [end for _, end in chunks]
    steps, i = [], 0
    while i < len(raws):
        k = data.draw(st.integers(1, 8), label="appended together")
        run = b"".join(raws[i:i + k])
        steps.append(lambda run=run: replica.append_replicated(run))
        i = min(i + k, len(raws))
        commit_to = data.draw(st.integers(0, i), label="chunks committed")
        if commit_to:
            steps.append(lambda end=ends[commit_to - 1]: replica.log.commit(end))
    steps.append(lambda: replica.log.commit(ends[-1]))
    subscribe_at = data.draw(st.integers(0, len(steps)), label="subscribe_at")
    everything = [(o, r) for o, r in enumerate(body(s, v) for s, v in enumerate(
        v for chunk_values in values for v in chunk_values))]
    wanted = predicate(want, match_unfiltered)
    expected = [r for r in everything if wanted(r[1])]

    def call_step(step):
        return lambda: server.call(step)

    try:
        got = asyncio.run(_consume_replica(
            server.port, name, subscribe_at, want, match_unfiltered, credit, refill, expected,
            [call_step(step) for step in steps]))
    finally:
        server.call(lambda: (app.broker.delete(name), app.broker.delete(leader_name)))
    assert len(everything) == n
    assert got == expected
