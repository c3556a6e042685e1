"""The clean-close marker (riverlog/log/clean_close.py): a log closed cleanly opens without a
recovery scan and answers its summary closed; any change to its files after the close (a
write, a torn tail, a damaged older segment) makes the marker stale and the open recovers."""
import os

from riverlog.config import LogConfig
from riverlog.log import CommitLog
from riverlog.log.clean_close import MARKER_NAME, LogSummary, read_summary

CONFIG = LogConfig(segment_max_bytes=4096)


def _filled(path, n=200) -> CommitLog:
    log = CommitLog(path, CONFIG)
    for i in range(n):
        log.append([b"record %d" % i])
    assert len(log.segments) > 2
    return log


def test_a_clean_close_is_trusted_at_the_next_open_and_keeps_the_summary(tmp_path):
    log = _filled(tmp_path)
    log.close()
    assert read_summary(str(tmp_path)) == LogSummary(
        first_offset=0, next_offset=200, committed_offset=199, last_message_offset=199,
        size_bytes=log.size_bytes, segments=len(log.segments))
    again = CommitLog(tmp_path, CONFIG)
    assert again.report.trusted and again.report.clean
    assert again.next_offset == 200
    assert [bytes(r) for c in again.read_chunks(199) for _, r in c.records()] == [
        b"record 199"]
    again.append([b"more"])
    again.close()
    third = CommitLog(tmp_path, CONFIG)
    assert third.report.trusted and third.next_offset == 201
    third.close()


def test_a_log_not_closed_after_a_write_is_recovered(tmp_path):
    _filled(tmp_path).close()
    crashed = CommitLog(tmp_path, CONFIG)
    crashed.append([b"written, then the process died"])
    crashed.sync()
    newest = crashed.segments[-1].path
    del crashed  # no close: the marker still describes the files before the write
    with open(newest, "ab") as f:
        f.write(b"\x00torn")  # a torn chunk after the last good one
    log = CommitLog(tmp_path, CONFIG)
    assert not log.report.trusted
    assert log.report.truncated_bytes == 5
    assert log.next_offset == 201
    log.close()


def test_a_damaged_older_segment_makes_the_marker_stale(tmp_path):
    log = _filled(tmp_path)
    oldest = log.segments[0].path
    log.close()
    with open(oldest, "r+b") as f:  # same size, other bytes: its mtime moves
        f.seek(60)
        f.write(b"\xff")
    opened = CommitLog(tmp_path, CONFIG)
    assert not opened.report.trusted  # recovered as after a crash (DESIGN.md's checks)
    opened.close()


def test_verify_on_open_never_trusts_the_marker(tmp_path):
    _filled(tmp_path).close()
    log = CommitLog(tmp_path, LogConfig(segment_max_bytes=4096, verify_on_open=True))
    assert not log.report.trusted
    log.close()


def test_a_deleted_log_leaves_no_marker_and_a_failed_close_removes_it(tmp_path):
    log = _filled(tmp_path / "a")
    log.delete()
    assert not os.path.exists(tmp_path / "a")
    _filled(tmp_path / "b").close()
    assert os.path.exists(tmp_path / "b" / MARKER_NAME)
    log = CommitLog(tmp_path / "b", CONFIG)
    log.close(mark=False)
    assert not os.path.exists(tmp_path / "b" / MARKER_NAME)
