# Partition replication (riverlog/cluster/replication*.py) between 2-3 servers in this event
# loop, each a Broker with its own nats-py connection to one real nats-server; the metadata
# holder in _replicas.py stands in for Raft (it applies shrink/expand with state.py).
from __future__ import annotations

import asyncio
import dataclasses
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from _relay import Relay  # noqa: E402
from _replicas import FAST, NS, SLOW, Cluster, chunk_bytes, eventually  # noqa: E402
from riverlog.cluster import state as meta  # noqa: E402
from riverlog.server.embedded_nats import EmbeddedNats  # noqa: E402


@pytest.fixture
async def nats_url():
    server = EmbeddedNats("127.0.0.1", 0)
    await server.start()
    yield server.url
    await server.stop()


@pytest.fixture
async def cluster(nats_url, tmp_path):
    c = Cluster(nats_url, tmp_path)
    await c.start()
    yield c
    await c.close()


async def publish(node, n: int, size: int = 100, batch: int = 10, stream: str = "s") -> int:
    """Write ``n`` records in chunks of ``batch`` on ``node``'s partition; wait until the
    last is committed; returns its offset."""
    part = node.partition(stream)
    last = -1
    for i in range(0, n, batch):
        last = part.write_records([b"%06d" % j + b"x" * size for j in range(i, i + batch)])[-1]
    await asyncio.wait_for(part.wait_committed(last), 30)
    return last


async def test_replicas_hold_the_same_bytes_and_the_high_watermark_is_the_isr_minimum(cluster):
    cluster.create_stream()
    a, b, c = (cluster.nodes[i] for i in "abc")
    last = await publish(a, 500)
    await eventually(lambda: all(n.partition().committed_offset == last for n in (b, c)),
                     what="followers committing the leader's high watermark")
    want = chunk_bytes(a.partition())
    assert want and chunk_bytes(b.partition()) == want and chunk_bytes(c.partition()) == want
    # with one follower stopped the leader's high watermark stays at what it holds
    await c.stop()
    part = a.partition()
    more = part.write_records([b"y" * 50] * 10)
    await eventually(lambda: b.partition().log.next_offset == more[-1] + 1,
                     what="b holding the new chunk")
    assert part.committed_offset == last  # c (in the ISR) lacks it
    stats = a.replication.stats("s", 0)
    assert stats["role"] == "leader" and stats["high_watermark"] == last
    assert stats["followers"]["c"]["log_end"] == last + 1
    assert stats["followers"]["c"]["lag_messages"] == 10
    assert stats["followers"]["c"]["lag_bytes"] == part.log.bytes_from(last + 1) > 0
    assert b.partition().committed_offset <= last  # never beyond the leader's


async def test_a_stopped_follower_leaves_the_isr_and_rejoins_after_catching_up(cluster):
    cluster.create_stream()
    a, c = cluster.nodes["a"], cluster.nodes["c"]
    await publish(a, 100)
    await c.stop()
    part = a.partition()
    offsets = part.write_records([b"z" * 10] * 20)
    await eventually(lambda: "c" not in cluster.placement().isr, what="c leaving the ISR")
    assert ("shrink_isr", "s", 0, "c", 1) in cluster.events
    await asyncio.wait_for(part.wait_committed(offsets[-1]), 10)  # the ISR without c commits
    await c.start()
    await eventually(lambda: "c" in cluster.placement().isr, what="c rejoining the ISR")
    assert ("expand_isr", "s", 0, "c", 1) in cluster.events
    await eventually(lambda: c.partition().committed_offset == offsets[-1],
                     what="c committing")
    assert chunk_bytes(c.partition()) == chunk_bytes(part)
    stats = a.replication.stats("s", 0)
    assert stats["followers"]["c"]["in_sync"] and stats["followers"]["c"]["in_sync_since"]


async def test_an_idle_follower_wakes_on_a_notification(nats_url, tmp_path):
    """With an idle wait far longer than the test, the follower can only learn of the new
    chunk through the leader's PartitionNotification."""
    cluster = Cluster(nats_url, tmp_path, ids=("a", "b"), settings=SLOW)
    await cluster.start()
    try:
        cluster.create_stream(replication_factor=2)
        a, b = cluster.nodes["a"], cluster.nodes["b"]
        await publish(a, 10)
        await asyncio.sleep(0.2)  # b is idle, waiting
        notes = []

        async def seen(msg):
            notes.append(msg.data)

        sub = await a.nc.subscribe(f"{NS}.notify.b", cb=seen)
        last = await publish(a, 10)
        await eventually(lambda: b.partition().committed_offset == last, what="b committing")
        assert notes
        await sub.unsubscribe()
    finally:
        await cluster.close()




