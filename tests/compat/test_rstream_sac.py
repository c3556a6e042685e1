"""Single active consumer against the `stream_server` fixture: rstream's consumers unmodified
(`single-active-consumer`/`name` properties, consumer_update_listener), and the exact frames
with the raw peer.

Covers: one active member per (stream, name), nothing delivered to the others, the offset
spec of the ConsumerUpdate answer deciding where delivery starts, failover in subscription
order on Unsubscribe and on connection loss with the stored offset of the group honoured,
Credit to an inactive member, a missing name, and the spread of active consumers over the
partitions of a super stream. RabbitMQ 3.10 has no single active consumer: riverlog only."""
from __future__ import annotations

import asyncio

import pytest
from rstream import (
    Consumer,
    OffsetSpecification,
    OffsetType,
    Producer,
    SuperStreamConsumer,
    SuperStreamCreationOption,
    SuperStreamProducer,
)
from rstream import exceptions as rexc

from ._helpers import GUEST, stream_name, wait_until
from ._raw import Chunk, RawPeer
from riverlog.protocol.rabbitmq_stream import frames as f

pytestmark = [pytest.mark.timeout(120), pytest.mark.riverlog_only]

OK, SUBSCRIPTION_DOES_NOT_EXIST, PRECONDITION_FAILED = 0x01, 0x04, 0x11
FIRST_TYPE, NEXT_TYPE, OFFSET_TYPE, NONE_TYPE = 1, 3, 4, 0


def sac_properties(group: str, **extra: str) -> dict[str, str]:
    return {"single-active-consumer": "true", "name": group, **extra}


class Member:
    """One rstream Consumer in a group: what it received and its activations. Its listener
    starts after the offset the group stored, or from the first message."""

    def __init__(self, server, label: str) -> None:
        self.label = label
        self.consumer = Consumer(server.host, server.port, **GUEST)
        self.received: list[tuple[str, int, bytes]] = []  # (stream, offset, message)
        self.events: list[tuple[str, bool]] = []  # (stream, active)

    async def on_message(self, msg, ctx) -> None:
        self.received.append((ctx.stream, ctx.offset, msg))

    async def on_update(self, active: bool, ctx) -> OffsetSpecification:
        self.events.append((ctx.stream, active))
        try:
            stored = await ctx.consumer.query_offset(ctx.stream, ctx.reference)
        except rexc.OffsetNotFound:
            return OffsetSpecification(OffsetType.FIRST, 0)
        return OffsetSpecification(OffsetType.OFFSET, stored + 1)

    async def join(self, stream: str, group: str, **extra: str) -> int:
        await self.consumer.start()
        return await self.consumer.subscribe(
            stream, self.on_message, properties=sac_properties(group, **extra),
            consumer_update_listener=self.on_update)

    def offsets(self, stream: str) -> list[int]:
        return [o for s, o, _ in self.received if s == stream]


async def store_offset(consumer: Consumer, stream: str, group: str, offset: int) -> None:
    """StoreOffset has no reply and may travel on another connection than the Unsubscribe
    that follows: wait until QueryOffset sees it."""
    await consumer.store_offset(stream, group, offset)

    async def stored() -> int | None:
        try:
            return await consumer.query_offset(stream, group)
        except rexc.OffsetNotFound:
            return None

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while await stored() != offset:
        assert loop.time() < deadline, f"offset {offset} of {group} on {stream} not stored"
        await asyncio.sleep(0.05)


async def publish(server, stream: str, messages: list[bytes]) -> None:
    async with Producer(server.host, server.port, **GUEST) as p:
        await p.send_batch(stream, messages)
        await p.send_wait(stream, messages[-1] + b"-last")  # confirms come in order


