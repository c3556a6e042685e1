"""The broker core on tmp_path: streams on disk, publisher deduplication that survives
restarts and segment rolls, stored consumer offsets, deletion, and Create arguments."""
import asyncio
import dataclasses
import json
import os

import pytest

from riverlog.broker import Broker, Partition, StreamConfig
from riverlog.broker.tracking import (OFFSETS_FILE, decode_offset_tracking,
                                      decode_writer_trailer, encode_writer_trailer)
from riverlog.config import MIN_SEGMENT_MAX_BYTES, LogConfig
from riverlog.errors import (InvalidArgumentError, LogClosedError, StreamExistsError,
                             StreamNotFoundError)
from riverlog.log.chunk import CHUNK_TRACKING_DELTA, encode_entries, iter_entries, parse_header
from riverlog.server.rabbitmq_stream import stream_config_from_arguments


def entries(*payloads):
    return [encode_entries([p]) for p in payloads]


def open_broker(path, **log):
    broker = Broker(str(path), LogConfig(**log))
    broker.open()
    return broker


def close(broker):
    asyncio.run(broker.close())


def test_streams_persist_with_their_settings(tmp_path):
    broker = open_broker(tmp_path)
    broker.create("orders", StreamConfig(retention_max_bytes=10_000_000, partitions=2))
    broker.create("weird/../name.", StreamConfig())
    with pytest.raises(StreamExistsError):
        broker.create("orders")
    with pytest.raises(InvalidArgumentError):
        broker.create("")
    with pytest.raises(InvalidArgumentError):
        broker.create("x" * 256)
    close(broker)
    again = open_broker(tmp_path)
    assert sorted(again.streams) == ["orders", "weird/../name."]
    orders = again.get("orders")
    assert orders.config.retention_max_bytes == 10_000_000 and len(orders.partitions) == 2
    assert orders.partitions[1].log.config.retention_max_bytes == 10_000_000
    with pytest.raises(StreamNotFoundError):
        again.get("nope")
    close(again)


def test_unreadable_stream_folder_is_skipped(tmp_path):
    broker = open_broker(tmp_path)
    stream = broker.create("good")
    bad = broker.create("bad")
    close(broker)
    with open(f"{bad.directory}/stream.json", "w") as f:
        f.write("{not json")
    again = open_broker(tmp_path)
    assert list(again.streams) == ["good"] and stream.name == "good"
    close(again)


def test_deduplication_by_publisher_reference(tmp_path):
    broker = open_broker(tmp_path)
    part = broker.create("s").partitions[0]
    batch = [(1, b"a"), (2, b"b"), (3, b"c")]
    new = part.new_entries("pub", batch)
    assert new == batch
    part.write_entries([e for _, e in new], writers={"pub": 3})
    assert part.publishers.get("pub") == 3
    assert part.new_entries("pub", [(2, b"x"), (3, b"y"), (4, b"z"), (4, b"again")]) == [(4, b"z")]
    assert part.new_entries(None, batch) == batch          # unnamed: no deduplication
    assert part.publishers.get("other") is None
    held = {"pub": 4}  # a caller's entries not written yet count as seen
    assert part.new_entries("pub", [(4, b"z"), (5, b"w")], held) == [(5, b"w")]
    close(broker)


def test_deduplication_starts_from_nothing_seen(tmp_path):
    """A reference never seen takes publishing id 0 (osiris); once stored, 0 is known, also
    after a restart; one chunk records every named publisher that wrote into it."""
    broker = open_broker(tmp_path)
    part = broker.create("s").partitions[0]
    assert part.new_entries("new", [(0, b"a"), (1, b"b")]) == [(0, b"a"), (1, b"b")]
    part.write_entries(entries(b"a"), writers={"zero": 0, "other": 9})
    assert part.new_entries("zero", [(0, b"again")]) == []
    close(broker)
    again = open_broker(tmp_path)
    publishers = again.get("s").partitions[0].publishers
    assert (publishers.get("zero"), publishers.get("other"), publishers.get("new")) == (0, 9, None)
    close(again)


