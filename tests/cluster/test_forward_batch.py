# PublishAsync through a server that does not lead the partition, on three real Apps of one
# cluster (real gRPC, real nats-servers routed together): the requests of a loop turn go to the
# leader as one NATS message on `<namespace>.forward.<leader>` and come back as one answer;
# every client sees what the leader itself would answer (offsets, errors, order), a paused
# partition is resumed first, the subject is the servers' own (a NATS client can neither
# publish there nor read the answers), a malformed batch is answered as failed without
# hurting the server, and a batch reaching a server that no longer leads is refused. No mocks.
from __future__ import annotations

import asyncio

import nats
import pytest

from _apps import stub_of, until
from riverlog.protocol.forward_batch import (ANSWER_MAGIC, FAILED_MAGIC, MAGIC,
                                             MAX_ITEMS_DIVISOR, decode_failed, decode_items,
                                             encode_items, forward_subject)
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.server.grpc_publish_async import _AsyncSession, _publish_batch
from riverlog.server.nats_link import settle

LEADER, NONE, ALL = pb.AckPolicy.LEADER, pb.AckPolicy.NONE, pb.AckPolicy.ALL


@pytest.fixture
async def stubs(cluster):
    """A gRPC stub of each App of ``cluster``, in its order; the channels closed after."""
    channels = [stub_of(app) for app in cluster]
    yield [stub for _, stub in channels]
    for channel, _ in channels:
        await channel.close()


async def _publish(stub, requests: list[pb.PublishRequest], chunk: int = 500):
    """PublishAsync ``requests`` (a pause every ``chunk``, so they arrive over several loop
    turns); the answers."""
    async def stream():
        for i, req in enumerate(requests):
            if i and i % chunk == 0:
                await asyncio.sleep(0.01)
            yield req
    return [r async for r in stub.PublishAsync(stream(), timeout=60)]


async def _stored(stub, stream: str, count: int) -> list[tuple[int, bytes]]:
    """(offset, value) of the first ``count`` records of ``stream``, read from its leader."""
    call = stub.Subscribe(pb.SubscribeRequest(stream=stream,
                                              startPosition=pb.StartPosition.EARLIEST),
                          timeout=60)
    got = []
    async for msg in call:
        if msg == pb.Message():  # Liftbridge's empty handshake message
            continue
        got.append((msg.offset, msg.value))
        if len(got) == count:
            break
    call.cancel()
    return got


async def _roles(cluster, stubs, name: str, **options):
    await stubs[0].CreateStream(pb.CreateStreamRequest(
        name=name, subject=name, replicationFactor=3, **options), timeout=30)
    await until(f"{name} led", lambda: all(
        (p := app.broker.placement.of(name, 0)) is not None and p.leader for app in cluster))
    leader_id = cluster[0].broker.placement.of(name, 0).leader
    index = next(i for i, app in enumerate(cluster)
                 if app.config.cluster.server_id == leader_id)
    return index, (index + 1) % 3


