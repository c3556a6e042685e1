# A cluster member's graceful stop (riverlog.cluster.leaving, App.stop's order) on three real
# Apps of one cluster: the doors stop first while replication still runs, so what the
# stopping leader took is committed and acked; then it hands every partition it leads to an
# in-sync follower and a stopping follower leaves the ISR, through Raft, before its Raft
# member stops. The followers' own detection is switched off here (leader timeout and lag
# time 120 s), so only the stopping server can have made those changes. No mocks.
from __future__ import annotations

import asyncio
import collections

import grpc
import nats
import pytest

from _apps import created, started, stopped, stub_of
from riverlog.protocol.forward_batch import FAILED_MAGIC, forward_subject
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.envelope import decode_ack, encode_publish
from riverlog.server.nats_link import settle

pytestmark = pytest.mark.timeout(180)

SLOW = (("replica_max_lag_time_ms", 120_000), ("replica_max_leader_timeout_ms", 120_000))
SOON_S = 10  # far less than the 120 s the followers would take on their own


async def _soon(what: str, check) -> None:
    for _ in range(SOON_S * 20):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"still not, {SOON_S} s after the stop: {what}")


async def _read(app, stream: str, last: int) -> dict[int, bytes]:
    """{offset: value} of ``stream``'s partition 0 up to ``last``, read from ``app``."""
    channel, stub = stub_of(app)
    got: dict[int, bytes] = {}
    call = stub.Subscribe(pb.SubscribeRequest(stream=stream,
                                              startPosition=pb.StartPosition.EARLIEST),
                          timeout=60)
    async for msg in call:
        if msg == pb.Message():  # Liftbridge's empty handshake message
            continue
        got[msg.offset] = msg.value
        if msg.offset >= last:
            break
    call.cancel()
    await channel.close()
    return got


async def test_a_stopping_leader_keeps_what_it_acked_and_hands_its_partitions_over(tmp_path):
    apps = await started(tmp_path, replica_timings_ms=SLOW)
    try:
        part = await created(apps, "leave", replication_factor=3, min_isr=2)
        by_id = {a.config.cluster.server_id: a for a in apps}
        leader = by_id[part.leader]
        others = [a for a in apps if a is not leader]
        channel, stub = stub_of(leader)

        async def publish(i: int):
            try:
                ack = (await stub.Publish(pb.PublishRequest(
                    stream="leave", value=b"m%d" % i, ackPolicy=pb.AckPolicy.ALL),
                    timeout=30)).ack
                return i, ack.offset
            except grpc.aio.AioRpcError as exc:
                return i, exc.code()
        first = await asyncio.gather(*(publish(i) for i in range(50)))
        assert all(isinstance(offset, int) for _, offset in first)
        # publishes in flight while the leader stops
        later = [asyncio.ensure_future(publish(i)) for i in range(50, 300)]
        await asyncio.sleep(0.05)
        await leader.stop()
        results = first + list(await asyncio.gather(*later))
        await channel.close()

        await _soon("another leader named everywhere", lambda: all(
            (p := a.broker.placement.of("leave", 0)).leader not in (None, part.leader)
            and p.leader_epoch == part.leader_epoch + 1 for a in others))
        now = others[0].broker.placement.of("leave", 0)
        assert part.leader not in now.isr and len(now.isr) == 2
        # every acked publish is on the new leader, at its offset; none taken was lost
        acked = {offset: b"m%d" % i for i, offset in results if isinstance(offset, int)}
        assert len(acked) >= 50
        stored = await _read(by_id[now.leader], "leave", max(acked))
        assert all(stored.get(offset) == value for offset, value in acked.items())
    finally:
        await stopped(apps)