def _entry(record: bytes) -> bytes:
    from riverlog.log.chunk import encode_entries
    return encode_entries([record])


async def test_a_returning_old_leader_truncates_its_divergent_tail(cluster):
    cluster.create_stream()
    a, b, c = (cluster.nodes[i] for i in "abc")
    last = await publish(a, 100)
    await eventually(lambda: c.partition().committed_offset == last, what="c committing")
    a.partition().write_entries([_entry(b"deduplicated")], writers={"p": 3})
    await eventually(lambda: b.partition().publishers.get("p") == 3,
                     what="b noting the publisher's sequence")  # dedup holds if b leads
    await a.stop()  # cut off: what it writes now reaches nobody
    a.partition().write_records([b"divergent"] * 7)
    a.partition().write_entries([_entry(b"divergent")] * 5, writers={"p": 8, "q": 1})
    cluster.change(meta.change_leader, "s", 0, leader_epoch=1)
    assert cluster.placement().leader == "b" and cluster.placement().leader_epoch == 2
    new_last = await publish(b, 30, batch=3)
    await a.start()  # back as b's follower: asks where epoch 1 ends on b, truncates there
    await eventually(lambda: a.partition().committed_offset == new_last, what="a catching up")
    assert chunk_bytes(a.partition(), committed_only=False) == chunk_bytes(b.partition())
    assert a.partition().log.epochs.entries == b.partition().log.epochs.entries
    # the truncated chunk's publishing ids are forgotten: a retry of them is not a duplicate
    assert (a.partition().publishers.get("p"), a.partition().publishers.get("q")) == (3, None)
    await eventually(lambda: "a" in cluster.placement().isr, what="a rejoining the ISR")


async def test_truncation_finds_the_epoch_both_logs_share(cluster):
    """c led epoch 2 alone (nobody got its chunks); b, which never saw epoch 2 but holds
    more of epoch 1 than c, leads epoch 3. c must cut at the end of *its* epoch 1 (100),
    not where b's epoch 1 ends (110): the leader's answer names epoch 1 (KIP-279). Cutting
    at 110 would keep c's epoch-2 records 100..109 beside b's different ones."""
    cluster.create_stream()
    a, b, c = (cluster.nodes[i] for i in "abc")
    last = await publish(a, 100)
    await eventually(lambda: c.partition().committed_offset == last, what="c committing")
    await c.stop()
    a.partition().write_records([b"epoch 1, not on c"] * 10)
    await eventually(lambda: b.partition().log.next_offset == 110, what="b holding 110")
    await a.stop()
    await b.stop()
    cluster.set_placement("c", ("c", "b"), 2)
    await c.start()
    c.partition().write_records([b"epoch 2, only on c"] * 20)
    await c.stop()
    cluster.set_placement("b", ("b", "a"), 3)
    await a.start()
    await b.start()
    new_last = await publish(b, 30)
    await c.start()
    await eventually(lambda: c.partition().log.next_offset == new_last + 1
                     and c.partition().committed_offset == new_last, what="c catching up")
    assert chunk_bytes(c.partition(), committed_only=False) == chunk_bytes(b.partition())


async def test_a_silent_leader_is_reported_and_replaced_and_rejoins_as_a_follower(cluster):
    cluster.create_stream()
    a, b, c = (cluster.nodes[i] for i in "abc")
    last = await publish(a, 100)
    await eventually(lambda: c.partition().committed_offset == last, what="c committing")
    await a.stop()
    await eventually(lambda: cluster.placement().leader_epoch == 2, what="a new leader")
    assert cluster.placement().leader == "b" and cluster.placement().isr == ("b", "c")
    assert {e[3:] for e in cluster.events if e[0] == "report_leader"} == {("a", 1)}
    new_last = await publish(b, 50)
    await a.start()
    await eventually(lambda: a.partition().committed_offset == new_last, what="a catching up")
    await eventually(lambda: "a" in cluster.placement().isr, what="a rejoining the ISR")
    assert chunk_bytes(a.partition()) == chunk_bytes(b.partition()) == chunk_bytes(c.partition())


