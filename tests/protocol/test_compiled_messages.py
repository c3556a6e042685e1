# The compiled twin of the Subscribe encoder (riverlog/protocol/liftbridge/_messages_c.pyx)
# held to its Python reference (messages.py's MessageEncoder): the same Message bytes appended,
# the same value_bytes and foreign counts and the same return value, for generated reads
# (records sharing fields, as the encoder's caches see them), damaged records (bytes set, cut,
# inserted, truncated), non-bytes records, start/stop offsets and a read that fails midway.
# Every test runs on both implementations.
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from _twins import IMPLEMENTATIONS, compiled_or_skip
from riverlog.protocol.liftbridge import messages
from riverlog.record import Record, encode_record, encode_records
from test_liftbridge_messages import (FAST, damage, offsets, partitions, records, shared,
                                      streams)

TWIN = "riverlog.protocol.liftbridge._messages_c"


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def Encoder(request):
    """The MessageEncoder class of one implementation."""
    if request.param == "python":
        return messages._PyMessageEncoder
    return messages._bind_twin(compiled_or_skip(TWIN))


def run(cls, pairs, start=0, stop=-1, stream="s", partition=1, default_ns=5_000_000):
    """(Messages, return value or error type, value_bytes, foreign) of one encoder of ``cls``
    reading ``pairs`` in two calls (the caches carried from the first to the second)."""
    encoder = cls(stream, partition)
    out: list[bytes] = []
    results = []
    half = len(pairs) // 2
    for part in (pairs[:half], pairs[half:]):
        try:
            results.append(encoder.extend(out, iter(part), start, stop, default_ns))
        except Exception as exc:  # the same type of error is what both must give
            results.append(type(exc))
    return out, results, encoder.value_bytes, encoder.foreign


def same(Encoder, pairs, **kw):
    got = run(Encoder, pairs, **kw)
    assert got == run(messages._PyMessageEncoder, pairs, **kw)
    return got


@FAST
@given(st.lists(shared, min_size=1, max_size=3), offsets, streams, partitions)
def test_reads_sharing_fields_give_the_references_messages(Encoder, reads, first, stream,
                                                           partition):
    raws = [raw for read in reads for raw in encode_records(read)]
    first = min(first, 2**63 - 1 - len(raws))
    same(Encoder, [(first + i, raw) for i, raw in enumerate(raws)], stream=stream,
         partition=partition)


@FAST
@given(shared, st.data())
def test_damaged_records_give_the_references_messages(Encoder, read, data):
    raws = encode_records(read)
    pairs = [(i, raw) for i, raw in enumerate(raws)]
    for _ in range(data.draw(st.integers(1, 3))):  # damaged copies after their good originals
        at = data.draw(st.integers(0, len(raws) - 1))
        pairs.append((len(pairs), damage(raws[at], data)))
    pairs += [(len(pairs) + i, raw) for i, raw in enumerate(raws)]
    same(Encoder, pairs)


@FAST
@given(shared, st.integers(-3, 12), st.integers(-2, 12), st.sampled_from([0, -7, 1 << 62]))
def test_start_and_stop_as_the_reference(Encoder, read, start, stop, default_ns):
    pairs = [(i, raw) for i, raw in enumerate(encode_records(read) * 2)]
    same(Encoder, pairs, start=start, stop=stop, default_ns=default_ns)


def test_odd_records_and_offsets_as_the_reference(Encoder):
    raw = encode_record(Record(b"value", None, {"subject": b"s", "reply": b""}, 5, "s"))
    for odd in (bytearray(raw), memoryview(raw), b"", b"\x00", raw[:-1], raw + b"x"):
        same(Encoder, [(0, raw), (1, raw), (2, odd), (3, raw)])
    same(Encoder, [(0, raw), (1, raw), (-1, raw), (1 << 63, raw), (1.0, raw), (True, raw)])


@FAST
@given(st.lists(records, min_size=1, max_size=4))
def test_a_read_that_fails_midway_keeps_and_counts_what_came_before(Encoder, batch):
    raws = encode_records(batch) * 2

    def read(encoder, out):
        def pairs():
            yield from enumerate(raws)
            raise OSError("a chunk that cannot be walked")
        with pytest.raises(OSError):
            encoder.extend(out, pairs(), 0, -1, 0)
        return out, encoder.value_bytes, encoder.foreign

    assert read(Encoder("s", 0), []) == read(messages._PyMessageEncoder("s", 0), [])


def test_the_twin_reads_records_the_encoder_has_seen_the_like_of():
    twin = compiled_or_skip(TWIN)
    calls = []

    def counted(*args):
        calls.append(args[2])
        return messages._PyMessageEncoder.extend(*args)

    cls = messages._bind_twin(twin)
    twin._bind(counted, messages._MA_KEY, messages._KEY_AT, messages._SEC_PROPERTIES,
               messages._NULL3, messages._SEC_APP_PROPERTIES, messages._SEC_DATA)
    try:
        raws = encode_records([Record(b"v%d" % i, b"k%d" % (i % 10), {"subject": b"s", "reply": b""},
                                      7, "s", None, f"c-{i}") for i in range(100)])
        out: list[bytes] = []
        cls("s", 0).extend(out, list(enumerate(raws)), 0, -1, 0)
        assert len(calls) == 1  # the first record only: its annotations and suffix were new
        assert out == run(messages._PyMessageEncoder, list(enumerate(raws)), partition=0)[0]
    finally:
        messages._bind_twin(twin)
