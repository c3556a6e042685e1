# The replication fetch answer's one-copy decode (envelope._replication_response_fast, used by
# decode_replication_response and decode_internal) held to the general path it shortcuts
# (decode_envelope, then _parse_replication_response): the same ReplicationResponse, None or
# EnvelopeError for generated answers with and without CRC, truncated, bit-flipped and random
# bytes, and bytes-likes that are not bytes.
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverlog.protocol.liftbridge import envelope
from riverlog.protocol.liftbridge.envelope import (EnvelopeError, MsgType, decode_internal,
                                                   decode_replication_response)


def general(data):
    """What decode_replication_response gave before the fast path."""
    decoded = envelope.decode_envelope(data)
    if decoded is None or decoded[0] is not MsgType.ReplicationResponse:
        return None
    return envelope._parse_replication_response(decoded[1])


def internal(data):
    try:
        return decode_internal(data, MsgType.ReplicationResponse)
    except EnvelopeError as exc:
        return exc.reason


answers = st.builds(
    lambda epoch, hw, entries, crc: envelope.encode_envelope(
        MsgType.ReplicationResponse, envelope._REPLICATION.pack(epoch, hw) + entries, crc),
    st.integers(0, (1 << 64) - 1), st.integers(-(1 << 63), (1 << 63) - 1),
    st.binary(max_size=64), st.booleans())


@settings(max_examples=400, deadline=None)
@given(answers, st.data())
def test_fast_path_answers_as_the_general_one(answer, data):
    cut = data.draw(st.integers(0, len(answer)))
    flipped = bytearray(answer)
    at = data.draw(st.integers(0, len(answer) - 1))
    flipped[at] ^= 1 << data.draw(st.integers(0, 7))
    for form in (answer, answer[:cut], bytes(flipped), data.draw(st.binary(max_size=30))):
        for kind in (bytes, bytearray, memoryview):
            assert decode_replication_response(kind(form)) == general(kind(form))
        expected = general(form)
        got = internal(form)
        if expected is not None:
            assert got == expected
        else:
            assert isinstance(got, str)  # an EnvelopeError, as before


def test_entries_are_copied_once():
    entries = b"x" * (1 << 20)
    answer = envelope.encode_replication_response(3, 9, entries)
    assert envelope._replication_response_fast(answer) == (3, 9, entries)
    assert envelope._replication_response_fast(answer[:23]) is None
    with pytest.raises(EnvelopeError):
        decode_internal(answer[:23], MsgType.ReplicationResponse)