async def test_a_leader_that_answers_late_is_not_reported_and_its_follower_keeps_up(
        nats_url, tmp_path):
    """A busy leader answers, though after the fetch timeout: here a relay holds every byte
    nats-server sends b for 1.3 s (fetch timeout 1 s, leader timeout 2 s). b takes the late
    answers (an answer to an earlier ask of the same request), keeps fetching, and never
    reports a (issue 29 item 5: a live leader is not deposed). Before, nats-py dropped each
    late answer, b heard nothing for 2 s and a was replaced."""
    relay = Relay(int(nats_url.rpartition(":")[2]))
    settings = dataclasses.replace(FAST, replica_max_lag_time_ms=60_000)  # b stays in the ISR
    cluster = Cluster(nats_url, tmp_path, ids=("a", "b"), settings=settings)
    cluster.nodes["b"].url = f"nats://127.0.0.1:{await relay.start()}"
    await cluster.start()
    try:
        cluster.create_stream(replication_factor=2)
        a, b = cluster.nodes["a"], cluster.nodes["b"]
        last = await publish(a, 10)
        await eventually(lambda: b.partition().committed_offset == last, what="b committing")
        relay.delay_s = 1.3
        for round_ in range(4):
            offsets = a.partition().write_records([b"late %d" % round_] * 10)
            await eventually(lambda: b.partition().log.next_offset == offsets[-1] + 1,
                             what=f"b holding round {round_}")
        assert [e for e in cluster.events if e[0] == "report_leader"] == []
        assert (cluster.placement().leader, cluster.placement().leader_epoch) == ("a", 1)
        assert chunk_bytes(b.partition(), committed_only=False) == chunk_bytes(
            a.partition(), committed_only=False)
    finally:
        relay.close()
        await cluster.close()


async def test_bad_replication_requests_get_an_error_and_change_nothing(nats_url, tmp_path):
    """The error answer: an empty payload with the header
    ``Riverlog-Replication-Error: <code>: <reason>``."""
    cluster = Cluster(nats_url, tmp_path, settings=SLOW)
    await cluster.start()
    try:
        await _bad_requests(cluster)
    finally:
        await cluster.close()


async def _bad_requests(cluster):
    import nats
    from riverlog.cluster.replication_leader import EPOCH_HEADER, ERROR_HEADER
    from riverlog.protocol.liftbridge import api_pb2
    from riverlog.protocol.liftbridge.envelope import encode_message

    cluster.create_stream()
    a = cluster.nodes["a"]
    last = await publish(a, 50)
    await eventually(lambda: all(cluster.nodes[i].partition().committed_offset == last
                                 for i in "bc"), what="b and c committing")
    before = a.replication.stats("s", 0)
    before.pop("followers")
    followers = {r: dict(f, last_seen_ms=0)
                 for r, f in a.replication.stats("s", 0)["followers"].items()}
    subject = f"{NS}.s.0.replicate"

    def request(replica, offset, epoch):
        return encode_message(api_pb2.ReplicationRequest(replicaID=replica, offset=offset,
                                                         leaderEpoch=epoch))

    client = await nats.connect(cluster.url)
    try:
        for payload, code in [
                (request("zzz", 0, 1), "unknown-replica"),
                (request("a", 0, 1), "unknown-replica"),  # the leader itself
                (request("b", 0, 0), "stale-epoch"),
                (request("b", last + 2, 1), "offset-out-of-range"),
                (request("b", -1, 1), "offset-out-of-range"),
                (b"not an envelope", "bad-request"),
                (encode_message(api_pb2.LeaderEpochOffsetRequest(leaderEpoch=1)), "bad-request")]:
            reply = await client.request(subject, payload, timeout=5)
            assert reply.data == b""
            assert reply.headers[ERROR_HEADER].startswith(code + ": "), (code, reply.headers)
        reply = await client.request(f"{NS}.s.0.offset", b"\x00" * 9, timeout=5)
        assert reply.headers[ERROR_HEADER].startswith("bad-request: ")
        offset_request = encode_message(api_pb2.LeaderEpochOffsetRequest(leaderEpoch=1))
        # "²" is a digit to str.isdigit, not to int(); int() refuses 4,301 digits or more
        for followed in ("0", "²", "x", "1" * 5000):
            reply = await client.request(f"{NS}.s.0.offset", offset_request, timeout=5,
                                         headers={EPOCH_HEADER: followed})
            assert reply.headers[ERROR_HEADER].startswith("stale-epoch: "), followed
        # a request for a newer epoch is left to that epoch's leader: no answer from a
        for subject, payload, headers in [
                (subject, request("b", 0, 2), None),
                (f"{NS}.s.0.offset", offset_request, {EPOCH_HEADER: "2"})]:
            with pytest.raises(nats.errors.TimeoutError):
                await client.request(subject, payload, timeout=0.5, headers=headers)
    finally:
        await client.close()
    after = a.replication.stats("s", 0)
    assert {r: dict(f, last_seen_ms=0) for r, f in after.pop("followers").items()} == followers
    assert after == before
    assert a.partition().committed_offset == last


