# Reading committed chunks of a partition's segment files for a table writer (the Parquet
# mirror, riverlog.tables.writer, and the Iceberg table, riverlog.tables.iceberg_writer).
# Rules: read-only, positional reads of local segment files (never through the server);
# every chunk read is checked (CRC) and only user chunks are returned (tracking chunks are
# not records a consumer sees); a read never goes past the chunk reaching the asked end (the
# committed offset bounds it, so a torn or unsynced tail is never touched). Where the last
# read of a segment stopped is remembered, so the next pass does not scan it again.
from __future__ import annotations

import os
from typing import Iterator

from ..log.chunk import CHUNK_USER, HEADER_SIZE, check_chunk, chunk_extent, parse_header
from ..log.segment import SEGMENT_SUFFIX, ChunkSlice, segment_name

READ_BYTES = 32 * 1024 * 1024
"""Bytes of chunks read and converted at a time."""


def segment_path(log_dir: str, base: int) -> str:
    """The segment file of base offset ``base`` in the partition folder ``log_dir``."""
    return os.path.join(log_dir, segment_name(base) + SEGMENT_SUFFIX)


class SegmentRuns:
    """Runs of checked user chunks read from segment files, resuming where the last read of
    a segment stopped."""

    def __init__(self) -> None:
        self._resume: dict[str, tuple[int, int]] = {}  # segment path -> (offset, position)

    def runs(self, fd: int, path: str, start: int, end: int,
              size: int) -> Iterator[list[ChunkSlice]]:
        """User chunks holding offsets of ``[start, end)``, READ_BYTES at a time, each
        checked (CRC); stops after the chunk reaching ``end`` (never reads past it)."""
        offset, pos = self._resume.get(path, (-1, 0))
        if offset > start:
            pos = 0
        while pos < size:
            block = os.pread(fd, min(READ_BYTES, size - pos), pos)
            if len(block) < HEADER_SIZE:
                return
            need = min(parse_header(block).max_size, size - pos)
            if need > len(block):  # one chunk larger than READ_BYTES
                block = os.pread(fd, need, pos)
            view = memoryview(block)
            at, run, done = 0, [], False
            while at + HEADER_SIZE <= len(block):
                h = parse_header(block, at)
                if at + min(h.max_size, size - pos - at) > len(block):
                    break  # chunk_extent must see the whole chunk: read on from here
                n = chunk_extent(block, h, at)
                if h.first_offset >= end:
                    done = True
                    break
                if h.next_offset > start:
                    check_chunk(block, h, at, n)
                    if h.chunk_type == CHUNK_USER:
                        run.append(ChunkSlice(h, view[at:at + n]))
                at += n
                self._resume[path] = (h.next_offset, pos + at)
                if h.next_offset >= end:
                    done = True
                    break
            if run:
                yield run
            pos += at
            if done:
                return