def test_publisher_sequences_survive_restart_and_segment_rolls(tmp_path):
    broker = open_broker(tmp_path, segment_max_bytes=4096)
    part = broker.create("s").partitions[0]
    for seq in range(1, 200):
        part.write_entries(entries(b"x" * 100), writers={"p1": seq})
        if seq % 3 == 0:
            part.write_entries(entries(b"y"), writers={"p2": seq * 10})
    part.write_entries(entries(b"anonymous"))
    assert len(part.log.segments) > 3
    close(broker)
    again = open_broker(tmp_path, segment_max_bytes=4096)
    part = again.get("s").partitions[0]
    assert part.publishers.get("p1") == 199
    assert part.publishers.get("p2") == 1980
    close(again)


def test_sequences_come_from_the_newest_snapshot_and_trailers(tmp_path):
    broker = open_broker(tmp_path, segment_max_bytes=4096)
    part = broker.create("s").partitions[0]
    part.write_entries(entries(b"early"), writers={"early": 7})
    for seq in range(1, 100):
        part.write_entries(entries(b"x" * 200), writers={"p": seq})
    segments = part.log.segments
    assert len(segments) > 3
    close(broker)
    # without the old segments, "early" is known only from the newest segment's snapshot
    for seg in segments[:-1]:
        seg.delete()
    again = open_broker(tmp_path, segment_max_bytes=4096)
    publishers = again.get("s").partitions[0].publishers
    assert publishers.get("early") == 7
    assert publishers.get("p") == 99
    close(again)


def test_writer_trailer_is_osiris_sequence_records():
    """osiris_tracking:flush writes <<0:8, IdSize:8, Id/binary, Seq:64>> per publisher;
    parse_trailer reads the same (rabbitmq/osiris 1.10.3). Damage inside a record is the
    chunk's trailer check's to find (tests/log/test_old_trailer.py); a run that does not
    add up is refused here."""
    trailer = encode_writer_trailer([("ref", 42), ("ref-2", 0)])
    assert trailer == (b"\x00\x03ref" + (42).to_bytes(8, "big")
                       + b"\x00\x05ref-2" + bytes(8))
    assert decode_writer_trailer(trailer) == [("ref", 42), ("ref-2", 0)]
    # offset (1) and timestamp (2) records, which osiris may put there too, are skipped
    other = b"\x01\x01c" + bytes(8) + b"\x02\x01t" + bytes(8)
    assert decode_writer_trailer(other + trailer) == [("ref", 42), ("ref-2", 0)]
    assert decode_writer_trailer(trailer[:-1]) is None
    assert decode_writer_trailer(b"\x03" + trailer[1:]) is None  # no such record type
    assert decode_writer_trailer(b"") is None
    with pytest.raises(ValueError):
        encode_writer_trailer([("r" * 256, 1)])


def test_consumer_offsets_persist(tmp_path):
    broker = open_broker(tmp_path)
    part = broker.create("s").partitions[0]
    assert part.offsets.query("app") is None
    part.store_offset("app", 41)
    part.store_offset("app", 42)
    close(broker)
    again = open_broker(tmp_path)
    assert again.get("s").partitions[0].offsets.query("app") == 42
    close(again)


