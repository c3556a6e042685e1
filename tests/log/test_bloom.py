"""Chunk bloom filters (riverlog/log/bloom.py) and where they live in a chunk: built from the
filter values of a chunk's entries, matched by filtered readers (never a false negative),
kept by the commit log through writes, reads, reopen, truncation and compaction, and used by
CommitLog.read_matching_chunks to skip chunks without reading them."""
import random

import pytest

from riverlog.broker.partition import Partition
from riverlog.config import LogConfig
from riverlog.errors import CorruptChunkError
from riverlog.log import CommitLog
from riverlog.log.bloom import (DEFAULT_SIZE, ChunkFilter, build_bloom,
                                filter_from_properties)
from riverlog.log.chunk import bloom_of, check_chunk, encode_chunk, \
    encode_entries, parse_header


def test_no_filter_value_means_no_filter():
    assert build_bloom([]) == b""
    assert build_bloom([None, None, ""]) == b""


def test_filter_has_the_size_asked_and_marks_unfiltered_entries_in_bit_0():
    only = build_bloom(["eu"])
    mixed = build_bloom(["eu", None])
    assert len(only) == DEFAULT_SIZE and len(build_bloom(["eu"], size=255)) == 255
    assert only[0] & 0x80 == 0 and mixed[0] & 0x80 == 0x80
    assert bytes(a & ~0x80 & 0xFF if i == 0 else a for i, a in enumerate(mixed)) == only
    with pytest.raises(ValueError):
        build_bloom(["eu"], size=15)
    with pytest.raises(ValueError):
        build_bloom(["eu"], size=256)


def test_each_value_sets_at_most_two_bits_never_bit_0():
    for value in ("a", "eu", "x" * 300, "ü"):
        bloom = int.from_bytes(build_bloom([value]), "big")
        assert 1 <= bin(bloom).count("1") <= 2
        assert not bloom >> (DEFAULT_SIZE * 8 - 1)


@pytest.mark.parametrize("size", [16, 64, 255])
def test_no_false_negatives(size):
    rng = random.Random(size)
    for _ in range(300):
        values = {f"v{rng.randrange(10_000)}" for _ in range(rng.randrange(1, 40))}
        bloom = build_bloom(values, size)
        for v in values:
            assert ChunkFilter([v]).matches(bloom), (v, values)
            assert ChunkFilter(["absent-value", v]).matches(bloom)


def test_false_positives_are_rare_for_one_value_per_chunk():
    """The filtered-consumer case: a chunk holds one filter value, the reader wants another
    (16 bytes, two bits: about 1 chance in 127*127/2 per pair)."""
    wanted = ChunkFilter(["region-0"])
    hits = sum(wanted.matches(build_bloom([f"region-{i}"])) for i in range(1, 5001))
    assert hits < 25


def test_unfiltered_entries_match_only_with_match_unfiltered():
    strict = ChunkFilter(["eu"])
    lenient = ChunkFilter(["eu"], match_unfiltered=True)
    no_filter = build_bloom([None])          # a chunk of entries without filter values
    other = build_bloom(["us"])
    other_and_unfiltered = build_bloom(["us", None])
    assert not strict.matches(no_filter) and lenient.matches(no_filter)
    assert strict.matches(b"") is False and lenient.matches(memoryview(b"")) is True
    assert not strict.matches(other) and not lenient.matches(other)
    assert not strict.matches(other_and_unfiltered) and lenient.matches(other_and_unfiltered)


def test_a_reader_matches_filters_of_any_size():
    f = ChunkFilter(["eu", "us"])
    for size in (16, 17, 100, 255):
        assert f.matches(build_bloom(["us", "jp"], size))
        assert not f.matches(build_bloom(["jp"], size))  # (no clash at these sizes)
    with pytest.raises(ValueError):
        ChunkFilter([])


