# Recovery on open: of each segment (decide which chunks to trust, trim a torn or corrupt
# tail, rebuild a missing or damaged index), of a partition folder's list of segments (drop
# what does not continue the log) and of its leader-epoch checkpoint; report what was dropped.
# Rules: never raise on bad bytes (only on I/O errors); never keep a chunk that fails its
# checks or breaks offset order; trust index entries up to the last one whose chunk checks,
# and scan everything after it (DESIGN.md, "Recovery on start").
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterator

from ..errors import EpochCheckpointError
from . import chunk as chunkfmt
from . import clean_close
from .epochs import CHECKPOINT_NAME, EpochEntry, LeaderEpochCache, entries_of_chunks
from .segment import COMPACTED_SUFFIX, SEGMENT_SUFFIX, Segment, read_compacted_marker

log = logging.getLogger("riverlog.log.recovery")

_WINDOW = 4 * 1024 * 1024


@dataclass(slots=True)
class RecoveryReport:
    """What opening a partition found: per problem, one line in ``problems``; the bytes and
    the chunks cut from segment tails; whole segments dropped; indexes rebuilt."""

    problems: list[str] = field(default_factory=list)
    truncated_bytes: int = 0
    dropped_segments: list[str] = field(default_factory=list)
    rebuilt_indexes: int = 0
    trusted: bool = False  # the clean-close marker was valid: no chunk was checked

    @property
    def clean(self) -> bool:
        return not (self.problems or self.truncated_bytes or self.dropped_segments)


def _check_indexed_chunk(seg: Segment, i: int, file_size: int) -> int | None:
    """The size on disk of chunk ``i`` of the index when it exists in the file, agrees with
    its entry and passes its checks; None otherwise."""
    idx = seg.index
    pos = idx.positions[i]
    if pos + chunkfmt.HEADER_SIZE > file_size:
        return None
    head = seg.file.pread(chunkfmt.HEADER_SIZE, pos)
    try:
        header = chunkfmt.parse_header(head)
    except chunkfmt.ChunkFormatError:
        return None
    if header.first_offset != idx.offsets[i] or header.num_records != idx.records[i]:
        return None
    known = idx.positions[i + 1] - pos if i + 1 < len(idx) else None
    raw = seg.file.pread(known if known is not None else min(header.max_size,
                                                               file_size - pos), pos)
    try:
        size = chunkfmt.check_chunk(raw, header, 0, known)
        counted = chunkfmt.counts_match(raw, header)
    except chunkfmt.ChunkFormatError:
        return None
    return size if counted else None


class ChunkScanner:
    """Iterate ``(position, header)`` over the valid chunks of a segment file from byte
    ``pos`` (``pread(n, pos)`` reads it), read-only, stopping at the first chunk that fails
    a check.

    ``expected`` is the offset the first chunk must start at; later chunks must follow
    without gaps unless ``allow_gaps`` (a compacted segment: any larger offset). After the
    loop, ``end`` is the byte position after the last good chunk and ``problem`` says why
    the scan stopped early (None when it reached ``file_size``).
    """

    def __init__(self, pread: Callable[[int, int], bytes], pos: int, expected: int,
                 file_size: int, allow_gaps: bool) -> None:
        self.pread, self.end, self.expected = pread, pos, expected
        self.file_size, self.allow_gaps = file_size, allow_gaps
        self.problem: str | None = None

    def __iter__(self) -> Iterator[tuple[int, chunkfmt.ChunkHeader]]:
        pos, expected, file_size = self.end, self.expected, self.file_size
        buf, buf_start = b"", pos
        while pos < file_size:
            if file_size - pos < chunkfmt.HEADER_SIZE:
                self.problem = f"torn chunk header at byte {pos}"
                return
            if pos + chunkfmt.HEADER_SIZE > buf_start + len(buf):
                buf, buf_start = self.pread(_WINDOW, pos), pos
            try:
                header = chunkfmt.parse_header(buf, pos - buf_start)
            except chunkfmt.ChunkFormatError as exc:
                self.problem = f"{exc} at byte {pos}"
                return
            if header.first_offset != expected and not (self.allow_gaps
                                                        and header.first_offset > expected):
                self.problem = (f"chunk at byte {pos} starts at offset {header.first_offset}, "
                                f"expected {expected}")
                return
            want = min(header.max_size, file_size - pos)  # chunk_extent looks that far
            if pos + want > buf_start + len(buf):
                buf, buf_start = self.pread(max(_WINDOW, want), pos), pos
            at = pos - buf_start
            size = chunkfmt.chunk_extent(buf, header, at)
            if pos + size > file_size:
                self.problem = (f"torn chunk at byte {pos} ({size} bytes, "
                                f"{file_size - pos} on disk)")
                return
            try:
                chunkfmt.check_chunk(buf, header, at, size)
                counted = chunkfmt.counts_match(buf, header, at)
            except chunkfmt.ChunkFormatError as exc:
                self.problem = f"{exc} in chunk at byte {pos}"
                return
            if not counted:
                self.problem = (f"entry/record counts disagree with the header of the chunk "
                                f"at byte {pos}")
                return
            yield pos, header
            expected = header.next_offset
            pos += size
            self.end = pos


