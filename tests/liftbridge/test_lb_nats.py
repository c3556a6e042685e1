"""The NATS door with nats-py against the embedded nats-server: plain messages become durable,
enveloped publishes are stored with key/value/headers and acked per ack policy, broken
envelopes are stored as plain messages, size limit, optimistic concurrency, partitions on
`subject.N`, paused and read-only partitions."""
from __future__ import annotations

import asyncio
import time

import pytest
from _lb import Clients, create, read_all, wait_for_offset

from riverlog.config import Durability
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.envelope import MAGIC, decode_ack, encode_envelope, encode_publish

pytestmark = pytest.mark.timeout(60)


async def ack_inbox(nc):
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    return inbox, sub


async def next_ack(sub, timeout=5.0) -> pb.Ack:
    msg = await sub.next_msg(timeout=timeout)
    ack = decode_ack(msg.data)
    assert ack is not None, f"not an enveloped Ack: {msg.data!r}"
    return ack


async def test_plain_messages_become_durable(server, stub, nc):
    await create(stub, "plain", "orders.eu")
    await nc.publish("orders.eu", b"first", reply="reply.here")
    await nc.publish("orders.eu", b"")
    await nc.flush()
    await wait_for_offset(server, "plain", 1)
    msgs = await read_all(stub, "plain")
    assert [m.value for m in msgs] == [b"first", b""]
    assert [m.offset for m in msgs] == [0, 1]
    first = msgs[0]
    assert first.key == b"" and first.subject == "orders.eu" and first.replySubject == "reply.here"
    assert dict(first.headers) == {"subject": b"orders.eu", "reply": b"reply.here"}
    assert abs(first.timestamp - time.time_ns()) < 60 * 10**9


@pytest.mark.parametrize("policy", [pb.AckPolicy.LEADER, pb.AckPolicy.ALL])
async def test_envelope_is_stored_and_acked(server, stub, nc, policy):
    await create(stub, "env", "env.subj")
    inbox, sub = await ack_inbox(nc)
    before = time.time_ns()
    msg = pb.Message(key=b"k1", value=b"v1", headers={"h": b"x"}, ackInbox=inbox,
                     correlationId="corr-1", ackPolicy=policy)
    await nc.publish("env.subj", encode_publish(msg))
    ack = await next_ack(sub)
    assert ack.stream == "env" and ack.partitionSubject == "env.subj"
    assert ack.msgSubject == "env.subj" and ack.offset == 0 and ack.ackInbox == inbox
    assert ack.correlationId == "corr-1" and ack.ackPolicy == policy
    assert ack.ackError == pb.Ack.Error.OK
    assert before <= ack.receptionTimestamp <= ack.commitTimestamp <= time.time_ns()
    (stored,) = await read_all(stub, "env")
    assert (stored.key, stored.value) == (b"k1", b"v1")
    assert dict(stored.headers) == {"h": b"x", "subject": b"env.subj", "reply": b""}


async def test_ack_policy_none_and_no_inbox_get_no_ack(server, stub, nc):
    await create(stub, "quiet", "quiet")
    inbox, sub = await ack_inbox(nc)
    await nc.publish("quiet", encode_publish(pb.Message(value=b"a", ackInbox=inbox,
                                                        ackPolicy=pb.AckPolicy.NONE)))
    await nc.publish("quiet", encode_publish(pb.Message(value=b"b")))
    await wait_for_offset(server, "quiet", 1)
    with pytest.raises(Exception):
        await sub.next_msg(timeout=0.3)
    assert [m.value for m in await read_all(stub, "quiet")] == [b"a", b"b"]


async def test_ack_all_waits_for_fsync_under_durability_always(server_factory):
    server = await server_factory(durability=Durability.ALWAYS)
    async with Clients(server) as (stub, nc):
        await create(stub, "durable", "durable")
        inbox, sub = await ack_inbox(nc)
        for policy in (pb.AckPolicy.LEADER, pb.AckPolicy.ALL):
            await nc.publish("durable", encode_publish(pb.Message(
                value=b"x", ackInbox=inbox, ackPolicy=policy, correlationId=str(policy))))
        acks = [await next_ack(sub), await next_ack(sub)]
        assert sorted(a.offset for a in acks) == [0, 1]
        part = server.app.broker.streams["durable"].partitions[0]
        assert part.committed_offset == 1  # the ALL ack came after the fsync committed it