async def test_requests_for_a_newer_epoch_are_logged_once_per_epoch(nats_url, tmp_path,
                                                                     caplog):
    """A deposed leader hears its followers ask the new epoch's leader, several times a
    second: "this leader's epoch is over" is told at INFO once per newer epoch, at DEBUG
    after that."""
    import logging

    import nats
    from riverlog.cluster.replication_leader import EPOCH_HEADER
    from riverlog.protocol.liftbridge import api_pb2
    from riverlog.protocol.liftbridge.envelope import encode_message
    caplog.set_level(logging.DEBUG, logger="riverlog.replication")
    cluster = Cluster(nats_url, tmp_path, settings=SLOW)
    await cluster.start()
    client = await nats.connect(cluster.url)
    try:
        cluster.create_stream()
        await publish(cluster.nodes["a"], 10)  # committed: the leader takes requests

        def over() -> list[logging.LogRecord]:
            return [r for r in caplog.records if "is over" in r.getMessage()]
        sent = 0
        for epoch in (2, 2, 2, 3, 3, 2):
            await client.publish(f"{NS}.s.0.replicate", encode_message(
                api_pb2.ReplicationRequest(replicaID="b", offset=0, leaderEpoch=epoch)))
            await client.publish(f"{NS}.s.0.offset", encode_message(
                api_pb2.LeaderEpochOffsetRequest(leaderEpoch=1)),
                headers={EPOCH_HEADER: str(epoch)})
            sent += 2
        await eventually(lambda: len(over()) == sent, what="every request handled")
        assert [r.getMessage().split(": ", 1)[1] for r in over()
                if r.levelno == logging.INFO] == [
            "a request for leader epoch 2: this leader's 1 is over",
            "a request for leader epoch 3: this leader's 1 is over"]
    finally:
        await client.close()
        await cluster.close()


async def play_leader(nats_url: str, source, answer):
    """Lead partition s/0 from the test, from ``source`` (a partition whose engine never
    runs): a nats-py connection answering each ReplicationRequest with leader epoch 1, the
    source's high watermark and its chunks from the offset asked, after
    ``answer(offset, chunk bytes)`` may change those bytes in place and returns the NATS
    headers of the answer (or None); LeaderEpochOffsetRequests get end offset 0. Returns
    the connection: close it."""
    import nats
    from riverlog.protocol.liftbridge import api_pb2
    from riverlog.protocol.liftbridge.envelope import (MsgType, decode_internal, encode_message,
                                                       encode_replication_response)
    leader = await nats.connect(nats_url)

    async def replicate(msg):
        req = decode_internal(msg.data, MsgType.ReplicationRequest)
        data = bytearray(b"".join(bytes(c.raw) for c in source.read_chunks(req.offset, 1 << 20)))
        headers = answer(req.offset, data)
        await leader.publish(msg.reply, encode_replication_response(
            1, source.committed_offset, bytes(data)), headers=headers)

    async def offset(msg):
        await msg.respond(encode_message(api_pb2.LeaderEpochOffsetResponse(endOffset=0)))

    await leader.subscribe(f"{NS}.s.0.replicate", cb=replicate)
    await leader.subscribe(f"{NS}.s.0.offset", cb=offset)
    return leader


async def test_a_chunk_with_a_bad_crc_is_refused_and_fetched_again(nats_url, tmp_path):
    """b follows a "leader" played by the test, which corrupts one byte of its first
    answer: b appends nothing of it, fetches again and gets the same bytes as the real log."""
    cluster = Cluster(nats_url, tmp_path, ids=("a", "b"))
    try:
        cluster.create_stream(replication_factor=2)
        source = cluster.nodes["a"].partition()  # a's engine never runs: the test leads
        for i in range(5):
            source.write_records([b"record %d" % i] * 4)
        source.log.commit(source.log.last_offset)
        answers = []

        def corrupt_first(offset: int, data: bytearray) -> None:
            if data and not answers:
                data[-5] ^= 0xFF  # in the last chunk's data: its CRC no longer matches
            answers.append((offset, len(data)))

        leader = await play_leader(nats_url, source, corrupt_first)
        b = cluster.nodes["b"]
        await b.start()
        await eventually(lambda: b.partition().committed_offset == source.committed_offset,
                         what="b committing")
        assert answers[0][0] == 0 and answers[1][0] == 0  # the same fetch again
        assert b.replication.stats("s", 0)["refused_chunks"] == 1
        assert chunk_bytes(b.partition()) == chunk_bytes(source)
        await leader.close()
    finally:
        await cluster.close()


