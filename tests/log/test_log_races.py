"""The commit log's worker-thread jobs (group fsync, compaction) racing the owner's own
changes, on real files, real fsyncs and real threads: a job is held at a gate (before it
starts, or before its result is handed back) while the log deletes, truncates or reads;
and a moment without file descriptors fails only the one request."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from riverlog.config import Durability, LogConfig
from riverlog.errors import ResourceExhaustedError
from riverlog.log import CommitLog
from riverlog.log import chunk as chunkfmt
from riverlog.log.files import OPEN_FILES

from test_open_files import budget, nofile_limit

DEADLINE_S = 30.0


class Gate:
    """Where one worker job waits (``before`` it runs, or ``after`` it ran, before its
    result is handed back); ``entered`` is set once it waits there, ``go`` lets it on."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.entered = threading.Event()
        self.go = threading.Event()

    def run(self, fn, args, kwargs):
        if self.where == "before":
            self.entered.set()
            self.go.wait(DEADLINE_S)
            return fn(*args, **kwargs)
        result = fn(*args, **kwargs)
        self.entered.set()
        self.go.wait(DEADLINE_S)
        return result


class GatedExecutor(ThreadPoolExecutor):
    """A real thread pool whose next jobs wait at ``gates`` (one each, in order of
    submission); later jobs run freely. ``entered`` and ``go`` are the first gate's."""

    def __init__(self, *wheres: str) -> None:
        super().__init__(max_workers=len(wheres) + 1)
        self.gates = [Gate(w) for w in wheres]
        self.entered, self.go = self.gates[0].entered, self.gates[0].go
        self._next = 0

    def submit(self, fn, /, *args, **kwargs):
        if self._next == len(self.gates):
            return super().submit(fn, *args, **kwargs)
        gate = self.gates[self._next]
        self._next += 1
        return super().submit(gate.run, fn, args, kwargs)


async def at_gate(gate) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not gate.entered.is_set():
        assert time.monotonic() < deadline, "the worker job never reached the gate"
        await asyncio.sleep(0.01)


@contextlib.contextmanager
def gated(*wheres: str):
    loop = asyncio.get_running_loop()
    executor = GatedExecutor(*wheres)
    loop.set_default_executor(executor)
    try:
        yield executor
    finally:
        for gate in executor.gates:
            gate.go.set()
        loop.set_default_executor(ThreadPoolExecutor())
        executor.shutdown(wait=True)


def values(chunks) -> list[bytes]:
    return [r for c in chunks for _, r in c.records()]


@pytest.mark.parametrize("cut", ["truncate", "reset"])
async def test_a_segment_deleted_during_an_fsync_leaves_the_log_writable(tmp_path, cut):
    """A follower truncating a divergent tail across a segment roll (or wiped by reset)
    while the group fsync runs in its thread: the fsync finds the deleted segment gone
    (before the fix: FileNotFoundError, the log stopped taking writes until restart)."""
    config = LogConfig(durability=Durability.ALWAYS, segment_max_bytes=4096)
    log = CommitLog(tmp_path / "log", config, auto_commit=False)
    try:
        for i in range(6):
            log.write_entries(*_entry(b"r%d " % i + b"x" * 1500))
        await log.flush()
        for i in range(6, 12):
            log.write_entries(*_entry(b"r%d " % i + b"x" * 1500))
        assert len(log.segments) > 2 and log.segments[-1].unsynced
        with gated("before") as gate:
            flush = asyncio.create_task(log.flush())
            await at_gate(gate)
            if cut == "truncate":
                offset = log.segments[-2].base_offset
                log.truncate(offset)
            else:
                offset = 1000
                log.reset(offset)
            gate.go.set()
            await asyncio.wait_for(flush, DEADLINE_S)  # what it waited for is gone
        assert log.failure is None
        assert log.durable_next_offset <= log.next_offset == offset
        written = log.write_entries(*_entry(b"after"))
        assert written == range(offset, offset + 1)
        assert log.durable_next_offset == offset  # not counted fsynced before its fsync
        await asyncio.wait_for(log.flush(), DEADLINE_S)
        assert log.durable_next_offset == offset + 1
        log.commit(offset)
        assert values(log.read_chunks(offset)) == [b"after"]
    finally:
        await log.aclose()


def _entry(record: bytes) -> tuple[bytes, int, int]:
    return chunkfmt.encode_entries([record]), 1, 1


def key_of(record: bytes) -> bytes:
    return record.split(b"=")[0]


