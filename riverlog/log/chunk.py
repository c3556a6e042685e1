# The osiris chunk: the unit riverlog writes to disk and RabbitMQ consumers receive as is.
# Owns the 48-byte header, the entry encodings inside the data section, where the bloom
# filter and the trailer sit, and the checks a chunk must pass (magic, lengths, CRC-32 of the
# data, the trailer check). Pure functions on bytes: no files, no asyncio.
# Layout on disk: header | data | bloom filter | trailer | trailer check. ``trailer_length``
# counts the trailer alone, osiris tracking records exactly as osiris writes them; the bloom
# filter is counted apart (``bloom_size``) as in osiris, which puts it before the data (here
# after it, so header and data stay one slice for Deliver); the trailer check, a CRC-32 of
# bloom filter and trailer, is counted by neither (present when either is). Chunks written
# before (docs/commit-log.md, "The old trailer layout") counted the filter in
# ``trailer_length`` and had no trailer check: ``check_chunk``/``chunk_extent`` tell them apart.
# Rules: a compressed sub-batch inflates into a buffer of its declared uncompressed size (at
# most MAX_SUB_BATCH_BYTES) and is refused as soon as it would overflow it, so reading costs
# what the publisher declared, never what a bomb would inflate to; a sub-batch that cannot
# be read spoils only its own records (readers may skip it and go on).
# count_entries runs once per record of every chunk a follower appends (check_chunks) and
# recovery checks: a compiled twin (_chunk_c.pyx, riverlog/_compiled.py) is bound over it when
# built, unless RIVERLOG_NO_EXTENSIONS is set; the Python one stays the reference.
# Wire facts: ../shared/reference/rabbitmq-stream-protocol.md, "Osiris chunk" (osiris_log.erl).
from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import cramjam
from isal.isal_zlib import crc32  # CRC-32 (IEEE, as zlib's) with ISA-L's SIMD code: ~10x zlib

from .._compiled import twin

MAGIC_VERSION = 0x50
"""Byte 0 of every chunk: magic 5 in the high nibble, version 0 in the low nibble."""

CHUNK_USER = 0
CHUNK_TRACKING_DELTA = 1
CHUNK_TRACKING_SNAPSHOT = 2

HEADER = struct.Struct(">BBHIqQQIIIB3x")
"""magic/version u8, chunk type u8, entries u16, records u32, timestamp ms i64, epoch u64,
chunk id (first offset) u64, CRC-32 of the data u32, data length u32, trailer length u32,
bloom filter size u8, 3 reserved bytes: 48 bytes, big-endian."""
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 48
TRAILER_CHECK_SIZE = 4
"""The trailer check: CRC-32 (u32) of the bloom filter and the trailer, right after them."""
LEGACY_WRITER_TAG = 0x57
"""'W': the first byte of every record in an old-layout trailer (``broker/tracking.py``)."""

MAX_ENTRIES = 0xFFFF
_MAX_I64 = 1 << 63
_U32 = struct.Struct(">I")
_SUB_BATCH = struct.Struct(">BHII")  # flags|codec, records u16, uncompressed length u32, length u32

SUB_BATCH_NONE = 0
SUB_BATCH_GZIP = 1
SUB_BATCH_SNAPPY = 2
SUB_BATCH_LZ4 = 3
SUB_BATCH_ZSTD = 4
_CODECS = {SUB_BATCH_GZIP: cramjam.gzip, SUB_BATCH_SNAPPY: cramjam.snappy,
           SUB_BATCH_LZ4: cramjam.lz4, SUB_BATCH_ZSTD: cramjam.zstd}

MAX_SUB_BATCH_BYTES = 16 * 1024 * 1024
"""The largest uncompressed size of a compressed sub-batch riverlog inflates (bytes). The
clients' sub-entry batches stay far below: they hold at most 65535 records and must fit one
publish frame compressed (frame_max, 1 MiB by default)."""