def test_subscribe_properties():
    assert filter_from_properties(None) is None
    assert filter_from_properties({"name": "x", "match-unfiltered": "true"}) is None
    f = filter_from_properties({"filter.0": "eu", "filter.1": "us", "name": "x"})
    assert sorted(f.values) == ["eu", "us"] and not f.match_unfiltered
    assert filter_from_properties({"filter.7": "eu", "match-unfiltered": "true"}).match_unfiltered
    # RabbitMQ takes exactly "true" (rabbit_stream_utils:filter_spec)
    upper = filter_from_properties({"filter.0": "eu", "match-unfiltered": "TRUE"})
    assert not upper.match_unfiltered


# -- the filter in the chunk -----------------------------------------------------------------


def test_bloom_follows_the_data_counted_apart_and_deliver_bytes_exclude_it():
    bloom = build_bloom(["eu"])
    data = encode_entries([b"a", b"bb"])
    raw = encode_chunk(data, 2, 2, first_offset=7, timestamp_ms=1, trailer=bloom + b"\0rest",
                       bloom_size=len(bloom))
    h = parse_header(raw)
    check_chunk(raw, h)
    assert h.bloom_size == 16 and h.trailer_length == 5  # as osiris: the filter apart
    assert bytes(bloom_of(h, raw)) == bloom
    assert raw[44] == 16  # header byte 44: bloom filter size (u8)


def test_bloom_larger_than_the_trailer_bytes_is_refused():
    data = encode_entries([b"a"])
    with pytest.raises(ValueError, match="bloom"):
        encode_chunk(data, 1, 1, first_offset=0, timestamp_ms=1, trailer=b"x" * 4,
                     bloom_size=16)


def _log(tmp_path, **kw):
    return CommitLog(tmp_path / "p", LogConfig(**kw))


def _write(log, records, values):
    bloom = build_bloom(values)
    return log.append_entries(encode_entries(records), len(records), len(records),
                              trailer=bloom, bloom_size=len(bloom))


def test_commit_log_keeps_blooms_across_reopen(tmp_path):
    log = _log(tmp_path)
    _write(log, [b"old"], [])                     # no filter values: no filter
    _write(log, [b"e1", b"e2"], ["eu", None])
    _write(log, [b"u1"], ["us"])
    log.close()
    log = _log(tmp_path)
    chunks = log.read_chunks(0, 1 << 20)
    eu = ChunkFilter(["eu"])
    assert [eu.matches(bloom_of(c.header, c.raw)) for c in chunks] == [False, True, False]
    assert [c.header.bloom_size for c in chunks] == [0, 16, 16]
    assert [r for c in chunks for _, r in c.records()] == [b"old", b"e1", b"e2", b"u1"]
    log.close()


def test_truncation_inside_a_chunk_keeps_its_bloom(tmp_path):
    log = _log(tmp_path)
    _write(log, [b"a", b"b", b"c"], ["eu", "us"])
    log.truncate(2)
    (chunk,) = log.read_chunks(0, 1 << 20)
    assert chunk.header.num_records == 2
    assert ChunkFilter(["eu"]).matches(bloom_of(chunk.header, chunk.raw))
    log.close()


async def test_compaction_keeps_the_bloom_of_rewritten_chunks(tmp_path):
    log = _log(tmp_path, segment_max_bytes=4096)
    _write(log, [b"k1=a" + b"." * 40, b"k2=b" + b"." * 40, b"k1=c" + b"." * 40], ["eu"])
    while len(log.segments) < 3:
        _write(log, [b"pad" + b"." * 1500], [])
    result = await log.compact(lambda r: r[:2] if r.startswith(b"k") else None)
    assert result.records_after < result.records_before
    (chunk, *_) = log.read_chunks(1, 1 << 20)
    assert chunk.header.first_offset == 1
    assert [r[:4] for _, r in chunk.records()] == [b"k2=b", b"k1=c"]
    assert ChunkFilter(["eu"]).matches(bloom_of(chunk.header, chunk.raw))
    log.close()


# -- filtered reads: CommitLog.read_matching_chunks --------------------------------------------


def _regions(log, plan):
    """One chunk of two records per plan item (a region, or None for no filter value)."""
    for c, region in enumerate(plan):
        _write(log, [b"c%d-a" % c, b"c%d-b" % c], [region])