def recover_segment(seg: Segment, full: bool,
                    report: RecoveryReport) -> bool:
    """Load and check ``seg``; trim what fails. Returns True if data was cut from it.

    The first chunk must start at the segment's base offset (or later, in a compacted
    segment). ``full`` checks every chunk instead of trusting the index.
    """
    file_size = seg.file_size()
    idx = seg.index
    loaded = not full and idx.load()
    if loaded and len(idx) and (idx.offsets[0] < seg.base_offset or idx.positions[0] != 0):
        loaded = False
    if not loaded:
        idx.clear()
        if file_size and not full:
            report.rebuilt_indexes += 1
            report.problems.append(f"{idx.path}: index missing or damaged, rebuilt")

    # trust the index up to the last entry whose chunk checks; scan from there
    trusted, size = len(idx) - 1, None
    while trusted >= 0:
        size = _check_indexed_chunk(seg, trusted, file_size)
        if size is not None:
            break
        trusted -= 1
    indexed_before = len(idx)
    idx.truncate(trusted + 1)
    if trusted >= 0 and size is not None:
        pos = idx.positions[trusted] + size
        expected = idx.offsets[trusted] + idx.records[trusted]
        min_ts = idx.timestamps[trusted]
    else:
        pos, min_ts, expected = 0, 0, seg.base_offset
    scan = ChunkScanner(seg.file.pread, pos, expected, file_size, seg.compacted)
    for chunk_pos, header in scan:
        min_ts = max(header.timestamp_ms, min_ts)  # keep index timestamps non-decreasing
        idx.append(header.first_offset, min_ts, header.epoch, chunk_pos, header.num_records)
    end, why = scan.end, scan.problem
    if len(idx) != indexed_before or not loaded:
        idx.rewrite()
    seg.size = end
    seg.next_offset = seg.indexed_next_offset()
    seg.created_ms = seg.first_timestamp_ms
    cut = file_size - end
    if why is None and not cut:
        return False
    report.problems.append(f"{seg.path}: {why or 'trailing bytes'}; truncated {cut} bytes "
                           f"after offset {seg.next_offset - 1}")
    report.truncated_bytes += cut
    seg.file.ftruncate(end)
    seg.file.fsync()
    return True


def verify_partition(directory: str) -> RecoveryReport:
    """Check every chunk (header, entries, CRC-32) of every segment in a partition folder,
    read-only: no file is changed. ``problems`` names each damaged place and
    ``truncated_bytes`` counts the bytes from there to the end of each damaged segment."""
    report = RecoveryReport()
    names = sorted(n for n in os.listdir(directory) if n.endswith(SEGMENT_SUFFIX))
    expected = None
    for name in names:
        path = os.path.join(directory, name)
        base = int(name[:-len(SEGMENT_SUFFIX)])
        end_mark = read_compacted_marker(path[:-len(SEGMENT_SUFFIX)] + COMPACTED_SUFFIX)
        compacted = end_mark is not None
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            start = base
            if expected is not None and base != expected:
                report.problems.append(f"{path}: starts at offset {base}, the previous "
                                       f"segment ends before offset {expected}")
            scan = ChunkScanner(partial(os.pread, fd), 0, start, size, compacted)
            last = None
            for _, header in scan:
                last = header
        finally:
            os.close(fd)
        if scan.problem:
            report.problems.append(f"{path}: {scan.problem}")
            report.truncated_bytes += size - scan.end
        expected = max(last.next_offset if last else start, end_mark or 0)
    return report


