# One segment: a file of back-to-back chunks named by its base offset, plus its chunk index.
# Owns positional writes and reads, fsync and truncation of that file; its descriptor is the
# open-file budget's (files.py: opened on use, closed when idle).
# Rules: bytes past ``size`` are never read (they are a torn or corrupt tail until recovery
# removes them); reads use pread so they never move the append position; everything here
# is synchronous and called from one thread at a time, except ``sync`` which may run in a
# worker thread while the owner keeps appending.
from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from ..errors import CorruptChunkError, LogError
from . import chunk as chunkfmt
from .files import LazyFile
from .index import ChunkIndex

SEGMENT_SUFFIX = ".segment"
INDEX_SUFFIX = ".index"
COMPACTED_SUFFIX = ".compacted"


def read_compacted_marker(path: str) -> int | None:
    """The next offset recorded in a ``.compacted`` marker, or None when there is none
    (a marker too short to read counts as none: the segment is then checked strictly)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
    except FileNotFoundError:
        return None
    return int.from_bytes(raw, "big") if len(raw) == 8 else None


def write_compacted_marker(path: str, next_offset: int) -> None:
    """Write and fsync a ``.compacted`` marker holding ``next_offset`` (u64, big-endian)."""
    with open(path, "wb") as f:
        f.write(next_offset.to_bytes(8, "big"))
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: str) -> None:
    """Fsync the directory ``path`` (makes file creations, renames and deletions in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str, data: bytes) -> None:
    """Replace the file ``path`` with ``data`` crash-safely: a temporary file beside it
    (``path + ".tmp"``, removed by the commit log's open if left over), fsync, rename, fsync of
    the folder. Raises OSError."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def segment_name(base_offset: int) -> str:
    """File stem of the segment whose base offset is ``base_offset``: 20 zero-padded digits."""
    return f"{base_offset:020d}"


@dataclass(slots=True)
class ChunkSlice:
    """A chunk as read from disk: ``raw`` is header + data + trailer, exactly as stored
    (bytes, or a memoryview into a larger read buffer)."""

    header: chunkfmt.ChunkHeader
    raw: bytes | memoryview

    @property
    def data(self) -> memoryview:
        """The entries (data section) of the chunk."""
        h = self.header
        return memoryview(self.raw)[chunkfmt.HEADER_SIZE:chunkfmt.HEADER_SIZE + h.data_length]

    @property
    def header_and_data(self) -> memoryview:
        """What a RabbitMQ Deliver carries: the header and the data, never the trailer."""
        return memoryview(self.raw)[:chunkfmt.HEADER_SIZE + self.header.data_length]

    def records(self, unreadable: chunkfmt.Unreadable | None = None):
        """``(offset, record bytes)`` pairs of this chunk (see ``chunk.iter_records``)."""
        return chunkfmt.iter_records(self.header, self.data, unreadable)


class Segment:
    """A segment file and its index.

    ``size`` is the number of valid bytes (the append position); ``next_offset`` is the offset
    after the segment's last record. ``compacted_end`` is set for a segment rewritten by
    compaction (read from its ``.compacted`` marker, which holds the segment's next offset
    from before compaction as a u64): its chunks may leave gaps between offsets, and its
    next offset stays what it was even when compaction removed its last records.
    ``deleted`` is set once the log deleted the segment or compaction replaced its file: an
    fsync running meanwhile skips it. ``checked`` is a byte position: every chunk that starts
    below it passed its checks in this process (its CRC computed or checked before this
    process appended it, or checked by a ``read_chunks`` with ``verify``); 0 after opening.
    """

    __slots__ = ("directory", "base_offset", "path", "index", "file", "size", "next_offset",
                 "compacted_end", "created_ms", "unsynced", "deleted", "checked")

    def __init__(self, directory: str, base_offset: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        stem = os.path.join(directory, segment_name(base_offset))
        self.path = stem + SEGMENT_SUFFIX
        self.index = ChunkIndex(stem + INDEX_SUFFIX)
        self.file = LazyFile(self.path, os.O_RDWR | os.O_CREAT)
        self.file.open()  # a new segment's file exists from here on
        self.size = 0
        self.next_offset = base_offset
        self.compacted_end = read_compacted_marker(stem + COMPACTED_SUFFIX)
        self.created_ms = 0
        self.unsynced = False
        self.deleted = False
        self.checked = 0

    # -- facts --------------------------------------------------------------------------
    @property
    def compacted(self) -> bool:
        return self.compacted_end is not None

    def indexed_next_offset(self) -> int:
        """Next offset as the chunks tell it (and the compaction marker, when present)."""
        idx = self.index
        n = idx.offsets[-1] + idx.records[-1] if len(idx) else self.base_offset
        return max(n, self.compacted_end or 0)

    @property
    def first_offset(self) -> int:
        """Offset of the first record kept (the base offset unless compaction removed it)."""
        return self.index.offsets[0] if len(self.index) else self.base_offset

    @property
    def num_records(self) -> int:
        return int(sum(self.index.records))

    @property
    def first_timestamp_ms(self) -> int:
        return self.index.timestamps[0] if len(self.index) else 0

    @property
    def last_timestamp_ms(self) -> int:
        return self.index.timestamps[-1] if len(self.index) else 0

    def file_size(self) -> int:
        return self.file.size()

    def chunk_end(self, i: int) -> int:
        """Byte position right after chunk ``i``."""
        idx = self.index
        return idx.positions[i + 1] if i + 1 < len(idx) else self.size

    def load_trusted(self) -> None:
        """Load the index of a segment this process just wrote and fsynced (compaction)
        without checking it chunk by chunk."""
        if not self.index.load():
            raise OSError(f"cannot load the index of {self.path}")
        self.size = self.file_size()
        self.next_offset = self.indexed_next_offset()
        self.created_ms = self.first_timestamp_ms

    # -- writes -------------------------------------------------------------------------
    def allow_gaps(self) -> None:
        """Mark this segment as holding gaps between chunk offsets (a follower appending
        its leader's compacted chunks): the ``.compacted`` marker (with the current next
        offset) makes recovery accept them, as in a segment compaction rewrote."""
        write_compacted_marker(self.path[:-len(SEGMENT_SUFFIX)] + COMPACTED_SUFFIX,
                               self.next_offset)
        fsync_dir(self.directory)
        self.compacted_end = self.next_offset

    def append(self, raw: bytes, first_offset: int, num_records: int, timestamp_ms: int,
               epoch: int) -> None:
        """Write a whole encoded chunk at the end (one pwrite) and index it. The caller
        computed or checked its CRC (CommitLog._write, append_chunks): it counts as checked."""
        written = self.file.pwrite(raw, self.size)
        if written != len(raw):  # the disk is full; the torn tail is overwritten next, or
            raise OSError(errno.ENOSPC, f"short write to {self.path}: {written} of "  # trimmed
                          f"{len(raw)} bytes (no space left on device)")  # by recovery
        self.index.append(first_offset, timestamp_ms, epoch, self.size, num_records)
        if self.checked == self.size:
            self.checked += len(raw)
        self.size += len(raw)
        self.next_offset = first_offset + num_records
        self.unsynced = True

    def sync(self) -> None:
        """Write buffered index entries and fsync the segment file (blocking)."""
        self.index.flush()
        self.file.fsync()

    def truncate_chunks(self, n: int) -> None:
        """Keep the first ``n`` chunks: shrink the file and the index."""
        self.size = self.index.positions[n] if n < len(self.index) else self.size
        self.checked = min(self.checked, self.size)
        self.index.truncate(n)
        self.file.ftruncate(self.size)
        if self.compacted_end is not None:
            self.compacted_end = None
            end = self.indexed_next_offset()
            write_compacted_marker(self.path[:-len(SEGMENT_SUFFIX)] + COMPACTED_SUFFIX, end)
            self.compacted_end = end
        self.next_offset = self.indexed_next_offset()
        self.unsynced = True

    def truncate_at(self, offset: int, verify: bool = True) -> None:
        """Remove every record at ``offset`` and after from this segment (``offset`` at or
        above its base). When ``offset`` falls inside a chunk, that chunk is rewritten with
        its leading records (same header fields, its bloom filter kept: it still covers
        them); raises ``LogError`` when that would split a sub-batch entry. The index is
        rewritten and the file fsynced before this returns."""
        idx = self.index
        i = idx.find_offset(offset)
        keep = None
        if i < len(idx) and idx.offsets[i] < offset:
            (chunk,) = self.read_chunks(i, i + 1, verify)
            keep = _leading_entries(chunk, offset)
        self.truncate_chunks(min(i, len(idx)))
        if keep is not None:
            data, n_entries, n_records = keep
            h = chunk.header
            raw = chunkfmt.encode_chunk(data, n_entries, n_records,
                                        first_offset=h.first_offset, timestamp_ms=h.timestamp_ms,
                                        epoch=h.epoch, chunk_type=h.chunk_type,
                                        trailer=bytes(chunkfmt.bloom_of(h, chunk.raw)),
                                        bloom_size=h.bloom_size)
            self.append(raw, h.first_offset, n_records, h.timestamp_ms, h.epoch)
        self.index.rewrite()
        self.sync()
        self.unsynced = False

    def close(self) -> None:
        self.index.flush()
        self.index.close(final=True)
        self.file.close(final=True)

    def delete(self) -> None:
        """Close and remove the segment and every file named after it (index, markers,
        snapshots kept by the owner: ``<base>.*``)."""
        self.deleted = True  # before the name goes: an fsync running now skips it
        self.close()
        prefix = segment_name(self.base_offset) + "."
        for name in os.listdir(self.directory):
            if name.startswith(prefix):
                try:
                    os.unlink(os.path.join(self.directory, name))
                except FileNotFoundError:
                    pass

    # -- reads --------------------------------------------------------------------------
    def chunk_type(self, i: int) -> int:
        """The chunk type of chunk ``i`` (index position), read from its header alone."""
        return self.file.pread(2, self.index.positions[i])[1]

    def read_chunks(self, start: int, stop: int, verify: bool,
                    buffer: bytearray | None = None) -> list[ChunkSlice]:
        """Chunks ``start`` .. ``stop - 1`` (index positions), read with one pread.

        With ``verify``, each chunk's header must agree with the index and its CRC-32 must
        match; raises ``CorruptChunkError`` otherwise (and the chunks read move ``checked``
        when they start at or below it). With a ``buffer`` at least as large as
        the bytes to read, they are read into it and the chunks are views of it (the caller
        must not reuse the buffer while it still needs them); otherwise into new bytes.
        """
        idx = self.index
        pos = idx.positions[start]
        end = self.chunk_end(stop - 1)
        if buffer is not None and len(buffer) >= end - pos:
            buf = memoryview(buffer)[:end - pos]
            if self.file.preadv([buf], pos) != end - pos:
                raise CorruptChunkError(self.path, pos, idx.offsets[start], "short read")
        else:
            buf = self.file.pread(end - pos, pos)
        view = memoryview(buf)  # chunks share the buffer read once: no copy per chunk
        out = []
        for i in range(start, stop):
            at = idx.positions[i] - pos
            size = self.chunk_end(i) - idx.positions[i]
            try:
                header = chunkfmt.parse_header(buf, at)
                if verify:
                    if (header.first_offset != idx.offsets[i]
                            or header.num_records != idx.records[i]):
                        raise chunkfmt.ChunkFormatError("header disagrees with the index")
                    chunkfmt.check_chunk(buf, header, at, size)
            except chunkfmt.ChunkFormatError as exc:
                raise CorruptChunkError(self.path, idx.positions[i], idx.offsets[i],
                                        str(exc)) from None
            out.append(ChunkSlice(header, view[at:at + size] if stop - start > 1 else buf))
        if verify and pos <= self.checked < end:
            self.checked = end
        return out


def _leading_entries(chunk: ChunkSlice, offset: int) -> tuple[bytes, int, int] | None:
    """The entries of ``chunk`` holding the records before ``offset``, as
    ``(data, entries, records)``, or None if there are none. Raises ``LogError`` when
    ``offset`` falls inside a sub-batch entry."""
    wanted = offset - chunk.header.first_offset
    kept = []
    records = 0
    for entry in chunkfmt.iter_entries(chunk.data):
        if records == wanted:
            break
        if records + entry.records > wanted:
            raise LogError(f"cannot truncate at offset {offset}: it falls inside a sub-batch")
        kept.append(entry)
        records += entry.records
    if not kept:
        return None
    return chunkfmt.join_entries(kept)
