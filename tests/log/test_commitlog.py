"""CommitLog behaviour on tmp_path: offsets, reads, waking readers, roll, retention,
compaction, durability policies, truncation and recovery of the index and the tail."""
import asyncio
import os
import struct

import pytest

from riverlog.config import Durability, LogConfig
from riverlog.errors import LogClosedError, LogError, OffsetOutOfRangeError
from riverlog.log import CommitLog


class Clock:
    def __init__(self, now=1_700_000_000_000):
        self.now = now

    def __call__(self):
        return self.now


def records_from(log, offset=None):
    """Every committed (offset, record) from ``offset`` (default: first) to the end."""
    out = []
    offset = log.first_offset if offset is None else offset
    while True:
        chunks = log.read_chunks(offset, 4096)
        if not chunks:
            return out
        for ch in chunks:
            out.extend(ch.records())
        offset = chunks[-1].header.next_offset


def test_empty_log_offsets(tmp_path):
    log = CommitLog(tmp_path)
    assert (log.first_offset, log.next_offset, log.last_offset, log.committed_offset) == (0, 0, -1, -1)
    assert log.read_chunks(0) == []
    assert log.report.clean


def test_append_assigns_contiguous_offsets_and_reads_back(tmp_path):
    log = CommitLog(tmp_path)
    assert log.append([b"a", b"b", b"c"]) == range(0, 3)
    assert log.append([b"d"]) == range(3, 4)
    assert (log.next_offset, log.last_offset, log.committed_offset) == (4, 3, 3)
    (first, second) = log.read_chunks(0)
    assert list(first.records()) == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert list(second.records()) == [(3, b"d")]
    # an offset inside a chunk returns that whole chunk
    assert log.read_chunks(1)[0].header.first_offset == 0
    assert log.read_chunks(3)[0].header.first_offset == 3
    assert log.read_chunks(4) == []
    # header + data, without a trailer, is what a RabbitMQ Deliver carries
    assert bytes(first.header_and_data) == first.raw


def test_read_respects_max_bytes_but_returns_at_least_one_chunk(tmp_path):
    log = CommitLog(tmp_path)
    for i in range(10):
        log.append([bytes([i]) * 100])
    assert len(log.read_chunks(0, max_bytes=1)) == 1
    chunk_size = len(log.read_chunks(0)[0].raw)
    assert len(log.read_chunks(0, max_bytes=3 * chunk_size)) == 3
    assert len(log.read_chunks(0, max_chunks=2)) == 2
    assert len(log.read_chunks(0, max_chunks=0)) == 10


def test_read_into_a_caller_buffer(tmp_path):
    log = CommitLog(tmp_path)
    for i in range(5):
        log.append([bytes([i]) * 100])
    expected = [list(ch.records()) for ch in log.read_chunks(0)]
    big = bytearray(1 << 16)
    into = log.read_chunks(0, buffer=big)
    assert [list(ch.records()) for ch in into] == expected
    assert all(isinstance(ch.raw, memoryview) and ch.raw.obj is big for ch in into)
    small = bytearray(10)                  # too small: read into new bytes instead
    fallback = log.read_chunks(0, buffer=small)
    assert [list(ch.records()) for ch in fallback] == expected
    assert small == bytearray(10)


def test_offsets_survive_reopen(tmp_path):
    with CommitLog(tmp_path) as log:
        log.append([b"x"] * 5)
    log = CommitLog(tmp_path)
    assert (log.first_offset, log.next_offset, log.committed_offset) == (0, 5, 4)
    assert log.append([b"y"]) == range(5, 6)
    assert log.report.clean


def test_read_before_first_offset_is_an_error(tmp_path):
    log = CommitLog(tmp_path, LogConfig(segment_max_bytes=4096, retention_max_messages=10))
    for _ in range(40):
        log.append([b"z" * 100] * 5)
    assert log.first_offset > 0
    with pytest.raises(OffsetOutOfRangeError):
        log.read_chunks(0)


