# The compiled twin of the Liftbridge envelope's per-message paths
# (riverlog/protocol/liftbridge/_envelope_c.pyx) held to its Python reference (envelope.py):
# decode_publish gives the same Message fields or the same None on generated publishes,
# hand-shaped protobuf (duplicate and unknown fields, other wire types, long varints, several
# headers) and damaged bytes (truncated, bit flips, random); AckTemplate.ack gives the same
# bytes, or the same exception, for any arguments. Every test runs on both implementations.
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _twins import IMPLEMENTATIONS, implementation
from riverlog.protocol.liftbridge import api_pb2, envelope
from riverlog.protocol.liftbridge.envelope import ACK_HEADER, MAGIC, encode_publish

FIELDS = ("offset", "key", "value", "timestamp", "stream", "partition", "subject",
          "replySubject", "ackInbox", "correlationId", "ackPolicy")
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def impl(request):
    """(decode_publish, AckTemplate) of one implementation."""
    return implementation(request.param, (envelope._py_decode_publish, envelope._PyAckTemplate),
                          envelope, "riverlog.protocol.liftbridge._envelope_c",
                          ("decode_publish", "AckTemplate"))


def view(message):
    """What callers read of a decoded Message, comparable; None stays None."""
    if message is None:
        return None
    return tuple(getattr(message, f) for f in FIELDS) + (dict(message.headers),)


def reference(data):
    return view(envelope._py_decode_publish(data))


messages = st.builds(
    api_pb2.Message, offset=INT64, key=st.binary(max_size=20), value=st.binary(max_size=40),
    timestamp=INT64, stream=st.text(max_size=10), partition=INT32, subject=st.text(max_size=10),
    replySubject=st.text(max_size=10),
    headers=st.dictionaries(st.text(max_size=6), st.binary(max_size=6), max_size=3),
    ackInbox=st.text(max_size=10), correlationId=st.text(max_size=10),
    ackPolicy=st.sampled_from([0, 1, 2]) | INT32)


@settings(max_examples=300, deadline=None)
@given(messages, st.booleans())
def test_publishes_decode_as_the_reference(impl, message, crc):
    decode_publish, _ = impl
    data = encode_publish(message, crc)
    decoded = decode_publish(data)
    assert view(decoded) == reference(data) == view(message)
    if decode_publish is not envelope._py_decode_publish and len(message.headers) < 2:
        assert type(decoded).__name__ == "PublishMessage"  # parsed by the twin, not upb
    assert view(decode_publish(bytearray(data))) == reference(data)
    assert view(decode_publish(memoryview(data))) == reference(data)


# protobuf fields by hand: any field number 0-15, any wire type, varints up to 11 bytes
varints = st.integers(0, (1 << 64) - 1).map(envelope.varint) | st.binary(min_size=1, max_size=11)
map_entries = st.lists(st.sampled_from([b"\x0a", b"\x12", b"\x08", b"\x1a"]).flatmap(
    lambda tag: st.binary(max_size=5).map(lambda v: tag + envelope.varint(len(v)) + v)),
    max_size=3).map(b"".join)
length_delimited = (st.binary(max_size=8) | st.text(max_size=4).map(str.encode) | map_entries)
raw_fields = st.tuples(st.integers(0, 15), st.integers(0, 7), varints, length_delimited).map(
    lambda f: envelope.varint(f[0] << 3 | f[1])
    + (envelope.varint(len(f[3])) + f[3] if f[1] == 2 else f[2]))


@settings(max_examples=500, deadline=None)
@given(st.lists(raw_fields, max_size=6).map(b"".join), st.booleans())
def test_hand_shaped_protobuf_decodes_as_the_reference(impl, payload, crc):
    decode_publish, _ = impl
    data = envelope.encode_envelope(0, payload, crc)
    assert view(decode_publish(data)) == reference(data)


@settings(max_examples=300, deadline=None)
@given(messages, st.booleans(), st.data())
def test_damaged_publishes_give_what_the_reference_gives(impl, message, crc, data):
    decode_publish, _ = impl
    good = encode_publish(message, crc)
    cut = data.draw(st.integers(0, len(good)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(good) - 1), st.integers(0, 7)),
                               max_size=3))
    flipped = bytearray(good)
    for at, bit in flips:
        flipped[at] ^= 1 << bit
    for damaged in (good[:cut], bytes(flipped), good + data.draw(st.binary(max_size=4))):
        assert view(decode_publish(damaged)) == reference(damaged)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40) | st.binary(max_size=30).map(lambda b: MAGIC + b"\x00\x08\x00\x00" + b))
def test_random_bytes_give_what_the_reference_gives(impl, data):
    decode_publish, _ = impl
    assert view(decode_publish(data)) == reference(data)


def test_other_envelopes_and_types_are_none_or_errors_as_in_python(impl):
    decode_publish, _ = impl
    assert decode_publish(envelope.encode_ack(api_pb2.Ack(offset=1))) is None
    assert decode_publish(b"") is None
    with pytest.raises(TypeError):
        decode_publish(None)
    with pytest.raises(TypeError):
        envelope._py_decode_publish(None)


def outcome(call):
    try:
        return call()
    except Exception as exc:  # the same type of error is what both must give
        return type(exc)


acks = st.tuples(
    st.integers(0, (1 << 63) - 1) | st.integers(-200, -1) | st.integers(1 << 63, 1 << 65)
    | st.just(True) | st.just(None),
    st.binary(max_size=12) | st.sampled_from([b"inbox.a", b"inbox.b", "text", None]),
    st.binary(max_size=300) | st.sampled_from([b"", "text", bytearray(b"ba")]),
    st.integers(-(1 << 63), (1 << 63) - 1) | st.sampled_from([1, 2, 2, "x"]))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=5), st.text(max_size=5), st.text(max_size=5), st.integers(-3, 5),
       st.integers(0, 1 << 62), st.sampled_from([b"", ACK_HEADER]), st.lists(acks, max_size=6))
def test_acks_are_the_references_bytes(impl, stream, psubject, msubject, policy, reception,
                                       prefix, calls):
    _, AckTemplate = impl
    template = AckTemplate(stream, psubject, msubject, policy, reception, prefix)
    ref = envelope._PyAckTemplate(stream, psubject, msubject, policy, reception, prefix)
    assert (template.head, template.policy, template.reception_ns) == (
        ref.head, ref.policy, ref.reception_ns)
    for args in calls:
        assert outcome(lambda: template.ack(*args)) == outcome(lambda: ref.ack(*args))


def test_acks_match_protobufs_own_serialization(impl):
    _, AckTemplate = impl
    template = AckTemplate("s", "s.0", "s", 1, 1700, ACK_HEADER)
    for offset in (0, 1, 127, 128, 1 << 40):
        ack = api_pb2.Ack(stream="s", partitionSubject="s.0", msgSubject="s", offset=offset,
                          ackInbox="in", correlationId="c", ackPolicy=1,
                          receptionTimestamp=1700, commitTimestamp=99)
        assert template.ack(offset, b"in", b"c", 99) == envelope.encode_ack(ack)


def test_the_grpc_subclass_of_ack_template_works_on_both(impl):
    _, AckTemplate = impl

    class Sub(AckTemplate):  # as riverlog.server.grpc_publish_async.AckTemplate
        __slots__ = ()

        def twice(self, offset):
            return self.ack(offset, b"", b"", 5) * 2

    assert Sub("s", "s", "s", 0, 1).twice(3) == envelope._PyAckTemplate(
        "s", "s", "s", 0, 1).ack(3, b"", b"", 5) * 2
