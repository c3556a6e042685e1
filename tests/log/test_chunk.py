"""The osiris chunk layout: header bytes, entries, sub-batches and the checks."""
import gzip
import struct
import zlib

import cramjam
import pytest

from riverlog.log import chunk as c


def test_header_layout_matches_osiris():
    data = c.encode_entries([b"ab", b"cde"])
    raw = c.encode_chunk(data, 2, 2, first_offset=7, timestamp_ms=1_700_000_000_123, epoch=3)
    assert len(raw) == 48 + len(data)
    assert raw[0] == 0x50                      # magic 5, version 0
    assert raw[1] == 0                         # user chunk
    assert struct.unpack(">H", raw[2:4]) == (2,)
    assert struct.unpack(">I", raw[4:8]) == (2,)
    assert struct.unpack(">q", raw[8:16]) == (1_700_000_000_123,)
    assert struct.unpack(">Q", raw[16:24]) == (3,)
    assert struct.unpack(">Q", raw[24:32]) == (7,)
    assert struct.unpack(">I", raw[32:36]) == (zlib.crc32(data),)
    assert struct.unpack(">I", raw[36:40]) == (len(data),)
    assert raw[40:48] == b"\0" * 8             # trailer length, bloom size, reserved
    assert data == b"\x00\x00\x00\x02ab\x00\x00\x00\x03cde"
    h = c.parse_header(raw)
    assert (h.first_offset, h.num_records, h.next_offset, h.size) == (7, 2, 9, len(raw))
    c.check_chunk(raw, h)
    assert list(c.iter_records(h, raw[48:])) == [(7, b"ab"), (8, b"cde")]


def test_trailer_is_outside_the_data_and_the_crc():
    """osiris_log:make_chunk: trailer length counts the tracking records alone, the bloom
    filter is counted by its own size byte; riverlog's trailer check (CRC-32 of filter and
    trailer) follows them, counted by neither."""
    data = c.encode_entries([b"x"])
    raw = c.encode_chunk(data, 1, 1, first_offset=0, timestamp_ms=0,
                         trailer=b"BLOOM" + b"TRK", bloom_size=5)
    h = c.parse_header(raw)
    assert (h.trailer_length, h.bloom_size, h.size) == (3, 5, len(raw))
    assert raw[48 + len(data):] == b"BLOOMTRK" + struct.pack(">I", zlib.crc32(b"BLOOMTRK"))
    assert c.check_chunk(raw, h) == len(raw)
    c.check_chunk(raw, h)
    only_bloom = c.encode_chunk(data, 1, 1, first_offset=0, timestamp_ms=0, trailer=b"BLOOM",
                                bloom_size=5)
    h = c.parse_header(only_bloom)
    assert (h.trailer_length, h.bloom_size, h.size) == (0, 5, len(only_bloom))
    assert c.check_chunk(only_bloom, h) == len(only_bloom)
    for damaged_at in (48 + len(data), len(raw) - 5, len(raw) - 1):  # filter, trailer, check
        damaged = bytearray(raw)
        damaged[damaged_at] ^= 0x10
        with pytest.raises(c.ChunkFormatError, match="trailer"):
            c.check_chunk(damaged, c.parse_header(damaged))


@pytest.mark.parametrize("damage", ["crc", "truncate", "magic"])
def test_check_chunk_rejects_damage(damage):
    raw = bytearray(c.encode_chunk(c.encode_entries([b"hello"]), 1, 1, first_offset=0,
                                   timestamp_ms=0))
    if damage == "crc":
        raw[-1] ^= 1
    elif damage == "truncate":
        del raw[-1]
    else:
        raw[0] = 0x51
    with pytest.raises(c.ChunkFormatError):
        c.check_chunk(raw, c.parse_header(raw))


def _sub_batch(codec: int, body: bytes, records: int, uncompressed: int) -> bytes:
    return struct.pack(">BHII", 0x80 | (codec << 4), records, uncompressed, len(body)) + body


@pytest.mark.parametrize("codec,compress", [
    (c.SUB_BATCH_NONE, lambda b: b),
    (c.SUB_BATCH_GZIP, gzip.compress),
    (c.SUB_BATCH_LZ4, lambda b: bytes(cramjam.lz4.compress(b))),
    (c.SUB_BATCH_ZSTD, lambda b: bytes(cramjam.zstd.compress(b))),
])
def test_sub_batches_are_kept_and_unpacked(codec, compress):
    records = [b"one", b"", b"three" * 50]
    plain = b"".join(struct.pack(">I", len(r)) + r for r in records)
    entry = _sub_batch(codec, compress(plain), len(records), len(plain))
    data = c.encode_entries([b"first"]) + entry
    assert c.count_entries(data) == (2, 4)
    raw = c.encode_chunk(data, 2, 4, first_offset=10, timestamp_ms=0)
    h = c.parse_header(raw)
    assert list(c.iter_records(h, raw[48:])) == [(10, b"first"), (11, b"one"), (12, b""),
                                                 (13, b"three" * 50)]
    entries = list(c.iter_entries(data))
    assert entries[1].raw == entry and entries[1].codec == codec and entries[1].records == 3


def test_record_count_mismatch_is_an_error():
    data = c.encode_entries([b"a", b"b"])
    raw = c.encode_chunk(data, 2, 3, first_offset=0, timestamp_ms=0)
    with pytest.raises(c.ChunkFormatError):
        list(c.iter_records(c.parse_header(raw), raw[48:]))


def test_encode_chunk_rejects_bad_counts():
    with pytest.raises(ValueError):
        c.encode_chunk(b"", 0, 0, first_offset=0, timestamp_ms=0)
    with pytest.raises(ValueError):
        c.encode_chunk(b"xx", 2, 1, first_offset=0, timestamp_ms=0)


def _counted_by_walking(data):
    """The reference: iter_entries' walk, entry by entry (what count_entries did before)."""
    try:
        entries = list(c.iter_entries(data))
    except c.ChunkFormatError as exc:
        return str(exc)
    return len(entries), sum(e.records for e in entries)


def _counted(data):
    try:
        return c.count_entries(data)
    except c.ChunkFormatError as exc:
        return str(exc)


def test_count_entries_counts_and_refuses_as_the_walk_does():
    """count_entries (a follower counts every chunk it appends) gives the walk's counts, or
    its ChunkFormatError message, on valid, truncated and damaged data sections."""
    from hypothesis import given, settings, strategies as st
    simple = st.binary(max_size=40).map(lambda b: struct.pack(">I", len(b)) + b)
    sub = st.tuples(st.integers(0, 4), st.integers(0, 3), st.binary(max_size=40)).map(
        lambda t: struct.pack(">BHII", 0x80 | t[0] << 4, t[1], len(t[2]), len(t[2])) + t[2])
    section = st.lists(st.one_of(simple, sub), max_size=8).map(b"".join)

    @settings(max_examples=300, deadline=None)
    @given(section, st.integers(0, 400), st.binary(max_size=6), st.booleans())
    def check(data, cut, junk, memory):
        for variant in (data, data[:cut], data + junk, junk + data):
            value = memoryview(variant) if memory else variant
            assert _counted(value) == _counted_by_walking(value)
    check()
