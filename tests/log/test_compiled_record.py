# The compiled twin of the record encoder (riverlog/_record_c.pyx) held to its Python
# reference (riverlog/record.py): encode_record and encode_records give the same bytes for
# generated records (every field, sizes across the 8/32-bit encodings, empty header values,
# negative timestamps) and, for records with fields of other types or values out of range
# (bytearray, str where bytes go, non-str header names, lone surrogates, timestamps past
# int64, missing attributes), the same bytes or the same type of error. Every test runs on
# both implementations.
from __future__ import annotations

import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _twins import IMPLEMENTATIONS, compiled_or_skip, implementation
from riverlog import record
from riverlog.protocol.amqp10 import Symbol, Timestamp
from riverlog.record import Record, decode_record

CHECKS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def impl(request):
    """(encode_record, encode_records) of one implementation."""
    return implementation(request.param, (record._py_encode_record, record._py_encode_records),
                          record, "riverlog._record_c", ("encode_record", "encode_records"))


text = st.text(alphabet=st.characters(codec="utf-8"), max_size=40) | st.text(min_size=250,
                                                                            max_size=300)
blob = st.binary(max_size=40) | st.binary(min_size=250, max_size=600) | st.sampled_from(
    [b"", b"\xff\xfe", "é".encode(), b"\xed\xa0\x80"])  # the last: a surrogate, not UTF-8
names = text | st.sampled_from(["reply", "subject"])
records = st.builds(
    Record, value=blob, key=st.none() | blob,
    headers=st.dictionaries(names, blob | st.just(b""), max_size=5),
    timestamp_ns=st.integers(-(1 << 63), (1 << 63) - 1) | st.sampled_from([0, 1, -1]),
    subject=st.none() | text, reply=st.none() | text, correlation_id=st.none() | text,
    ack_inbox=st.none() | text)

# fields of other types, or out of range: the reference's bytes or its error
odd_text = st.sampled_from([None, "ok", "\ud800", Symbol("sym"), b"bytes", 5])
odd_blob = st.sampled_from([None, b"ok", bytearray(b"ba"), memoryview(b"mv"), "str", 5])
odd_records = st.builds(
    Record, value=odd_blob, key=odd_blob,
    headers=st.dictionaries(st.sampled_from(["a", "reply", 5, "\ud800", Symbol("s"), b"b"]),
                            odd_blob | st.just(b"") | st.just(bytearray()), max_size=3)
    | st.sampled_from([None, [("a", b"b")], {}]),
    timestamp_ns=st.sampled_from([0, True, 1.5, 1 << 63, -(1 << 63) - 1, Timestamp(7), None]),
    subject=odd_text, reply=odd_text, correlation_id=odd_text, ack_inbox=odd_text)


def outcome(call):
    try:
        return call()
    except Exception as exc:  # the same type of error is what both must give
        return type(exc)


@CHECKS
@given(records)
def test_records_encode_as_the_reference(impl, rec):
    encode_record, encode_records = impl
    expected = record._py_encode_record(rec)
    assert encode_record(rec) == expected
    assert encode_records([rec]) == [expected]
    assert decode_record(expected) == decode_record(encode_record(rec))


@CHECKS
@given(st.lists(records | st.sampled_from([Record(b"v", None, {"reply": b""}, 5, "s")]),
                max_size=8))
def test_batches_encode_as_the_reference(impl, batch):
    _, encode_records = impl
    assert encode_records(batch) == record._py_encode_records(batch) == [
        record._py_encode_record(r) for r in batch]
    assert encode_records(iter(batch)) == record._py_encode_records(batch)


@CHECKS
@given(odd_records)
def test_odd_fields_give_the_references_bytes_or_error(impl, rec):
    encode_record, encode_records = impl
    expected = outcome(lambda: record._py_encode_record(rec))
    assert outcome(lambda: encode_record(rec)) == expected
    good = Record(b"v", timestamp_ns=1)
    for batch in ([rec], [good, rec, good]):  # encode_records' contract: encode_record's
        assert outcome(lambda: encode_records(batch)) == outcome(
            lambda: [record._py_encode_record(r) for r in batch])


def test_headers_none_is_taken_by_the_batch_encoder_too(impl):
    # encode_record takes headers=None as no headers; encode_records used to raise TypeError
    # for it as the first record (its cache of the last headers started out None)
    _, encode_records = impl
    batch = [Record(b"v", headers=None), Record(b"w", headers=None), Record(b"x")]
    assert encode_records(batch) == [record._py_encode_record(r) for r in batch]


def test_any_object_with_the_fields_is_a_record_and_missing_ones_raise(impl):
    encode_record, encode_records = impl
    duck = types.SimpleNamespace(value=b"v", key=None, headers={}, timestamp_ns=3, subject="s",
                                 reply=None, correlation_id=None, ack_inbox=None)
    assert encode_record(duck) == record._py_encode_record(duck)
    with pytest.raises(AttributeError):
        encode_record(types.SimpleNamespace(value=b"v"))
    with pytest.raises(ValueError, match="64-bit"):
        encode_records([Record(b"v"), Record(b"v", timestamp_ns=1 << 63)])


def test_an_iterator_that_fails_raises_its_own_error(impl):
    _, encode_records = impl

    def reads():
        yield Record(b"v")
        raise OSError("read failed")

    with pytest.raises(OSError, match="read failed"):
        encode_records(reads())


def test_the_record_module_runs_the_twin_when_built():
    compiled = compiled_or_skip("riverlog._record_c")
    if record.encode_record is record._py_encode_record:
        pytest.skip("RIVERLOG_NO_EXTENSIONS is set: record.py runs its Python code")
    assert record.encode_record is compiled.encode_record
    assert record.encode_records is compiled.encode_records