async def test_a_follower_refuses_a_compaction_point_no_compaction_makes(nats_url, tmp_path,
                                                                       caplog):
    """b follows a "leader" played by the test whose answers carry Riverlog-Compaction-Point
    values no compaction makes: not two decimal offsets, negative, past 2**64, or an end past
    upto + 1 ("50 4": applied, the records 5..49 whose keys also come at 0..4, the newest of
    each key, would go and 0..4 stay). b keeps following and applies none of them: it holds
    every record of the leader's log, byte for byte, and no compaction point."""
    from riverlog.cluster.replication_leader import COMPACTION_HEADER
    from riverlog.config import LogConfig
    from riverlog.record import Record, encode_record

    cluster = Cluster(nats_url, tmp_path, ids=("a", "b"),
                      log_config=LogConfig(segment_max_bytes=4096, compact=True))
    try:
        cluster.create_stream(replication_factor=2)
        source = cluster.nodes["a"].partition()  # a's engine never runs: the test leads
        for i in range(0, 50, 5):
            source.write_records([encode_record(Record(value=b"v%d" % j + b"x" * 300,
                                                        key=b"k%d" % (j % 5)))
                                  for j in range(i, i + 5)])
        source.log.commit(source.log.last_offset)
        values = iter(["50 4", "x", "1", "1 2 3", "-1 -1", "%d %d" % (2**64, 2**64), "4 ²",
                       "1 " + "9" * 5000])
        sent = []

        def bad_point(offset: int, data: bytearray) -> dict[str, str]:
            sent.append(next(values, "50 4"))
            return {COMPACTION_HEADER: sent[-1]}

        leader = await play_leader(nats_url, source, bad_point)
        b = cluster.nodes["b"]
        await b.start()
        await eventually(lambda: len(sent) > 10 and b.partition().committed_offset == 49,
                         what="b committing and getting every value")
        await b.stop()  # no compaction of b's runs after this
        await b.partition().log.compaction_finished()
        assert len(b.partition().log._segments) > 2  # closed segments a point would compact
        assert b.partition().log.compaction_point is None
        assert chunk_bytes(b.partition()) == chunk_bytes(source)
        # each value logged once in a row (every answer carries it): the 8 values, then "50 4"
        assert len([r for r in caplog.records if COMPACTION_HEADER in r.getMessage()]) == 9
        await leader.close()
    finally:
        await cluster.close()


async def test_the_high_watermark_survives_a_restart(cluster, tmp_path):
    """Saved off the hot path: after a restart a follower's log exposes what was committed
    (all of it here, once the checkpoint caught up) and none of the records it held beyond
    the high watermark, before any replication traffic."""
    from riverlog.broker.placement import PartitionPlacement
    from riverlog.cluster.replication import Replication
    from riverlog.log.high_watermark import HighWatermarkCheckpoint

    cluster.create_stream()
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    last = await publish(a, 40)
    await cluster.nodes["c"].stop()  # the high watermark stays at ``last`` from now on
    a.partition().write_records([b"uncommitted"] * 10)
    await eventually(lambda: b.partition().log.next_offset == last + 11, what="b fetching")
    await eventually(lambda: HighWatermarkCheckpoint(b.partition().log.directory).offset == last,
                     what="b's checkpoint")
    await b.stop()
    await b.reopen()
    part = b.partition()
    assert part.committed_offset == -1 and part.log.next_offset == last + 11
    engine = Replication("b", NS, a.nc, cluster.settings, cluster)
    engine.assign(part, PartitionPlacement(None, ("a", "b", "c"), ("a", "b"), 2))
    assert part.committed_offset == last
    assert engine.stats("s", 0)["role"] == "none"
    await engine.stop()


@pytest.mark.parametrize("replicas", [1, 3])
async def test_under_durability_always_commits_wait_for_fsync(nats_url, tmp_path, replicas):
    """An ISR of one commits as a single server would (after the fsync); with three, the
    leader counts only what it fsynced and followers report only fsynced data."""
    from riverlog.config import Durability, LogConfig
    cluster = Cluster(nats_url, tmp_path, log_config=LogConfig(durability=Durability.ALWAYS))
    await cluster.start()
    try:
        cluster.create_stream(replication_factor=replicas)
        a = cluster.nodes["a"]
        part = a.partition()
        offsets = part.write_records([b"r"] * 5)
        assert part.committed_offset == -1  # written, not yet fsynced
        await asyncio.wait_for(part.wait_committed(offsets[-1]), 10)
        assert part.log.durable_next_offset == offsets[-1] + 1
        if replicas == 3:
            await eventually(lambda: cluster.nodes["c"].partition().committed_offset
                             == offsets[-1], what="c committing")
            # writes nobody waits on with wait_committed (LEADER acks) are fsynced and
            # committed too: the leader flushes its own writes
            more = part.write_records([b"s"] * 5)
            await asyncio.wait_for(part.wait_for(more[-1]), 10)
    finally:
        await cluster.close()


