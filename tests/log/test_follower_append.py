"""A follower's append of its leader's chunks (CommitLog.append_chunks): the follower's files
end byte-identical to the leader's, bad chunks are refused whole with ChunkRefusedError, the
high watermark is left alone, and after a leader change the old leader truncates to the end of
its last epoch on the new leader and then takes the new leader's chunks."""
import os
import struct

import pytest

from riverlog.config import LogConfig
from riverlog.errors import ChunkRefusedError, LogError
from riverlog.log import CommitLog
from riverlog.log.bloom import build_bloom
from riverlog.log.chunk import CHUNK_TRACKING_DELTA, encode_chunk, encode_entries
from riverlog.log.clean_close import MARKER_NAME

CONFIG = LogConfig(segment_max_bytes=4096)


def _sub_batch(records):
    body = encode_entries(records)
    return struct.pack(">BHII", 0x80, len(records), len(body), len(body)) + body


def _write_as_leader(log, epoch, rounds):
    """Appends of every kind a leader makes: simple entries, a sub-batch, a chunk with a bloom
    filter, a tracking chunk."""
    log.epoch = epoch
    for k in range(rounds):
        log.append([bytes([k]) * (k * 37 % 300) for _ in range(1 + k % 5)])
        if k % 7 == 0:
            log.append_entries(_sub_batch([b"s%d" % i for i in range(9)]), 1, 9)
        if k % 11 == 0:
            bloom = build_bloom(["eu", "us"])
            log.append_entries(encode_entries([b"filtered"]), 1, 1, trailer=bloom + b"W",
                               bloom_size=len(bloom))
            log.append_entries(encode_entries([b"t"]), 1, 1, chunk_type=CHUNK_TRACKING_DELTA)


def _raw_from(leader, offset, max_bytes=3000):
    return b"".join(bytes(c.raw) for c in leader.read_chunks(offset, max_bytes,
                                                             committed_only=False))


def _replicate(leader, follower):
    while raw := _raw_from(leader, follower.next_offset):
        appended = follower.append_chunks(raw)
        assert appended.start < appended.stop
        assert follower.committed_offset == -1  # the high watermark is the leader's to give


def _files(path):
    out = {}
    for name in sorted(os.listdir(path)):
        if name == MARKER_NAME:  # file sizes and mtimes: not the data compared
            continue
        with open(os.path.join(path, name), "rb") as f:
            out[name] = f.read()
    return out


def test_follower_fed_the_leaders_chunks_is_byte_identical(tmp_path):
    leader = CommitLog(tmp_path / "leader", CONFIG, auto_commit=False)
    follower = CommitLog(tmp_path / "follower", CONFIG, auto_commit=False)
    _write_as_leader(leader, 1, 40)
    _replicate(leader, follower)
    epoch_3 = leader.next_offset
    _write_as_leader(leader, 3, 25)
    _replicate(leader, follower)
    assert len(leader.segments) > 5 and follower.next_offset == leader.next_offset
    assert follower.epochs.entries == leader.epochs.entries == ((1, 0), (3, epoch_3))
    assert follower.epoch == 3
    leader.commit(leader.last_offset)
    follower.commit(leader.last_offset)
    assert [bytes(c.raw) for c in follower.read_chunks(0, 1 << 30)] == \
        [bytes(c.raw) for c in leader.read_chunks(0, 1 << 30)]
    leader.close()
    follower.close()
    leader_files = _files(tmp_path / "leader")
    assert _files(tmp_path / "follower") == leader_files  # segments, indexes, epoch checkpoint
    assert sum(n.endswith(".segment") for n in leader_files) == len(leader.segments)
    reopened = CommitLog(tmp_path / "follower", CONFIG, auto_commit=False)
    assert reopened.report.clean and reopened.epoch == 3


@pytest.fixture
def pair(tmp_path):
    """A leader with two epochs of chunks and a follower holding its first 20 offsets."""
    leader = CommitLog(tmp_path / "leader", CONFIG, auto_commit=False)
    _write_as_leader(leader, 1, 10)
    _write_as_leader(leader, 2, 10)
    follower = CommitLog(tmp_path / "follower", CONFIG, auto_commit=False)
    follower.append_chunks(_raw_from(leader, 0, max_bytes=1))
    while follower.next_offset < 20:
        follower.append_chunks(_raw_from(leader, follower.next_offset, max_bytes=1))
    return leader, follower


def _flip(raw, pos):
    return raw[:pos] + bytes([raw[pos] ^ 1]) + raw[pos + 1:]


@pytest.mark.parametrize("damage, reason", [
    (lambda raw, second: _flip(raw, second + 60), "CRC-32 mismatch"),  # a data byte of chunk 2
    (lambda raw, second: _flip(raw, second), "bad magic/version byte 0x51"),
    (lambda raw, second: raw[:-1], "truncated chunk"),
    (lambda raw, second: raw[:second + 20], "short header"),
    (lambda raw, second: raw[:second] + raw[:second], "chunk starts at offset"),  # a repeat
    # the header's record count (not under the CRC): recovery would cut it on the next open
    (lambda raw, second: _flip(raw, second + 6), "entry/record counts disagree"),
])
def test_a_bad_chunk_is_refused_and_nothing_is_appended(pair, damage, reason):
    leader, follower = pair
    chunks = leader.read_chunks(follower.next_offset, 1 << 20, max_chunks=3,
                                committed_only=False)
    raw = b"".join(bytes(c.raw) for c in chunks)
    before = (follower.next_offset, [s.size for s in follower.segments], follower.epochs.entries)
    with pytest.raises(ChunkRefusedError) as caught:
        follower.append_chunks(damage(raw, len(chunks[0].raw)))
    assert caught.value.offset == follower.next_offset and reason in caught.value.reason
    assert str(follower.directory) in str(caught.value)
    assert (follower.next_offset, [s.size for s in follower.segments],
            follower.epochs.entries) == before
    assert follower.append_chunks(raw) == range(before[0], chunks[-1].header.next_offset)