async def test_one_active_member_then_failover_on_unsubscribe_and_on_close(stream_server, stream):
    a, b, c = (Member(stream_server, x) for x in "abc")
    a_id = await a.join(stream, "group")
    await b.join(stream, "group")
    await c.join(stream, "group")
    await publish(stream_server, stream, [b"m%d" % i for i in range(99)])  # offsets 0..99
    await wait_until(lambda: len(a.received) == 100, 15, lambda: f"100 to a (got {len(a.received)})")
    await asyncio.sleep(0.5)
    assert a.offsets(stream) == list(range(100))
    assert (b.received, c.received) == ([], [])
    assert a.events == [(stream, True)] and b.events == c.events == []

    # a stores 59 under the group name and leaves (Unsubscribe): b takes over after 59
    await store_offset(a.consumer, stream, "group", 59)
    await a.consumer.unsubscribe(a_id)
    await wait_until(lambda: len(b.received) == 40, 15, lambda: f"40 to b (got {len(b.received)})")
    assert b.events == [(stream, True)]
    assert b.offsets(stream) == list(range(60, 100))
    assert c.received == []

    # b stores 79 and its connection goes (close): c continues after 79
    await store_offset(b.consumer, stream, "group", 79)
    await b.consumer.close()
    await wait_until(lambda: len(c.received) == 20, 15, lambda: f"20 to c (got {len(c.received)})")
    assert c.offsets(stream) == list(range(80, 100))
    # new messages go to the active member only
    await publish(stream_server, stream, [b"new"])
    await wait_until(lambda: len(c.received) == 22, 15, "2 new messages to c")
    await asyncio.sleep(0.3)
    # (offsets 100 and 101 are the two stored offsets: tracking chunks, as osiris writes)
    assert c.offsets(stream)[-2:] == [102, 103] and len(a.received) == 100
    await a.consumer.close()
    await c.consumer.close()


async def test_answer_without_listener_starts_at_next(stream_server, stream):
    """rstream without a consumer_update_listener answers ConsumerUpdate with `next`: the
    answer, not the Subscribe's `first`, decides where delivery starts."""
    await publish(stream_server, stream, [b"old-%d" % i for i in range(9)])
    got = []
    async with Consumer(stream_server.host, stream_server.port, **GUEST) as c:
        await c.subscribe(stream, lambda m, ctx: got.append((ctx.offset, m)),
                          properties=sac_properties("nolistener"))
        await asyncio.sleep(0.5)
        await publish(stream_server, stream, [b"fresh"])
        await wait_until(lambda: len(got) == 2, 15, lambda: f"2 new messages (got {got})")
    assert got == [(10, b"fresh"), (11, b"fresh-last")]


async def test_super_stream_spreads_active_consumers_over_partitions(stream_server):
    """Three SuperStreamConsumers in one group on a 3-partition super stream (with the
    `super-stream` property, as the Java client sends it): partition i is consumed by member
    i % 3 in subscription order. When the second leaves, its partition and the rebalanced
    one continue from the group's stored offsets."""
    name = stream_name("sac-super")
    parts = [f"{name}-{i}" for i in range(3)]

    async def key(message: bytes) -> str:
        return message.split(b"|")[0].decode()

    consumers, members = [], []
    for label in "abc":
        member = Member(stream_server, label)
        c = SuperStreamConsumer(stream_server.host, stream_server.port, **GUEST,
                                super_stream=name,
                                super_stream_creation_option=SuperStreamCreationOption(3))
        await c.start()
        await c.subscribe(member.on_message, consumer_update_listener=member.on_update,
                          properties=sac_properties("group", **{"super-stream": name}))
        consumers.append(c)
        members.append(member)

    present = list(members)

    def active_on(stream: str) -> list[str]:
        """Members still there whose last ConsumerUpdate on ``stream`` activated them."""
        last = {m.label: e[1] for m in present for e in m.events if e[0] == stream}
        return sorted(label for label, active in last.items() if active)

    await wait_until(lambda: [active_on(p) for p in parts] == [["a"], ["b"], ["c"]], 15,
                     lambda: f"a, b, c active on partitions 0, 1, 2 ({[active_on(p) for p in parts]})")

    async with SuperStreamProducer(stream_server.host, stream_server.port, **GUEST,
                                   super_stream=name, routing_extractor=key) as p:
        for i in range(300):
            await p.send(b"k%d|%d" % (i % 11, i))
    a, b, c = members
    await wait_until(lambda: sum(len(m.received) for m in members) == 300, 20,
                     lambda: f"300 messages (got {[len(m.received) for m in members]})")
    await asyncio.sleep(0.5)
    # each member received exactly the messages of its partition
    for member, stream in zip(members, parts):
        assert {s for s, _, _ in member.received} == {stream}
        assert member.offsets(stream) == list(range(len(member.received)))

    # b leaves after storing its progress on partition 1; c keeps partition 2 until it
    # stepped down, then a takes partition 2 and c partition 1, each after the stored offset
    counts = [len(m.received) for m in members]
    store = Consumer(stream_server.host, stream_server.port, **GUEST)
    await store.start()
    await store_offset(store, parts[1], "group", counts[1] - 1)
    await store_offset(store, parts[2], "group", counts[2] - 1)
    await consumers[1].close()
    present.remove(b)
    await wait_until(lambda: [active_on(p) for p in parts] == [["a"], ["c"], ["a"]], 15,
                     lambda: f"a, c, a active on partitions 0, 1, 2 ({[active_on(p) for p in parts]})")
    async with SuperStreamProducer(stream_server.host, stream_server.port, **GUEST,
                                   super_stream=name, routing_extractor=key) as p:
        for i in range(300, 600):
            await p.send(b"k%d|%d" % (i % 11, i))
    def new_a():
        return a.received[counts[0]:]

    def new_c():
        return c.received[counts[2]:]

    await wait_until(lambda: len(new_a()) + len(new_c()) == 300, 20,
                     lambda: f"300 new messages (got {len(new_a())} + {len(new_c())})")
    await asyncio.sleep(0.5)
    # nothing read twice, nothing skipped (the stored offsets lie between the messages of
    # partitions 1 and 2, tracking chunks as osiris writes them: no message at their offsets)
    received = sorted(bytes(body) for m in members for _, _, body in m.received)
    assert received == sorted(b"k%d|%d" % (i % 11, i) for i in range(600))
    for stream in parts:
        offsets = sorted(o for m in members for st, o, _ in m.received if st == stream)
        assert len(set(offsets)) == len(offsets)
    assert {s for s, _, _ in new_c()} == {parts[1]}
    assert {s for s, _, _ in new_a()} == {parts[0], parts[2]}
    await store.close()
    await consumers[0].close()
    await consumers[2].close()
    async with SuperStreamProducer(stream_server.host, stream_server.port, **GUEST,
                                   super_stream=name, routing_extractor=key) as p:
        await p.delete_super_stream(name)