async def test_without_a_leader_nothing_is_fetched_and_unassign_forgets(cluster):
    cluster.create_stream()
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    last = await publish(a, 20)
    await eventually(lambda: b.partition().committed_offset == last, what="b committing")
    cluster.set_placement(None, ("a", "b", "c"), 2)
    assert {n.replication.stats("s", 0)["role"] for n in cluster.nodes.values()} == {"none"}
    assert a.partition().log.on_written is None  # the old leader's side is off
    b.replication.unassign("s", 0)
    with pytest.raises(KeyError):
        b.replication.stats("s", 0)


async def test_a_follower_behind_the_leaders_log_start_starts_again_there(nats_url, tmp_path):
    """c stops; retention on the leader removes the offsets c would fetch next; back, c is
    refused (offset-out-of-range), learns where the leader's log starts and continues from
    there with the same chunks."""
    from riverlog.config import LogConfig
    cluster = Cluster(nats_url, tmp_path, log_config=LogConfig(segment_max_bytes=4096,
                                                               retention_max_bytes=8192))
    await cluster.start()
    try:
        cluster.create_stream()
        a, c = cluster.nodes["a"], cluster.nodes["c"]
        await publish(a, 20)
        await eventually(lambda: c.partition().log.next_offset == 20, what="c fetching")
        await c.stop()
        cluster.change(meta.shrink_isr, "s", 0, "c")
        last = await publish(a, 400, batch=20)
        part = a.partition()
        assert part.log.first_offset > 20  # retention removed what c needs next
        await c.start()
        await eventually(lambda: c.partition().committed_offset == last, what="c catching up")
        assert c.partition().log.first_offset == part.log.first_offset
        assert chunk_bytes(c.partition()) == chunk_bytes(part)
        await eventually(lambda: "c" in cluster.placement().isr, what="c rejoining the ISR")
    finally:
        await cluster.close()


async def test_partitions_of_one_stream_replicate_apart_under_a_name_of_any_characters(cluster):
    """Two partitions led by different servers, the stream named with NATS subject
    characters: each partition's traffic stays on its own subjects."""
    name = "odd.name *> %2E"
    stream = cluster.create_stream(name, partitions=2)
    leaders = [cluster.nodes[p.leader] for p in stream.partitions]
    assert leaders[0] is not leaders[1]
    lasts = []
    for index, leader in enumerate(leaders):
        part = leader.partition(name, index)
        offsets = part.write_records([b"partition %d" % index] * (5 + index))
        await asyncio.wait_for(part.wait_committed(offsets[-1]), 10)
        lasts.append(offsets[-1])
    for index, leader in enumerate(leaders):
        want = chunk_bytes(leader.partition(name, index))
        for node in cluster.nodes.values():
            await eventually(lambda: node.partition(name, index).committed_offset == lasts[index],
                             what=f"{node.id} committing partition {index}")
            assert chunk_bytes(node.partition(name, index)) == want


def _records(partition) -> list[tuple[int, bytes | None, bytes]]:
    """Every committed record of ``partition`` as (offset, key, value)."""
    from riverlog.record import decode_record
    out, offset = [], partition.log.first_offset
    while chunks := partition.log.read_chunks(offset, 1 << 24):
        for chunk in chunks:
            for at, raw in chunk.records():
                record = decode_record(bytes(raw))
                out.append((at, record.key, record.value))
        offset = chunks[-1].header.next_offset
    return out


def _key(i: int) -> bytes:
    """Record i's key: one of 5 shared keys, or its own for every 7th (kept by compaction)."""
    return b"k%d" % (i % 5) if i % 7 else b"u%d" % i


async def publish_keyed(node, start: int, n: int) -> int:
    """Write records ``start`` .. ``start + n - 1`` (value ``v<i>``, key ``_key(i)``), 5 a
    chunk, on ``node``; wait until the last is committed; returns its offset."""
    from riverlog.record import Record, encode_record
    part = node.partition()
    last = -1
    for i in range(start, start + n, 5):
        last = part.write_records([encode_record(Record(value=b"v%d" % j, key=_key(j)))
                                   for j in range(i, i + 5)])[-1]
    await asyncio.wait_for(part.wait_committed(last), 30)
    return last