def test_timestamps_and_offset_for_timestamp(tmp_path):
    clock = Clock()
    log = CommitLog(tmp_path, clock_ms=clock)
    log.append([b"a"])            # t0
    clock.now += 1000
    log.append([b"b", b"c"])      # t0 + 1 s
    clock.now -= 5000             # the wall clock steps back: chunk timestamps do not
    log.append([b"d"])
    t0 = 1_700_000_000_000
    stamps = [ch.header.timestamp_ms for ch in log.read_chunks(0)]
    assert stamps == [t0, t0 + 1000, t0 + 1000]
    assert log.offset_for_timestamp(t0 - 1) == 0
    assert log.offset_for_timestamp(t0 + 1) == 1
    assert log.offset_for_timestamp(t0 + 2000) == log.next_offset
    assert log.last_chunk_offset == 3


def test_segment_roll_by_size(tmp_path):
    log = CommitLog(tmp_path, LogConfig(segment_max_bytes=4096))
    for i in range(50):
        log.append([b"%03d" % i * 50])
    segs = log.segments
    assert len(segs) == 3          # 50 chunks of 202 bytes in 4 KiB segments
    assert all(s.size <= 4096 for s in segs)
    # segments are named by their base offset and chain without gaps
    for prev, nxt in zip(segs, segs[1:]):
        assert nxt.base_offset == prev.next_offset
        assert os.path.basename(nxt.path) == "%020d.segment" % nxt.base_offset
    assert [r for _, r in records_from(log)] == [b"%03d" % i * 50 for i in range(50)]


def test_segment_roll_by_age(tmp_path):
    clock = Clock()
    log = CommitLog(tmp_path, LogConfig(segment_max_age_ms=60_000), clock_ms=clock)
    log.append([b"a"])
    clock.now += 30_000
    log.append([b"b"])
    assert len(log.segments) == 1
    clock.now += 30_000
    log.append([b"c"])
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_retention_by_bytes_keeps_the_active_segment(tmp_path):
    log = CommitLog(tmp_path, LogConfig(segment_max_bytes=4096, retention_max_bytes=10_000))
    for i in range(100):
        log.append([b"r" * 200])
    assert log.size_bytes <= 10_000
    assert log.first_offset > 0 and log.next_offset == 100
    assert records_from(log)[0][0] == log.first_offset
    # a single oversized active segment is never deleted
    big = CommitLog(tmp_path / "big", LogConfig(retention_max_bytes=100))
    big.append([b"x" * 1000])
    assert big.enforce_retention() == 0 and big.first_offset == 0


def test_retention_by_age(tmp_path):
    clock = Clock()
    log = CommitLog(tmp_path, LogConfig(segment_max_bytes=4096, retention_max_age_ms=3_600_000),
                    clock_ms=clock)
    for _ in range(30):
        log.append([b"o" * 500])
    old_next = log.next_offset
    clock.now += 2 * 3_600_000
    log.append([b"n" * 500])
    assert log.enforce_retention() > 0
    assert log.first_offset == old_next - len(log.segments[0].index) or log.first_offset > 0
    # every remaining segment but the active one is young
    assert all(s.last_timestamp_ms >= clock.now - 3_600_000 for s in log.segments[:-1])
    assert log.segments[-1].next_offset == old_next + 1


def test_retention_by_message_count(tmp_path):
    log = CommitLog(tmp_path, LogConfig(segment_max_bytes=4096, retention_max_messages=100))
    for _ in range(60):
        log.append([b"m" * 40] * 5)
    kept = sum(s.num_records for s in log.segments)
    assert kept <= 100 + log.segments[-1].num_records
    assert log.next_offset - log.first_offset == kept


def test_wait_for_wakes_on_append_and_close(tmp_path):
    async def main():
        log = CommitLog(tmp_path)
        waiter = asyncio.create_task(log.wait_for(2))
        await asyncio.sleep(0)
        await log.append_async([b"a", b"b"])
        await asyncio.sleep(0)
        assert not waiter.done()              # offset 2 not there yet
        await log.append_async([b"c"])
        await asyncio.wait_for(waiter, 1)
        pending = asyncio.create_task(log.wait_for(10))
        await asyncio.sleep(0)
        await log.aclose()
        with pytest.raises(LogClosedError):
            await asyncio.wait_for(pending, 1)
    asyncio.run(main())


