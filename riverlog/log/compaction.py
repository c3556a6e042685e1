# Compaction by key: rewrite closed segments keeping only the newest record of each key.
# Owns the key map, the rewritten segment files and their crash-safe installation.
# Rules: runs in a worker thread on a snapshot of the segments and touches only closed
# segments whose records are all committed; records with no key and sub-batch entries are
# kept (one that cannot be read too, its keys unknown); a kept run of consecutive offsets
# becomes one chunk (so offsets may have gaps between chunks, never inside one); a chunk kept
# whole is copied byte for byte.
# A compaction is described by its point (end, upto): every record below ``end`` whose key has
# a newer record at or below ``upto`` is removed. A leader's compaction takes its closed,
# committed segments (end: where they end; upto: the committed offset); a follower applies its
# leader's point to its own segments, wherever they begin and end, so both hold the same
# records (a record at ``end`` or above is kept as it is).
# Crash safety: the new file is fsynced, a ".compacted" marker is written, then the new
# file replaces the old one by rename; recovery accepts either state. The point is then saved
# in the partition's folder (file `compaction-point`, text "<end> <upto>"), so a restarted
# leader sends it to its followers at once; a crash before that leaves the previous point,
# which removes no more than what the segments show (a follower keeps records meanwhile).
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

from . import chunk as chunkfmt
from .index import ENTRY
from .segment import (COMPACTED_SUFFIX, INDEX_SUFFIX, SEGMENT_SUFFIX, Segment, fsync_dir,
                      segment_name, write_atomically, write_compacted_marker)

_READ_BYTES = 4 * 1024 * 1024
POINT_NAME = "compaction-point"
"""File name of the saved compaction point in a partition's folder."""


class CompactionPoint(NamedTuple):
    """What a compaction removed: every record below offset ``end`` whose key has a newer
    record at or below offset ``upto`` (records without a key and sub-batches excepted)."""

    end: int
    upto: int

    def covers(self, other: "CompactionPoint") -> bool:
        """Whether applying ``other`` after this one would remove nothing more."""
        return self.end >= other.end and self.upto >= other.upto

    @classmethod
    def parse(cls, text: str) -> "CompactionPoint | None":
        """The point written ``"<end> <upto>"`` (the saved file, COMPACTION_HEADER): two
        decimal offsets below 2**64 with ``end <= upto + 1``, as every compaction makes it
        (a larger ``end`` would remove records above ``upto``, the newest of their keys);
        None for anything else."""
        fields = text.split()
        if len(fields) != 2 or not all(n.isascii() and n.isdigit() and len(n) <= 20
                                       for n in fields):
            return None
        end, upto = int(fields[0]), int(fields[1])
        return cls(end, upto) if end <= upto + 1 and upto < 1 << 64 else None


def load_point(directory: str) -> tuple[CompactionPoint | None, str | None]:
    """``(point, problem)``: the point saved in ``directory`` (None when there is none), and
    why a file that exists was not read (it does not hold a point, ``CompactionPoint.parse``;
    the point is then None: a follower keeps more records until the next compaction, a
    leader sends its point after its next one). Raises OSError for I/O errors."""
    path = os.path.join(directory, POINT_NAME)
    try:
        with open(path, "rb") as f:
            raw = f.read(64)
    except FileNotFoundError:
        return None, None
    point = CompactionPoint.parse(raw.decode("ascii", "replace"))
    if raw.endswith(b"\n") and point is not None:
        return point, None
    return None, f"{path}: not a compaction point ({raw[:32]!r}); read as none"


def save_point(directory: str, point: CompactionPoint | None) -> None:
    """Save ``point`` in ``directory`` crash-safely (None removes the file). Raises OSError."""
    path = os.path.join(directory, POINT_NAME)
    if point is not None:
        write_atomically(path, b"%d %d\n" % point)
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_dir(directory)


@dataclass(slots=True)
class CompactionResult:
    """What a compaction did: its ``point`` (None when it did nothing: no segment to
    compact, or a follower's not ready yet), segments rewritten (by base offset; ``emptied``
    lists those left with no record, kept as empty files so offsets stay contiguous across
    segments), and the record and byte counts before and after over those segments."""

    point: CompactionPoint | None = None
    rewritten: list[int] = field(default_factory=list)
    emptied: list[int] = field(default_factory=list)
    records_before: int = 0
    records_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


def _iter_chunks(seg: Segment, upto: int):
    """Chunks of ``seg`` whose first offset is <= ``upto``, read in large batches."""
    i, n = 0, len(seg.index)
    while i < n and seg.index.offsets[i] <= upto:
        stop = i + 1
        while (stop < n and seg.index.offsets[stop] <= upto
               and seg.chunk_end(stop) - seg.index.positions[i] <= _READ_BYTES):
            stop += 1
        yield from seg.read_chunks(i, stop, True)
        i = stop


def _latest_offsets(segments: Sequence[Segment], committed: int,
                    key_of: Callable[[bytes], bytes | None]) -> dict[bytes, int]:
    latest: dict[bytes, int] = {}
    for seg in segments:
        for chunk in _iter_chunks(seg, committed):
            if chunk.header.chunk_type != chunkfmt.CHUNK_USER:
                continue
            for offset, record in chunk.records(chunkfmt.ignore_unreadable):
                if offset > committed:
                    break
                key = key_of(record)
                if key is not None:
                    latest[key] = offset
    return latest


