"""The leader-epoch checkpoint (riverlog/log/epochs.py) and the commit log's use of it: Kafka's
LeaderEpochFileCache semantics, the Kafka/Liftbridge file format, a corrupt or missing file
reported and rebuilt from the chunk epochs, epochs stamped on chunks, truncation and retention."""
import os

import pytest

from riverlog.config import LogConfig
from riverlog.errors import EpochCheckpointError
from riverlog.log import CommitLog
from riverlog.log.epochs import CHECKPOINT_NAME, UNDEFINED, EpochEntry, LeaderEpochCache


@pytest.fixture
def cache(tmp_path):
    c = LeaderEpochCache(tmp_path / CHECKPOINT_NAME)
    for epoch, start in ((1, 0), (2, 5), (4, 9)):
        c.assign(epoch, start)
    return c


def test_end_offset_for_is_the_next_epochs_start_or_the_log_end(cache):
    assert [cache.end_offset_for(e, log_end=12) for e in range(6)] == [0, 5, 9, 9, 12, UNDEFINED]
    assert LeaderEpochCache(cache.path + ".other").end_offset_for(1, log_end=12) == UNDEFINED


def test_epoch_and_end_offset_for_names_the_epoch_it_answers_for(cache):
    """KIP-279: asked for epoch 3, which this log never had, it answers for epoch 2."""
    assert [cache.epoch_and_end_offset_for(e, log_end=12) for e in range(6)] == [
        (0, 0), (1, 5), (2, 9), (2, 9), (4, 12), (UNDEFINED, UNDEFINED)]


def test_assign(cache):
    assert cache.latest_epoch == 4
    cache.assign(4, 11)  # the latest epoch again: nothing changes
    assert cache.entries == ((1, 0), (2, 5), (4, 9))
    for epoch, start in ((3, 10), (4, 8), (5, 8), (-1, 20), (6, -1)):
        with pytest.raises(ValueError):
            cache.assign(epoch, start)
    cache.assign(5, 9)  # epoch 4 wrote nothing: it ends where it started
    assert cache.entries[-2:] == (EpochEntry(4, 9), EpochEntry(5, 9))
    assert cache.end_offset_for(4, log_end=12) == 9
    assert LeaderEpochCache(cache.path).entries == cache.entries


def test_file_is_kafkas_and_liftbridges_format_and_written_atomically(cache, tmp_path):
    with open(cache.path) as f:
        assert f.read() == "0\n3\n1 0\n2 5\n4 9\n"
    assert os.listdir(tmp_path) == [CHECKPOINT_NAME]  # no temp file left behind


@pytest.mark.parametrize("truncate, offset, entries", [
    ("truncate_from_end", 100, ((1, 0), (2, 5), (4, 9))),
    ("truncate_from_end", 10, ((1, 0), (2, 5), (4, 9))),
    ("truncate_from_end", 9, ((1, 0), (2, 5))),
    ("truncate_from_end", 6, ((1, 0), (2, 5))),
    ("truncate_from_end", 5, ((1, 0),)),
    ("truncate_from_end", 0, ()),
    ("truncate_from_start", 0, ((1, 0), (2, 5), (4, 9))),
    ("truncate_from_start", 3, ((1, 3), (2, 5), (4, 9))),
    ("truncate_from_start", 5, ((2, 5), (4, 9))),
    ("truncate_from_start", 7, ((2, 7), (4, 9))),
    ("truncate_from_start", 20, ((4, 20),)),
])
def test_truncate(cache, truncate, offset, entries):
    getattr(cache, truncate)(offset)
    assert cache.entries == entries
    assert LeaderEpochCache(cache.path).entries == entries


@pytest.mark.parametrize("content, reason", [
    (b"", "no version and entry count lines"),
    (b"0\n", "no version and entry count lines"),
    (b"1\n0\n", "unknown version 1"),
    (b"0\n2\n1 0\n", "says 2 entries, holds 1"),
    (b"0\n1\n1 0", "the last line is not complete"),
    (b"0\n1\n1\n", "line 3 is not 'epoch startOffset': '1'"),
    (b"0\n1\n1 -4\n", "line 3 is not 'epoch startOffset': '1 -4'"),
    (b"0\n1\n1  4\n", "line 3 is not 'epoch startOffset': '1  4'"),
    (b"0\n2\n2 0\n1 5\n", "entry (1, 5) out of order after (2, 0)"),
    (b"0\n2\n1 5\n2 4\n", "entry (2, 4) out of order after (1, 5)"),
    (b"0\n1\n9223372036854775808 0\n", "an epoch or offset outside 0..2^63-1"),
    (b"\xff\n", "not ASCII text"),
])
def test_corrupt_file_raises_naming_the_path(tmp_path, content, reason):
    path = tmp_path / CHECKPOINT_NAME
    path.write_bytes(content)
    with pytest.raises(EpochCheckpointError) as caught:
        LeaderEpochCache(path)
    assert caught.value.path == str(path) and caught.value.reason == reason
    assert str(caught.value) == f"corrupt leader-epoch checkpoint {path}: {reason}"


