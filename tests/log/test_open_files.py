"""The log's open-file budget (riverlog/log/files.py) on real files: segment and index files
are opened on use and the least recently used idle ones closed beyond the budget or when the
process runs out of descriptors, so the number of logs is not capped by RLIMIT_NOFILE; when
no descriptor can be had at all, the one operation fails with ResourceExhaustedError and a
stream being created leaves nothing on disk."""
import contextlib
import os
import resource

import pytest

from riverlog.broker import Broker
from riverlog.config import Durability, LogConfig
from riverlog.errors import ResourceExhaustedError
from riverlog.log import CommitLog
from riverlog.log.files import OPEN_FILES

NEVER = LogConfig(durability=Durability.NEVER)


def open_under(path) -> int:
    """Descriptors of this process on files under ``path``."""
    prefix = os.path.join(str(path), "")
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith(prefix):
                count += 1
    return count


@contextlib.contextmanager
def budget(capacity: int):
    before = OPEN_FILES.capacity
    OPEN_FILES.resize(capacity)
    try:
        yield
    finally:
        OPEN_FILES.resize(before)


@contextlib.contextmanager
def nofile_limit(extra: int):
    """The soft RLIMIT_NOFILE set to the descriptors open now plus ``extra``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = max(int(fd) for fd in os.listdir("/proc/self/fd")) + 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_logs_beyond_the_budget_work_with_at_most_budget_files_open(tmp_path):
    with budget(6):
        logs = [CommitLog(tmp_path / f"log{i}", NEVER) for i in range(40)]
        for i, log in enumerate(logs):
            log.append([b"record %d" % i] * 3)
        assert open_under(tmp_path) <= 6
        for i, log in enumerate(logs):  # every log reads back, in another order
            (chunk,) = log.read_chunks(0)
            assert [r for _, r in chunk.records()] == [b"record %d" % i] * 3
            log.append([b"more"])
        assert open_under(tmp_path) <= 6
        for log in logs:
            log.close()
        assert open_under(tmp_path) == 0
        reopened = [CommitLog(tmp_path / f"log{i}", NEVER) for i in range(40)]
        assert [log.next_offset for log in reopened] == [4] * 40
        assert open_under(tmp_path) <= 6
        for log in reopened:
            log.close()


def test_more_logs_than_descriptors(tmp_path):
    """With 60 descriptors to spare and a budget of 30 files, 300 logs open, take appends
    and read back (before the budget, the 60th failed with EMFILE)."""
    with budget(30), nofile_limit(60):
        logs = [CommitLog(tmp_path / f"log{i}", NEVER) for i in range(300)]
        for i, log in enumerate(logs):
            log.append([b"r%d" % i])
        for i, log in enumerate(logs):
            (chunk,) = log.read_chunks(0)
            assert [r for _, r in chunk.records()] == [b"r%d" % i]
        for log in logs:
            log.close()


def test_no_descriptor_fails_the_one_create_and_leaves_nothing(tmp_path):
    broker = Broker(str(tmp_path))
    broker.open()
    broker.create("kept").partitions[0].log.append([b"before"])
    hogs = []
    with nofile_limit(40):
        with pytest.raises(OSError):
            while True:
                hogs.append(os.open("/dev/null", os.O_RDONLY))
        try:
            with pytest.raises(ResourceExhaustedError, match="no file descriptor"):
                broker.create("new")
        finally:
            for fd in hogs:
                os.close(fd)
        assert sorted(os.listdir(broker.root)) == ["kept"]  # removed while out of descriptors
        assert "new" not in broker.streams
        broker.create("new").partitions[0].log.append([b"after"])
        assert broker.streams["kept"].partitions[0].log.append([b"still"]) == range(1, 2)
    for stream in broker.streams.values():
        stream.partitions[0].log.close()


def test_a_deleted_segment_is_not_made_again_by_a_late_reader(tmp_path):
    """As retention deletes a segment: its folder stays, and a reader still holding the
    segment gets an error instead of an empty file made again in its place."""
    log = CommitLog(tmp_path / "log", NEVER)
    log.append([b"a"])
    (segment,) = log._segments
    segment.delete()
    with pytest.raises(OSError):
        segment.read_chunks(0, 1, verify=True)
    assert not os.path.exists(segment.path)


def test_a_segment_removed_while_closed_for_the_budget_is_an_error_not_a_new_file(tmp_path):
    """A segment file is created once: when its descriptor was closed for the budget and the
    file removed from the folder meanwhile, the next write fails instead of creating an empty
    file and writing at the old position (a sparse file with the first records gone)."""
    with budget(2):
        log = CommitLog(tmp_path / "log", NEVER)
        log.append([b"first"] * 3)
        others = [CommitLog(tmp_path / f"other{i}", NEVER) for i in range(3)]
        for other in others:  # their files push the log's segment out of the budget
            other.append([b"x"])
        segment = log._segments[-1].path
        os.unlink(segment)
        with pytest.raises(OSError):
            log.append([b"second"])
        assert not os.path.exists(segment)
        for other in [log, *others]:
            with contextlib.suppress(Exception):
                other.close()
