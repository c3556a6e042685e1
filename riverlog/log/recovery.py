# Recovery of a segment on open: decide which chunks to trust, trim a torn or corrupt tail,
# rebuild a missing or damaged index, and report what was dropped.
# Rules: never raise on bad bytes (only on I/O errors); never keep a chunk that fails its
# checks or breaks offset order; trust index entries up to the last one whose chunk checks,
# and scan everything after it (DESIGN.md, "Recovery on start").
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from . import chunk as chunkfmt
from .segment import Segment

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

    @property
    def clean(self) -> bool:
        return not (self.problems or self.truncated_bytes or self.dropped_segments)


def _check_indexed_chunk(seg: Segment, i: int, file_size: int) -> bool:
    """Does chunk ``i`` of the index exist in the file, agree with its entry and pass CRC?"""
    idx = seg.index
    pos = idx.positions[i]
    if pos + chunkfmt.HEADER_SIZE > file_size:
        return False
    head = os.pread(seg.fd, chunkfmt.HEADER_SIZE, pos)
    try:
        header = chunkfmt.parse_header(head)
    except chunkfmt.ChunkFormatError:
        return False
    if (header.first_offset != idx.offsets[i] or header.num_records != idx.records[i]
            or pos + header.size > file_size):
        return False
    if i + 1 < len(idx) and idx.positions[i + 1] != pos + header.size:
        return False
    raw = os.pread(seg.fd, header.size, pos)
    try:
        chunkfmt.check_chunk(raw, header)
        entries, records = chunkfmt.count_entries(
            memoryview(raw)[chunkfmt.HEADER_SIZE:chunkfmt.HEADER_SIZE + header.data_length])
    except chunkfmt.ChunkFormatError:
        return False
    return entries == header.num_entries and records == header.num_records


def _scan(seg: Segment, pos: int, expected: int, min_ts: int,
          file_size: int) -> tuple[int, str | None]:
    """Append to the index every valid chunk from byte ``pos`` on; stop at the first bad one.

    ``expected`` is the offset the next chunk must start at (any offset >= it in a compacted
    segment). Returns the byte position after the last good chunk, and why the scan stopped
    early (None when it reached the file end).
    """
    buf, buf_start = b"", pos
    while pos < file_size:
        if file_size - pos < chunkfmt.HEADER_SIZE:
            return pos, f"torn chunk header at byte {pos}"
        if pos + chunkfmt.HEADER_SIZE > buf_start + len(buf):
            buf, buf_start = os.pread(seg.fd, _WINDOW, pos), pos
        try:
            header = chunkfmt.parse_header(buf, pos - buf_start)
        except chunkfmt.ChunkFormatError as exc:
            return pos, f"{exc} at byte {pos}"
        if header.first_offset != expected and not (seg.compacted
                                                    and header.first_offset > expected):
            return pos, (f"chunk at byte {pos} starts at offset {header.first_offset}, "
                         f"expected {expected}")
        if pos + header.size > file_size:
            return pos, f"torn chunk at byte {pos} ({header.size} bytes, {file_size - pos} on disk)"
        if pos + header.size > buf_start + len(buf):
            buf, buf_start = os.pread(seg.fd, max(_WINDOW, header.size), pos), pos
        at = pos - buf_start
        try:
            chunkfmt.check_chunk(buf, header, at)
            start = at + chunkfmt.HEADER_SIZE
            counts = chunkfmt.count_entries(memoryview(buf)[start:start + header.data_length])
        except chunkfmt.ChunkFormatError as exc:
            return pos, f"{exc} in chunk at byte {pos}"
        if counts != (header.num_entries, header.num_records):
            return pos, f"entry/record counts disagree with the header of the chunk at byte {pos}"
        ts = max(header.timestamp_ms, min_ts)
        seg.index.append(header.first_offset, ts, header.epoch, pos, header.num_records)
        min_ts = ts
        expected = header.next_offset
        pos += header.size
    return pos, None


def recover_segment(seg: Segment, expected_base: int, full: bool,
                    report: RecoveryReport) -> bool:
    """Load and check ``seg``; trim what fails. Returns True if data was cut from it.

    ``expected_base`` is the lowest offset its first chunk may start at (the previous
    segment's next offset). ``full`` checks every chunk instead of trusting the index.
    """
    file_size = seg.file_size()
    idx = seg.index
    loaded = not full and idx.load()
    if loaded and len(idx) and (idx.offsets[0] < expected_base or idx.positions[0] != 0):
        loaded = False
    if not loaded:
        idx.clear()
        if file_size and not full:
            report.rebuilt_indexes += 1
            report.problems.append(f"{idx.path}: index missing or damaged, rebuilt")

    # trust the index up to the last entry whose chunk checks; scan from there
    trusted = len(idx) - 1
    while trusted >= 0 and not _check_indexed_chunk(seg, trusted, file_size):
        trusted -= 1
    indexed_before = len(idx)
    idx.truncate(trusted + 1)
    if trusted >= 0:
        head = os.pread(seg.fd, chunkfmt.HEADER_SIZE, idx.positions[trusted])
        pos = idx.positions[trusted] + chunkfmt.parse_header(head).size
        expected = idx.offsets[trusted] + idx.records[trusted]
        min_ts = idx.timestamps[trusted]
    else:
        pos, min_ts = 0, 0
        expected = expected_base if seg.compacted else max(expected_base, seg.base_offset)
    end, why = _scan(seg, pos, expected, min_ts, file_size)
    if len(idx) != indexed_before or not loaded:
        idx.rewrite()
    seg.size = end
    seg.next_offset = (idx.offsets[-1] + idx.records[-1]) if len(idx) else seg.base_offset
    seg.created_ms = seg.first_timestamp_ms
    cut = file_size - end
    if why is None and not cut:
        return False
    report.problems.append(f"{seg.path}: {why or 'trailing bytes'}; truncated {cut} bytes "
                           f"after offset {seg.next_offset - 1}")
    report.truncated_bytes += cut
    os.ftruncate(seg.fd, end)
    os.fsync(seg.fd)
    return True