def test_a_commit_wakes_only_the_waiters_it_reaches_and_cancelled_ones_do_not_pile_up(tmp_path):
    """Replicated logs commit in many small steps with many waiters (one per unconfirmed
    chunk): each commit must wake only the waiters at or below it."""
    async def main():
        log = CommitLog(tmp_path, auto_commit=False)
        log.append([b"r"] * 10)
        woken = []

        async def wait(offset):
            await log.wait_for(offset)
            woken.append(offset)

        tasks = [asyncio.create_task(wait(o)) for o in range(10)]
        await asyncio.sleep(0)
        log.commit(3)
        await asyncio.gather(*tasks[:4])
        await asyncio.sleep(0)
        assert sorted(woken) == [0, 1, 2, 3] and len(log._waiters) == 6
        for _ in range(200):  # a reader polling an idle log with a timeout
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(log.wait_for(9), 0)
        assert len(log._waiters) < 6 + 70
        log.commit(9)
        await asyncio.gather(*tasks)
        assert sorted(woken) == list(range(10)) and not log._waiters
        log.close()
    asyncio.run(main())


def test_a_cancelled_reader_does_not_stop_the_others(tmp_path):
    async def main():
        log = CommitLog(tmp_path)
        quitter = asyncio.create_task(log.wait_for(0))
        stayer = asyncio.create_task(log.wait_for(0))
        await asyncio.sleep(0)
        quitter.cancel()
        await asyncio.sleep(0)
        await log.append_async([b"a"])
        await asyncio.wait_for(stayer, 1)
        assert quitter.cancelled() and stayer.done() and not stayer.cancelled()
        await log.aclose()
    asyncio.run(main())


def test_uncommitted_records_are_not_read(tmp_path):
    log = CommitLog(tmp_path, auto_commit=False)
    log.append([b"a", b"b"])
    assert log.committed_offset == -1 and log.read_chunks(0) == []
    assert len(log.read_chunks(0, committed_only=False)) == 1
    log.commit(0)
    assert log.read_chunks(0)[0].header.first_offset == 0
    log.commit(99)                  # never past the last offset
    assert log.committed_offset == 1


@pytest.fixture
def fsyncs(monkeypatch):
    """The fsyncs of segment files (not those of the leader-epoch checkpoint, written once per
    leader epoch, nor of folders)."""
    calls = []
    real = os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".segment"):
            calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def test_durability_always_fsyncs_every_append(tmp_path, fsyncs):
    log = CommitLog(tmp_path, LogConfig(durability=Durability.ALWAYS))
    for _ in range(5):
        log.append([b"d"])
    assert len(fsyncs) == 5


def test_durability_never_does_not_fsync(tmp_path, fsyncs):
    log = CommitLog(tmp_path, LogConfig(durability=Durability.NEVER))
    for _ in range(5):
        log.append([b"d"])
    log.close()
    assert fsyncs == []


def test_durability_interval_fsyncs_after_the_interval(tmp_path, fsyncs):
    clock = Clock()
    log = CommitLog(tmp_path, LogConfig(durability=Durability.INTERVAL, fsync_interval_ms=100),
                    clock_ms=clock)
    log.append([b"a"])
    log.append([b"b"])
    assert fsyncs == [] and log.committed_offset == 1     # committed without waiting
    clock.now += 100
    log.append([b"c"])
    assert len(fsyncs) == 1


def test_durability_interval_async_flushes_in_the_background(tmp_path, fsyncs):
    async def main():
        log = CommitLog(tmp_path, LogConfig(durability=Durability.INTERVAL, fsync_interval_ms=20))
        await log.append_async([b"a"])
        assert fsyncs == []
        for _ in range(100):
            await asyncio.sleep(0.01)
            if fsyncs:
                break
        assert len(fsyncs) == 1
        await log.aclose()
    asyncio.run(main())


def test_durability_always_async_group_commits(tmp_path, fsyncs):
    async def main():
        log = CommitLog(tmp_path, LogConfig(durability=Durability.ALWAYS))
        results = await asyncio.gather(*(log.append_async([b"%d" % i]) for i in range(50)))
        assert sorted(r[0] for r in results) == list(range(50))
        assert log.committed_offset == 49
        assert 1 <= len(fsyncs) < 50          # concurrent appends shared fsyncs
        await log.aclose()
    asyncio.run(main())


def test_commit_waits_for_fsync_under_always(tmp_path):
    async def main():
        log = CommitLog(tmp_path, LogConfig(durability=Durability.ALWAYS))
        task = asyncio.create_task(log.append_async([b"a"]))
        await asyncio.sleep(0)
        assert log.next_offset == 1 and log.committed_offset == -1
        await task
        assert log.committed_offset == 0
        await log.aclose()
    asyncio.run(main())