def _chunk(first, epoch, records=5):
    return encode_chunk(encode_entries([b"r%d" % i for i in range(records)]), records, records,
                        first_offset=first, timestamp_ms=1, epoch=epoch)


def test_gaps_the_leaders_compaction_left_are_kept_across_a_reopen_and_a_truncation(tmp_path):
    """Chunks after offsets the leader's compaction removed are taken with the same gap (Kafka's
    rule: offsets only increase); the segment is marked so that recovery keeps them; an epoch
    starting after a gap is recorded from the gap's start (its leader's start is in there);
    a truncation inside a gap cuts back to the chunk before it, with its epochs."""
    follower = CommitLog(tmp_path / "f", CONFIG, auto_commit=False)
    follower.append_chunks(_chunk(0, 1) + _chunk(10, 1))
    follower.append_chunks(_chunk(30, 2))
    assert follower.next_offset == 35 and follower.epochs.entries == ((1, 0), (2, 15))
    assert [c.header.first_offset for c in follower.read_chunks(5, 1 << 20,
                                                                committed_only=False)] == [10, 30]
    follower.close()
    follower = CommitLog(tmp_path / "f", CONFIG, auto_commit=False)
    assert follower.report.clean and follower.next_offset == 35
    assert follower.epochs.entries == ((1, 0), (2, 15))
    assert follower.end_offset_for(1) == 15
    follower.truncate(25)  # a leader's epoch 1 ending inside the gap
    assert follower.next_offset == 15 and follower.epochs.entries == ((1, 0),)
    follower.append_chunks(_chunk(25, 3))
    assert follower.epochs.entries == ((1, 0), (3, 15)) and follower.next_offset == 30
    with pytest.raises(ChunkRefusedError, match="chunk starts at offset 29"):
        follower.append_chunks(_chunk(29, 3))  # before the log end: never taken
    follower.close()
    assert CommitLog(tmp_path / "f", CONFIG, auto_commit=False).report.clean


def test_a_chunk_of_an_older_epoch_is_refused(pair):
    leader, follower = pair
    _replicate(leader, follower)
    assert follower.epochs.latest_epoch == 2
    stale = encode_chunk(encode_entries([b"old"]), 1, 1, first_offset=follower.next_offset,
                         timestamp_ms=1, epoch=1)
    with pytest.raises(ChunkRefusedError, match="chunk of leader epoch 1, older than epoch 2"):
        follower.append_chunks(stale)
    assert follower.next_offset == leader.next_offset


def test_only_a_log_without_auto_commit_takes_a_leaders_chunks(tmp_path, pair):
    leader, _ = pair
    with pytest.raises(LogError, match="auto_commit"):
        CommitLog(tmp_path / "own", CONFIG).append_chunks(_raw_from(leader, 0))
    empty = CommitLog(tmp_path / "empty", CONFIG, auto_commit=False)
    assert empty.append_chunks(b"") == range(0, 0)


def test_old_leader_truncates_to_its_epochs_end_then_follows_the_new_leader(pair):
    old, new = pair  # "new" is the follower that becomes leader with epoch 3
    _replicate(old, new)
    replicated, epochs = old.next_offset, old.epochs.entries
    assert [e.epoch for e in epochs] == [1, 2]
    _write_as_leader(old, 2, 4)  # the old leader's tail nobody copied
    new.epoch = 3
    _write_as_leader(new, 3, 6)
    with pytest.raises(ChunkRefusedError):
        old.append_chunks(_raw_from(new, replicated))
    end = new.end_offset_for(old.epochs.latest_epoch)  # LeaderEpochOffsetRequest {epoch 2}
    assert end == replicated
    old.truncate(end)
    assert old.next_offset == end and old.epochs.entries == epochs
    _replicate(new, old)
    assert old.epochs.entries == new.epochs.entries == epochs + ((3, replicated),)
    old.close()
    new.close()
    assert _files(old.directory) == _files(new.directory)


def test_reset_starts_an_empty_log_at_the_leaders_log_start(tmp_path):
    leader = CommitLog(tmp_path / "leader", CONFIG)
    _write_as_leader(leader, 3, 40)
    start = leader.segments[-1].base_offset  # as if retention removed the older segments
    follower = CommitLog(tmp_path / "follower", CONFIG, auto_commit=False)
    follower.append([b"old"] * 5)
    follower.reset(start)
    assert (follower.first_offset, follower.next_offset, follower.committed_offset,
            follower.epochs.entries) == (start, start, start - 1, ())
    raw = b"".join(bytes(c.raw) for c in leader.read_chunks(start, 1 << 20))
    follower.append_chunks(raw)
    follower.close()
    reopened = CommitLog(tmp_path / "follower", CONFIG, auto_commit=False)
    assert (reopened.first_offset, reopened.next_offset) == (start, leader.next_offset)
    assert reopened.epochs.entries == ((3, start),)
    reopened.close()
    leader.close()