async def test_a_stopping_leader_acks_every_nats_publish_it_stored(tmp_path):
    """Enveloped NATS publishes with ALL acks keep arriving, through another server's
    nats-server, while the leader stops: every message the new leader holds was acked.
    Before, what reached the leader in its last loop turns was stored after the appenders
    drained, so it never committed there (and the stop waited 5 s for it at the close), and
    acks committed after the data connection closed were not sent."""
    apps = await started(tmp_path, replica_timings_ms=SLOW)
    try:
        part = await created(apps, "nleave", replication_factor=3, min_isr=2, subject="nleave")
        by_id = {a.config.cluster.server_id: a for a in apps}
        leader = by_id[part.leader]
        via = next(a for a in apps if a is not leader)
        nc = await nats.connect(via.nats.embedded.url)
        acked: set[bytes] = set()

        async def on_ack(msg) -> None:
            ack = decode_ack(msg.data)
            if ack is not None and ack.ackError == pb.Ack.Error.OK:
                acked.add(ack.correlationId.encode())
        inbox = nc.new_inbox()
        await nc.subscribe(inbox, cb=on_ack)
        await nc.flush()
        done = asyncio.Event()

        async def publish() -> int:
            n = 0
            while not done.is_set():
                for _ in range(20):  # bursts: some always wait in the leader's queues
                    n += 1
                    await nc.publish("nleave", encode_publish(pb.Message(
                        value=b"n%d" % n, ackInbox=inbox, ackPolicy=pb.AckPolicy.ALL,
                        correlationId="n%d" % n)))
                await asyncio.sleep(0.002)
            return n
        publishing = asyncio.ensure_future(publish())
        await asyncio.sleep(0.5)
        await leader.stop()
        done.set()
        sent = await publishing
        others = [a for a in apps if a is not leader]
        await _soon("another leader named everywhere", lambda: all(
            a.broker.placement.of("nleave", 0).leader not in (None, part.leader)
            for a in others))
        new = by_id[others[0].broker.placement.of("nleave", 0).leader]
        await asyncio.sleep(1.0)  # the acks of the new leader's own last writes
        await nc.close()
        last = new.broker.streams["nleave"].partitions[0].log.committed_offset
        stored = set((await _read(new, "nleave", last)).values())
        assert sent > 200 and len(stored) > 100
        unacked = sorted(stored - acked, key=lambda v: int(v[1:]))
        assert not unacked, f"stored without an ack: {unacked[:10]}"
    finally:
        await stopped(apps)


async def test_a_stopping_leader_answers_its_forward_subject_until_its_partitions_moved(
        tmp_path):
    """While a leader stops, batches keep coming on its forward subject from a server that
    still names it the leader: it answers every one itself (a batch taken before its doors
    stopped is stored and answered; one after is answered "503 Leader Stopping", stored
    nowhere, and its sender sends it on), until that server names the new leader. Before, it
    unsubscribed when its doors stopped, before the hand-over, so nats-server answered "no
    responders" there instead; and a batch crossing a NATS route while the interest went was
    dropped with no answer at all (only the publishing server answers "no responders"), its
    requests' acks left to time out."""
    apps = await started(tmp_path, replica_timings_ms=SLOW)
    try:
        part = await created(apps, "fleave", replication_factor=3, min_isr=2)
        by_id = {a.config.cluster.server_id: a for a in apps}
        leader = by_id[part.leader]
        via = next(a for a in apps if a is not leader)
        namespace = via.liftbridge.namespace
        nc = via.nats_link.nc  # the server's own connection: it may use `<namespace>.>`
        answers: dict[int, tuple[str | None, str | None, bytes]] = {}

        async def on_answer(msg) -> None:
            headers = msg.headers or {}
            answers[int(msg.subject.rsplit(".", 1)[1])] = (
                headers.get("Status"), headers.get("Description"), msg.data)
        await nc.subscribe(f"{namespace}.ack.leaving.*", cb=on_answer)
        await settle(nc)
        subject = forward_subject(namespace, part.leader)
        stopping = asyncio.ensure_future(leader.stop())
        sent = 0
        while via.broker.placement.of("fleave", 0).leader == part.leader:
            await nc.publish(subject, b"", reply=f"{namespace}.ack.leaving.{sent}")
            sent += 1
            await asyncio.sleep(0.005)
        await stopping
        await _soon("every batch answered", lambda: len(answers) >= sent)
        kinds = collections.Counter(
            "failed" if data.startswith(FAILED_MAGIC) else f"{status} {description}"
            for status, description, data in answers.values())
        # an empty batch is malformed: the leader's own answer is "failed" until it stops
        assert set(kinds) <= {"failed", "503 Leader Stopping"}, kinds
        assert kinds["503 Leader Stopping"] > 0, kinds
    finally:
        await stopped(apps)


async def test_a_stopping_follower_leaves_the_isr(tmp_path):
    apps = await started(tmp_path, replica_timings_ms=SLOW)
    try:
        part = await created(apps, "follow", replication_factor=3, min_isr=2)
        follower = next(a for a in apps if a.config.cluster.server_id != part.leader)
        gone = follower.config.cluster.server_id
        await follower.stop()
        rest = [a for a in apps if a is not follower]
        await _soon(f"{gone} out of the ISR everywhere", lambda: all(
            gone not in a.broker.placement.of("follow", 0).isr for a in rest))
        # the leader kept its place; the ISR still meets min ISR, so writes go on
        assert all(a.broker.placement.of("follow", 0).leader == part.leader for a in rest)
    finally:
        await stopped(apps)