class ChunkFormatError(ValueError):
    """Bytes that are not a valid chunk (or entry); ``reason`` says which check failed."""


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    """The decoded 48-byte header. ``size`` is the whole chunk on disk in the current
    layout: header + data + bloom filter (``bloom_size`` bytes, 0 when no entry carried a
    filter value; see ``bloom.py``) + trailer (``trailer_length`` bytes of osiris tracking
    records, ``broker/tracking.py``) + the trailer check; ``legacy_size`` the old layout's."""

    chunk_type: int
    num_entries: int
    num_records: int
    timestamp_ms: int
    epoch: int
    first_offset: int
    crc: int
    data_length: int
    trailer_length: int
    bloom_size: int

    @property
    def size(self) -> int:
        """Bytes on disk in the current layout: header, data, bloom filter, trailer and the
        4-byte trailer check (when there is a filter or a trailer)."""
        extra = self.bloom_size + self.trailer_length
        return HEADER_SIZE + self.data_length + extra + (TRAILER_CHECK_SIZE if extra else 0)

    @property
    def legacy_size(self) -> int | None:
        """Bytes on disk if the chunk was written in the old layout (``trailer_length``
        counting the bloom filter, no trailer check); None when that layout cannot hold
        this header or would take the same bytes (no filter, no trailer)."""
        if not self.trailer_length or self.trailer_length < self.bloom_size:
            return None
        return HEADER_SIZE + self.data_length + self.trailer_length

    @property
    def max_size(self) -> int:
        """The most bytes the chunk may take on disk, whichever its layout: what
        ``chunk_extent`` needs to see (or the file's end) to tell the layouts apart."""
        return max(self.size, self.legacy_size or 0)

    @property
    def next_offset(self) -> int:
        """Offset right after this chunk's last record."""
        return self.first_offset + self.num_records


def parse_header(buf: bytes | memoryview, pos: int = 0) -> ChunkHeader:
    """Decode the header at ``buf[pos:pos+48]``.

    Raises ``ChunkFormatError`` when fewer than 48 bytes remain, the magic byte is not 0x50,
    or the first offset or epoch is 2^63 or more (riverlog keeps both as signed 64-bit).
    """
    if len(buf) - pos < HEADER_SIZE:
        raise ChunkFormatError("short header")
    (magic, ctype, entries, records, ts, epoch, first, crc, dlen, tlen,
     bloom) = HEADER.unpack_from(buf, pos)
    if magic != MAGIC_VERSION:
        raise ChunkFormatError(f"bad magic/version byte 0x{magic:02x}")
    if first >= _MAX_I64 or epoch >= _MAX_I64:  # u64 on the wire; riverlog never writes these
        raise ChunkFormatError("offset or epoch out of range")
    return ChunkHeader(ctype, entries, records, ts, epoch, first, crc, dlen, tlen, bloom)


def encode_chunk(data: bytes, num_entries: int, num_records: int, *, first_offset: int,
                 timestamp_ms: int, epoch: int = 0, chunk_type: int = CHUNK_USER,
                 trailer: bytes = b"", bloom_size: int = 0) -> bytes:
    """Build a whole chunk ready to write: header, ``data``, ``trailer`` and, when
    ``trailer`` is not empty, the trailer check (CRC-32 of ``trailer``, u32).

    ``data`` is the already-encoded entries (see ``encode_entries``); its CRC-32 (IEEE, the
    polynomial zlib uses) goes in the header. ``trailer`` is what follows the data: the
    bloom filter (its first ``bloom_size`` bytes), then osiris tracking records; the
    header's trailer length counts the records alone, as osiris_log:make_chunk does.
    Raises ``ValueError`` for counts out of the header's ranges.
    """
    if not 0 < num_entries <= MAX_ENTRIES:
        raise ValueError(f"a chunk holds 1..{MAX_ENTRIES} entries, got {num_entries}")
    if num_records < num_entries:
        raise ValueError("a chunk has at least one record per entry")
    if not 0 <= bloom_size <= min(len(trailer), 255):
        raise ValueError(f"bloom filter of {bloom_size} bytes in a trailer of {len(trailer)}")
    header = HEADER.pack(MAGIC_VERSION, chunk_type, num_entries, num_records, timestamp_ms,
                         epoch, first_offset, crc32(data), len(data),
                         len(trailer) - bloom_size, bloom_size)
    check = _U32.pack(crc32(trailer)) if trailer else b""
    return b"".join((header, data, trailer, check))