# -- the exact frames --------------------------------------------------------------------------


async def subscribe(peer: RawPeer, sub_id: int, stream: str, properties, credit: int = 10,
                    offset_type: int = FIRST_TYPE) -> int:
    r = await peer.request(f.Subscribe(peer.next_corr(), sub_id, stream, offset_type, None,
                                       credit, properties))
    return r.response_code


async def test_frames_of_activation_credit_and_connection_loss(stream_server, stream):
    await publish(stream_server, stream, [b"m%d" % i for i in range(9)])  # offsets 0..9
    one = await RawPeer.open(stream_server.host, stream_server.port)
    two = await RawPeer.open(stream_server.host, stream_server.port)
    try:
        # a name is required (the property, even empty, as RabbitMQ's reader)
        assert await subscribe(one, 1, stream, {"single-active-consumer": "true"}) == PRECONDITION_FAILED
        assert await subscribe(one, 7, stream, sac_properties("")) == OK
        assert (await one.recv_until(f.ConsumerUpdate)).subscription_id == 7
        assert (await one.request(f.Unsubscribe(one.next_corr(), 7))).response_code == OK
        assert await subscribe(one, 1, stream, sac_properties("g")) == OK
        update = await one.recv_until(f.ConsumerUpdate)
        assert (update.subscription_id, update.active) == (1, True)
        # nothing is delivered before the answer
        with pytest.raises(asyncio.TimeoutError):
            await one.recv_until(f.Deliver, timeout=0.5)
        assert await subscribe(two, 5, stream, sac_properties("g")) == OK
        # the answer's offset spec decides: offset 9, inside the second chunk
        one.send(f.ConsumerUpdateResponse(update.correlation_id, OK, OFFSET_TYPE, 9))
        deliver = await one.recv_until(f.Deliver)
        chunk = Chunk.parse(deliver.chunk)
        assert deliver.subscription_id == 1 and chunk.chunk_id <= 9 < chunk.chunk_id + chunk.records
        # the inactive member gets no ConsumerUpdate and no Deliver; Credit to it is kept and
        # answered with 0x11 (as RabbitMQ does), Credit to an unknown id with 0x04
        two.send(f.Credit(5, 3))
        r = await two.recv_until(f.CreditResponse)
        assert (r.response_code, r.subscription_id) == (PRECONDITION_FAILED, 5)
        two.send(f.Credit(9, 3))
        r = await two.recv_until(f.CreditResponse)
        assert (r.response_code, r.subscription_id) == (SUBSCRIPTION_DOES_NOT_EXIST, 9)
        # connection loss of the active member: the next one is activated
        one.writer.transport.abort()
        update = await two.recv_until(f.ConsumerUpdate)
        assert (update.subscription_id, update.active) == (5, True)
        # no spec in the answer (type 0): the Subscribe's own spec (first) applies, and the
        # credit kept from before counts too
        two.send(f.ConsumerUpdateResponse(update.correlation_id, OK, NONE_TYPE, None))
        chunks = [Chunk.parse((await two.recv_until(f.Deliver)).chunk)]
        while chunks[-1].chunk_id + chunks[-1].records < 10:
            chunks.append(Chunk.parse((await two.recv_until(f.Deliver)).chunk))
        assert [c.chunk_id for c in chunks] == [0] + [c.chunk_id + c.records for c in chunks[:-1]]
        # an answer nobody asked for is ignored; the connection stays usable
        two.send(f.ConsumerUpdateResponse(4242, OK, NEXT_TYPE, 0))
        r = await two.request(f.Unsubscribe(two.next_corr(), 5))
        assert r.response_code == OK
    finally:
        one.close()
        two.close()


