# Reads across the segments of one commit log: finding the chunk that holds an offset (or a
# timestamp, or the newest one) and cutting the run of chunks one read returns, with or
# without a bloom filter. Owns no state: the commit log hands in its segments, their base
# offsets and the limit readers may see (the committed offset, or the last one).
# Rules: a read never goes past the limit nor past the end of one segment; it returns at
# least one chunk when there is one to read, at most ``max_bytes`` (but one chunk always)
# and ``max_chunks`` (0: no limit); an offset in a gap left by compaction starts at the next
# chunk.
from __future__ import annotations

from bisect import bisect_right
from typing import Callable, Sequence

from .bloom import BloomCache
from .chunk import CHUNK_USER
from .segment import ChunkSlice, Segment

__all__ = ["bytes_from", "last_chunk", "locate", "offset_for_timestamp", "read_matching", "run",
           "run_end"]


def locate(segments: Sequence[Segment], bases: Sequence[int], offset: int,
           limit: int) -> tuple[Segment, int] | None:
    """``(segment, index position)`` of the chunk holding ``offset`` (or the next one), None
    when there is none at or below ``limit``. ``bases``: the segments' base offsets."""
    if offset > limit:
        return None
    s = max(bisect_right(bases, offset) - 1, 0)
    while s < len(segments):
        seg = segments[s]
        i = seg.index.find_offset(offset)
        if i < len(seg.index):
            return (seg, i) if seg.index.offsets[i] <= limit else None
        s += 1
    return None


def run_end(seg: Segment, i: int, limit: int, max_bytes: int, max_chunks: int,
            wanted: Callable[[int], bool] | None = None) -> int:
    """End (exclusive index position) of the run of chunks read together from chunk ``i``:
    committed (first offset <= ``limit``), within ``max_bytes`` (but at least one chunk)
    and ``max_chunks`` (0: no limit), and each ``wanted`` (when given)."""
    idx = seg.index
    stop = i + 1
    start_pos = idx.positions[i]
    last = min(len(idx), i + max_chunks) if max_chunks > 0 else len(idx)
    while (stop < last and idx.offsets[stop] <= limit
           and seg.chunk_end(stop) - start_pos <= max_bytes
           and (wanted is None or wanted(stop))):
        stop += 1
    return stop


def run(segments: Sequence[Segment], bases: Sequence[int], offset: int, limit: int,
        max_bytes: int, max_chunks: int) -> tuple[Segment, int, int] | None:
    """``(segment, first, stop)`` index positions of the run of chunks one read from
    ``offset`` returns (``locate``, then ``run_end``); None when there is none."""
    found = locate(segments, bases, offset, limit)
    if found is None:
        return None
    return found[0], found[1], run_end(found[0], found[1], limit, max_bytes, max_chunks)


def read_matching(segments: Sequence[Segment], bases: Sequence[int], offset: int, limit: int,
                  blooms: BloomCache, matches: Callable[[bytes], bool], max_bytes: int,
                  max_chunks: int, verify: bool, buffer: bytearray | None,
                  max_skip: int) -> tuple[list[ChunkSlice], int]:
    """From the chunk holding ``offset`` (``locate``) on: skip (at most ``max_skip``) chunks
    whose bloom filter ``matches`` refuses without reading their data, then read the run of
    consecutive accepted ones (see CommitLog.read_matching_chunks). Returns
    ``(chunks, resume)``."""
    found = locate(segments, bases, offset, limit)
    if found is None:
        return [], offset
    seg, i = found
    idx, filters, load = seg.index, blooms.of(seg), blooms.load
    n = len(idx)
    stop_skip = i + max_skip

    def wanted(j: int) -> bool:
        bloom = filters[j]
        if bloom is None:
            bloom = load(seg, filters, j)
        return bloom is None or matches(bloom)  # an unreadable header: read it, check it

    while i < n and i < stop_skip and idx.offsets[i] <= limit and not wanted(i):
        i += 1
    if i == n:
        return [], seg.next_offset
    if i == stop_skip or idx.offsets[i] > limit:
        return [], idx.offsets[i]
    stop = run_end(seg, i, limit, max_bytes, max_chunks, wanted)
    chunks = seg.read_chunks(i, stop, verify, buffer)
    return chunks, chunks[-1].header.next_offset


def offset_for_timestamp(segments: Sequence[Segment], timestamp_ms: int,
                         next_offset: int) -> int:
    """First offset of the first chunk whose timestamp is >= ``timestamp_ms`` (ms since the
    epoch); ``next_offset`` when every chunk is older."""
    for seg in segments:
        idx = seg.index
        if len(idx) and idx.timestamps[-1] >= timestamp_ms:
            return idx.offsets[idx.find_timestamp(timestamp_ms)]
    return next_offset


def last_chunk(segments: Sequence[Segment], limit: int,
               user_only: bool = False) -> tuple[Segment, int] | None:
    """``(segment, index position)`` of the newest chunk whose first offset is at or below
    ``limit`` (with ``user_only``: of type CHUNK_USER, tracking chunks passed over, reading
    two bytes of each header it looks at, newest first); None when there is none."""
    for seg in reversed(segments):
        idx = seg.index
        for i in range(bisect_right(idx.offsets, limit) - 1, -1, -1):
            if not user_only or seg.chunk_type(i) == CHUNK_USER:
                return seg, i
    return None


def bytes_from(segments: Sequence[Segment], offset: int) -> int:
    """Bytes on disk of the chunks from the one holding ``offset`` to the end (0 when
    ``offset`` is at or past the end)."""
    total = 0
    for seg in reversed(segments):
        if seg.next_offset <= offset:
            break
        i = seg.index.find_offset(offset)
        total += seg.size - (seg.index.positions[i] if i < len(seg.index) else seg.size)
    return total
