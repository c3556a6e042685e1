# Fuzzing the Liftbridge NATS envelope decoders (riverlog.protocol.liftbridge.envelope) with
# near-valid input: every MsgType's header with and without the CRC flag, a CRC that matches or
# not, and a payload that is a serialized, truncated or random protobuf of any api.proto message.
# The contract (envelope.py): decoding never raises on bytes-like input; it returns the parsed
# message or None, and a parsed message re-encodes to a decodable envelope. The strict decoder of
# internal messages (decode_internal) raises EnvelopeError, and nothing else, exactly when
# decode_message gives None or another MsgType.
from __future__ import annotations

import struct

from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.envelope import (MAGIC, MESSAGE_CLASSES, PUBLISH_CLASSES,
                                                   EnvelopeError,
                                                   MsgType, decode_ack, decode_envelope,
                                                   decode_internal, decode_message,
                                                   decode_publish,
                                                   decode_replication_response, encode_message)

from ._budget import budget
from ._proto import wire

_CLASSES = sorted({c for c in MESSAGE_CLASSES.values() if c is not None}, key=lambda c: c.__name__)


@st.composite
def envelopes(draw) -> bytes:
    payload = draw(st.one_of(*(wire(c, depth=2) for c in _CLASSES)))
    msg_type = draw(st.one_of(st.sampled_from(list(MsgType)), st.integers(0, 255)))
    crc = draw(st.booleans())
    header_len = draw(st.sampled_from([12 if crc else 8, 8, 12, 0, 255]))
    flags = (1 if crc else 0) | draw(st.sampled_from([0, 0, 0, 2, 0x80]))
    version = draw(st.sampled_from([0, 0, 0, 1]))
    head = MAGIC + struct.pack(">BBBB", version, header_len, flags, msg_type)
    if crc:
        good = crc32c(payload)
        head += struct.pack(">I", good if draw(st.booleans()) else good ^ 1)
    data = head + payload
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    return data if cut is None else data[:cut]


@budget(400)
@given(envelopes(), st.sampled_from([bytes, bytearray, memoryview]))
def test_decoders_never_raise_and_results_round_trip(data, kind):
    data = kind(data)
    assert decode_envelope(data) is None or isinstance(decode_envelope(data)[0], MsgType)
    publish = decode_publish(data)
    assert publish is None or isinstance(publish, PUBLISH_CLASSES)
    ack = decode_ack(data)
    assert ack is None or isinstance(ack, pb.Ack)
    decode_replication_response(data)
    decoded = decode_message(data)
    if decoded is not None and MESSAGE_CLASSES[decoded[0]] is not None:
        msg_type, message = decoded
        again = decode_message(encode_message(message))
        assert again is not None and again[1] == message


@budget(400)
@given(envelopes(), st.sampled_from(list(MsgType)))
def test_strict_decoder_raises_envelope_error_only(data, expected):
    decoded = decode_message(data)
    try:
        message = decode_internal(data, expected)
    except EnvelopeError:
        assert decoded is None or decoded[0] is not expected
    else:
        assert decoded == (expected, message)