def open_segments(directory: str, verify: bool, report: RecoveryReport,
                  now_ms: int) -> list[Segment]:
    """The segments of the partition folder ``directory``, oldest first, each recovered
    (``recover_segment``, ``verify``: check every chunk); leftovers of an interrupted
    compaction (``*.cleaned``, ``*.tmp``) are removed; a segment that does not start where
    the one before it ends, or follows a truncated one, is dropped and reported. An empty
    folder gets one empty segment at offset 0. ``created_ms`` of each: its first
    timestamp, else ``now_ms``. When the folder's clean-close marker is valid
    (clean_close.py; ``report.trusted``) each index is loaded as it is, no chunk checked,
    unless it does not load. Raises OSError only for I/O errors."""
    names = sorted(n for n in os.listdir(directory) if n.endswith(SEGMENT_SUFFIX)
                   and n[:-len(SEGMENT_SUFFIX)].isdigit())
    for leftover in os.listdir(directory):
        if leftover.endswith((".cleaned", ".tmp")):
            os.unlink(os.path.join(directory, leftover))
    segments: list[Segment] = []
    expected = None
    cut = False
    trusted = report.trusted = bool(names) and not verify and clean_close.is_clean(
        directory, names)
    for name in names:
        seg = Segment(directory, int(name[:-len(SEGMENT_SUFFIX)]))
        if cut or (expected is not None and seg.base_offset != expected):
            reason = ("follows a truncated segment" if cut else
                      f"starts at offset {seg.base_offset} but the log before it ends "
                      f"before offset {expected}")
            report.problems.append(f"{seg.path}: dropped, {reason}")
            report.dropped_segments.append(seg.path)
            report.truncated_bytes += seg.file_size()
            seg.delete()
            cut = True
            continue
        if trusted and seg.index.load():
            seg.size = seg.file_size()
            seg.next_offset = seg.indexed_next_offset()
            segments.append(seg)
            expected = seg.next_offset
            continue
        cut = recover_segment(seg, verify, report)
        segments.append(seg)
        expected = seg.next_offset
    if not segments:
        segments.append(Segment(directory, 0))
    for seg in segments:
        seg.created_ms = seg.first_timestamp_ms or now_ms
    return segments


def open_epochs(directory: str, segments: list[Segment],
                report: RecoveryReport) -> LeaderEpochCache:
    """The leader-epoch checkpoint of the folder, rebuilt from the chunk epochs of
    ``segments`` when it does not parse (reported), or is missing while the log has chunks
    (written before riverlog kept one); what recovery cut or retention removed is dropped."""
    path = os.path.join(directory, CHECKPOINT_NAME)
    first = next((seg.first_offset for seg in segments if len(seg.index)),
                 segments[-1].next_offset)
    end = segments[-1].next_offset

    def chunk_epochs() -> list[EpochEntry]:
        return entries_of_chunks((offset, epoch) for seg in segments
                                 for offset, epoch in zip(seg.index.offsets, seg.index.epochs))

    try:
        cache = LeaderEpochCache(path)
    except EpochCheckpointError as exc:  # logged with the other recovery problems
        report.problems.append(f"{exc}; rebuilt from the epochs of the chunks")
        cache = LeaderEpochCache(path, load=False)
        cache.replace(chunk_epochs())
    else:
        if not os.path.exists(path) and end > first:
            cache.replace(chunk_epochs())
    cache.truncate_from_end(end)
    cache.truncate_from_start(first)
    return cache