async def test_a_read_during_compaction_reads_the_old_file_with_its_old_positions(tmp_path):
    """Compaction renames the new file over a segment in its thread; the log swaps in the
    new index later. A read between the two, with the old segment's descriptor closed by a
    budget of one file, reopened the path: the new file read at the old positions (before
    the fix: CorruptChunkError)."""
    config = LogConfig(durability=Durability.NEVER, segment_max_bytes=4096)
    log = CommitLog(tmp_path / "log", config)
    try:
        pad = b" " + b"x" * 300
        for i in range(30):  # even: one key, rewritten each time; odd: unique keys
            log.append([(b"dup=%d" if i % 2 == 0 else b"u%d=" % i) + pad])
        kept = [o for o in range(1, log.segments[0].next_offset) if o % 2]
        assert len(log.segments) > 2 and kept
        with budget(1), gated("after") as gate:
            compaction = asyncio.create_task(log.compact(key_of))
            await at_gate(gate)  # the new files are in place, the old index still used
            assert log.read_chunks(log.last_offset)  # the active file takes the budget
            for o in kept:
                assert values(log.read_chunks(o, max_chunks=1)) == [b"u%d=" % o + pad]
            gate.go.set()
            result = await asyncio.wait_for(compaction, DEADLINE_S)
        assert log.segments[0].base_offset in result.rewritten
        for o in kept:
            assert values(log.read_chunks(o, max_chunks=1)) == [b"u%d=" % o + pad]
    finally:
        await log.aclose()


async def test_compaction_replacing_an_unsynced_segment_during_an_fsync(tmp_path):
    """Under INTERVAL a just-rolled segment is committed before its fsync; compaction
    replaces its file while the fsync that took it runs: the old file, its name gone, was
    taken for a storage fault (before the fix: the log stopped taking writes)."""
    config = LogConfig(durability=Durability.INTERVAL, fsync_interval_ms=3_600_000,
                       segment_max_bytes=4096)
    log = CommitLog(tmp_path / "log", config)
    try:
        pad = b" " + b"x" * 300
        for i in range(30):
            log.write_entries(*_entry(b"k%d=%d" % (i % 3, i) + pad))
        assert len(log.segments) > 2 and log.segments[0].unsynced
        with gated("before", "after") as pool:
            fsync, rewrite = pool.gates
            flush = asyncio.create_task(log.flush())
            await at_gate(fsync)  # the fsync took the segments, not yet fsynced them
            compaction = asyncio.create_task(log.compact(key_of))
            await at_gate(rewrite)  # new files in place, the log not swapped yet
            fsync.go.set()
            await asyncio.wait_for(flush, DEADLINE_S)
            assert log.failure is None
            rewrite.go.set()
            result = await asyncio.wait_for(compaction, DEADLINE_S)
            assert log.segments[0].base_offset in result.rewritten
        assert log.failure is None
        written = log.write_entries(*_entry(b"after"))
        await asyncio.wait_for(log.flush(), DEADLINE_S)
        assert values(log.read_chunks(written[0])) == [b"after"]
    finally:
        await log.aclose()


@contextlib.contextmanager
def no_descriptors():
    """The process has no descriptor left and the budget no idle log file to give back."""
    OPEN_FILES.close_under(os.sep)
    held = []
    with nofile_limit(0):
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE
        try:
            yield
        finally:
            for fd in held:
                os.close(fd)


def test_no_descriptor_for_a_moment_fails_the_one_write_and_fsync_not_the_log(tmp_path):
    """An append and an fsync that find no descriptor fail alone (ResourceExhaustedError);
    the log stays writable and the next fsync retries the segment (before the fix: the
    log stopped taking writes until restart, as after a disk fault)."""
    config = LogConfig(durability=Durability.INTERVAL, fsync_interval_ms=3_600_000)
    log = CommitLog(tmp_path / "log", config)
    try:
        log.append([b"first"])
        with no_descriptors():
            with pytest.raises(ResourceExhaustedError):
                log.append([b"lost"])
            assert log.failure is None
            with pytest.raises(ResourceExhaustedError):
                log.sync()
            assert log.failure is None and log.segments[-1].unsynced
        log.append([b"second"])
        log.sync()
        assert not log.segments[-1].unsynced
        assert values(log.read_chunks(0)) == [b"first", b"second"]
    finally:
        log.close()


async def test_no_descriptor_for_a_group_fsync_fails_that_flush_not_the_log(tmp_path):
    log = CommitLog(tmp_path / "log", LogConfig(durability=Durability.ALWAYS))
    try:
        log.write_entries(*_entry(b"first"))
        with no_descriptors():
            with pytest.raises(ResourceExhaustedError):
                await asyncio.wait_for(log.flush(), DEADLINE_S)
        assert log.failure is None and log.committed_offset == -1
        await asyncio.wait_for(log.flush(), DEADLINE_S)
        assert log.committed_offset == 0
        assert values(log.read_chunks(0)) == [b"first"]
    finally:
        await log.aclose()