def _key_record(key, value):
    k = b"" if key is None else key
    return (b"K" if key is not None else b"N") + struct.pack(">H", len(k)) + k + value


def _key_of(record):
    if record[:1] != b"K":
        return None
    (n,) = struct.unpack(">H", record[1:3])
    return record[3:3 + n]


def test_compaction_keeps_newest_record_per_key(tmp_path):
    async def main():
        log = CommitLog(tmp_path, LogConfig(segment_max_bytes=4096, compact=True))
        expected = {}
        keyless = []
        for i in range(300):
            key = b"k%d" % (i % 7) if i % 5 else None
            rec = _key_record(key, b"v%d" % i)
            (off,) = log.append([rec])
            if key is None:
                keyless.append((off, rec))
            else:
                expected[key] = (off, rec)
        before = records_from(log)
        active = log.segments[-1]
        result = await log.compact(_key_of)
        assert result.records_after < result.records_before
        after = records_from(log)
        # active segment untouched; keyless records kept; newest per key kept
        closed_end = active.base_offset
        survivors = {off for off, _ in after}
        for off, rec in keyless:
            assert off in survivors
        for key, (off, rec) in expected.items():
            assert (off, rec) in after
        for off, rec in after:
            key = _key_of(rec)
            if key is not None and off < closed_end:
                assert expected[key][0] == off or any(
                    o >= closed_end and _key_of(r) == key for o, r in before)
        assert [x for x in before if x[0] >= closed_end] == [x for x in after if x[0] >= closed_end]
        # order kept and offsets unchanged
        assert after == [x for x in before if x[0] in survivors]
        # reading from an offset removed by compaction starts at the next kept record
        gone = next(o for o, _ in before if o not in survivors)
        first = log.read_chunks(gone)[0]
        assert first.header.first_offset > gone
        log.close()
        reopened = CommitLog(tmp_path)
        assert reopened.report.clean, reopened.report
        assert records_from(reopened) == after
        assert reopened.append([b"more"]) == range(300, 301)
    asyncio.run(main())


def test_compaction_skips_uncommitted_segments(tmp_path):
    async def main():
        log = CommitLog(tmp_path, LogConfig(segment_max_bytes=4096), auto_commit=False)
        for i in range(100):
            log.append([_key_record(b"same", b"%d" % i)])
        result = await log.compact(_key_of)
        assert result.rewritten == [] and result.emptied == []
        log.commit(log.last_offset)
        result = await log.compact(_key_of)
        assert result.records_after < result.records_before
        assert records_from(log)[-1] == (99, _key_record(b"same", b"99"))
    asyncio.run(main())


def test_a_compaction_point_applied_to_other_segments_leaves_the_same_records(tmp_path):
    """A follower's log (other segment boundaries) applying its leader's compaction point
    ends with the leader's records; not before it committed the point's ``upto``, and
    never while its active segment holds records below the point's ``end``."""
    from riverlog.log.compaction import compact_segments

    async def main():
        leader = CommitLog(tmp_path / "leader", LogConfig(segment_max_bytes=4096))
        follower = CommitLog(tmp_path / "follower", LogConfig(segment_max_bytes=5000),
                             auto_commit=False)
        for i in range(300):
            rec = [_key_record(b"k%d" % (i % 7) if i % 5 else None, b"v%d" % i)]
            leader.append(rec)
            follower.append(rec)
        point = (await leader.compact(_key_of)).point
        assert point is not None and point.upto == 299
        follower.commit(point.upto - 1)  # not committed that far yet
        result = await follower.compact(_key_of, point)
        assert result.point is None and result.rewritten == []
        follower.commit(point.upto)
        everything = records_from(follower, 0)
        assert follower.segments[-1].first_offset < point.end  # its active segment holds some
        assert compact_segments(follower.segments, 299, _key_of, point).point is None
        result = await follower.compact(_key_of, point)  # rolls, then compacts
        assert result.point == point == follower.compaction_point
        assert records_from(follower, 0) == records_from(leader, 0) != everything
        assert [s.base_offset for s in follower.segments] != \
            [s.base_offset for s in leader.segments]
    asyncio.run(main())


