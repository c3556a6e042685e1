"""Chunks of the old trailer layout are still read (issue 20 item 5), and the new layout is
osiris' byte for byte.

``fixtures/old_trailer/`` is one partition written by riverlog before the change (commit
2098311; the script is in its README): chunks with no trailer, with writer records only,
with a bloom filter only (one of them the segment's last chunk), with both, and a tracking
delta chunk. Old layout (docs/commit-log.md, "The old trailer layout"): trailer length
counts the bloom filter; the trailer is the filter then 'W' | len u8 | id | seq u64 | CRC-32
u32 per named publisher; no trailer check."""
import os
import shutil
import struct
import zlib

import pytest

from riverlog.broker.partition import Partition
from riverlog.broker.tracking import decode_writer_trailer
from riverlog.config import LogConfig
from riverlog.errors import CorruptChunkError
from riverlog.log.bloom import ChunkFilter, build_bloom
from riverlog.log.chunk import (CHUNK_USER, HEADER, HEADER_SIZE, ChunkFormatError, check_chunk,
                                chunk_extent, encode_chunk, encode_entries, parse_header,
                                trailer_of)
from riverlog.log.recovery import verify_partition

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "old_trailer")
SEGMENT = "00000000000000000000.segment"
RECORDS = [b"a", b"b", b"c", b"d", b"e", b"f", b"g"]  # offset 6 is the tracking chunk


def _copy(tmp_path, index: bool = True) -> str:
    directory = str(tmp_path / "p")
    shutil.copytree(FIXTURE, directory, ignore=shutil.ignore_patterns("README.md"))
    if not index:
        os.unlink(os.path.join(directory, "00000000000000000000.index"))
    return directory


def _records(part: Partition) -> list[bytes]:
    return [r for c in part.read_chunks(0, 1 << 20) if c.header.chunk_type == CHUNK_USER
            for _, r in c.records()]


def _matching(part: Partition, value: str) -> list[int]:
    """The first offsets of the chunks a filtered reader of ``value`` is given."""
    out, offset = [], 0
    while offset < part.log.next_offset:
        chunks, offset = part.read_matching_chunks(offset, ChunkFilter([value]).matches)
        out += [c.header.first_offset for c in chunks]
    return out


@pytest.mark.parametrize("index", [True, False], ids=["indexed", "scanned"])
def test_a_partition_written_in_the_old_layout_reads_whole(tmp_path, index):
    directory = _copy(tmp_path, index)
    size = os.path.getsize(os.path.join(directory, SEGMENT))
    part = Partition("old", 0, directory, LogConfig())
    assert not part.log.report.truncated_bytes and not part.log.report.dropped_segments
    assert os.path.getsize(os.path.join(directory, SEGMENT)) == size  # nothing cut
    assert _records(part) == RECORDS
    assert (part.publishers.get("app"), part.publishers.get("other-publisher")) == (9, 3)
    assert part.offsets.query("consumer-1") == 2
    assert _matching(part, "eu") == [3, 7] and _matching(part, "us") == [4]
    part.log.close()
    assert not verify_partition(directory).problems


@pytest.mark.parametrize("index", [True, False], ids=["indexed", "scanned"])
def test_new_chunks_after_old_ones_in_the_same_segment(tmp_path, index):
    """Opened by the new code, the old active segment takes chunks of the new layout after
    its old ones (the last old chunk ends in a bloom filter with no writer record)."""
    directory = _copy(tmp_path)
    part = Partition("old", 0, directory, LogConfig())
    part.write_entries([encode_entries([b"h"])], writers={"app": 12}, filter_values={"eu"})
    part.write_entries([encode_entries([b"i"])], writers={"new": 1})
    part.write_entries([encode_entries([b"j"])], filter_values={"us"})
    part.log.close()
    if not index:
        os.unlink(os.path.join(directory, "00000000000000000000.index"))
    part = Partition("old", 0, directory, LogConfig())
    assert not part.log.report.truncated_bytes
    assert _records(part) == RECORDS + [b"h", b"i", b"j"]
    assert [part.publishers.get(r) for r in ("app", "other-publisher", "new")] == [12, 3, 1]
    assert _matching(part, "eu") == [3, 7, 8] and _matching(part, "us") == [4, 10]
    layouts = [trailer_of(c.header, c.raw)[1] for c in part.read_chunks(0, 1 << 20)
               if c.header.trailer_length]
    assert layouts == [True, True, True, True, False, False]  # old: writers or bloom
    part.log.close()
    assert not verify_partition(directory).problems


