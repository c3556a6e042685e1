# The compiled twin of the chunk data-section walk (riverlog/log/_chunk_c.pyx) held to its
# Python reference (riverlog/log/chunk.py): count_entries gives the same (entries, records),
# or the same ChunkFormatError with the same message, on generated data sections (simple
# entries, sub-batches of any codec with a record count of 0 too, lengths past the end, up to
# 2^32-1), cut, extended, bit-flipped and random bytes, as bytes, bytearray and memoryviews
# (slices of a larger buffer included); on inputs C does not read (other buffer formats,
# strided or released views, objects that are not buffers) the same result or error; and a
# follower's check_chunks of generated chunks gives the same answer on both. Every
# parametrized test runs on both implementations, against iter_entries' walk as well.
from __future__ import annotations

import array
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _twins import IMPLEMENTATIONS, compiled_or_skip, implementation
from riverlog.log import chunk

BOUND = chunk.count_entries  # the module's own (the twin when built)
CHECKS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def count_entries(request):
    """count_entries of one implementation."""
    (fn,) = implementation(request.param, (chunk._py_count_entries,), chunk,
                           "riverlog.log._chunk_c", ("count_entries",))
    return fn


def outcome(call):
    """The result, or the error's type and message: both must give the same."""
    try:
        return call()
    except Exception as exc:
        return type(exc), str(exc)


def walked(data):
    """What iter_entries' walk (another reading of the same format) gives."""
    try:
        entries = list(chunk.iter_entries(data))
    except chunk.ChunkFormatError as exc:
        return chunk.ChunkFormatError, str(exc)
    return len(entries), sum(e.records for e in entries)


# a length that fits the body, or any u32 (mostly past the end), or the body's with the top
# bit set (a sub-batch's length is all 32 bits, a simple entry's the low 31)
def length(body: bytes):
    return (st.just(len(body)) | st.integers(0, len(body) + 8) | st.integers(0, (1 << 32) - 1)
            | st.just(len(body) | 1 << 31))


bodies = st.binary(max_size=40) | st.binary(min_size=250, max_size=600)
simple = bodies.flatmap(
    lambda b: length(b).map(lambda n: struct.pack(">I", n & 0x7FFF_FFFF) + b))
sub_batch = st.tuples(st.integers(0, 7), st.integers(0, 15), st.integers(0, 3)
                      | st.integers(0, 0xFFFF), st.integers(0, (1 << 32) - 1),
                      bodies).flatmap(
    lambda t: length(t[4]).map(lambda n: struct.pack(
        ">BHII", 0x80 | t[0] << 4 | t[1], t[2], t[3], n) + t[4]))
sections = st.lists(simple | sub_batch, max_size=8).map(b"".join)
# damage: cut at any byte, junk appended or prepended, one bit flipped
damaged = st.tuples(sections, st.integers(0, 400), st.binary(max_size=12),
                    st.integers(0, 4000)).map(
    lambda t: [t[0][:t[1]], t[0] + t[2], t[2] + t[0], flip(t[0], t[3])])


def flip(data: bytes, bit: int) -> bytes:
    if not data:
        return data
    i = bit // 8 % len(data)
    return data[:i] + bytes([data[i] ^ (1 << bit % 8)]) + data[i + 1:]


def shapes(data: bytes):
    """The same bytes as every input type C reads: bytes, bytearray, a memoryview of them, a
    memoryview slice in the middle of a larger buffer."""
    padded = b"\x80\x00\x00" + data + b"\x00\x00\x00\x09"
    return (data, bytearray(data), memoryview(data),
            memoryview(padded)[3:3 + len(data)], memoryview(bytearray(padded))[3:-4])


def same_as_reference(count_entries, data: bytes):
    expected = walked(data)
    assert outcome(lambda: chunk._py_count_entries(data)) == expected
    for shaped in shapes(data):
        assert outcome(lambda: count_entries(shaped)) == expected, (data, type(shaped))


@CHECKS
@given(sections)
def test_data_sections_count_as_the_reference(count_entries, data):
    same_as_reference(count_entries, data)


@CHECKS
@given(damaged)
def test_damaged_sections_give_the_references_error(count_entries, variants):
    for data in variants:
        same_as_reference(count_entries, data)


@CHECKS
@given(st.binary(max_size=200))
def test_random_bytes_give_the_references_answer(count_entries, data):
    same_as_reference(count_entries, data)