def _rewrite(seg: Segment, latest: dict[bytes, int], key_of, end: int,
             result: CompactionResult, pinned: list) -> None:
    stem = os.path.join(seg.directory, segment_name(seg.base_offset))
    out_path = stem + SEGMENT_SUFFIX + ".cleaned"
    index_out = stem + INDEX_SUFFIX + ".cleaned"
    entries_out = []  # (first offset, timestamp, epoch, position, records)
    pos = 0
    changed = False
    with open(out_path, "wb") as out:
        for chunk in _iter_chunks(seg, seg.next_offset):
            h = chunk.header
            result.records_before += h.num_records
            runs: list[list] = []  # [first offset, entries, records]
            offset = h.first_offset
            expected = None
            for entry in chunkfmt.iter_entries(chunk.data):
                keep = True
                if (entry.codec is None and h.chunk_type == chunkfmt.CHUNK_USER
                        and offset < end):
                    key = key_of(entry.payload)
                    keep = key is None or latest.get(key, offset) == offset
                if keep:
                    if expected == offset:
                        runs[-1][1].append(entry)
                        runs[-1][2] += entry.records
                    else:
                        runs.append([offset, [entry], entry.records])
                    expected = offset + entry.records
                offset += entry.records
            if len(runs) == 1 and runs[0][2] == h.num_records:
                pieces = [(h.first_offset, h.num_records, chunk.raw)]
            else:
                changed = True
                pieces = []
                bloom = chunkfmt.bloom_of(h, chunk.raw)
                for first, entries, records in runs:
                    data, n_entries, n_records = chunkfmt.join_entries(entries)
                    # the chunk's bloom filter still covers the kept entries
                    raw = chunkfmt.encode_chunk(data, n_entries, n_records, first_offset=first,
                                                timestamp_ms=h.timestamp_ms, epoch=h.epoch,
                                                chunk_type=h.chunk_type, trailer=bytes(bloom),
                                                bloom_size=h.bloom_size)
                    pieces.append((first, n_records, raw))
            for first, records, raw in pieces:
                out.write(raw)
                entries_out.append((first, h.timestamp_ms, h.epoch, pos, records))
                pos += len(raw)
                result.records_after += records
        out.flush()
        os.fsync(out.fileno())
    result.bytes_before += seg.size
    if not changed:
        os.unlink(out_path)
        result.bytes_after += seg.size
        return
    result.bytes_after += pos
    if not entries_out:
        result.emptied.append(seg.base_offset)
    with open(index_out, "wb") as f:
        f.write(b"".join(ENTRY.pack(*e) for e in entries_out))
    seg.file.pin()  # reads keep the old file (its positions) until install_compacted
    pinned.append(seg.file)
    write_compacted_marker(stem + COMPACTED_SUFFIX, seg.next_offset)
    fsync_dir(seg.directory)
    seg.deleted = True  # the new file is fsynced: an fsync running now skips the old one
    try:
        os.replace(out_path, stem + SEGMENT_SUFFIX)
    except BaseException:
        seg.deleted = False
        raise
    os.replace(index_out, stem + INDEX_SUFFIX)
    fsync_dir(seg.directory)
    result.rewritten.append(seg.base_offset)


def compact_segments(segments: Sequence[Segment], committed: int,
                     key_of: Callable[[bytes], bytes | None],
                     point: CompactionPoint | None = None,
                     pinned: list | None = None) -> CompactionResult:
    """Rewrite (in place, crash-safely) every closed, fully committed segment of
    ``segments`` (oldest first, the last one being active), keeping the newest record of
    each key among the committed ones; the result's point is (the end of those segments,
    ``committed``). With ``point`` (a follower applying its leader's), the closed segments
    holding records below ``point.end`` are rewritten by that point instead, provided every
    one of them is committed and the active segment holds none (else nothing is done and the
    result's point is None: try again once more is committed, or after a roll). The
    result's point is saved in the segments' folder (``load_point`` reads it back).
    The file of each rewritten segment is pinned (``LazyFile.pin``) before the new one
    replaces it and added to ``pinned``: the caller unpins them after ``install_compacted``
    (also when this raises), so reads meanwhile use the old file with the old index.
    Blocking: run it in a thread."""
    pinned = [] if pinned is None else pinned
    result = CompactionResult()
    if point is None:
        closed = [s for s in segments[:-1] if len(s.index) and s.next_offset - 1 <= committed]
        if not closed:
            return result
        point = CompactionPoint(closed[-1].next_offset, committed)
    else:
        closed = [s for s in segments[:-1] if len(s.index) and s.base_offset < point.end]
        active = segments[-1]
        if (point.upto > committed or any(s.next_offset - 1 > committed for s in closed)
                or (len(active.index) and active.first_offset < point.end)):
            return result
    latest = _latest_offsets(segments, point.upto, key_of)
    for seg in closed:
        _rewrite(seg, latest, key_of, point.end, result, pinned)
    save_point(segments[-1].directory, point)
    result.point = point
    return result


def unpin_all(files: list) -> None:
    """Unpin the files ``compact_segments`` pinned (see there)."""
    for file in files:
        file.unpin()


def install_compacted(segments: list[Segment], result: CompactionResult) -> list[Segment]:
    """Swap the rewritten segments into ``segments`` (on the owner's thread).
    Returns the new list."""
    out = []
    rewritten = set(result.rewritten)
    for seg in segments:
        if seg.base_offset in rewritten:
            seg.close()
            seg = Segment(seg.directory, seg.base_offset)
            seg.load_trusted()
        out.append(seg)
    return out
