"""Damage a closed commit log at random (hypothesis) and check what opening it gives back.

The original log (several segments) is built once per module and copied for every example.
Damage: truncate a segment or index file at a random length, flip random bytes of segment
and index files (anywhere, or aimed at chunk headers), delete index files, append garbage.
Then:

- ``CommitLog(...)`` does not raise;
- ``verify_on_open=True``: reading from ``first_offset`` on returns exactly a prefix of the
  original log (same offsets, same bytes), ending on an original chunk boundary, with no
  error, and ``next_offset`` is right after it;
- ``verify_on_open=False`` (default): reading returns a prefix of the original and may stop
  with ``CorruptChunkError``, but only in a segment whose bytes (or index) were damaged;
  never a wrong record;
- nothing undamaged is given up: the segments before the first damaged file are kept whole,
  and damage to index files alone (a cache of the segments) loses no record;
- in both modes appends continue at ``next_offset``, are readable, and survive a close and
  a reopen (the prefix read before is still there after).

Chunk header timestamp and epoch are not covered by the CRC, so only offsets and record bytes
are compared.
"""
from __future__ import annotations

import os
import random
import shutil
import tempfile

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from riverlog.config import LogConfig
from riverlog.errors import CorruptChunkError
from riverlog.log import CommitLog
from riverlog.log.chunk import HEADER_SIZE, parse_header
from riverlog.log.clean_close import MARKER_NAME
from riverlog.log.epochs import CHECKPOINT_NAME

SEGMENT_MAX_BYTES = 4096


class Original:
    """The undamaged log: its folder, records[offset], the offsets where its chunks start
    (plus the end offset), the names of its segment and index files, and per segment file
    the byte positions where its chunks start."""

    def __init__(self, directory: str, records: list[bytes], boundaries: frozenset[int],
                 files: list[str], chunk_starts: dict[str, list[int]]) -> None:
        self.directory, self.records = directory, records
        self.boundaries, self.files = boundaries, files
        self.chunk_starts = chunk_starts

    def __repr__(self) -> str:  # keep hypothesis' failure reports short
        return f"<original log: {len(self.records)} records, {len(self.files)} files>"


def _records_for_chunk(rng: random.Random, k: int) -> list[bytes]:
    if k == 17:  # one chunk bigger than a segment: it gets a segment of its own
        return [rng.randbytes(1500) for _ in range(4)]
    return [rng.randbytes(rng.choice((0, 1, rng.randrange(300), rng.randrange(900))))
            for _ in range(rng.randint(1, 12))]


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Original:
    directory = str(tmp_path_factory.mktemp("corruption") / "original")
    rng = random.Random(20240611)
    records: list[bytes] = []
    boundaries = {0}
    now = [1_700_000_000_000]
    log = CommitLog(directory, LogConfig(segment_max_bytes=SEGMENT_MAX_BYTES),
                    clock_ms=lambda: now[0])
    for k in range(60):
        batch = _records_for_chunk(rng, k)
        now[0] += 7
        r = log.append(batch)
        assert r.start == len(records)
        records.extend(batch)
        boundaries.add(r.stop)
    assert len(log.segments) >= 6
    log.close()
    files = sorted(os.listdir(directory))
    assert {f.rsplit(".", 1)[-1] for f in files} == {"segment", "index", CHECKPOINT_NAME,
                                                     MARKER_NAME}, files
    chunk_starts = {}
    for name in files:
        if name.endswith(".segment"):
            with open(os.path.join(directory, name), "rb") as f:
                raw = f.read()
            starts, pos = [], 0
            while pos < len(raw):
                starts.append(pos)
                pos += parse_header(raw, pos).size
            chunk_starts[name] = starts
    return Original(directory, records, frozenset(boundaries), files, chunk_starts)


# -- damage ---------------------------------------------------------------------------------
# A damage step is (kind, file kind, file number, argument). The file number picks among the
# original's segment (or index) files, oldest first, modulo their count; positions and
# lengths are taken modulo the file's size when the step runs, so earlier steps never make
# later ones invalid and everything shrinks towards "first file, byte 0".
_file_numbers = st.integers(0, 63)
_positions = st.integers(0, 2**32 - 1)