@pytest.mark.parametrize("payload", [
    MAGIC + b"\x00\x08\x00\x00" + b"\xff\xff\xff",  # Publish header, payload not a Message
    MAGIC + b"\x01\x08\x00\x00" + pb.Message(value=b"v").SerializeToString(),  # version 1
    MAGIC + b"\x00\x0c\x01\x00" + b"\x00\x00\x00\x00" + pb.Message(value=b"v").SerializeToString(),
    MAGIC + b"\x00\x08",  # too short
    b"\xb9\x0e\x43\xb5\x00\x08\x00\x00",  # wrong magic
    encode_envelope(1, pb.Ack(stream="x").SerializeToString()),  # an Ack, not a Publish
])
async def test_malformed_envelopes_are_stored_as_plain_messages(server, stub, nc, payload):
    await create(stub, "bad", "bad")
    await nc.publish("bad", payload)
    await wait_for_offset(server, "bad", 0)
    (stored,) = await read_all(stub, "bad")
    assert stored.value == payload and stored.key == b""
    assert dict(stored.headers) == {"subject": b"bad", "reply": b""}


async def test_envelope_with_crc_is_accepted(server, stub, nc):
    await create(stub, "crc", "crc")
    await nc.publish("crc", encode_publish(pb.Message(value=b"checked", key=b"k"), crc=True))
    await wait_for_offset(server, "crc", 0)
    (stored,) = await read_all(stub, "crc")
    assert (stored.key, stored.value) == (b"k", b"checked")


async def test_too_large_gets_a_too_large_ack(server_factory):
    server = await server_factory(replication_max_bytes=1000)
    async with Clients(server) as (stub, nc):
        await create(stub, "big", "big")
        inbox, sub = await ack_inbox(nc)
        await nc.publish("big", encode_publish(pb.Message(value=b"x" * 2000, ackInbox=inbox,
                                                          correlationId="c")))
        ack = await next_ack(sub)
        assert ack.ackError == pb.Ack.Error.TOO_LARGE and ack.correlationId == "c"
        await nc.publish("big", b"y" * 2000)  # plain and too large: dropped, no ack
        await nc.publish("big", encode_publish(pb.Message(value=b"small", ackInbox=inbox)))
        assert (await next_ack(sub)).offset == 0
        assert [m.value for m in await read_all(stub, "big")] == [b"small"]


async def test_optimistic_concurrency(server, stub, nc):
    await create(stub, "occ", "occ", optimisticConcurrencyControl=pb.NullableBool(value=True))
    inbox, sub = await ack_inbox(nc)

    async def publish(expected, corr):
        await nc.publish("occ", encode_publish(pb.Message(
            value=corr.encode(), offset=expected, ackInbox=inbox, correlationId=corr)))
        return await next_ack(sub)

    assert (await publish(0, "a")).ackError == pb.Ack.Error.OK
    bad = await publish(0, "b")
    assert bad.ackError == pb.Ack.Error.INCORRECT_OFFSET and bad.correlationId == "b"
    assert (await publish(1, "c")).offset == 1
    assert (await publish(-1, "d")).offset == 2  # -1: no check
    assert [m.value for m in await read_all(stub, "occ")] == [b"a", b"c", b"d"]


async def test_partitions_listen_on_subject_dot_n(server, stub, nc):
    await create(stub, "parts", "p", partitions=3)
    for subject in ("p", "p.1", "p.2", "p.3"):
        await nc.publish(subject, subject.encode())
    await nc.flush()
    for i in range(3):
        await wait_for_offset(server, "parts", 0, partition=i)
        assert [m.value for m in await read_all(stub, "parts", i)] == [
            ("p" if i == 0 else f"p.{i}").encode()]


async def test_two_streams_on_one_subject_both_store(server, stub, nc):
    await create(stub, "s1", "shared")
    await create(stub, "s2", "shared", group="g")
    await nc.publish("shared", b"m")
    await wait_for_offset(server, "s1", 0)
    await wait_for_offset(server, "s2", 0)


async def test_paused_and_readonly_partitions_take_no_nats_messages(server, stub, nc):
    await create(stub, "pz", "pz")
    await stub.PauseStream(pb.PauseStreamRequest(name="pz"), timeout=5)
    await nc.publish("pz", b"lost")
    await nc.flush()
    await asyncio.sleep(0.2)
    assert server.app.broker.streams["pz"].partitions[0].next_offset == 0
    await stub.Publish(pb.PublishRequest(stream="pz", value=b"resumes"), timeout=5)
    await server.app.nats.sync()
    await nc.publish("pz", b"kept")
    await wait_for_offset(server, "pz", 1)
    await stub.SetStreamReadonly(pb.SetStreamReadonlyRequest(name="pz", readonly=True), timeout=5)
    await nc.publish("pz", b"dropped")
    await nc.flush()
    await asyncio.sleep(0.2)
    assert [m.value for m in await read_all(stub, "pz")] == [b"resumes", b"kept"]
