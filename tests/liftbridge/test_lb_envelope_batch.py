# The NATS door's batch path (server/nats_bridge.py): the NATS messages of one loop turn are
# stored in runs (one encode pass, one append, one AckTemplate per subject and ack mode), the
# Ack envelopes are built from template bytes and the turn's acks leave in one write. These
# tests hold the template to the bytes of the generated protobuf classes and encode_ack, and a
# burst of mixed messages (plain, malformed envelopes, every ack policy, two ack inboxes, no
# inbox, keys, headers, reply subjects, oversized ones, optimistic concurrency, ack inboxes
# that are not valid subjects, which are refused) to what one-by-one ingest stores and acks,
# record bytes included, with a real nats-py client and the real nats-server.
from __future__ import annotations

import asyncio

import pytest
from _lb import Clients, create, read_all, wait_for_offset

from riverlog.log.chunk import CHUNK_USER
from riverlog.metrics import REGISTRY
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.envelope import (ACK_HEADER, MAGIC, AckTemplate, decode_ack,
                                                   encode_ack, encode_envelope, encode_publish,
                                                   varint)
from riverlog.record import Record, decode_record, encode_record
from riverlog.server.nats_bridge import TURN_MESSAGES

pytestmark = pytest.mark.timeout(60)

LEADER, ALL, NONE = pb.AckPolicy.LEADER, pb.AckPolicy.ALL, pb.AckPolicy.NONE
MALFORMED = [
    MAGIC + b"\x00\x08\x00\x00" + b"\xff\xff\xff",  # Publish header, payload not a Message
    MAGIC + b"\x01\x08\x00\x00" + pb.Message(value=b"v").SerializeToString(),  # version 1
    MAGIC + b"\x00\x0c\x01\x00" + b"\x00\x00\x00\x00" + pb.Message(value=b"v").SerializeToString(),
    MAGIC + b"\x00\x08",  # too short
    encode_envelope(1, pb.Ack(stream="x").SerializeToString()),  # an Ack, not a Publish
]


@pytest.mark.parametrize("offset", [0, 1, 127, 128, 300_000, 2**62])
@pytest.mark.parametrize("correlation_id", ["", "7", "é✓" * 70])
@pytest.mark.parametrize("policy", [LEADER, ALL])
@pytest.mark.parametrize("names", [("s", "s.sub", "s.sub.1"), ("", "", ""), ("x" * 200,) * 3])
def test_ack_template_gives_encode_acks_bytes(offset, correlation_id, policy, names):
    stream, partition_subject, msg_subject = names
    enveloped = AckTemplate(stream, partition_subject, msg_subject, policy, 1_700_000_000_123,
                            ACK_HEADER)
    bare = AckTemplate(stream, partition_subject, msg_subject, policy, 1_700_000_000_123)
    # inboxes change from ack to ack (the template keeps the last one's field)
    for commit_ns, inbox in [(1_700_000_000_456, "_INBOX.a"), (1_700_000_000_456, "_INBOX.a"),
                             (1_700_000_001_000, ""), (1_700_000_001_000, "i" * 300),
                             (1_700_000_001_000, "_INBOX.a")]:
        ack = pb.Ack(stream=stream, partitionSubject=partition_subject, msgSubject=msg_subject,
                     offset=offset, ackInbox=inbox, correlationId=correlation_id,
                     ackPolicy=policy, receptionTimestamp=1_700_000_000_123,
                     commitTimestamp=commit_ns)
        args = (offset, inbox.encode(), correlation_id.encode(), commit_ns)
        assert enveloped.ack(*args) == encode_ack(ack)
        assert bare.ack(*args) == ack.SerializeToString()
        assert decode_ack(enveloped.ack(*args)) == ack


def test_varint_is_protobufs():
    assert varint(0) == b"\x00"
    for n in [*range(1, 20_000), 2**21 - 1, 2**21, 2**28, 2**35 + 7, 2**62, 2**63 - 1]:
        assert b"\x20" + varint(n) == pb.Ack(offset=n).SerializeToString()


def _published(stream: str) -> float:
    return REGISTRY.get_sample_value("riverlog_published_messages_total",
                                     {"vhost": "/", "stream": stream, "door": "nats"}) or 0.0


def _raw_records(server, stream: str) -> list[bytes]:
    part = server.app.broker.streams[stream].partitions[0]
    return [raw for chunk in part.read_chunks(0, 1 << 24)
            if chunk.header.chunk_type == CHUNK_USER for _, raw in chunk.records()]


