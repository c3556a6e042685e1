# The chunk index of one segment: one fixed-size entry per chunk, on disk and in memory.
# Owns the index file format and the binary searches by offset and by timestamp.
# Rules: the index is a cache of the segment (it can always be rebuilt by scanning the
# segment), so it is written lazily and never fsynced; entries are only ever appended or
# truncated, never rewritten in place; its descriptor is the open-file budget's (files.py).
from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_left, bisect_right

from .files import LazyFile

ENTRY = struct.Struct(">QqQII")
"""first offset u64, timestamp ms i64, epoch u64, file position u32, records u32: 32 bytes."""
ENTRY_SIZE = ENTRY.size
assert ENTRY_SIZE == 32


class ChunkIndex:
    """In-memory arrays of a segment's chunks, mirrored to an index file.

    Per chunk: first offset, timestamp (ms), epoch, file position (bytes) and record count.
    Lookups are O(log n). Appends are buffered and written by ``flush``.
    """

    __slots__ = ("path", "offsets", "timestamps", "epochs", "positions", "records",
                 "_file", "_flushed")

    def __init__(self, path: str) -> None:
        self.path = path
        self.offsets = array("q")
        self.timestamps = array("q")
        self.epochs = array("q")
        self.positions = array("q")
        self.records = array("q")
        self._file = LazyFile(path, os.O_WRONLY | os.O_CREAT)  # opened by the first flush
        self._flushed = 0  # entries already written to the file

    def __len__(self) -> int:
        return len(self.offsets)

    # -- file ---------------------------------------------------------------------------
    def load(self) -> bool:
        """Read the index file into memory. Returns False (and loads nothing) when the file is
        missing, its size is not a multiple of 32 bytes, or entries are not strictly
        increasing in offset and position: the caller then rebuilds it from the segment."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return False
        if len(raw) % ENTRY_SIZE:
            return False
        prev_offset = prev_pos = -1
        for first, ts, epoch, pos, records in ENTRY.iter_unpack(raw):
            if (first <= prev_offset or pos <= prev_pos or records == 0
                    or first >= 1 << 63 or epoch >= 1 << 63):
                self.clear()
                return False
            self._append(first, ts, epoch, pos, records)
            prev_offset, prev_pos = first, pos
        self._flushed = len(self.offsets)
        return True

    def rewrite(self) -> None:
        """Write the whole in-memory index to the file (after a rebuild or truncation)."""
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(self._encode(0, len(self.offsets)))
        os.replace(tmp, self.path)
        self.close()
        self._flushed = len(self.offsets)

    def flush(self) -> None:
        """Append the buffered entries to the index file (no fsync: the index is a cache)."""
        n = len(self.offsets)
        if self._flushed == n:
            return
        self._file.pwrite(self._encode(self._flushed, n), self._flushed * ENTRY_SIZE)
        self._flushed = n

    def close(self, final: bool = False) -> None:
        """Close the index file (``final``: for good, see LazyFile.close)."""
        self._file.close(final)

    def _encode(self, start: int, stop: int) -> bytes:
        pack = ENTRY.pack
        return b"".join(pack(self.offsets[i], self.timestamps[i], self.epochs[i],
                             self.positions[i], self.records[i]) for i in range(start, stop))

    # -- memory -------------------------------------------------------------------------
    def _append(self, first: int, ts: int, epoch: int, pos: int, records: int) -> None:
        self.offsets.append(first)
        self.timestamps.append(ts)
        self.epochs.append(epoch)
        self.positions.append(pos)
        self.records.append(records)

    def append(self, first: int, ts: int, epoch: int, pos: int, records: int) -> None:
        """Record a chunk just written at byte ``pos`` (kept in memory until ``flush``)."""
        self._append(first, ts, epoch, pos, records)

    def clear(self) -> None:
        self.truncate(0)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` entries, in memory and in the file."""
        for arr in (self.offsets, self.timestamps, self.epochs, self.positions, self.records):
            del arr[n:]
        if self._flushed > n:
            self._flushed = n
            if os.path.exists(self.path):
                os.truncate(self.path, n * ENTRY_SIZE)

    # -- lookups ------------------------------------------------------------------------
    def find_offset(self, offset: int) -> int:
        """Index of the chunk holding ``offset``, or of the first chunk after it when the
        offset falls in a gap (compaction) or before the first chunk; ``len(self)`` if the
        offset is past the last chunk."""
        i = bisect_right(self.offsets, offset) - 1
        if i < 0:
            return 0
        if offset < self.offsets[i] + self.records[i]:
            return i
        return i + 1

    def find_timestamp(self, timestamp_ms: int) -> int:
        """Index of the first chunk whose timestamp is >= ``timestamp_ms`` (timestamps are
        kept non-decreasing by the log), or ``len(self)`` if none."""
        return bisect_left(self.timestamps, timestamp_ms)