def test_the_compaction_point_is_kept_with_the_log(tmp_path):
    """A leader's compaction point and a follower's applied one are read back on open (a
    restarted leader sends it at once); a reset forgets it; a damaged file is reported and
    read as none."""
    async def main():
        leader = CommitLog(tmp_path / "leader", LogConfig(segment_max_bytes=4096))
        follower = CommitLog(tmp_path / "follower", LogConfig(segment_max_bytes=5000),
                             auto_commit=False)
        for i in range(300):
            rec = [_key_record(b"k%d" % (i % 7), b"v%d" % i)]
            leader.append(rec)
            follower.append(rec)
        follower.commit(299)
        point = (await leader.compact(_key_of)).point
        assert (await follower.compact(_key_of, point)).point == point
        leader.close()
        follower.close()
        leader, follower = CommitLog(tmp_path / "leader"), CommitLog(tmp_path / "follower")
        assert leader.compaction_point == point == follower.compaction_point
        assert leader.report.clean and follower.report.clean
        follower.reset(400)
        assert follower.compaction_point is None
        follower.close()
        assert CommitLog(tmp_path / "follower").compaction_point is None
        leader.close()
        (tmp_path / "leader" / "compaction-point").write_bytes(b"12 x\n")
        reopened = CommitLog(tmp_path / "leader")
        assert reopened.compaction_point is None
        assert any("not a compaction point" in p for p in reopened.report.problems)
    asyncio.run(main())


def test_truncate_at_chunk_boundary_and_inside_a_chunk(tmp_path):
    log = CommitLog(tmp_path, LogConfig(segment_max_bytes=4096))
    for i in range(40):
        log.append([b"%d-%d" % (i, j) for j in range(10)])
    log.truncate(250)                      # a chunk boundary, in an older segment
    assert log.next_offset == 250 and log.committed_offset == 249
    log.truncate(123)                      # inside a chunk: its first 3 records stay
    assert log.next_offset == 123
    recs = records_from(log)
    assert recs[-1] == (122, b"12-2") and len(recs) == 123
    assert log.append([b"new"]) == range(123, 124)
    log.close()
    again = CommitLog(tmp_path)
    assert again.report.clean and records_from(again)[-2:] == [(122, b"12-2"), (123, b"new")]


def test_truncate_cannot_split_a_sub_batch(tmp_path):
    log = CommitLog(tmp_path)
    body = b"".join(struct.pack(">I", 1) + bytes([i]) for i in range(3))
    entry = struct.pack(">BHII", 0x80, 3, len(body), len(body)) + body
    log.append_entries(entry, 1, 3)
    with pytest.raises(LogError):
        log.truncate(1)
    log.truncate(0)
    assert log.next_offset == 0


def test_missing_and_damaged_index_are_rebuilt(tmp_path):
    with CommitLog(tmp_path, LogConfig(segment_max_bytes=4096)) as log:
        for i in range(30):
            log.append([b"%02d" % i * 60])
        expected = records_from(log)
        segs = log.segments
    os.unlink(segs[0].index.path)
    with open(segs[1].index.path, "r+b") as f:
        f.truncate(33)                         # not a multiple of the entry size
    log = CommitLog(tmp_path)
    assert log.report.rebuilt_indexes == 2
    assert records_from(log) == expected
    assert os.path.getsize(segs[0].index.path) == 32 * len(log.segments[0].index)


def test_torn_tail_is_truncated_and_reported(tmp_path, caplog):
    with CommitLog(tmp_path) as log:
        for i in range(5):
            log.append([b"rec%d" % i])
        path = log.segments[-1].path
    with open(path, "ab") as f:
        f.write(b"\x50garbage-from-a-torn-write")
    log = CommitLog(tmp_path)
    assert log.next_offset == 5
    assert log.report.truncated_bytes == len(b"\x50garbage-from-a-torn-write")
    assert any("truncated" in m for m in caplog.messages)
    assert log.append([b"next"]) == range(5, 6)


def test_closed_log_refuses_work(tmp_path):
    log = CommitLog(tmp_path)
    log.close()
    with pytest.raises(LogClosedError):
        log.append([b"x"])
    with pytest.raises(LogClosedError):
        log.read_chunks(0)
    with pytest.raises(LogClosedError):
        asyncio.run(log.compact(lambda record: record))


def test_config_validation_names_the_key():
    with pytest.raises(ValueError, match="segment_max_bytes"):
        LogConfig(segment_max_bytes=10)
    with pytest.raises(ValueError, match="retention_max_age_ms"):
        LogConfig(retention_max_age_ms=-1)
    assert LogConfig(durability="always").durability is Durability.ALWAYS