def test_stored_offsets_are_tracking_chunks_of_the_log(tmp_path):
    """As osiris: a StoreOffset is a tracking delta chunk (type 1, one offset of the log),
    read back at open, also past a segment roll (the roll's snapshot), and over the
    offsets.json an earlier version saved (upgrade)."""
    broker = open_broker(tmp_path)
    part = broker.create("s", StreamConfig(segment_max_bytes=MIN_SEGMENT_MAX_BYTES)
                         ).partitions[0]
    directory = part.log.directory
    close(broker)
    with open(os.path.join(directory, OFFSETS_FILE), "w") as f:
        json.dump({"old": 5, "app": 1}, f)
    broker = open_broker(tmp_path)
    part = broker.get("s").partitions[0]
    assert (part.offsets.query("old"), part.offsets.query("app")) == (5, 1)
    part.write_records([b"x"])
    assert part.store_offset("app", 0) == range(1, 2)
    # the newest chunk is no message: "last" and the consumer lag pass over it
    assert (part.last_chunk_offset, part.last_user_chunk_offset,
            part.last_message_offset) == (1, 0, 0)
    chunk = part.read_chunks(1)[0]
    assert (chunk.header.chunk_type, chunk.header.num_records) == (CHUNK_TRACKING_DELTA, 1)
    assert decode_offset_tracking(next(iter_entries(chunk.data)).payload) == [
        ("app", 0)]
    while len(part.log.segments) < 3:  # rolls: the offsets live on in the snapshots
        part.write_records([b"y" * 1000] * 100)
    part.store_offset("late", 9)
    close(broker)
    again = open_broker(tmp_path)
    offsets = again.get("s").partitions[0].offsets
    assert sorted(offsets.items()) == [("app", 0), ("late", 9), ("old", 5)]
    close(again)


def test_a_follower_rolling_inside_a_batch_keeps_its_tracking_across_a_restart(tmp_path):
    """A follower appends its leader's chunks in one batch that rolls a segment: the roll's
    snapshot holds what the chunks before the roll carried (publisher sequence, stored
    offset), so a restart, which reads only the newest segment, still knows them."""
    config = LogConfig(segment_max_bytes=MIN_SEGMENT_MAX_BYTES)
    leader = Partition("s", 0, str(tmp_path / "leader"), config)
    leader.write_entries([encode_entries([b"a"])], writers={"pub": 7})
    leader.store_offset("app", 0)
    for _ in range(3):  # enough for the follower to roll after the first two chunks
        leader.write_records([b"x" * 1000] * 100)
    chunks, offset = [], 0
    while offset < leader.next_offset:  # each read stops at its segment's end
        chunks += [bytes(c.raw) for c in leader.log.read_chunks(offset, 1 << 24)]
        offset = parse_header(chunks[-1]).next_offset
    batch = b"".join(chunks)

    async def follow():
        follower = Partition("s", 0, str(tmp_path / "follower"), config, auto_commit=False)
        follower.append_replicated(batch)
        assert len(follower.log.segments) > 1
        await follower.close()
        again = Partition("s", 0, str(tmp_path / "follower"), config, auto_commit=False)
        assert (again.publishers.get("pub"), again.offsets.query("app")) == (7, 0)
        await again.close()
        await leader.close()
    asyncio.run(follow())


def test_delete_wakes_readers_and_tells_listeners(tmp_path):
    async def main():
        broker = open_broker(tmp_path)
        part = broker.create("s").partitions[0]
        deleted = []
        broker.deletion_listeners.append(lambda stream: deleted.append(stream.name))
        waiter = asyncio.create_task(part.wait_for(0))
        await asyncio.sleep(0)
        broker.delete("s")
        with pytest.raises(LogClosedError):
            await asyncio.wait_for(waiter, 1)
        assert deleted == ["s"]
        assert "s" not in broker.streams
        with pytest.raises(StreamNotFoundError):
            broker.delete("s")
        broker.create("s")                  # the name can be used again, empty
        assert broker.get("s").partitions[0].next_offset == 0
        await broker.close()
    asyncio.run(main())