async def test_publish_async_through_a_follower_goes_in_batches(cluster, stubs):
    lead, follow = await _roles(cluster, stubs, "fb", minIsr=pb.NullableInt32(value=2))
    leader, via = stubs[lead], stubs[follow]
    n = 3000
    answers = await _publish(via, [pb.PublishRequest(
        stream="fb", value=b"v%d" % i, correlationId=f"c{i}", ackPolicy=LEADER)
        for i in range(n)])
    # every request acked once, in request order, at the offset its record has
    assert [(a.correlationId, a.ack.offset, a.HasField("asyncError")) for a in answers] == [
        (f"c{i}", i, False) for i in range(n)]
    assert await _stored(leader, "fb", n) == [(i, b"v%d" % i) for i in range(n)]
    assert cluster[lead].forwarded.batches < n  # several requests a NATS message

    # the requests of one loop turn: one NATS message to the leader, split where NATS's
    # max_payload would be passed (at most max_payload // MAX_ITEMS_DIVISOR requests)
    before = cluster[lead].forwarded.batches
    session = _AsyncSession()
    session.batch = [pb.PublishRequest(stream="fb", value=b"t%d" % i, correlationId=f"t{i}",
                                       ackPolicy=LEADER).SerializeToString()
                     for i in range(n)]
    _publish_batch(cluster[follow].liftbridge, session)
    await until("every request of the turn answered", lambda: len(session.out) == n)
    assert [pb.PublishResponse.FromString(a).ack.offset for a in session.out] == list(
        range(n, 2 * n))
    per_batch = cluster[follow].nats_link.nc.max_payload // MAX_ITEMS_DIVISOR
    assert cluster[lead].forwarded.batches - before == -(-n // per_batch) == 2
    n *= 2

    # mixed ack policies: NONE unanswered, LEADER and ALL acked at their records' offsets
    policies = [LEADER, NONE, ALL, ALL, NONE, LEADER]
    mixed = [pb.PublishRequest(stream="fb", value=b"m%d" % i, correlationId=f"m{i}",
                               ackPolicy=policies[i % len(policies)]) for i in range(600)]
    answers = await _publish(via, mixed, chunk=100)
    acked = {a.correlationId: a.ack for a in answers}
    assert not any(a.HasField("asyncError") for a in answers)
    assert sorted(acked) == sorted(r.correlationId for r in mixed if r.ackPolicy != NONE)
    assert all(ack.ackPolicy == mixed[int(c[1:])].ackPolicy for c, ack in acked.items())
    stored = await _stored(leader, "fb", n + 600)
    assert stored[n:] == [(n + i, b"m%d" % i) for i in range(600)]
    assert all(acked[c].offset == n + int(c[1:]) for c in acked)

    # a paused partition: resumed by the publish, which is then stored and acked
    await via.PauseStream(pb.PauseStreamRequest(name="fb"), timeout=30)
    await until("fb paused", lambda: all(
        app.broker.placement.flags("fb", 0).paused for app in cluster))
    answers = await _publish(via, [pb.PublishRequest(
        stream="fb", value=b"after", correlationId="p", ackPolicy=LEADER)])
    assert [(a.correlationId, a.ack.offset, a.HasField("asyncError")) for a in answers] == [
        ("p", n + 600, False)]


async def test_forwarded_errors_are_the_leaders_own_answers(cluster, stubs):
    """The same requests through the leader and through a follower, on two streams with
    optimistic concurrency: the same answers (expected offset mismatches, NONE refused)."""
    occ = {"optimisticConcurrencyControl": pb.NullableBool(value=True)}
    answers = {}
    for name, direct in (("occ-direct", True), ("occ-forwarded", False)):
        lead, follow = await _roles(cluster, stubs, name, **occ)
        requests = [
            pb.PublishRequest(stream=name, value=b"a", correlationId="ok0",
                              ackPolicy=LEADER, expectedOffset=0),
            pb.PublishRequest(stream=name, value=b"b", correlationId="bad",
                              ackPolicy=LEADER, expectedOffset=5),
            pb.PublishRequest(stream=name, value=b"c", correlationId="none",
                              ackPolicy=NONE, expectedOffset=1),
            pb.PublishRequest(stream=name, value=b"d", correlationId="ok1",
                              ackPolicy=ALL, expectedOffset=1),
            pb.PublishRequest(stream=name, value=b"e", correlationId="free",
                              ackPolicy=LEADER, expectedOffset=-1),
            pb.PublishRequest(stream="no-such", value=b"f", correlationId="missing",
                              ackPolicy=LEADER)]
        got = await _publish(stubs[lead if direct else follow], requests)
        answers[direct] = sorted(
            (a.correlationId, a.ack.offset, a.asyncError.code, a.asyncError.message)
            for a in got)
    assert answers[False] == answers[True]
    assert ("bad", 0, pb.PublishAsyncError.Code.INCORRECT_OFFSET,
            "incorrect expected offset") in answers[False]
    assert [a[:2] for a in answers[False] if a[0].startswith("ok")] == [("ok0", 0),
                                                                       ("ok1", 1)]


async def test_the_forward_subject_is_the_servers_own(cluster, stubs):
    lead, follow = await _roles(cluster, stubs, "guarded")
    app = cluster[lead]
    namespace = app.liftbridge.namespace
    subject = forward_subject(namespace, app.config.cluster.server_id)
    batch = encode_items(MAGIC, [pb.PublishRequest(
        stream="guarded", value=b"x", ackPolicy=LEADER).SerializeToString()])
    # a NATS client (nats-server's restricted anonymous user): refused both ways
    errors = []

    async def on_error(exc):
        errors.append(str(exc).lower())
    nc = await nats.connect(cluster[follow].nats.url, error_cb=on_error)
    await nc.subscribe(f"{namespace}.ack.>")
    await nc.publish(subject, batch, reply=f"{namespace}.ack.x.0")
    await settle(nc)
    await until("both refusals", lambda: len(errors) >= 2)
    assert "permissions violation for subscription" in errors[0]
    assert "permissions violation for publish" in errors[1]
    await nc.close()

    # malformed batches (from a server: the bridge's own connection) are answered as
    # failed; one without a riverlog reply inbox is dropped; the server goes on
    own = cluster[follow].nats_link.nc
    sub = await own.subscribe(f"{namespace}.ack.test.*")
    for data in (b"junk", MAGIC + b"\x05ab", encode_items(MAGIC, [b"\xff\xff"])):
        await own.publish(subject, data, reply=f"{namespace}.ack.test.0")
        answer = (await sub.next_msg(timeout=30)).data
        assert answer.startswith(FAILED_MAGIC), answer
        assert decode_failed(answer)
    await own.publish(subject, batch, reply="_INBOX.elsewhere")
    await own.flush()
    await until("three malformed and one dropped", lambda: app.forwarded.batches == 4)
    # a batch reaching a server that does not lead the partition (the leader changed on
    # the way): each request answered NOT_FOUND, nothing stored there
    other = cluster[follow]
    await own.publish(forward_subject(namespace, other.config.cluster.server_id),
                      encode_items(MAGIC, [pb.PublishRequest(
                          stream="guarded", value=b"z", correlationId="z",
                          ackPolicy=LEADER).SerializeToString()]),
                      reply=f"{namespace}.ack.test.1")
    (answer,) = decode_items((await sub.next_msg(timeout=30)).data, ANSWER_MAGIC, 10)
    answer = pb.PublishResponse.FromString(answer)
    assert (answer.correlationId, answer.asyncError.code) == (
        "z", pb.PublishAsyncError.Code.NOT_FOUND)
    assert "no longer leads partition 0 of stream guarded" in answer.asyncError.message
    assert other.broker.streams["guarded"].partitions[0].next_offset == 0
    answers = await _publish(stubs[follow], [pb.PublishRequest(
        stream="guarded", value=b"y", correlationId="y", ackPolicy=LEADER)])
    assert [(a.correlationId, a.ack.offset) for a in answers] == [("y", 0)]
    await sub.unsubscribe()


async def test_the_first_forward_of_a_call_is_answered_while_the_control_connection_is_busy(
        cluster, stubs):
    """A call's first forward must not reach the leader before nats-server has the call's
    answer inbox (and has passed it on to its routes). Here the bridge's control connection
    (nats-py) still has megabytes to write when the first request is forwarded: an inbox
    subscribed there, as it was, reaches nats-server long after the leader answered (CI:
    go-liftbridge's first publish after CreateStream timed out; the record was stored on the
    leader and the answer dropped for want of interest). The inbox is now on the data
    connection the forwards leave on."""
    lead, follow = await _roles(cluster, stubs, "busy")
    via = cluster[follow]
    nc = via.nats_link.nc
    for attempt in range(3):
        backlog = b"x" * (nc.max_payload - 1024)
        for _ in range(48):  # the control connection busy: ~48 MB ahead of the SUB
            await nc.publish(f"{via.liftbridge.namespace}.busy.nobody", backlog)
        session = _AsyncSession()
        session.batch = [pb.PublishRequest(stream="busy", value=b"first",
                                           correlationId=f"f{attempt}",
                                           ackPolicy=LEADER).SerializeToString()]
        _publish_batch(via.liftbridge, session)
        await until("the first forward answered", lambda: session.out)
        answer = pb.PublishResponse.FromString(session.out[0])
        assert (answer.correlationId, answer.ack.offset) == (f"f{attempt}", attempt)
        assert not answer.HasField("asyncError"), answer
        session.close()


async def test_a_batch_no_server_took_goes_to_the_next_leader(cluster, stubs):
    """The leader refuses forwarded batches (as a stopping server does until it has handed
    its partitions over): it answers a batch "503 Leader Stopping", as nats-server answers
    "no responders" where nobody takes it; nothing of it was stored, and the forwarding
    server sends it on once the placement names the next leader; the client's request is
    acked there (before: left unanswered, the client's ack timed out)."""
    lead, follow = await _roles(cluster, stubs, "moving", minIsr=pb.NullableInt32(value=1))
    third = 3 - lead - follow
    via, old = cluster[follow], cluster[lead]
    await old.forwarded.refuse()  # `forward.<old leader>` is answered 503 now

    session = _AsyncSession()
    session.batch = [pb.PublishRequest(stream="moving", value=b"v", correlationId="c",
                                       ackPolicy=LEADER).SerializeToString()]
    _publish_batch(via.liftbridge, session)
    await asyncio.sleep(0.5)
    assert session.out == [] and session.resends  # waiting for another leader
    assert old.forwarded.refused == 1  # the old leader answered it
    part = via.broker.placement.of("moving", 0)
    new_id = cluster[third].config.cluster.server_id
    await via.broker.placement.submit("change_leader", stream="moving", index=0, leader=new_id,
                             leader_epoch=part.leader_epoch)
    await until("the resent request answered", lambda: session.out)
    answer = pb.PublishResponse.FromString(session.out[0])
    assert not answer.HasField("asyncError"), answer
    assert (answer.correlationId, answer.ack.offset) == ("c", 0)
    assert await _stored(stubs[third], "moving", 1) == [(0, b"v")]
    session.close()
