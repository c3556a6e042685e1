"""Crash test of the commit log: a child process appends under ``Durability.ALWAYS`` and is
SIGKILLed at random points, over and over, on the same folder.

After every kill the parent reopens the folder and checks that
- opening does not raise;
- the log starts at offset 0 and every offset the child reported (printed right after its
  ``append`` returned) is there, in exactly the chunk it was appended as;
- offsets are contiguous from ``first_offset`` to ``next_offset - 1`` (no gap, no duplicate);
- every record equals what the child generated for that offset (records are a function of
  the offset alone, so records that reached the disk but were never reported are checked too);
- nothing is returned past ``next_offset`` and the log never shrinks between rounds.

The kill point is chosen per round: after a random number of reported appends (the child is
then usually inside its next ``append``: write, index flush or fsync), or after a random
delay (which may fall in interpreter start-up, in ``CommitLog`` open, or anywhere in an
append, segment rolls included). ``RIVERLOG_CRASH_SEED`` replays a run.
"""
from __future__ import annotations

import os
import random
import selectors
import signal
import subprocess
import sys
import time

import pytest

from riverlog.config import Durability, LogConfig
from riverlog.log import CommitLog

SEGMENT_MAX_BYTES = 64 * 1024
ROUNDS = 60
ROUND_TIMEOUT_S = 20.0

# Shared by the child (prepended to its script) and the parent (exec'd below), so both sides
# derive records from the very same code.
GENERATOR_SRC = r'''
import random as _random

def record_for(seed, offset):
    """The record stored at ``offset``: 0..2000 bytes, a function of (seed, offset) only."""
    rng = _random.Random(f"riverlog-crash:{seed}:{offset}")
    return rng.randbytes(rng.randrange(2001))

def chunk_count(seed, run, k):
    """How many records the ``k``-th append of child run ``run`` holds (1..50)."""
    rng = _random.Random(f"riverlog-crash-chunk:{seed}:{run}:{k}")
    return rng.choice((1, 2, 3, rng.randint(1, 50), rng.randint(1, 50), rng.randint(30, 50)))
'''

CHILD_MAIN = r'''
import sys
from riverlog.config import Durability, LogConfig
from riverlog.log import CommitLog

directory, seed, run, segment_max = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
log = CommitLog(directory, LogConfig(durability=Durability.ALWAYS, segment_max_bytes=segment_max))
print(f"READY {log.first_offset} {log.next_offset}", flush=True)
for k in range(100_000):
    start = log.next_offset
    records = [record_for(seed, start + i) for i in range(chunk_count(seed, run, k))]
    r = log.append(records)
    print(f"{r.start} {r.stop}", flush=True)
'''

_gen: dict = {}
exec(compile(GENERATOR_SRC, "<crash-generator>", "exec"), _gen)
record_for = _gen["record_for"]


class LineReader:
    """Whole lines from a pipe, with a deadline (select, no polling sleeps)."""

    def __init__(self, pipe) -> None:
        self.fd = pipe.fileno()
        os.set_blocking(self.fd, False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.fd, selectors.EVENT_READ)
        self.buf = b""
        self.eof = False

    def _take_line(self) -> str | None:
        nl = self.buf.find(b"\n")
        if nl < 0:
            return None
        line, self.buf = self.buf[:nl], self.buf[nl + 1:]
        return line.decode()

    def readline(self, deadline: float) -> str | None:
        """Next whole line, or None at EOF or when ``deadline`` (monotonic) passes."""
        while True:
            line = self._take_line()
            if line is not None:
                return line
            if self.eof:
                return None
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                return None
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                self.eof = True
            self.buf += data

    def rest(self) -> list[str]:
        """Every whole line left, once the writer is dead (a torn last line is dropped)."""
        os.set_blocking(self.fd, True)
        while not self.eof:
            data = os.read(self.fd, 65536)
            if not data:
                self.eof = True
            self.buf += data
        lines = []
        while (line := self._take_line()) is not None:
            lines.append(line)
        return lines

    def close(self) -> None:
        self.sel.close()


def _config() -> LogConfig:
    return LogConfig(durability=Durability.ALWAYS, segment_max_bytes=SEGMENT_MAX_BYTES)


def verify(directory, seed, printed: list[range], min_next: int, where: str):
    """Reopen ``directory`` and check it against the generator; returns
    (next_offset, number of segments, recovery report)."""
    try:
        log = CommitLog(directory, _config())
    except Exception as exc:  # open must never raise on what a crash leaves behind
        pytest.fail(f"{where}: CommitLog open raised {exc!r}")
    try:
        assert log.first_offset == 0, f"{where}: first_offset {log.first_offset}, expected 0"
        nxt = log.next_offset
        assert nxt >= min_next, (
            f"{where}: next_offset {nxt} < {min_next}: acknowledged or verified records lost "
            f"(recovery report: {log.report})")
        assert log.committed_offset == nxt - 1, where
        chunk_bounds: dict[int, int] = {}
        offset = expected = log.first_offset
        while True:
            chunks = log.read_chunks(offset, 256 * 1024)
            if not chunks:
                break
            for ch in chunks:
                h = ch.header
                assert h.first_offset == expected, (
                    f"{where}: chunk starts at offset {h.first_offset}, expected {expected} "
                    f"(gap or duplicate)")
                for off, rec in ch.records():
                    assert off == expected, f"{where}: record offset {off}, expected {expected}"
                    if rec != record_for(seed, off):
                        pytest.fail(f"{where}: record at offset {off} differs from what was "
                                    f"written ({len(rec)} bytes read, "
                                    f"{len(record_for(seed, off))} written)")
                    expected += 1
                assert h.next_offset == expected, where
                chunk_bounds[h.first_offset] = h.next_offset
            offset = chunks[-1].header.next_offset
        assert expected == nxt, (
            f"{where}: reading from first_offset ended at {expected}, next_offset is {nxt}")
        assert log.read_chunks(nxt) == [], f"{where}: data returned past next_offset"
        for r in printed:
            assert chunk_bounds.get(r.start) == r.stop, (
                f"{where}: acknowledged append {r.start}..{r.stop - 1} is not one chunk on disk "
                f"(chunk at {r.start}: {chunk_bounds.get(r.start)})")
        return nxt, len(log.segments), log.report
    finally:
        log.close()


