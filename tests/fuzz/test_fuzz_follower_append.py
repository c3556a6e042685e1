# Fuzzing a follower's append of its leader's chunks (CommitLog.append_chunks) with what a
# replication response may carry when something is wrong: a leader's chunks with bytes
# flipped, cut, repeated, spliced with garbage, or shifted to another offset or epoch. The
# contract (commitlog.py): append_chunks raises ChunkRefusedError and leaves the log as it was,
# or appends whole chunks that pass every check; nothing else, whatever the bytes, and the log
# then reopens without recovery cutting anything.
from __future__ import annotations

import tempfile

from hypothesis import event, given
from hypothesis import strategies as st

from riverlog.config import LogConfig
from riverlog.errors import ChunkRefusedError
from riverlog.log import CommitLog
from riverlog.log.chunk import HEADER_SIZE, encode_chunk, encode_entries, parse_header

from ._budget import budget

_CONFIG = LogConfig(segment_max_bytes=4096)


def _leader_raw() -> bytes:
    """Four chunks a leader wrote from offset 0: epochs 1, 1, 2, 2."""
    raw = []
    first = 0
    for n, epoch in enumerate((1, 1, 2, 2)):
        records = [bytes([n]) * (10 * n + 1)] * (n + 1)
        raw.append(encode_chunk(encode_entries(records), len(records), len(records),
                                first_offset=first, timestamp_ms=1_700_000_000_000 + n,
                                epoch=epoch))
        first += len(records)
    return b"".join(raw)


_RAW = _leader_raw()
_FIRST = _RAW[:parse_header(_RAW).size]

damages = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, len(_RAW) - 1), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, len(_RAW)), st.integers(0, len(_RAW))),
    st.tuples(st.just("splice"), st.integers(0, len(_RAW)), st.binary(max_size=64)),
    st.tuples(st.just("repeat"), st.integers(0, len(_RAW)), st.integers(0, len(_RAW))),
    st.tuples(st.just("shift"), st.integers(-3, 3), st.integers(-2, 2)),
)


def _damage(raw: bytes, damage) -> bytes:
    kind, a, b = damage
    if kind == "flip":  # positions taken modulo the size: earlier steps may have cut
        if not raw:
            return raw
        a %= len(raw)
        return raw[:a] + bytes([raw[a] ^ b]) + raw[a + 1:]
    if kind == "cut":
        return raw[min(a, b):max(a, b)]
    if kind == "splice":
        return raw[:a] + b + raw[a:]
    if kind == "repeat":
        return raw + raw[min(a, b):max(a, b)]
    # shift: the leader's first chunk, re-encoded for another offset and epoch
    data = _FIRST[HEADER_SIZE:]
    return encode_chunk(data, 1, 1, first_offset=max(0, a), timestamp_ms=1, epoch=max(0, 1 + b))


@budget(300)
@given(st.lists(damages, min_size=1, max_size=3), st.booleans())
def test_append_chunks_refuses_or_appends_whole_checked_chunks(steps, prefill):
    raw = _RAW
    for step in steps:
        raw = _damage(raw, step)
    with tempfile.TemporaryDirectory() as directory:
        log = CommitLog(directory, _CONFIG, auto_commit=False)
        if prefill:
            log.append_chunks(_FIRST)
        before = (log.next_offset, [s.size for s in log.segments], log.epochs.entries)
        try:
            appended = log.append_chunks(raw)
        except ChunkRefusedError as exc:
            event("refused")
            assert exc.offset == log.next_offset
            assert (log.next_offset, [s.size for s in log.segments],
                    log.epochs.entries) == before
        else:
            event("appended")
            assert appended.start == before[0] and appended.stop == log.next_offset
        log.close()
        again = CommitLog(directory, _CONFIG, auto_commit=False)
        assert again.report.clean, again.report.problems
        assert again.next_offset == log.next_offset
        again.close()