def encode_entries(records: Sequence[bytes]) -> bytes:
    """Encode records as simple entries: ``0|len:31`` (u32, top bit clear) then the bytes."""
    pack = _U32.pack
    parts = []
    append = parts.append
    for record in records:
        n = len(record)
        if n > 0x7FFF_FFFF:
            raise ValueError("a record is at most 2^31-1 bytes")
        append(pack(n))
        append(record)
    return b"".join(parts)


def _trailer_checks(buf: bytes | memoryview, header: ChunkHeader, pos: int) -> bool:
    """Does the current layout's trailer check of the chunk at ``buf[pos:]`` match?"""
    start = pos + HEADER_SIZE + header.data_length
    end = start + header.bloom_size + header.trailer_length
    if end + TRAILER_CHECK_SIZE > len(buf):
        return False
    return crc32(memoryview(buf)[start:end]) == _U32.unpack_from(buf, end)[0]


def _legacy_fits(buf: bytes | memoryview, header: ChunkHeader, pos: int) -> bool:
    """Can the chunk at ``buf[pos:]`` be one in the old layout? Its trailer records start
    with 'W' (then ``broker/tracking.py`` checks each record's CRC); a trailer that is only
    the bloom filter has nothing to check."""
    size = header.legacy_size
    if size is None or pos + size > len(buf):
        return False
    records = pos + HEADER_SIZE + header.data_length + header.bloom_size
    return header.trailer_length == header.bloom_size or buf[records] == LEGACY_WRITER_TAG


def chunk_extent(buf: bytes | memoryview, header: ChunkHeader, pos: int = 0) -> int:
    """The bytes the chunk at ``buf[pos:]`` takes on disk: ``header.size``, or its
    ``legacy_size`` when it was written in the old layout. The current layout is the one
    whose trailer check matches; failing that, the old one when its bytes fit it (a chunk
    that fits neither, damaged, gets ``header.size`` and fails ``check_chunk``). ``buf``
    must hold ``header.max_size`` bytes from ``pos`` unless it ends where the stored bytes
    end (a file's end, a replication payload's), or a new chunk may be taken for an old
    one."""
    if header.legacy_size is None or _trailer_checks(buf, header, pos):
        return header.size
    return header.legacy_size if _legacy_fits(buf, header, pos) else header.size


def check_chunk(buf: bytes | memoryview, header: ChunkHeader, pos: int = 0,
                size: int | None = None) -> int:
    """Verify that ``buf[pos:]`` holds the whole chunk described by ``header``: counts,
    the data section's CRC-32, and the trailer check (in the old layout: its records'
    tag). ``size`` is the chunk's extent when known (the index's), else it is found as
    ``chunk_extent`` does. Returns the chunk's size on disk. Raises ``ChunkFormatError``."""
    if size is None:
        size = chunk_extent(buf, header, pos)
    if size != header.size and size != header.legacy_size:
        raise ChunkFormatError(f"chunk of {size} bytes, its header says {header.size}")
    if len(buf) < pos + size:
        raise ChunkFormatError("truncated chunk")
    if header.num_entries == 0 or header.num_records < header.num_entries:
        raise ChunkFormatError("impossible entry/record counts")
    start = pos + HEADER_SIZE
    if crc32(memoryview(buf)[start:start + header.data_length]) != header.crc:
        raise ChunkFormatError("CRC-32 mismatch")
    if size == header.size:
        if header.bloom_size + header.trailer_length and not _trailer_checks(buf, header, pos):
            raise ChunkFormatError("trailer check mismatch (bloom filter or trailer damaged)")
    elif not _legacy_fits(buf, header, pos):
        raise ChunkFormatError("damaged trailer (old layout)")
    return size