@pytest.mark.timeout(180)
def test_sigkill_during_appends_never_loses_acked_records_or_serves_bad_ones(tmp_path):
    seed = int(os.environ.get("RIVERLOG_CRASH_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    directory = tmp_path / "log"
    script = tmp_path / "child.py"
    script.write_text(GENERATOR_SRC + CHILD_MAIN)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")

    printed: list[range] = []  # every range any child reported, all rounds
    verified_next = 0
    killed_mid_run = 0
    max_segments = 0
    unacked_found = tails_cut = 0  # how often a kill landed inside an append
    started = time.monotonic()
    for run in range(ROUNDS):
        where = f"seed {seed}, round {run}"
        stderr_path = tmp_path / f"child-{run}.err"
        mode = rng.choice(("lines", "lines", "delay_after_ready", "delay_from_spawn"))
        lines_before_kill = rng.choice((0, 1, rng.randint(2, 8), rng.randint(2, 40)))
        delay = rng.choice((rng.uniform(0, 0.01), rng.uniform(0, 0.1), rng.uniform(0.05, 0.25)))
        with open(stderr_path, "wb") as err:
            child = subprocess.Popen(
                [sys.executable, str(script), str(directory), str(seed), str(run),
                 str(SEGMENT_MAX_BYTES)],
                stdout=subprocess.PIPE, stderr=err, env=env)
        reader = LineReader(child.stdout)
        run_lines: list[str] = []
        try:
            spawn = time.monotonic()
            hard_deadline = spawn + ROUND_TIMEOUT_S
            if mode == "delay_from_spawn":
                deadline = spawn + delay
            else:
                line = reader.readline(hard_deadline)
                assert line is not None and line.startswith("READY"), (
                    f"{where}: child did not get ready: {line!r}; stderr: "
                    f"{stderr_path.read_text()[-2000:]}")
                run_lines.append(line)
                deadline = time.monotonic() + delay if mode == "delay_after_ready" else hard_deadline
            while mode != "lines" or len(run_lines) - 1 < lines_before_kill:
                line = reader.readline(deadline)
                if line is None:
                    break
                run_lines.append(line)
            assert child.poll() is None, (
                f"{where}: child exited by itself ({child.returncode}); stderr: "
                f"{stderr_path.read_text()[-2000:]}")
            assert time.monotonic() < hard_deadline, f"{where}: child stalled"
            child.send_signal(signal.SIGKILL)
            rc = child.wait(timeout=ROUND_TIMEOUT_S)
            run_lines.extend(reader.rest())
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            reader.close()
            child.stdout.close()
        assert rc == -signal.SIGKILL, (
            f"{where}: child ended with {rc}, not SIGKILL; stderr: "
            f"{stderr_path.read_text()[-2000:]}")

        # what the child reported: READY (unless killed before it), then one range per append
        ranges = []
        if run_lines and run_lines[0].startswith("READY"):
            _, first, nxt = run_lines.pop(0).split()
            assert (int(first), int(nxt)) == (0, verified_next), (
                f"{where}: child opened the log at first={first} next={nxt}, parent verified "
                f"next={verified_next}")
            expect_start = verified_next
            for line in run_lines:
                start, stop = map(int, line.split())
                assert start == expect_start and stop > start, (
                    f"{where}: child reported {start}..{stop - 1}, expected to start at "
                    f"{expect_start}")
                ranges.append(range(start, stop))
                expect_start = stop
        else:
            assert not run_lines, f"{where}: output before READY: {run_lines[:3]}"
        if ranges:
            killed_mid_run += 1
        printed.extend(ranges)
        acked_next = ranges[-1].stop if ranges else verified_next
        verified_next, segments, report = verify(directory, seed, printed,
                                                 max(acked_next, verified_next), where)
        max_segments = max(max_segments, segments)
        unacked_found += verified_next > acked_next
        tails_cut += report.truncated_bytes > 0

    elapsed = time.monotonic() - started
    # the test only means something if it really crashed appends and rolled segments
    assert killed_mid_run >= ROUNDS // 3, f"seed {seed}: only {killed_mid_run} rounds appended"
    assert max_segments >= 10, f"seed {seed}: only {max_segments} segments; no rolls to crash in"
    print(f"crash test seed {seed}: {ROUNDS} kills in {elapsed:.1f}s, {verified_next} records, "
          f"{len(printed)} acknowledged appends, {max_segments} segments; kills that left "
          f"unacknowledged records: {unacked_found}, torn tails cut on open: {tails_cut}")