async def test_a_member_must_agree_on_the_partition_index(stream_server):
    """The first member fixes the group's partition index: one naming the super stream
    (index 1) and one not (-1) in the same group is refused with 0x11, as RabbitMQ's
    coordinator does (partition_index_conflict); nothing is delivered to it."""
    name = stream_name("sac-conflict")
    parts = tuple(f"{name}-{i}" for i in range(2))
    peer = await RawPeer.open(stream_server.host, stream_server.port)
    try:
        r = await peer.request(f.CreateSuperStream(peer.next_corr(), name, parts, ("0", "1"), {}))
        assert r.response_code == OK
        assert await subscribe(peer, 1, parts[1], sac_properties("g", **{"super-stream": name})) == OK
        assert (await peer.recv_until(f.ConsumerUpdate)).subscription_id == 1
        assert await subscribe(peer, 2, parts[1], sac_properties("g")) == PRECONDITION_FAILED
        # another group, or the same index, is fine
        assert await subscribe(peer, 3, parts[1], sac_properties("h")) == OK
        assert await subscribe(peer, 4, parts[1], sac_properties("g", **{"super-stream": name})) == OK
        # the refused subscription does not exist
        peer.send(f.Credit(2, 1))
        r = await peer.recv_until(f.CreditResponse)
        assert (r.response_code, r.subscription_id) == (SUBSCRIPTION_DOES_NOT_EXIST, 2)
        assert (await peer.request(f.DeleteSuperStream(peer.next_corr(), name))).response_code == OK
    finally:
        peer.close()


async def test_three_super_stream_consumers_of_one_group_share_10000_messages(stream_server):
    """rstream's own test_consume_superstream_with_sac_all_active, unmodified in substance:
    three SuperStreamConsumers (the `super-stream` property set, bodies as bytes) over a
    3-partition super stream, then 10,000 messages through a hash-routing
    SuperStreamProducer: each consumer gets exactly one partition, together all 10,000.
    (rstream 1.1 encodes a `str` body as an invalid AMQP message that its own decoder
    fails on with "'NoneType' object is not callable"; RabbitMQ stores message bytes as
    they come, so a server cannot help there.)"""
    name = stream_name("sac-10k")
    got: list[list[tuple[str, bytes]]] = [[], [], []]
    consumers = []
    try:
        for received in got:
            c = SuperStreamConsumer(stream_server.host, stream_server.port, **GUEST,
                                    super_stream=name,
                                    super_stream_creation_option=SuperStreamCreationOption(3))
            await c.start()
            consumers.append(c)
            await c.subscribe(lambda msg, ctx, received=received: received.append((ctx.stream, msg)),
                              properties=sac_properties("consumer-group-1", **{"super-stream": name}))

        async def by_id(message: bytes) -> str:
            return message.split(b":")[1].decode()

        async with SuperStreamProducer(stream_server.host, stream_server.port, **GUEST,
                                       super_stream=name, routing_extractor=by_id) as p:
            for i in range(10_000):
                await p.send(b"a:%d" % i)
        await wait_until(lambda: sum(map(len, got)) >= 10_000, 30,
                         lambda: f"10,000 messages (got {[len(g) for g in got]})")
        await asyncio.sleep(0.5)
        assert sorted(m for g in got for _, m in g) == sorted(b"a:%d" % i for i in range(10_000))
        assert sorted({s for s, _ in g}.pop() for g in got if len({s for s, _ in g}) == 1) == \
            [f"{name}-{i}" for i in range(3)]
    finally:
        for c in consumers:
            await c.close()
        async with SuperStreamProducer(stream_server.host, stream_server.port, **GUEST,
                                       super_stream=name, routing_extractor=None) as p:
            await p.delete_super_stream(name, missing_ok=True)