@pytest.fixture
async def compacting(nats_url, tmp_path):
    """The three servers of ``cluster``, their streams compacted, with 4 KiB segments; the
    stream created, the first 50 records (0..49) on every replica."""
    from riverlog.config import LogConfig
    c = Cluster(nats_url, tmp_path, log_config=LogConfig(segment_max_bytes=4096, compact=True))
    await c.start()
    try:
        c.create_stream()
        await publish_keyed(c.nodes["a"], 0, 50)
        await eventually(lambda: all(n.partition().committed_offset == 49
                                     for n in c.nodes.values()), what="every replica at 49")
        yield c
    finally:
        await c.close()


async def test_a_compacted_stream_replicates_the_leaders_compaction(compacting):
    """c stops; the leader writes and compacts (offsets with gaps); c comes back and fetches
    across the gaps (the leader answers the next chunk that exists), b applies the leader's
    compaction point: every replica then holds the same (offset, key, value) records as the
    leader, the newest of each key among them."""
    from riverlog.broker.broker import record_key
    cluster = compacting
    a, b, c = (cluster.nodes[i] for i in "abc")
    await c.stop()
    cluster.change(meta.shrink_isr, "s", 0, "c")
    last = await publish_keyed(a, 50, 300)
    result = await a.partition().log.compact(record_key)
    assert result.records_after < result.records_before  # gaps below c's next offset
    last = await publish_keyed(a, 350, 20)  # after the compaction point
    await c.start()
    want = _records(a.partition())
    assert len(want) < last + 1
    await eventually(lambda: all(_records(n.partition()) == want for n in (b, c)),
                     what="b and c holding the leader's records")
    newest = {_key(i): b"v%d" % i for i in range(last + 1)}
    assert {key: value for _, key, value in want} == newest  # the newest of each key kept
    await eventually(lambda: "c" in cluster.placement().isr, what="c rejoining the ISR")
    assert c.replication.stats("s", 0)["refused_chunks"] == 0


async def test_a_restarted_leader_sends_its_compaction_point_at_once(compacting):
    """The leader compacts while b is away, then restarts (its log closed and opened
    again); b, back, gets the leader's compaction point with the first answers and applies
    it, without waiting for the leader's next compaction (streams.cleaner.interval)."""
    from riverlog.broker.broker import record_key
    cluster = compacting
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    await b.stop()
    cluster.change(meta.shrink_isr, "s", 0, "b")
    await publish_keyed(a, 50, 300)
    point = (await a.partition().log.compact(record_key)).point
    assert point is not None
    await a.stop()
    await a.reopen()
    await a.start()
    assert a.partition().log.compaction_point == point
    await b.start()
    await eventually(lambda: b.partition().log.compaction_point == point
                     and _records(b.partition()) == _records(a.partition()),
                     what="b applying the restarted leader's compaction point")


async def test_truncation_across_a_gap_the_leaders_compaction_left(compacting):
    """c fetches epoch 2 only after b compacted its start away (a gap from 50); c then leads
    epoch 3, and a, whose uncommitted epoch-1 tail 50..69 nobody has, truncates by c's
    answer. c's epoch 2 must start where its gap starts (50), not at its first chunk after
    it: a would keep its stale records below that chunk."""
    from riverlog.broker.broker import record_key
    from riverlog.record import Record, encode_record
    cluster = compacting
    a, b, c = (cluster.nodes[i] for i in "abc")
    await c.stop()
    await b.stop()
    await a.stop()  # cut off: its tail reaches nobody
    a.partition().write_records([encode_record(Record(value=b"stale%d" % i, key=b"s%d" % i))
                                 for i in range(50, 70)])  # keys no compaction removes
    cluster.set_placement("b", ("b",), 2)
    await b.start()
    await publish_keyed(b, 50, 300)
    result = await b.partition().log.compact(record_key)
    assert result.point is not None and result.point.end > 50
    await c.start()
    cluster.change(meta.expand_isr, "s", 0, "c")
    last = await publish_keyed(b, 350, 20)
    await eventually(lambda: c.partition().committed_offset == last, what="c catching up")
    assert c.partition().log.read_chunks(50, 1)[0].header.first_offset > 50  # the gap
    cluster.change(meta.change_leader, "s", 0, leader="c")
    assert cluster.placement().leader_epoch == 3
    await a.start()  # c's follower: asks where epoch 1 ends on c, truncates there
    await eventually(lambda: a.partition().committed_offset == last, what="a catching up")
    await eventually(lambda: _records(a.partition()) == _records(c.partition()),
                     what="a holding c's records")
    assert not [v for _, _, v in _records(a.partition()) if v.startswith(b"stale")]