@pytest.mark.parametrize("durability", ["always", "interval", "never"])
def test_the_commit_pipeline_follows_the_durability_policy(tmp_path, durability):
    """One event, the high watermark passing an offset, is what every confirm waits for: under
    ``always`` a write is committed by the group fsync ``wait_committed`` joins, under the
    other policies at once; readers see only committed records."""
    async def main():
        broker = open_broker(tmp_path, durability=durability)
        part = broker.create("s").partitions[0]
        assert part.committed_offset == -1 and part.is_committed(-1)
        offsets = part.write_entries(entries(b"a", b"b"))
        assert list(offsets) == [0, 1]
        committed_now = durability != "always"
        assert part.is_committed(1) is committed_now
        assert len(part.read_chunks(0)) == int(committed_now)
        both = await asyncio.gather(part.wait_committed(1), part.wait_committed(0))
        assert both == [None, None] and part.committed_offset == 1
        assert len(part.read_chunks(0)) == 1
        await part.wait_committed(1)  # already committed: returns at once
        waiter = asyncio.create_task(part.wait_committed(2))  # not written yet
        await asyncio.sleep(0.05)
        assert not waiter.done()
        broker.delete("s")
        with pytest.raises(LogClosedError):
            await asyncio.wait_for(waiter, 1)
        await broker.close()
    asyncio.run(main())


def test_housekeeping_applies_retention_and_compaction(tmp_path):
    async def main():
        from riverlog.record import Record, encode_record
        from riverlog.broker import broker as broker_module
        broker_module.HOUSEKEEPING_INTERVAL_S = 0.05
        try:
            broker = open_broker(tmp_path, segment_max_bytes=4096)
            broker.start()
            part = broker.create("c", StreamConfig(compact=True, cleaner_interval_ms=10)).partitions[0]
            for i in range(200):
                part.write_records([encode_record(Record(value=b"v%d" % i, key=b"k%d" % (i % 3)))])
            before = part.log.segments[0].num_records
            for _ in range(100):
                await asyncio.sleep(0.05)
                if part.log.segments[0].num_records < before:
                    break
            assert part.log.segments[0].num_records < before
            await broker.close()
        finally:
            broker_module.HOUSEKEEPING_INTERVAL_S = 1.0
    asyncio.run(main())


def test_create_arguments():
    cfg = stream_config_from_arguments({"max-length-bytes": "1000000", "max-age": "7D",
                                        "stream-max-segment-size-bytes": "500000",
                                        "initial-cluster-size": "3"})
    assert cfg.retention_max_bytes == 1_000_000
    assert cfg.retention_max_age_ms == 7 * 86_400_000
    assert cfg.segment_max_bytes == 500_000
    assert stream_config_from_arguments({"max-age": "30s"}).retention_max_age_ms == 30_000
    assert stream_config_from_arguments({"max-age": "12h"}).retention_max_age_ms == 43_200_000
    with pytest.raises(InvalidArgumentError):
        stream_config_from_arguments({"max-age": "forever"})
    with pytest.raises(InvalidArgumentError):
        stream_config_from_arguments({"max-length-bytes": "lots"})
    # below the log's smallest segment: raised to it, as RabbitMQ takes any size up to 3 GB
    tiny = stream_config_from_arguments({"stream-max-segment-size-bytes": "1000"})
    assert tiny.segment_max_bytes == MIN_SEGMENT_MAX_BYTES
    # the defaults, with the (no) arguments kept for a later Create to compare with
    assert dataclasses.asdict(stream_config_from_arguments({})) == dataclasses.asdict(
        StreamConfig(rabbitmq_arguments="{}"))
    assert cfg.rabbitmq_arguments == ('{"initial-cluster-size": 3, "max-age": "7D", '
                                      '"max-length-bytes": 1000000, '
                                      '"stream-max-segment-size-bytes": 500000}')


def test_initial_cluster_size_in_a_cluster():
    """Every server when not given (RabbitMQ's), the cluster's default when it has one
    (riverlog.stream.initial.cluster.size), what Create asks for either way, each capped at
    the cluster's size."""
    assert stream_config_from_arguments({}, 3).replication_factor == -1
    assert stream_config_from_arguments({}, 3, 1).replication_factor == 1
    assert stream_config_from_arguments({}, 2, 5).replication_factor == 2
    asked = {"initial-cluster-size": "2"}
    assert stream_config_from_arguments(asked, 3, 1).replication_factor == 2
    assert stream_config_from_arguments(asked, 3).replication_factor == 2
    assert stream_config_from_arguments({"initial-cluster-size": "9"}, 3, 1) \
        .replication_factor == 3
