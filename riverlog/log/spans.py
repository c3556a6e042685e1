# Chunks served from their segment file without reading their data into Python: a
# ``ChunkSpan`` is one chunk's 48-byte header (read) and where its data section lies in the
# file, for a front door that sends the data with os.sendfile (as osiris does). Owns which
# chunks may be served that way and the reads of their headers.
# Rules: with ``verify`` (LogConfig.verify_reads) a chunk becomes a span only below its
# segment's ``checked`` mark, i.e. once this process checked its CRC (it wrote the chunk, or
# Segment.read_chunks read and checked it); a chunk above the mark is read and checked by
# Segment.read_chunks first (and served from the bytes it checked), so a chunk is never served
# unchecked. A span is used within the event-loop turn that made it: later, retention or
# compaction may have removed its file.
from __future__ import annotations

from dataclasses import dataclass

from ..errors import CorruptChunkError
from .chunk import HEADER_SIZE, ChunkFormatError, ChunkHeader, parse_header
from .files import LazyFile
from .segment import ChunkSlice, Segment

__all__ = ["ChunkSpan", "read_spans"]


@dataclass(slots=True)
class ChunkSpan:
    """One stored chunk as a Deliver carries it: ``head`` (its 48 header bytes as stored,
    decoded as ``header``), then ``header.data_length`` data bytes at byte ``position`` of
    ``file`` (its segment file), never the bloom filter or trailer after them."""

    header: ChunkHeader
    head: bytes
    file: LazyFile
    position: int

    @property
    def size(self) -> int:
        """Bytes a Deliver carries of this chunk: header and data."""
        return HEADER_SIZE + self.header.data_length

    def sendfile(self, out_fd: int, sent: int) -> int:
        """Send the data section from byte ``sent`` on (what was sent before) to the socket
        ``out_fd`` with one os.sendfile; the bytes it took (0: the file ended early). Raises
        BlockingIOError when a non-blocking socket takes nothing now, OSError otherwise."""
        return self.file.sendfile(out_fd, self.position + sent, self.header.data_length - sent)

    def data_from(self, start: int) -> bytes:
        """The data section from byte ``start`` on, read from the file (for what a socket did
        not take). Raises CorruptChunkError when the file ends before it, OSError."""
        want = self.header.data_length - start
        data = self.file.pread(want, self.position + start)
        if len(data) != want:
            raise CorruptChunkError(self.file.path, self.position - HEADER_SIZE,
                                    self.header.first_offset, "short read")
        return data


def read_spans(seg: Segment, start: int, stop: int, verify: bool, min_bytes: int,
               buffer: bytearray | None) -> list[ChunkSpan] | list[ChunkSlice]:
    """Chunks ``start`` .. ``stop - 1`` (index positions) of ``seg``: as spans, one 48-byte
    pread each, up to the first that may not be one: smaller than ``min_bytes`` (whole, on
    disk) or, with ``verify``, not below ``seg.checked``. When chunk ``start`` may not be
    one: the run up to the next that may, read (into ``buffer``) and checked by
    Segment.read_chunks. With ``verify`` each span's header must agree with the index.
    Raises CorruptChunkError when a check fails, OSError."""
    idx = seg.index

    def may_be_span(i: int) -> bool:
        pos = idx.positions[i]
        return seg.chunk_end(i) - pos >= min_bytes and not (verify and pos >= seg.checked)

    if not may_be_span(start):
        end = start + 1
        while end < stop and not may_be_span(end):
            end += 1
        return seg.read_chunks(start, end, verify, buffer)
    out: list[ChunkSpan] = []
    for i in range(start, stop):
        if not may_be_span(i):
            break
        pos, end = idx.positions[i], seg.chunk_end(i)
        head = seg.file.pread(HEADER_SIZE, pos)
        try:
            header = parse_header(head)
            if verify and (header.first_offset != idx.offsets[i]
                           or header.num_records != idx.records[i]):
                raise ChunkFormatError("header disagrees with the index")
            if pos + HEADER_SIZE + header.data_length > end:
                raise ChunkFormatError("data length past the chunk's end")
        except ChunkFormatError as exc:
            raise CorruptChunkError(seg.path, pos, idx.offsets[i], str(exc)) from None
        out.append(ChunkSpan(header, head, seg.file, pos + HEADER_SIZE))
    return out