def _ids(chunks):
    return [c.header.first_offset for c in chunks]


def test_read_matching_chunks_skips_and_resumes(tmp_path):
    log = _log(tmp_path)
    _regions(log, ["eu", "eu", "us", None, "eu", "us"])
    eu = ChunkFilter(["eu"]).matches
    chunks, resume = log.read_matching_chunks(0, eu)
    assert _ids(chunks) == [0, 2] and resume == 4          # a run of consecutive matches
    chunks, resume = log.read_matching_chunks(resume, eu)
    assert _ids(chunks) == [8] and resume == 10             # chunks 2 and 3 skipped unread
    assert log.read_matching_chunks(resume, eu) == ([], 12)  # last chunk skipped: resume past it
    assert log.read_matching_chunks(12, eu) == ([], 12)      # nothing more
    chunks, _ = log.read_matching_chunks(0, eu, max_chunks=1)
    assert _ids(chunks) == [0]
    lenient = ChunkFilter(["us"], match_unfiltered=True).matches
    assert _ids(log.read_matching_chunks(0, lenient)[0]) == [4, 6]
    assert log.read_matching_chunks(0, eu, max_skip=1)[0] != []  # first chunk matches anyway
    assert log.read_matching_chunks(4, eu, max_skip=1) == ([], 6)  # one skipped, then stop
    log.close()


def test_skipped_chunks_are_not_read(tmp_path):
    """Damage the data of a chunk that cannot match: a filtered reader never notices (its
    data is not read), a reader that wants it gets the CRC error."""
    log = _log(tmp_path, verify_reads=True)
    _regions(log, ["eu", "us", "eu"])
    seg = log.segments[0]
    seg.file.pwrite(b"XX", seg.index.positions[1] + 48)  # inside chunk 1's data section
    chunks, resume = log.read_matching_chunks(2, ChunkFilter(["eu"]).matches)
    assert _ids(chunks) == [4] and resume == 6
    with pytest.raises(CorruptChunkError):
        log.read_matching_chunks(2, ChunkFilter(["us"]).matches)
    log.close()


def test_filters_known_before_a_truncation_are_forgotten(tmp_path):
    log = _log(tmp_path)
    _regions(log, ["eu", "us"])
    eu = ChunkFilter(["eu"]).matches
    assert log.read_matching_chunks(2, eu) == ([], 4)       # chunk 1 ("us") now cached
    log.truncate(2)
    _regions(log, ["eu"])                                    # same file position, new filter
    chunks, _ = log.read_matching_chunks(2, eu)
    assert _ids(chunks) == [2]
    log.close()


def test_filters_after_reopen_and_of_new_appends(tmp_path):
    log = _log(tmp_path)
    _regions(log, ["us", "eu"])
    log.close()
    log = _log(tmp_path)
    eu = ChunkFilter(["eu"]).matches
    assert _ids(log.read_matching_chunks(0, eu)[0]) == [2]  # read from the file
    _regions(log, ["us", "eu"])                              # noted as written
    chunks, resume = log.read_matching_chunks(4, eu)
    assert _ids(chunks) == [6] and resume == 8
    log.close()


def test_writer_record_follows_the_filter_in_the_trailer(tmp_path):
    """A named publisher's chunk carries both: the filter first, then the writer record that
    deduplication reads back after a restart."""
    part = Partition("s", 0, str(tmp_path / "p"), LogConfig())
    part.write_entries([encode_entries([b"a"]), encode_entries([b"b"])], writers={"app": 41},
                       filter_values={"eu", None})
    part.log.close()
    part = Partition("s", 0, str(tmp_path / "p"), LogConfig())
    assert part.publishers.get("app") == 41
    (chunk,) = part.read_chunks(0)
    h = chunk.header
    assert h.bloom_size == 16 and h.trailer_length == 2 + len("app") + 8  # one osiris record
    assert bytes(bloom_of(h, chunk.raw)) == build_bloom(["eu", None])
    assert ChunkFilter(["us"], match_unfiltered=True).matches(bloom_of(h, chunk.raw))
    part.log.close()