def _one_by_one(subject: str, reply: str, payload: bytes, message: pb.Message | None,
                timestamp_ns: int) -> bytes:
    """The record bytes Liftbridge.ingest (one message at a time) writes for a NATS message."""
    headers = {"subject": subject.encode(), "reply": reply.encode()}
    if message is None:
        return encode_record(Record(value=payload, headers=headers, timestamp_ns=timestamp_ns,
                                    subject=subject, reply=reply or None))
    return encode_record(Record(
        value=message.value, key=message.key or None, headers={**message.headers, **headers},
        timestamp_ns=timestamp_ns, subject=subject, reply=reply or None,
        correlation_id=message.correlationId or None, ack_inbox=message.ackInbox or None))


async def test_a_mixed_burst_is_stored_and_acked_as_one_by_one(server_factory):
    server = await server_factory(replication_max_bytes=2000)
    async with Clients(server) as (stub, nc):
        await create(stub, "mix", "mix.sub")
        acks: dict[str, list[bytes]] = {}
        inboxes = [nc.new_inbox(), nc.new_inbox()]
        for inbox in inboxes + ["evil"]:
            await nc.subscribe(inbox, cb=_collect(acks.setdefault(inbox, [])))
        # not subjects: refused (not stored, no ack, no injection)
        bad_inboxes = ["bad inbox", "x\r\nPUB evil 1\r\nz"]
        before = _published("mix")
        sent = []  # (reply, payload, Message or None)
        for i in range(300):
            reply = "r.x" if i % 6 == 0 else ""
            if i % 10 == 3:
                sent.append((reply, b"plain%d" % i, None))
                continue
            if i % 10 == 7:
                payload = MALFORMED[i // 10 % len(MALFORMED)]
                sent.append((reply, payload, None))
                continue
            if i % 50 == 26:
                sent.append((reply, b"P" * 3000, None))  # plain and too large: dropped
                continue
            message = pb.Message(
                value=b"L" * 3000 if i % 50 == 25 else b"v%d" % i,
                key=b"k%d" % i if i % 5 == 0 else b"",
                headers={"h": b"%d" % i, "subject": b"theirs"} if i % 7 == 0 else {},
                ackInbox="" if i % 11 == 0 else inboxes[i % 4 // 3],
                correlationId=f"c{i}" if i % 9 else f"é✓{i}", ackPolicy=(LEADER, ALL, NONE)[i % 3])
            if i in (100, 101):
                message.ackInbox, message.ackPolicy = bad_inboxes[i - 100], LEADER
            sent.append((reply, encode_publish(message, crc=i % 13 == 0), message))
        for reply, payload, _ in sent:
            await nc.publish("mix.sub", payload, reply=reply)
        await nc.flush()

        stored = [(r, p, m) for r, p, m in sent
                  if len(p) <= 2000 and (m is None or m.ackInbox not in bad_inboxes)]
        wanted = {(m.ackInbox, m.correlationId) for _, p, m in sent
                  if m is not None and m.ackInbox in inboxes
                  and (m.ackPolicy != NONE or len(p) > 2000)}
        await wait_for_offset(server, "mix", len(stored) - 1)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while sum(len(acks[i]) for i in inboxes) < len(wanted) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        await nc.flush()
        await asyncio.sleep(0.2)  # anything sent that should not have been arrives too

        raws = _raw_records(server, "mix")
        assert len(raws) == len(stored)
        timestamps = [decode_record(raw).timestamp_ns for raw in raws]
        for raw, ts, (reply, payload, message) in zip(raws, timestamps, stored):
            # the same record, field for field: headers compared as a map (a protobuf map's
            # iteration order differs between the test's message and the one the server
            # parsed, so two headers may be stored in either order)
            expected = _one_by_one("mix.sub", reply, payload, message, ts)
            assert (len(raw), decode_record(raw)) == (len(expected), decode_record(expected))
        messages = await read_all(stub, "mix")
        assert [m.offset for m in messages] == list(range(len(stored)))

        offsets = {(m.ackInbox, m.correlationId): offset
                   for offset, (_, _, m) in enumerate(stored) if m is not None}
        by_key = {(m.ackInbox, m.correlationId): (m, len(p)) for _, p, m in sent
                  if m is not None}
        got = [(inbox, data) for inbox in inboxes for data in acks[inbox]]
        assert acks["evil"] == []
        assert len(got) == len(wanted)
        assert {(inbox, decode_ack(data).correlationId) for inbox, data in got} == wanted
        for inbox, data in got:
            ack = decode_ack(data)
            message, size = by_key[(inbox, ack.correlationId)]
            if size > 2000:
                want = pb.Ack(stream="mix", partitionSubject="mix.sub", msgSubject="mix.sub",
                              ackInbox=inbox, correlationId=message.correlationId,
                              ackPolicy=message.ackPolicy,
                              receptionTimestamp=ack.receptionTimestamp,
                              ackError=pb.Ack.Error.TOO_LARGE)
            else:
                offset = offsets[(inbox, ack.correlationId)]
                assert ack.receptionTimestamp == timestamps[offset]
                assert ack.receptionTimestamp <= ack.commitTimestamp
                want = pb.Ack(stream="mix", partitionSubject="mix.sub", msgSubject="mix.sub",
                              offset=offset, ackInbox=inbox, correlationId=message.correlationId,
                              ackPolicy=message.ackPolicy,
                              receptionTimestamp=ack.receptionTimestamp,
                              commitTimestamp=ack.commitTimestamp)
            assert data == encode_ack(want)
        assert _published("mix") - before == len(stored)


def _collect(got: list):
    async def on_message(msg) -> None:
        got.append(msg.data)
    return on_message


async def test_optimistic_concurrency_in_a_burst(server_factory):
    server = await server_factory()
    async with Clients(server) as (stub, nc):
        await create(stub, "occ", "occ", optimisticConcurrencyControl=pb.NullableBool(value=True))
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        # (expected offset, ack policy, inbox?) -> stored at / rejected
        plan = [(-1, LEADER, True), (-1, ALL, True), (2, LEADER, True), (2, LEADER, True),
                (-1, LEADER, True), (4, ALL, True), (0, NONE, True), (0, LEADER, False),
                (-1, LEADER, True)]
        for i, (expected, policy, with_inbox) in enumerate(plan):
            await nc.publish("occ", encode_publish(pb.Message(
                value=b"m%d" % i, offset=expected, ackPolicy=policy,
                ackInbox=inbox if with_inbox else "", correlationId=str(i))))
        await nc.flush()
        got = {}
        for _ in range(8):  # all but the one without an inbox answer
            ack = decode_ack((await sub.next_msg(timeout=5)).data)
            got[ack.correlationId] = (ack.ackError, ack.offset)
        ok, bad = pb.Ack.Error.OK, pb.Ack.Error.INCORRECT_OFFSET
        assert got == {"0": (ok, 0), "1": (ok, 1), "2": (ok, 2), "3": (bad, 0), "4": (ok, 3),
                       "5": (ok, 4), "6": (bad, 0), "8": (ok, 5)}
        await wait_for_offset(server, "occ", 5)
        assert [m.value for m in await read_all(stub, "occ")] == [
            b"m0", b"m1", b"m2", b"m4", b"m5", b"m8"]


async def test_a_burst_is_stored_a_turn_at_a_time_and_what_waits_is_dropped_once_read_only(
        server, stub):
    """10,000 NATS messages of one read (the data connection hands a partition a read's
    messages as one list) are stored TURN_MESSAGES per loop turn, so a burst does not hold the
    loop for long (a three-server leader stopped answering its followers: test_nats_burst);
    those still waiting when the partition becomes read-only are dropped, never stored or
    acked, and counted."""
    await create(stub, "turns")
    stream = server.app.broker.streams["turns"]
    partition = stream.partitions[0]
    labels = {"door": "nats", "reason": "not_stored_here"}
    dropped = REGISTRY.get_sample_value("riverlog_dropped_messages_total", labels) or 0.0
    handler = server.app.nats._handler(stream, partition)
    handler([(1, "turns", "", None, b"m%d" % i) for i in range(10_000)])
    await asyncio.sleep(0)  # one loop turn: the first TURN_MESSAGES go to the appender
    partition.readonly = True  # as SetStreamReadonly sets it, between two turns
    await asyncio.sleep(0.1)
    assert partition.next_offset == TURN_MESSAGES
    assert (REGISTRY.get_sample_value("riverlog_dropped_messages_total", labels) or 0.0) \
        - dropped == 10_000 - TURN_MESSAGES