async def test_an_answer_leaves_room_in_the_nats_max_payload_for_the_compaction_point(
        nats_url, tmp_path):
    """Two chunks that fill an answer to 64 bytes short of the NATS max payload are sent in
    two answers once the leader has a compaction point: nats-server counts the
    Riverlog-Compaction-Point header in the max payload and closes a connection that goes
    over it (the leader's, with every partition it leads)."""
    from riverlog.broker.broker import record_key
    from riverlog.config import LogConfig
    from riverlog.record import Record, encode_record
    cluster = Cluster(nats_url, tmp_path, log_config=LogConfig(segment_max_bytes=2 << 20,
                                                               compact=True))
    await cluster.start()
    try:
        cluster.create_stream()
        a, b, c = (cluster.nodes[i] for i in "abc")
        part = a.partition()

        def big(size: int) -> int:
            (offset,) = part.write_records([encode_record(Record(value=b"x" * size, key=b"k"))])
            return offset
        for _ in range(4):  # three fill the first segment, the fourth starts the next
            last = big(600_000)
        await asyncio.wait_for(part.wait_committed(last), 30)
        assert (await part.log.compact(record_key)).point is not None
        await b.stop()
        await c.stop()
        first = big(400_000)
        size = len(part.log.read_chunks(first, 1, committed_only=False)[0].raw)
        wanted = a.nc.max_payload - 64 - size  # the second chunk's size
        last = big(400_000 + wanted - size)
        assert len(part.log.read_chunks(last, 1, committed_only=False)[0].raw) == wanted
        await b.start()
        await c.start()
        await eventually(lambda: all(n.partition().log.next_offset == last + 1 for n in (b, c)),
                         what="b and c holding both chunks")
        assert not a.nc.is_closed
    finally:
        await cluster.close()


async def test_the_brokers_compaction_pass_compacts_only_the_leaders_log(compacting):
    """The periodic compaction (Broker._compact, every streams.cleaner.interval) compacts the
    leader's log and leaves the followers' to the leader's compaction point, which they
    apply: compacting on their own, their closed segments (other boundaries, another
    committed offset) would lose other records than the leader's."""
    cluster = compacting
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    last = await publish_keyed(a, 50, 200)
    await eventually(lambda: b.partition().committed_offset == last, what="b following")
    before = _records(b.partition())
    await b.broker._compact(b.broker.get("s"))
    assert b.partition().log.compaction_point is None and _records(b.partition()) == before
    await a.broker._compact(a.broker.get("s"))
    point = a.partition().log.compaction_point
    assert point is not None and len(_records(a.partition())) < len(before)
    await publish_keyed(a, 250, 5)  # the answers carry the point to b
    await eventually(lambda: b.partition().log.compaction_point == point
                     and _records(b.partition()) == _records(a.partition()),
                     what="b applying the leader's compaction point")


async def test_a_replica_without_a_leader_does_not_compact_on_its_own(compacting):
    """b, restarted (its log opened again) while its partition has no leader (a server
    replaying Raft, or every ISR member down), is assigned without a role: the broker's
    compaction pass leaves its log alone, as a follower's (compacting by its own segments
    and committed offset, it would hold other records than the leader's)."""
    cluster = compacting
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    last = await publish_keyed(a, 50, 200)
    await eventually(lambda: b.partition().committed_offset == last, what="b following")
    await b.stop()
    await b.reopen()
    cluster.set_placement(None, ("a", "b", "c"), 1)
    await b.start()
    assert b.partition().committed_offset == last  # the high watermark restored
    before = _records(b.partition())
    await b.broker._compact(b.broker.get("s"))
    assert b.partition().log.compaction_point is None and _records(b.partition()) == before


async def test_the_brokers_compaction_pass_skips_a_log_already_compacting(compacting, caplog):
    """A new leader whose log still applies its former leader's compaction point (a
    follower's, in the background) is skipped by the broker's compaction pass, which goes
    on with the stream's other partitions; before, compact raised "a compaction is already
    running", logged as the stream's compaction failing, and the pass ended there."""
    import logging

    from riverlog.broker.broker import record_key
    a = compacting.nodes["a"]
    await publish_keyed(a, 50, 200)
    running = asyncio.create_task(a.partition().log.compact(record_key))
    await asyncio.sleep(0)  # the task is in its rewrite, in a worker thread
    assert a.partition().log.compacting
    with caplog.at_level(logging.WARNING, logger="riverlog"):
        await a.broker._compact(a.broker.get("s"))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert (await running).point is not None