damage_steps = st.one_of(
    st.tuples(st.just("truncate"), st.sampled_from(["segment", "index"]), _file_numbers,
              _positions),
    st.tuples(st.just("flip"), st.sampled_from(["segment", "index"]), _file_numbers,
              st.lists(st.tuples(_positions, st.integers(1, 255)), min_size=1, max_size=4)),
    # bytes of chunk headers (counts, offsets, lengths, timestamp, epoch... are not all
    # covered by the CRC): (chunk number, byte of the header, xor mask)
    st.tuples(st.just("flip_header"), st.just("segment"), _file_numbers,
              st.lists(st.tuples(st.integers(0, 63), st.integers(0, HEADER_SIZE - 1),
                                 st.integers(1, 255)), min_size=1, max_size=3)),
    st.tuples(st.just("delete"), st.just("index"), _file_numbers, st.none()),
    st.tuples(st.just("garbage"), st.sampled_from(["segment", "index"]), _file_numbers,
              st.binary(min_size=1, max_size=200)),
)
damage_plans = st.lists(damage_steps, min_size=1, max_size=4)


def apply_damage(directory: str, original: Original, steps) -> set[tuple[int, str]]:
    """Apply ``steps``; return the (base offset, "segment" or "index") of the files changed."""
    touched = set()
    for kind, suffix, number, arg in steps:
        names = [f for f in original.files if f.endswith("." + suffix)]
        name = names[number % len(names)]
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            continue
        size = os.path.getsize(path)
        if kind == "truncate":
            os.truncate(path, arg % (size + 1))
        elif kind in ("flip", "flip_header"):
            if kind == "flip_header":
                starts = original.chunk_starts[name]
                arg = [(starts[chunk % len(starts)] + byte, mask) for chunk, byte, mask in arg]
                arg = [(pos, mask) for pos, mask in arg if pos < size]
            if not size or not arg:
                continue
            with open(path, "r+b") as f:
                for pos, mask in arg:
                    pos %= size
                    f.seek(pos)
                    byte = f.read(1)[0]
                    f.seek(pos)
                    f.write(bytes([byte ^ mask]))
        elif kind == "delete":
            os.unlink(path)
        else:
            with open(path, "ab") as f:
                f.write(arg)
        touched.add((int(name.rsplit(".", 1)[0]), suffix))
    return touched


# -- reading --------------------------------------------------------------------------------
def read_all(log: CommitLog, start: int | None = None):
    """(offset, record) pairs from ``start`` (default first_offset) following chunks, and the
    CorruptChunkError that stopped the read (or None)."""
    out = []
    offset = log.first_offset if start is None else start
    while True:
        try:
            chunks = log.read_chunks(offset, 8192)
        except CorruptChunkError as exc:
            return out, exc
        if not chunks:
            return out, None
        for ch in chunks:
            out.extend(ch.records())
        offset = chunks[-1].header.next_offset


def assert_prefix(got, original: Original, what: str) -> int:
    """``got`` is exactly records 0..n-1 of the original; returns n."""
    for i, (off, rec) in enumerate(got):
        assert off == i, f"{what}: record #{i} has offset {off} (gap, duplicate or skip)"
        assert i < len(original.records), f"{what}: offset {off} was never written"
        assert rec == original.records[i], f"{what}: record at offset {off} has wrong bytes"
    return len(got)


def _new_records(n: int) -> list[bytes]:
    return [f"appended-after-damage-{i}".encode() * (i % 5) for i in range(n)]