@pytest.mark.parametrize("data, expected", [
    (b"", (0, 0)),
    (b"\x00\x00\x00\x00", (1, 1)),
    (b"\x00\x00\x00", "truncated entry header"),
    (b"\x00\x00\x00\x02x", "entry longer than the data section"),
    (b"\x7f\xff\xff\xff", "entry longer than the data section"),
    (b"\x80\x00\x00\x00\x00\x00\x00\x00\x00\x00", "truncated sub-batch header"),
    (struct.pack(">BHII", 0x80, 0, 0, 0), "malformed sub-batch entry"),  # count 0
    (struct.pack(">BHII", 0x80, 1, 0, 1), "malformed sub-batch entry"),  # past the end
    (struct.pack(">BHII", 0x80, 1, 0, 0xFFFF_FFFF), "malformed sub-batch entry"),
    (struct.pack(">BHII", 0x80, 1, 3, 0x8000_0003) + b"abc", "malformed sub-batch entry"),
    (struct.pack(">BHII", 0xC0, 0xFFFF, 3, 3) + b"abc" + b"\x00\x00\x00\x01z", (2, 0x10000)),
])
def test_each_rule_of_the_walk(count_entries, data, expected):
    if isinstance(expected, str):
        expected = chunk.ChunkFormatError, expected
    for shaped in shapes(data):
        assert outcome(lambda: count_entries(shaped)) == expected


def odd_inputs():
    """Inputs C hands to the reference: what each gives there (a result or an error)."""
    data = chunk.encode_entries([b"a", b"bc"])
    released = memoryview(data)
    released.release()

    class Bytes(bytes):
        pass

    return [
        memoryview(data)[::2],  # strided
        memoryview(data * 4).cast("I"),  # 4-byte items
        memoryview(data).cast("c"),  # items are bytes
        memoryview(data).cast("b"),  # signed
        memoryview(data + data).cast("B", (2, len(data))),  # two dimensions
        memoryview(array.array("b", data)),
        array.array("B", data),
        released,
        Bytes(data),
        bytearray(data)[:0],
        list(data),
        "text",
        None,
        7,
    ]


@pytest.mark.parametrize("index", range(len(odd_inputs())))
def test_inputs_c_does_not_read_give_the_references_result_or_error(index):
    compiled = compiled_or_skip("riverlog.log._chunk_c")
    chunk._bind_twin(compiled)
    data = odd_inputs()[index]
    assert outcome(lambda: compiled.count_entries(data)) == outcome(
        lambda: chunk._py_count_entries(data))


# a follower's check of a fetch answer: back-to-back chunks, some with counts that disagree
entries_lists = st.lists(st.binary(max_size=30), min_size=1, max_size=6)
chunk_runs = st.lists(st.tuples(entries_lists, st.integers(-1, 1), st.booleans()),
                      min_size=1, max_size=4)


def fetch_answer(run) -> tuple[bytes, bool]:
    """The chunks of ``run`` back to back, and whether a header miscounts its records."""
    out, offset, miscounted = [], 0, False
    for records, skew, as_sub_batch in run:
        data = chunk.encode_entries(records)
        entries = len(records)
        if as_sub_batch:  # the records as one uncompressed sub-batch
            data = struct.pack(">BHII", 0x80, len(records), len(data), len(data)) + data
            entries = 1
        said = max(entries, len(records) + skew)
        miscounted |= said != len(records)
        out.append(chunk.encode_chunk(data, entries, said, first_offset=offset,
                                      timestamp_ms=1))
        offset += said
    return b"".join(out), miscounted


@CHECKS
@given(chunk_runs, st.integers(0, 2000))
def test_check_chunks_answers_as_with_the_reference(count_entries, run, cut):
    buf, miscounted = fetch_answer(run)
    answers = []
    try:
        for fn in (chunk._py_count_entries, count_entries):
            chunk.count_entries = fn  # what counts_match calls
            answers.append([outcome(lambda: chunk.check_chunks(b, 0, 0))
                            for b in (buf, memoryview(buf), buf[:cut])])
    finally:
        chunk.count_entries = BOUND
    assert answers[0] == answers[1]
    whole = answers[0][0]
    if miscounted:
        assert whole[0] is chunk.ChunkFormatError and "counts disagree" in whole[1]
    else:
        firsts = [sum(len(records) for records, _, _ in run[:i]) for i in range(len(run))]
        assert [first for _, first, _, _ in whole] == firsts


def test_the_chunk_module_runs_the_twin_when_built():
    compiled = compiled_or_skip("riverlog.log._chunk_c")
    if chunk.count_entries is chunk._py_count_entries:
        pytest.skip("RIVERLOG_NO_EXTENSIONS is set: chunk.py runs its Python code")
    assert chunk.count_entries is compiled.count_entries