def test_new_chunks_are_osiris_byte_for_byte(tmp_path):
    """The header's trailer length counts osiris sequence records <<0, IdSize, Id, Seq:64>>
    alone; the bloom filter is counted by its size byte; the trailer check follows."""
    part = Partition("s", 0, str(tmp_path / "p"), LogConfig())
    part.write_entries([encode_entries([b"x"])], writers={"app": 0x0102}, filter_values={"eu"})
    (chunk,) = part.read_chunks(0)
    part.log.close()
    raw, h = bytes(chunk.raw), chunk.header
    bloom = build_bloom(["eu"])
    trailer = b"\x00\x03app" + (0x0102).to_bytes(8, "big")
    assert (h.data_length, h.trailer_length, h.bloom_size) == (5, len(trailer), len(bloom))
    assert raw[HEADER_SIZE + 5:] == bloom + trailer + struct.pack(">I", zlib.crc32(bloom + trailer))
    assert raw[45:48] == b"\0\0\0"  # reserved, as osiris writes it
    assert decode_writer_trailer(trailer_of(h, raw)[0]) == [("app", 0x0102)]


def test_a_damaged_trailer_or_filter_is_found(tmp_path):
    """Found by the trailer check: on read (a chunk the index trusts), by recovery (a chunk
    it scans, here with the index gone: the segment is cut from there) and by verify."""
    for n, where in enumerate(("filter", "trailer")):
        directory = str(tmp_path / f"p{n}")
        part = Partition("s", 0, directory, LogConfig())
        part.write_entries([encode_entries([b"x"])], writers={"app": 1}, filter_values={"eu"})
        part.write_entries([encode_entries([b"y"])], writers={"app": 2}, filter_values={"eu"})
        part.log.close()
        path = os.path.join(directory, SEGMENT)
        with open(path, "rb") as f:
            raw = bytearray(f.read())
        first = parse_header(raw)
        at = HEADER_SIZE + first.data_length + (3 if where == "filter" else 16 + 5)
        raw[at] ^= 0x01
        with pytest.raises(ChunkFormatError, match="trailer"):
            check_chunk(raw, first)
        with open(path, "wb") as f:
            f.write(raw)
        assert verify_partition(directory).problems
        part = Partition("s", 0, directory, LogConfig())  # the index is trusted: on read
        with pytest.raises(CorruptChunkError, match="trailer check"):
            part.read_chunks(0)
        part.log.close()
        os.unlink(os.path.join(directory, "00000000000000000000.index"))
        part = Partition("s", 0, directory, LogConfig())  # scanned: cut from the damage
        assert part.log.next_offset == 0 and part.log.report.truncated_bytes == len(raw)
        assert part.publishers.get("app") is None
        part.log.close()


def _old_chunk(first_offset: int, record: bytes, bloom: bytes, writers: list) -> bytes:
    """A chunk in the old layout, built from its documentation byte by byte."""
    data = encode_entries([record])
    records = b""
    for ref, seq in writers:
        body = b"W" + bytes((len(ref),)) + ref.encode() + seq.to_bytes(8, "big")
        records += body + struct.pack(">I", zlib.crc32(body))
    trailer = bloom + records
    return HEADER.pack(0x50, 0, 1, 1, 1, 1, first_offset, zlib.crc32(data), len(data),
                       len(trailer), len(bloom)) + data + trailer


def test_extent_tells_the_layouts_apart_byte_by_byte():
    bloom = build_bloom(["eu"])
    old = [_old_chunk(0, b"a", b"", [("app", 1)]),          # writers only: 'W' first
           _old_chunk(1, b"b", bloom, []),                  # filter only: trailer = filter
           _old_chunk(2, b"c", bloom, [("app", 2)])]        # both
    new = [encode_chunk(encode_entries([b"d"]), 1, 1, first_offset=3, timestamp_ms=1,
                        trailer=bloom + b"\x00\x06abcdef" + bytes(8), bloom_size=16),
           encode_chunk(encode_entries([b"e"]), 1, 1, first_offset=4, timestamp_ms=1,
                        trailer=b"\x00\x01z" + bytes(8), bloom_size=0)]
    # a new chunk whose trailer is as long as its filter (16 bytes) right after an old one
    # with a filter only; and every chunk as the last bytes of a file
    for chunks in ([old[1], new[0]], old + new, new + old, [old[1]], [new[0]]):
        buf = b"".join(chunks)
        pos, sizes = 0, []
        while pos < len(buf):
            h = parse_header(buf, pos)
            sizes.append(check_chunk(buf, h, pos))
            assert sizes[-1] == chunk_extent(buf, h, pos)
            pos += sizes[-1]
        assert sizes == [len(c) for c in chunks]