def check_damaged_log(original: Original, steps, verify_on_open: bool) -> int:
    """Copy, damage, open, read, append, reopen and read (asserting all along); returns the
    number of original records that survived the damage."""
    with tempfile.TemporaryDirectory(prefix="riverlog-corrupt-") as tmp:
        directory = os.path.join(tmp, "log")
        shutil.copytree(original.directory, directory)
        touched = apply_damage(directory, original, steps)
        config = LogConfig(segment_max_bytes=SEGMENT_MAX_BYTES, verify_on_open=verify_on_open)

        log = CommitLog(directory, config)  # must not raise
        try:
            assert log.first_offset == 0, (
                f"first_offset is {log.first_offset}: records 0..{log.first_offset - 1} were "
                f"dropped while later ones are kept (report: {log.report})")
            got, err = read_all(log)
            n = assert_prefix(got, original, "after damage")
            nxt = log.next_offset
            assert nxt <= len(original.records), f"next_offset {nxt} past the original end"
            if verify_on_open:
                assert err is None, f"verify_on_open=True, yet a read raised {err!r}"
            if err is None:
                assert n == nxt, (f"reading stopped at offset {n} without error but "
                                  f"next_offset is {nxt}")
                assert n in original.boundaries, f"the log ends inside an original chunk ({n})"
            else:
                base = int(os.path.basename(err.path).rsplit(".", 1)[0])
                assert base in {b for b, _ in touched}, (
                    f"CorruptChunkError in {err.path}, which was not damaged ({err})")
                assert n < nxt, f"CorruptChunkError at offset {n} but next_offset is {nxt}"
            # nothing undamaged is given up: every segment before the first damaged file is
            # kept whole, and (the index being a cache) damage to index files alone loses
            # nothing -- with verify_on_open, indexes are not even trusted
            damaged = {b for b, kind in touched if kind == "segment" or not verify_on_open}
            must_keep = min(damaged, default=len(original.records))
            if err is None and all(kind == "index" for _, kind in touched):
                must_keep = len(original.records)
            assert n >= must_keep, (
                f"only {n} records survive, but the first {must_keep} were not damaged "
                f"(report: {log.report})")

            new = _new_records(7)
            appended = log.append(new)
            assert appended == range(nxt, nxt + len(new)), (appended, nxt)
            assert log.next_offset == nxt + len(new)
            tail, tail_err = read_all(log, nxt)
            assert tail_err is None, f"reading the new records raised {tail_err!r}"
            assert tail == list(zip(appended, new))
        finally:
            log.close()

        log = CommitLog(directory, config)
        try:
            assert log.first_offset == 0
            assert log.next_offset == appended.stop, (
                f"after reopen next_offset is {log.next_offset}, expected {appended.stop}")
            tail, tail_err = read_all(log, nxt)
            assert tail_err is None, f"reading the new records after reopen raised {tail_err!r}"
            assert tail == list(zip(appended, new)), "appended records changed after reopen"
            again, again_err = read_all(log)
            if err is None:
                assert again_err is None, f"after reopen a read raised {again_err!r}"
                assert again == got + list(zip(appended, new))
            else:  # still a prefix of what the log held, and nothing readable before is lost
                assert again[:n] == got, "records readable before the reopen were lost"
                expected = original.records[:nxt] + new
                for i, (off, rec) in enumerate(again):
                    assert off == i and rec == expected[i], f"after reopen: bad record at {off}"
        finally:
            log.close()
        return n


@pytest.mark.parametrize("verify_on_open", [True, False], ids=["verify", "trust-index"])
@settings(max_examples=300, deadline=None)
@given(steps=damage_plans)
# damage that found bugs once, kept as fixed examples
@example(steps=[("truncate", "segment", 0, 0)])  # the first segment emptied
@example(steps=[("truncate", "segment", 3, 0)])  # a middle segment emptied
@example(steps=[("flip", "index", 2, [(0, 0x80)])])  # offset of an index entry >= 2**63
@example(steps=[("flip", "index", 0, [(48, 0x80)])])  # epoch of an index entry >= 2**63
@example(steps=[("flip_header", "segment", 0, [(1, 16, 0x80)])])  # chunk epoch >= 2**63
@example(steps=[("delete", "index", 2, None),  # ... found while rebuilding the index
                ("flip_header", "segment", 2, [(0, 16, 0x80)])])
def test_damaged_log_opens_serves_a_prefix_and_keeps_appending(original, verify_on_open, steps):
    check_damaged_log(original, steps, verify_on_open)


def test_damage_free_copy_reads_back_whole(original):
    """The harness itself: an undamaged copy reads back exactly, in both modes."""
    assert check_damaged_log(original, [], True) == len(original.records)
    assert check_damaged_log(original, [], False) == len(original.records)