# -- in the commit log -------------------------------------------------------------------------


def _epochs_of_chunks(log):
    return [(c.header.first_offset, c.header.epoch)
            for c in log.read_chunks(log.first_offset, 1 << 30, committed_only=False)]


def test_chunks_carry_the_leader_epoch_starting_at_1(tmp_path):
    log = CommitLog(tmp_path)
    assert log.epoch == 1
    log.append([b"a", b"b"])
    log.epoch = 3
    log.append([b"c"])
    log.append([b"d"])
    assert _epochs_of_chunks(log) == [(0, 1), (2, 3), (3, 3)]
    assert log.epochs.entries == ((1, 0), (3, 2))
    assert [log.end_offset_for(e) for e in (0, 1, 2, 3, 4)] == [0, 2, 2, 4, UNDEFINED]
    log.epoch = 2
    with pytest.raises(ValueError):
        log.append([b"stale leader"])
    assert log.next_offset == 4
    log.close()
    again = CommitLog(tmp_path)
    assert again.epoch == 3 and again.epochs.entries == ((1, 0), (3, 2))


def _log_of_three_epochs(path, **kw):
    log = CommitLog(path, LogConfig(segment_max_bytes=4096), **kw)
    for epoch in (1, 2, 2, 5):
        log.epoch = epoch
        log.append([b"x" * 100] * 10)
    return log


@pytest.mark.parametrize("content", [b"garbage", b"0\n1\n7 0 0\n", b""])
def test_corrupt_checkpoint_is_reported_and_rebuilt_from_the_chunks(tmp_path, content):
    _log_of_three_epochs(tmp_path).close()
    (tmp_path / CHECKPOINT_NAME).write_bytes(content)
    log = CommitLog(tmp_path)
    assert [p for p in log.report.problems if str(tmp_path / CHECKPOINT_NAME) in p]
    assert log.epochs.entries == ((1, 0), (2, 10), (5, 30)) and log.epoch == 5
    log.close()
    again = CommitLog(tmp_path)  # the rewritten file opens cleanly: no crash loop
    assert again.report.clean and again.epochs.entries == ((1, 0), (2, 10), (5, 30))


def test_missing_checkpoint_is_rebuilt_and_an_empty_log_writes_none(tmp_path):
    _log_of_three_epochs(tmp_path / "a").close()
    os.unlink(tmp_path / "a" / CHECKPOINT_NAME)
    assert CommitLog(tmp_path / "a").epochs.entries == ((1, 0), (2, 10), (5, 30))
    assert (tmp_path / "a" / CHECKPOINT_NAME).exists()
    CommitLog(tmp_path / "b").close()
    assert not (tmp_path / "b" / CHECKPOINT_NAME).exists()


def test_truncation_and_retention_update_the_checkpoint(tmp_path):
    log = _log_of_three_epochs(tmp_path)
    log.truncate(25)
    assert log.epochs.entries == ((1, 0), (2, 10))
    log.epoch = 6
    for _ in range(60):
        log.append([b"y" * 100] * 10)
    log.config = LogConfig(segment_max_bytes=4096, retention_max_messages=100)
    assert log.enforce_retention() > 0
    assert log.epochs.entries == ((6, log.first_offset),)
    log.close()
    assert CommitLog(tmp_path).epochs.entries == ((6, log.first_offset),)


def test_an_epoch_entry_past_a_recovered_tail_is_dropped(tmp_path):
    log = _log_of_three_epochs(tmp_path)
    log.epochs.assign(9, log.next_offset)  # a leader that crashed before its first chunk
    log.close()
    assert CommitLog(tmp_path).epochs.entries == ((1, 0), (2, 10), (5, 30))


def test_a_checkpoint_write_cut_by_a_crash_leaves_the_previous_file(tmp_path):
    _log_of_three_epochs(tmp_path).close()
    (tmp_path / (CHECKPOINT_NAME + ".tmp")).write_bytes(b"0\n4\n1 0\n2 1")  # the temp file, torn
    log = CommitLog(tmp_path)
    assert log.report.clean and log.epochs.entries == ((1, 0), (2, 10), (5, 30))
    assert not (tmp_path / (CHECKPOINT_NAME + ".tmp")).exists()