def trailer_of(header: ChunkHeader, raw: bytes | memoryview) -> tuple[memoryview, bool]:
    """The trailer records of the whole chunk ``raw`` (exactly its bytes on disk) and
    whether they are in the old layout (riverlog's 'W' records, ``broker/tracking.py``)
    rather than osiris tracking records."""
    start = HEADER_SIZE + header.data_length + header.bloom_size
    legacy = header.size != len(raw) and header.legacy_size == len(raw)
    length = header.trailer_length - (header.bloom_size if legacy else 0)
    return memoryview(raw)[start:start + length], legacy


def check_chunks(buf: bytes | memoryview, expected: int,
                 epoch: int) -> list[tuple[int, int, ChunkHeader, int]]:
    """Check back-to-back whole chunks (a leader's, for a follower's append): each passes
    ``check_chunk`` (the old trailer layout too), its entry and record counts are those of
    its header (what recovery checks on open), it starts at or after where the one before
    ends (``expected`` for the first: a gap is what compaction left) and has an epoch not
    older than the one before (``epoch`` for the first). Returns ``(position, expected first
    offset, header, size in bytes)`` of each; raises ChunkFormatError naming the first chunk
    that fails."""
    out = []
    pos = 0
    while pos < len(buf):
        try:
            h = parse_header(buf, pos)
            size = check_chunk(buf, h, pos)
            problem = (None if counts_match(buf, h, pos)
                       else "entry/record counts disagree with the header")
        except ChunkFormatError as exc:
            problem = str(exc)
        else:
            if h.first_offset < expected:
                problem = f"chunk starts at offset {h.first_offset}"
            elif h.epoch < epoch:
                problem = f"chunk of leader epoch {h.epoch}, older than epoch {epoch}"
        if problem:
            raise ChunkFormatError(f"the chunk at byte {pos} (for offset {expected}): {problem}")
        out.append((pos, expected, h, size))
        pos, expected, epoch = pos + size, h.next_offset, h.epoch
    return out


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a chunk's data section.

    ``records`` is the number of records it holds (1 for a simple entry); ``codec`` is
    ``None`` for a simple entry, else the sub-batch compression codec (0 none .. 4 zstd);
    ``payload`` is the record bytes (simple) or the sub-batch body as stored (maybe
    compressed); ``raw`` is the entry exactly as stored, header included; ``uncompressed``
    is the size of the payload uncompressed, as the sub-batch header declares it (bytes).
    """

    records: int
    codec: int | None
    payload: bytes
    raw: bytes
    uncompressed: int


def iter_entries(data: bytes | memoryview) -> Iterator[Entry]:
    """Walk the entries of a data section. Raises ``ChunkFormatError`` on a malformed entry."""
    data = memoryview(data)
    pos, end = 0, len(data)
    while pos < end:
        entry, pos = _entry_at(data, pos, end)
        yield entry


def _entry_at(data: bytes | memoryview, pos: int, end: int) -> tuple[Entry, int]:
    """The entry at ``data[pos:]`` (the data section ends at ``end``) and the position after
    it. Raises ``ChunkFormatError`` when it is malformed."""
    if end - pos < 4:
        raise ChunkFormatError("truncated entry header")
    if data[pos] & 0x80 == 0:
        (n,) = _U32.unpack_from(data, pos)
        stop = pos + 4 + n
        if stop > end:
            raise ChunkFormatError("entry longer than the data section")
        return Entry(1, None, bytes(data[pos + 4:stop]), bytes(data[pos:stop]), n), stop
    if end - pos < _SUB_BATCH.size:
        raise ChunkFormatError("truncated sub-batch header")
    flags, count, uncompressed, n = _SUB_BATCH.unpack_from(data, pos)
    stop = pos + _SUB_BATCH.size + n
    if stop > end or count == 0:
        raise ChunkFormatError("malformed sub-batch entry")
    return Entry(count, (flags >> 4) & 0x7, bytes(data[pos + _SUB_BATCH.size:stop]),
                 bytes(data[pos:stop]), uncompressed), stop


def counts_match(buf: bytes | memoryview, header: ChunkHeader, pos: int = 0) -> bool:
    """Whether the entries and records of the chunk at ``buf[pos:]`` are those its header
    counts (what recovery checks on open, and a follower before it appends). Raises
    ChunkFormatError when the data section does not parse."""
    start = pos + HEADER_SIZE
    return count_entries(memoryview(buf)[start:start + header.data_length]) == \
        (header.num_entries, header.num_records)


def count_entries(data: bytes | memoryview) -> tuple[int, int]:
    """Return ``(entries, records)`` of an encoded data section, validating its structure as
    ``iter_entries`` does (the same ChunkFormatError on the same bytes) without building the
    entries: a follower counts every chunk it appends (check_chunks), once per record."""
    entries = records = 0
    pos, end = 0, len(data)
    u32, sub_batch, sub_size = _U32.unpack_from, _SUB_BATCH.unpack_from, _SUB_BATCH.size
    while pos < end:
        if end - pos < 4:
            raise ChunkFormatError("truncated entry header")
        if data[pos] & 0x80 == 0:
            pos += 4 + u32(data, pos)[0]
            if pos > end:
                raise ChunkFormatError("entry longer than the data section")
            records += 1
        else:
            if end - pos < sub_size:
                raise ChunkFormatError("truncated sub-batch header")
            _, count, _, n = sub_batch(data, pos)
            pos += sub_size + n
            if pos > end or count == 0:
                raise ChunkFormatError("malformed sub-batch entry")
            records += count
        entries += 1
    return entries, records


# The compiled twin (_chunk_c.pyx, riverlog/_compiled.py): count_entries bound over the Python
# one above, which stays as the reference (_py_count_entries) and the fallback.
_py_count_entries = count_entries


def _bind_twin(compiled) -> None:
    """Hand the twin the error class and its fallback (also for tests that import it
    directly)."""
    compiled._bind(ChunkFormatError, _py_count_entries)


_c = twin(__name__, "_chunk_c")
if _c is not None:
    _bind_twin(_c)
    count_entries = _c.count_entries  # noqa: F811


def bloom_of(header: ChunkHeader, raw: bytes | memoryview) -> memoryview:
    """The bloom filter bytes of the whole chunk ``raw`` (empty when it has none)."""
    start = HEADER_SIZE + header.data_length
    return memoryview(raw)[start:start + header.bloom_size]


def decompress_sub_batch(codec: int, body: bytes, uncompressed: int) -> bytes | bytearray:
    """Uncompress a sub-batch body (codec 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd) in the
    framing the RabbitMQ clients write (rabbitmq-stream-java-client CompressionUtils, Go
    client aggregation.go): gzip; snappy framing format (xerial
    SnappyFramedOutputStream, golang/snappy NewBufferedWriter), not raw snappy; LZ4 frame
    format (LZ4FrameOutputStream, pierrec/lz4 Writer), not a bare block; zstd frame(s),
    with or without the content size.

    ``uncompressed`` is the size the sub-batch header declares (bytes); the body must
    inflate to exactly that, as the clients' decoders require too (rstream's
    GzipCompressionCodec.uncompress, the Java client's buffer of that size). It is inflated
    into a buffer of that size and stopped as soon as it would overflow, so a bomb costs
    no more than its declared size. Codec 0 is returned as is.

    Raises ``ChunkFormatError`` for an unknown codec, undecodable bytes, a body that
    inflates to another size, or a declared size above MAX_SUB_BATCH_BYTES.
    """
    if codec == SUB_BATCH_NONE:
        return body
    module = _CODECS.get(codec)
    if module is None:
        raise ChunkFormatError(f"unknown sub-batch codec {codec}")
    if uncompressed > MAX_SUB_BATCH_BYTES:
        raise ChunkFormatError(f"sub-batch codec {codec}: declares {uncompressed} bytes "
                               f"uncompressed, more than {MAX_SUB_BATCH_BYTES}")
    out = bytearray(uncompressed + 1)  # one byte more: a longer body is seen, not cut
    try:
        n = module.decompress_into(body, out)
    except Exception as exc:  # the codecs raise their own types; a full buffer included
        raise ChunkFormatError(f"sub-batch codec {codec}: {exc} (declared size "
                               f"{uncompressed} bytes)") from exc
    if n != uncompressed:
        raise ChunkFormatError(f"sub-batch codec {codec}: inflates to {n} bytes, not the "
                               f"declared {uncompressed}")
    del out[n:]
    return out


def split_sub_batch(codec: int, body: bytes, count: int, uncompressed: int) -> list[bytes]:
    """The records of a sub-batch: uncompressed body is ``[len:u32, record]...``;
    ``uncompressed`` is its declared uncompressed size (see ``decompress_sub_batch``)."""
    plain = memoryview(decompress_sub_batch(codec, body, uncompressed))
    out, pos = [], 0
    for _ in range(count):
        if len(plain) - pos < 4:
            raise ChunkFormatError("sub-batch shorter than its record count")
        (n,) = _U32.unpack_from(plain, pos)
        pos += 4
        if pos + n > len(plain):
            raise ChunkFormatError("sub-batch record longer than the body")
        out.append(bytes(plain[pos:pos + n]))
        pos += n
    return out


Unreadable = Callable[[int, int, ChunkFormatError], None]
"""Told of a sub-batch that cannot be read: (its first offset, its records, the error)."""


def ignore_unreadable(first: int, records: int, error: ChunkFormatError) -> None:
    """An ``Unreadable`` for readers that have nothing to do with those records (e.g. a
    timestamp search, compaction, which keeps sub-batches as they are)."""


def log_unreadable(logger: logging.Logger, where: str) -> Unreadable:
    """An ``Unreadable`` that logs a warning naming ``where`` (e.g. the stream) and the
    skipped offsets."""
    def report(first: int, records: int, error: ChunkFormatError) -> None:
        logger.warning("%s: offsets %d..%d skipped, their sub-batch cannot be read: %s",
                       where, first, first + records - 1, error)
    return report


def iter_records(header: ChunkHeader, data: bytes | memoryview,
                 unreadable: Unreadable | None = None) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, record bytes)`` for every record of a chunk, sub-batches unpacked.

    Records are numbered from ``header.first_offset``. Raises ``ChunkFormatError`` on
    malformed entries or a record count that disagrees with the header, and on a sub-batch
    that cannot be read unless ``unreadable`` is given: then that sub-batch is reported to
    it and its records are skipped (their offsets stay unused), and the records after it
    are yielded as usual.
    """
    offset = header.first_offset
    # a reader's hot path (Subscribe, Spark): a simple entry is sliced straight from one
    # bytes copy of the data section, without an Entry
    if type(data) is not bytes:
        data = bytes(data)
    pos, end = 0, len(data)
    unpack = _U32.unpack_from
    while pos < end:
        if data[pos] & 0x80 == 0 and end - pos >= 4:
            stop = pos + 4 + unpack(data, pos)[0]
            if stop > end:
                raise ChunkFormatError("entry longer than the data section")
            yield offset, data[pos + 4:stop]
            offset += 1
            pos = stop
            continue
        entry, pos = _entry_at(data, pos, end)  # a sub-batch (or a malformed entry: raises)
        try:
            records = split_sub_batch(entry.codec, entry.payload, entry.records,
                                      entry.uncompressed)
        except ChunkFormatError as exc:
            if unreadable is None:
                raise
            unreadable(offset, entry.records, exc)
            offset += entry.records
            continue
        for record in records:
            yield offset, record
            offset += 1
    if offset != header.next_offset:
        raise ChunkFormatError("record count disagrees with the header")


def check_entry(raw: bytes | memoryview) -> None:
    """Read one entry (header included) to its last record: a sub-batch is inflated and
    split. Raises ``ChunkFormatError`` when any of it cannot be read."""
    entries = list(iter_entries(raw))
    if len(entries) != 1:
        raise ChunkFormatError("not exactly one entry")
    entry = entries[0]
    if entry.codec is not None:
        split_sub_batch(entry.codec, entry.payload, entry.records, entry.uncompressed)


def join_entries(entries: Iterable[Entry]) -> tuple[bytes, int, int]:
    """Concatenate stored entries into a data section: ``(data, entries, records)``."""
    raws, n, records = [], 0, 0
    for entry in entries:
        raws.append(entry.raw)
        n += 1
        records += entry.records
    return b"".join(raws), n, records
