# Tests for riverlog.record: the record format (docs/record-format.md).
#
# Three independent codecs keep the format honest:
# - our own round trip (encode_record -> decode_record), property-tested;
# - rstream's AMQP 1.0 codec (what rstream's consumer uses to build AMQPMessage) and Apache
#   Qpid Proton (the reference AMQP 1.0 implementation) must read our bytes as the intended
#   AMQP message;
# - messages encoded by rstream and by Proton (every type encoding, every section) must come
#   back through our decoder with the right value, headers and properties.
from __future__ import annotations

import json
import uuid
from decimal import Decimal

import proton
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rstream._pyamqp.message import Header, Properties
from rstream.amqp import AMQPMessage, amqp_decoder

from riverlog import record as rec
from riverlog.protocol import amqp10
from riverlog.record import (
    Described,
    Record,
    Symbol,
    Timestamp,
    decode_amqp_value,
    decode_record,
    encode_record,
    encode_records,
)

# Hypothesis warns that the recursive strategy's repr is large; that is all it is.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# UTF-8 encodable text (no lone surrogates), mixing ASCII, accents, CJK and emoji.
text = st.text(alphabet=st.characters(codec="utf-8"), max_size=120)
# Sizes straddle the 255-octet limit of the 8-bit encodings (vbin8/str8/list8/map8).
blob = st.one_of(st.binary(max_size=40), st.binary(min_size=240, max_size=600))
records = st.builds(
    Record,
    value=blob,
    key=st.one_of(st.none(), blob),
    headers=st.dictionaries(text, blob, max_size=6),
    timestamp_ns=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    subject=st.one_of(st.none(), text),
    reply=st.one_of(st.none(), text),
    correlation_id=st.one_of(st.none(), text),
    ack_inbox=st.one_of(st.none(), text),
)


def raw(data: bytes, ts: int = 0) -> Record:
    return Record(value=data, timestamp_ns=ts)


def record_order(headers: dict[str, bytes]) -> list[tuple[str, bytes]]:
    """The order decode_record gives headers in: as they come in the record, the empty ones
    (x-opt-empty-headers) first, then the others (application-properties)."""
    return ([(k, v) for k, v in headers.items() if v == b""]
            + [(k, v) for k, v in headers.items() if v != b""])


def empty_names(headers: dict[str, bytes]) -> str | None:
    """The x-opt-empty-headers annotation encode_record writes for ``headers``."""
    names = [k for k, v in headers.items() if v == b""]
    return json.dumps(names, ensure_ascii=False, separators=(",", ":")) if names else None


# --------------------------------------------------------------------------- our round trip


@FAST
@given(records)
def test_round_trip_is_exact(record: Record) -> None:
    data = encode_record(record)
    decoded = decode_record(data, default_timestamp_ns=123)
    assert decoded == record
    assert list(decoded.headers.items()) == record_order(record.headers)


@FAST
@given(records)
def test_fast_path_and_general_parser_agree(record: Record) -> None:
    # decode_record reads riverlog's own layout through a fast path; the general AMQP parser
    # must give the very same Record for those bytes.
    data = encode_record(record)
    fast = rec._decode_own(data)
    assert fast is not None
    general = rec._to_record(amqp10.parse_message(data), 0)
    assert general == fast == record
    assert list(general.headers.items()) == list(fast.headers.items())


# Batches as a read brings them: records sharing timestamp, subject, reply and headers, with
# their own values and correlation ids, mixed with unrelated records (which end the sharing).
shared_batches = st.builds(
    lambda base, parts, others, where: _mix(
        [Record(value=v, key=base.key, headers=dict(base.headers), timestamp_ns=base.timestamp_ns,
                subject=base.subject, reply=base.reply, correlation_id=c,
                ack_inbox=base.ack_inbox) for v, c in parts], others, where),
    records, st.lists(st.tuples(blob, st.one_of(st.none(), text)), max_size=12),
    st.lists(records, max_size=3), st.integers(min_value=0, max_value=12))


def _mix(batch: list[Record], others: list[Record], where: int) -> list[Record]:
    where = min(where, len(batch))
    return batch[:where] + others + batch[where:]


@FAST
@given(shared_batches)
def test_batch_encoder_equals_the_single_one(batch: list[Record]) -> None:
    assert encode_records(batch) == [encode_record(r) for r in batch]


def test_batch_encoder_sees_a_reused_headers_dict_change() -> None:
    def reads():  # a producer that reuses one headers dict, changing it between records
        headers = {"a": b"1"}
        yield Record(value=b"x", headers=headers, timestamp_ns=5, correlation_id="1")
        headers["a"] = b"2"
        yield Record(value=b"y", headers=headers, timestamp_ns=5, correlation_id="2")

    assert encode_records(reads()) == [
        encode_record(Record(value=b"x", headers={"a": b"1"}, timestamp_ns=5, correlation_id="1")),
        encode_record(Record(value=b"y", headers={"a": b"2"}, timestamp_ns=5, correlation_id="2"))]


def test_batch_encoder_sees_empty_headers_come_and_go() -> None:
    # same timestamp, no key: the cached annotations must follow the empty header names
    batch = [Record(value=b"v", headers=h, timestamp_ns=5)
             for h in ({}, {"reply": b""}, {"reply": b"", "a": b"1"}, {"a": b"1"},
                       {"b": b""}, {"b": b""}, {"c": b"", "reply": b""}, {})]
    encoded = encode_records(batch)
    assert encoded == [encode_record(r) for r in batch]
    assert [decode_record(d) for d in encoded] == batch


def test_batch_encoder_raises_like_the_single_one() -> None:
    good = Record(value=b"v", timestamp_ns=1)
    with pytest.raises(ValueError, match="64-bit"):
        encode_records([good, Record(value=b"v", timestamp_ns=2**63)])
    assert encode_records([]) == []


def test_none_key_is_distinct_from_empty_key() -> None:
    none_key = encode_record(Record(value=b"v", key=None, timestamp_ns=1))
    empty_key = encode_record(Record(value=b"v", key=b"", timestamp_ns=1))
    assert none_key != empty_key
    assert decode_record(none_key).key is None
    assert decode_record(empty_key).key == b""


def test_empty_header_values_are_annotated_not_application_properties() -> None:
    # the Node client (rabbitmq-stream-js-client 1.0.0) throws on an empty application
    # property value; a plain NATS publish stores `reply` empty, as does every gRPC publish
    nats = Record(value=b"v", headers={"subject": b"orders", "reply": b""}, timestamp_ns=5,
                  subject="orders")
    message = amqp_decoder(encode_record(nats))
    assert message.application_properties == {b"subject": b"orders"}
    assert message.message_annotations[b"x-opt-empty-headers"] == b'["reply"]'
    assert decode_record(encode_record(nats)).headers == {"reply": b"", "subject": b"orders"}
    only_empty = Record(value=b"v", headers={"reply": b""}, timestamp_ns=5)
    message = amqp_decoder(encode_record(only_empty))
    assert message.application_properties is None
    assert decode_record(encode_record(only_empty)) == only_empty


def test_empty_header_names_come_back_exactly() -> None:
    # names JSON must escape, the empty name, non-ASCII, and an order with values between
    headers = {'quote"back\\slash': b"", "a": b"1", "": b"", "ctl\x00\n\u2028": b"",
               "ключ-🔑": b"", "b": b"2"}
    r = Record(value=b"v", headers=headers, timestamp_ns=5)
    data = encode_record(r)
    message = amqp_decoder(data)
    assert json.loads(message.message_annotations[b"x-opt-empty-headers"]) == [
        'quote"back\\slash', "", "ctl\x00\n\u2028", "ключ-🔑"]
    assert message.application_properties == {b"a": b"1", b"b": b"2"}
    decoded = decode_record(data)
    assert decoded == r and list(decoded.headers.items()) == record_order(headers)


def test_encode_rejects_empty_header_names_that_are_not_str() -> None:
    with pytest.raises(TypeError):
        encode_record(Record(headers={b"bytes": b""}))  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        encode_record(Record(headers={"\ud800": b""}))


@pytest.mark.parametrize("names, expected", [
    ('["a"]', {"a": b"", "h": b"app"}),
    ('["h"]', {"h": b"app"}),  # named and an application property: the property wins
    ('not json', {"h": b"app"}),
    ('{"a": 1}', {"h": b"app"}),
    ('["b", 7, null, ["c"], "\\ud800"]', {"b": b"", "h": b"app"}),
    ("[" * 5000, {"h": b"app"}),
])
def test_foreign_empty_header_annotations(names, expected) -> None:
    # another AMQP writer's x-opt-empty-headers: strings taken, the rest ignored, never raises
    data = bytes(AMQPMessage(body=b"v", application_properties={"h": "app"},
                             message_annotations={"x-opt-empty-headers": names}))
    decoded = decode_record(data)
    assert decoded.headers == expected
    assert list(decoded.headers) == list(expected)


def test_empty_strings_are_distinct_from_none() -> None:
    r = Record(value=b"", subject="", reply="", correlation_id="", ack_inbox="", headers={"": b""})
    assert decode_record(encode_record(r)) == r
    assert decode_record(encode_record(Record())) == Record()


def test_large_fields_use_32_bit_encodings_and_round_trip() -> None:
    r = Record(
        value=bytes(range(256)) * 4096,  # 1 MiB
        key=b"k" * 70_000,
        headers={f"h{i}": b"x" * 300 for i in range(300)},  # map32 with 600 items
        timestamp_ns=2**63 - 1,
        subject="s" * 300,
        reply="é" * 200,
        correlation_id="c" * 256,
        ack_inbox="a" * 1000,
    )
    data = encode_record(r)
    assert decode_record(data) == r
    message = amqp_decoder(data)
    assert message.body == r.value
    assert len(message.application_properties) == 300


def test_unicode_round_trip() -> None:
    r = Record(
        value="ünïcødé 🚀".encode(),
        headers={"naïve-ключ-键-🔑": "värde".encode()},
        subject="заказы.欧洲",
        reply="_INBOX.🙂",
        correlation_id="id-∞",
        ack_inbox="acks.ß",
        timestamp_ns=-1,
    )
    assert decode_record(encode_record(r)) == r


def test_encode_rejects_timestamp_outside_int64() -> None:
    with pytest.raises(ValueError):
        encode_record(Record(timestamp_ns=2**63))
    with pytest.raises(ValueError):
        encode_record(Record(timestamp_ns=-(2**63) - 1))


def test_missing_timestamp_annotation_uses_default() -> None:
    message = AMQPMessage(body=b"v")
    assert decode_record(bytes(message), default_timestamp_ns=42).timestamp_ns == 42


# The example of docs/record-format.md, byte for byte: the on-disk format must not drift.
DOC_EXAMPLE = Record(
    value=b"hi",
    key=b"k1",
    headers={"h": b"v"},
    timestamp_ns=1_700_000_000_000_000_000,
    subject="orders",
    reply="_INBOX.r",
    correlation_id="c7",
    ack_inbox="acks",
)
DOC_EXAMPLE_HEX = (
    "005372c14406"
    "a312782d6f70742d74696d657374616d702d6e73" "8017979cfe362a0000"
    "a309782d6f70742d6b6579" "a1026b31"
    "a30f782d6f70742d61636b2d696e626f78" "a10461636b73"
    "005373c01a06" "404040" "a1066f7264657273" "a1085f494e424f582e72" "a1026337"
    "005374c10702" "a10168" "a10176"
    "005375" "a0026869"
)
# The same record as riverlog wrote it before the timestamp became a ulong and UTF-8 keys and
# header values strings: a long and binaries. Such records stay on disk and must read the same.
DOC_EXAMPLE_V1_HEX = (DOC_EXAMPLE_HEX.replace("8017979c", "8117979c")
                      .replace("a1026b31", "a0026b31").replace("a10176", "a00176"))


# The second example of docs/record-format.md: a plain NATS publish without a reply subject.
DOC_NATS_EXAMPLE = Record(value=b"hi", headers={"subject": b"orders", "reply": b""},
                          timestamp_ns=1_700_000_000_000_000_000, subject="orders")
DOC_NATS_EXAMPLE_HEX = (
    "005372c13e04"
    "a312782d6f70742d74696d657374616d702d6e73" "8017979cfe362a0000"
    "a313782d6f70742d656d7074792d68656164657273" "a1095b227265706c79225d"
    "005373c00c04" "404040" "a1066f7264657273"
    "005374c11202" "a1077375626a656374" "a1066f7264657273"
    "005375" "a0026869"
)


def test_golden_vector_matches_the_docs() -> None:
    assert encode_record(DOC_EXAMPLE).hex() == DOC_EXAMPLE_HEX
    assert decode_record(bytes.fromhex(DOC_EXAMPLE_HEX)) == DOC_EXAMPLE
    assert encode_record(DOC_NATS_EXAMPLE).hex() == DOC_NATS_EXAMPLE_HEX
    assert decode_record(bytes.fromhex(DOC_NATS_EXAMPLE_HEX)) == DOC_NATS_EXAMPLE


def test_empty_headers_written_as_application_properties_read_the_same() -> None:
    # before x-opt-empty-headers, an empty header value was an empty string property
    old = encode_record(Record(value=b"v", headers={"subject": b"s", "reply": b"-"},
                               timestamp_ns=5))
    old = old.replace(b"\xc1\x17\x04", b"\xc1\x16\x04").replace(b"\xa1\x01-", b"\xa1\x00")
    assert decode_record(old) == Record(value=b"v", headers={"subject": b"s", "reply": b""},
                                        timestamp_ns=5)
    assert rec._decode_own(old) is not None


def test_records_of_the_first_layout_read_the_same() -> None:
    old = bytes.fromhex(DOC_EXAMPLE_V1_HEX)
    assert rec._decode_own(old) == rec._to_record(amqp10.parse_message(old), 0) == DOC_EXAMPLE


def test_key_and_header_values_are_strings_when_utf8_else_binary() -> None:
    r = Record(value=b"v", key=b"\xff\xfe", headers={"text": "värde".encode(), "bin": b"\x80",
                                                      "empty": b""}, timestamp_ns=7)
    message = proton.Message()
    message.decode(encode_record(r))
    assert message.properties == {"text": "värde", "bin": b"\x80"}
    assert message.annotations[proton.symbol("x-opt-empty-headers")] == '["empty"]'
    assert message.annotations[proton.symbol("x-opt-key")] == b"\xff\xfe"
    assert decode_record(encode_record(r)) == r


def test_timestamp_is_a_ulong_and_a_long_only_before_1970() -> None:
    assert encode_record(Record(timestamp_ns=5))[26] == 0x80
    assert encode_record(Record(timestamp_ns=-5))[26] == 0x81
    # a ulong beyond a signed 64-bit timestamp is not one: the chunk's timestamp is used
    huge = encode_record(Record(timestamp_ns=5)).replace(bytes(7) + b"\x05", b"\xff" * 8)
    assert decode_record(huge, default_timestamp_ns=9).timestamp_ns == 9


def test_minimal_record_layout() -> None:
    data = encode_record(Record(value=b"x", timestamp_ns=5))
    assert data == bytes.fromhex(
        "005372c11e02a312782d6f70742d74696d657374616d702d6e73800000000000000005" "005375a00178"
    )


# ------------------------------------------------------------- third-party decoders read ours


@FAST
@given(records)
def test_rstream_decodes_our_records(record: Record) -> None:
    message = amqp_decoder(encode_record(record))  # what rstream's consumer hands to callbacks
    assert message.body == record.value
    assert message.value is None and message.sequence is None
    valued = {k.encode(): v for k, v in record.headers.items() if v}
    if valued:  # rstream returns AMQP strings as bytes
        assert message.application_properties == valued
    else:
        assert message.application_properties is None
    props = message.properties
    if record.subject is None and record.reply is None and record.correlation_id is None:
        assert props is None
    else:
        enc = lambda s: None if s is None else s.encode()  # noqa: E731
        assert props.subject == enc(record.subject)
        assert props.reply_to == enc(record.reply)
        assert props.correlation_id == enc(record.correlation_id)
        assert props.message_id is None and props.to is None
    annotations = message.message_annotations
    assert annotations[b"x-opt-timestamp-ns"] == record.timestamp_ns
    assert annotations.get(b"x-opt-key") == record.key
    assert annotations.get(b"x-opt-ack-inbox") == enc_opt(record.ack_inbox)
    assert annotations.get(b"x-opt-empty-headers") == enc_opt(empty_names(record.headers))


def enc_opt(s: str | None) -> bytes | None:
    return None if s is None else s.encode()


def _utf8_or_bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _proton_sections(data: bytes) -> list:
    """Every top-level value Proton's decoder finds in ``data`` (the message sections)."""
    decoder = proton.Data()
    pos = 0
    while pos < len(data):
        pos += decoder.decode(data[pos:])
    decoder.rewind()
    sections = []
    while decoder.next():
        sections.append(decoder.get_object())
    return sections


@settings(max_examples=60, deadline=None)
@given(records)
def test_proton_decodes_our_records(record: Record) -> None:
    data = encode_record(record)
    message = proton.Message()
    message.decode(data)  # Proton validates the encoding strictly
    assert message.inferred  # the body is a data section, not an amqp-value
    assert bytes(message.body) == record.value
    # Proton's Message accessors hand strings over as C strings (cut at the first NUL), so
    # check subject, reply-to and correlation-id on the decoded properties section itself.
    sections = {int(s.descriptor): s.value for s in _proton_sections(data)}
    assert list(sections) == sorted(sections)  # section order of AMQP 1.0 part 3 section 3.2
    fields = sections.get(0x73, [])
    fields = fields + [None] * (6 - len(fields))
    assert fields == [None, None, None, record.subject, record.reply, record.correlation_id]
    assert all(type(f) is str for f in fields[3:] if f is not None)
    assert message.id is None
    headers = {k: _utf8_or_bytes(v) for k, v in (message.properties or {}).items()}
    assert headers == {k: v for k, v in record.headers.items() if v}
    assert all(type(k) is str for k in headers)
    # values that are UTF-8 arrive as strings, the others as binary
    assert all(type(v) is str for k, v in (message.properties or {}).items()
               if _is_utf8(record.headers[k]))
    annotations = message.annotations
    assert all(isinstance(k, proton.symbol) for k in annotations)
    assert annotations[proton.symbol("x-opt-timestamp-ns")] == record.timestamp_ns
    key = annotations.get(proton.symbol("x-opt-key"))
    assert (None if key is None else _utf8_or_bytes(key)) == record.key
    assert annotations.get(proton.symbol("x-opt-ack-inbox")) == record.ack_inbox
    assert annotations.get(proton.symbol("x-opt-empty-headers")) == empty_names(record.headers)


# ------------------------------------------------------------- we read third-party messages


def test_rstream_message_with_every_section_kind() -> None:
    message_id = uuid.UUID("12345678-1234-5678-1234-567812345678")
    message = AMQPMessage(
        body=b"payload",
        header=Header(durable=True, priority=4),
        properties=Properties(
            message_id="m-1",
            user_id=b"guest",
            to="/queues/q",
            subject="orders.eu",
            reply_to="_INBOX.reply",
            correlation_id="corr-9",
            content_type="text/plain",
            creation_time=1_700_000_000_000,
            group_id="g",
            group_sequence=3,
        ),
        application_properties={
            "str": "text",
            "int": 42,
            "negative": -7,
            "big": 2**40,
            "yes": True,
            "no": False,
            "float": 1.5,
            "bin": b"\x00\xff",
            "none": None,
            "uuid": message_id,
            "ünï": "ß",
        },
        message_annotations={"x-opt-key": b"key-1", "x-stream-filter-value": "eu"},
        delivery_annotations={"x-opt-lock-token": "t"},  # rstream writes this one last
    )
    r = decode_record(bytes(message), default_timestamp_ns=99)
    assert r == Record(
        value=b"payload",
        key=b"key-1",
        headers={
            "str": b"text",
            "int": b"42",
            "negative": b"-7",
            "big": b"1099511627776",
            "yes": b"true",
            "no": b"false",
            "float": b"1.5",
            "bin": b"\x00\xff",
            "none": b"",
            "uuid": str(message_id).encode(),
            "ünï": "ß".encode(),
        },
        timestamp_ns=99,
        subject="orders.eu",
        reply="_INBOX.reply",
        correlation_id="corr-9",
    )


@FAST
@given(
    body=st.binary(max_size=600),
    props=st.dictionaries(
        text,
        st.one_of(
            text,
            st.binary(max_size=300),
            st.booleans(),
            st.integers(min_value=-(2**63), max_value=2**63 - 1),
        ),
        max_size=8,
    ),
    subject=st.one_of(st.none(), text.filter(bool)),
)
def test_rstream_encoded_messages_decode_to_value_and_headers(body, props, subject) -> None:
    message = AMQPMessage(
        body=body,
        application_properties=props,
        properties=Properties(subject=subject) if subject else None,
    )
    r = decode_record(bytes(message), default_timestamp_ns=7)

    def expected(v):
        if isinstance(v, bool):
            return b"true" if v else b"false"
        if isinstance(v, int):
            return str(v).encode()
        return v.encode() if isinstance(v, str) else v

    assert r.value == body  # rstream leaves out an empty data section: value b""
    assert r.headers == {k: expected(v) for k, v in props.items()}
    assert r.subject == subject and r.key is None and r.timestamp_ns == 7


def test_rstream_amqp_value_and_sequence_bodies() -> None:
    assert decode_record(bytes(AMQPMessage(value="plain text"))).value == b"plain text"
    assert decode_record(bytes(AMQPMessage(value=b"\x01\x02"))).value == b"\x01\x02"
    assert decode_record(bytes(AMQPMessage(value=12345))).value == b"12345"
    mapped = decode_record(bytes(AMQPMessage(value={"a": [1, "x", None], "b": b"\xff"}))).value
    assert json.loads(mapped) == {"a": [1, "x", None], "b": "ff"}
    seq = decode_record(bytes(AMQPMessage(sequence=[[1, 2], ["three"]]))).value
    assert json.loads(seq) == [1, 2, "three"]


def test_rstream_publisher_raw_bytes_are_the_value() -> None:
    # rstream can publish plain bytes (no AMQP encoding): stored and read back as they came.
    for data in (b"plain", b'{"json": true}', b"", b"\x00", b"\x00\x53", b"\x00\x01\x02"):
        assert decode_record(data, default_timestamp_ns=5) == raw(data, 5)


def _proton_encode(value) -> bytes:
    data = proton.Data()
    data.put_object(value)
    return data.encode()


def test_proton_message_with_every_field() -> None:
    m = proton.Message(body=b"body", inferred=True)
    m.durable, m.priority, m.ttl, m.first_acquirer, m.delivery_count = True, 5, 1000, True, 2
    m.id = uuid.uuid4()
    m.user_id = b"user"
    m.address = "to-address"
    m.subject = "subj"
    m.reply_to = "reply"
    m.correlation_id = proton.ulong(123)
    m.content_type = proton.symbol("text/plain")
    m.content_encoding = proton.symbol("gzip")
    m.expiry_time = 1.0
    m.creation_time = 2.0
    m.group_id = "group"
    m.group_sequence = 3
    m.reply_to_group_id = "rgroup"
    m.instructions = {proton.symbol("x-opt-delivery"): "d"}
    m.annotations = {
        proton.symbol("x-opt-key"): "string key",  # a string key is taken as UTF-8
        proton.symbol("x-opt-timestamp-ns"): 1_700_000_000_123_456_789,
        proton.symbol("x-opt-ack-inbox"): "acks",
    }
    m.properties = {
        "byte": proton.byte(-3),
        "ushort": proton.ushort(65535),
        "uint": proton.uint(4_000_000_000),
        "ulong": proton.ulong(2**64 - 1),
        "float": proton.float32(0.5),
        "double": -2.5,
        "char": proton.char("€"),
        "timestamp": proton.timestamp(1_700_000_000_000),
        "symbol": proton.symbol("sym"),
        "bin": b"\x00\x01",
    }
    signature = {proton.symbol("x-opt-sig"): b"s"}
    footer = _proton_encode(proton.Described(proton.ulong(0x78), signature))
    r = decode_record(m.encode() + footer, default_timestamp_ns=1)
    assert r == Record(
        value=b"body",
        key=b"string key",
        headers={
            "byte": b"-3",
            "ushort": b"65535",
            "uint": b"4000000000",
            "ulong": str(2**64 - 1).encode(),
            "float": b"0.5",
            "double": b"-2.5",
            "char": "€".encode(),
            "timestamp": b"1700000000000",
            "symbol": b"sym",
            "bin": b"\x00\x01",
        },
        timestamp_ns=1_700_000_000_123_456_789,
        subject="subj",
        reply="reply",
        correlation_id="123",
        ack_inbox="acks",
    )


@pytest.mark.parametrize(
    ("correlation_id", "expected"),
    [
        (proton.ulong(7), "7"),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
        (b"utf8-bytes", "utf8-bytes"),
        (b"\xff\x00", "ff00"),
        ("text", "text"),
    ],
)
def test_foreign_correlation_id_types(correlation_id, expected) -> None:
    m = proton.Message(body=b"", inferred=True, correlation_id=correlation_id)
    assert decode_record(m.encode()).correlation_id == expected


def test_proton_amqp_value_and_sequence_bodies() -> None:
    m = proton.Message(body={"k": [1, 2.5, "s"], "u": uuid.UUID(int=2)})  # amqp-value map
    assert json.loads(decode_record(m.encode()).value) == {
        "k": [1, 2.5, "s"],
        "u": "00000000-0000-0000-0000-000000000002",
    }
    m = proton.Message(body="a string body")  # amqp-value string
    assert decode_record(m.encode()).value == b"a string body"
    m = proton.Message(body=[1, "two"], inferred=True)  # amqp-sequence
    assert json.loads(decode_record(m.encode()).value) == [1, "two"]
    m = proton.Message(body=None)  # no body section at all
    assert decode_record(m.encode()).value == b""


def test_multiple_data_sections_are_concatenated() -> None:
    data = b"".join(
        _proton_encode(proton.Described(proton.ulong(0x75), part)) for part in (b"ab", b"", b"cd")
    )
    assert decode_record(data).value == b"abcd"
    assert amqp_decoder(data).body == b"cd"  # rstream keeps only the last one: we do better


def test_symbolic_and_ulong_section_descriptors() -> None:
    data = (
        _proton_encode(
            proton.Described(proton.symbol("amqp:application-properties:map"), {"h": b"v"})
        )
        + bytes.fromhex("0080" "0000000000000075" "a0026869")  # data section, ulong descriptor
    )
    assert decode_record(data) == Record(value=b"hi", headers={"h": b"v"})


# ----------------------------------------------------------------------- the type decoder


symbols = st.text(alphabet=st.characters(codec="ascii"), max_size=40).map(proton.symbol)
proton_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=0, max_value=255).map(proton.ubyte),
        st.integers(min_value=0, max_value=2**16 - 1).map(proton.ushort),
        st.integers(min_value=0, max_value=2**32 - 1).map(proton.uint),
        st.integers(min_value=0, max_value=2**64 - 1).map(proton.ulong),
        st.integers(min_value=-128, max_value=127).map(proton.byte),
        st.integers(min_value=-(2**15), max_value=2**15 - 1).map(proton.short),
        st.integers(min_value=-(2**31), max_value=2**31 - 1).map(proton.int32),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(width=32, allow_nan=False).map(proton.float32),
        st.floats(allow_nan=False),
        st.characters(codec="utf-8").map(proton.char),
        st.integers(min_value=-(2**63), max_value=2**63 - 1).map(proton.timestamp),
        st.uuids(),
        st.binary(max_size=300),
        st.text(alphabet=st.characters(codec="utf-8"), max_size=300),
        symbols,
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.text(max_size=10), inner, max_size=5),
        st.builds(proton.Described, symbols, inner),
        st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1), max_size=5).map(
            lambda xs: proton.Array(proton.UNDESCRIBED, proton.Data.INT, *xs)
        ),
        st.lists(st.text(max_size=5), max_size=5).map(
            lambda xs: proton.Array(proton.symbol("d"), proton.Data.STRING, *xs)
        ),
    ),
    max_leaves=20,
)


def _expected(value):
    """What decode_amqp_value must return for a value Proton encoded."""
    if isinstance(value, proton.Array):
        items = [_expected(v) for v in value.elements]
        if value.descriptor is not proton.UNDESCRIBED:
            items = [Described(str(value.descriptor), v) for v in items]
        return items
    if isinstance(value, proton.Described):
        return Described(str(value.descriptor), _expected(value.value))
    if isinstance(value, list):
        return [_expected(v) for v in value]
    if isinstance(value, dict):
        return {k: _expected(v) for k, v in value.items()}
    if isinstance(value, proton.float32):
        return float(value)
    return value


@FAST
@given(proton_values)
def test_type_decoder_reads_every_proton_encoding(value) -> None:
    decoded = decode_amqp_value(_proton_encode(value))
    assert decoded == _expected(value)
    if isinstance(value, proton.symbol):
        assert type(decoded) is Symbol
    if isinstance(value, proton.timestamp):
        assert type(decoded) is Timestamp


def test_bid_decimals() -> None:
    # IEEE 754-2008 BID: decimal32 bias 101, decimal64 bias 398, decimal128 bias 6176.
    d32 = lambda bits: decode_amqp_value(_proton_encode(proton.decimal32(bits)))  # noqa: E731
    d64 = lambda bits: decode_amqp_value(_proton_encode(proton.decimal64(bits)))  # noqa: E731
    assert d32(0x32800001) == Decimal(1)
    assert d32(0xB280007B) == Decimal(-123)
    assert d32(0x3200007B) == Decimal("12.3")
    assert d32(0x78000000) == Decimal("Infinity")
    assert d32(0xF8000000) == Decimal("-Infinity")
    assert d32(0x7C000000).is_nan()
    assert d32(0x6CB8967F) == Decimal(9999999)  # "11" combination form: coefficient 0b100...
    assert d64(0x31C0000000000001) == Decimal(1)
    assert d64(0x31A0000000000019) == Decimal("2.5")
    d128 = decode_amqp_value(
        _proton_encode(proton.decimal128(bytes.fromhex("30400000000000000000000000000001")))
    )
    assert d128 == Decimal(1)


def test_decoded_char_never_yields_surrogates() -> None:
    assert decode_amqp_value(bytes.fromhex("730000d800")) == "\ufffd"
    assert decode_amqp_value(bytes.fromhex("7300110000")) == "\ufffd"


def test_decode_amqp_value_rejects_bad_input() -> None:
    for data in (b"", b"\x02", b"\xa1\x05ab", b"\x40\x40", b"\xc0\x03\x02\x40"):
        with pytest.raises(ValueError):
            decode_amqp_value(data)


# ------------------------------------------------------------------- never raise, ever


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    r = decode_record(data, default_timestamp_ns=3)
    assert isinstance(r, Record) and isinstance(r.value, bytes)
    if not data.startswith(b"\x00"):  # no AMQP section can start here: raw bytes
        assert r == raw(data, 3)


section_starts = st.sampled_from(
    [b"\x00\x53" + bytes([code]) for code in range(0x70, 0x79)] + [b"\x00\xa3\x10amqp:data:binary"]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(section_starts, st.binary(max_size=40)), min_size=1, max_size=4))
def test_section_shaped_garbage_never_raises(parts) -> None:
    data = b"".join(start + body for start, body in parts)
    r = decode_record(data, default_timestamp_ns=3)
    assert isinstance(r, Record) and isinstance(r.value, bytes)
    assert all(type(k) is str and type(v) is bytes for k, v in r.headers.items())


@settings(max_examples=200, deadline=None)
@given(proton_values, st.data())
def test_corrupted_foreign_messages_never_raise(value, data) -> None:
    header = value if isinstance(value, (str, bytes, int)) else 1  # simple types only
    message = proton.Message(body=value, subject="s", properties={"h": header})
    encoded = bytearray(message.encode())
    valid = decode_record(bytes(encoded))
    assert valid.subject == "s" and set(valid.headers) == {"h"}  # intact: read as AMQP
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        i = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
        encoded[i] = data.draw(st.integers(min_value=0, max_value=255))
    r = decode_record(bytes(encoded))
    assert isinstance(r, Record) and isinstance(r.value, bytes)


@settings(max_examples=300, deadline=None)
@given(records, st.data())
def test_corrupted_records_never_raise(record: Record, data) -> None:
    encoded = bytearray(encode_record(record))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        i = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
        encoded[i] = data.draw(st.integers(min_value=0, max_value=255))
    r = decode_record(bytes(encoded))
    assert isinstance(r, Record) and isinstance(r.value, bytes)
    assert all(type(k) is str and type(v) is bytes for k, v in r.headers.items())


@FAST
@given(records)
def test_truncated_or_extended_records_are_raw(record: Record) -> None:
    data = encode_record(record)
    assert decode_record(data[:-1], 9) == raw(data[:-1], 9)  # cut inside the data section
    assert decode_record(data + b"\x00", 9) == raw(data + b"\x00", 9)
    assert decode_record(data + b"x", 9) == raw(data + b"x", 9)


def test_hostile_nesting_and_counts_are_raw() -> None:
    # amqp-value holding lists nested 2000 deep (list8 can't hold them: use list32 sizes)
    inner = b"\x45"
    for _ in range(2000):
        inner = b"\xd0" + (len(inner) + 4).to_bytes(4, "big") + (1).to_bytes(4, "big") + inner
    deep = b"\x00\x53\x77" + inner
    assert decode_record(deep) == raw(deep)
    # an array32 claiming 4 billion nulls, a list32 claiming 4 billion items in 8 octets
    nulls = b"\x00\x53\x77\xf0\x00\x00\x00\x05\xff\xff\xff\xff\x40"
    assert decode_record(nulls) == raw(nulls)
    items = b"\x00\x53\x77\xd0\x00\x00\x00\x04\xff\xff\xff\xff"
    assert decode_record(items) == raw(items)
    # a vbin32 claiming 4 GiB
    huge = b"\x00\x53\x75\xb0\xff\xff\xff\xff" + b"x" * 10
    assert decode_record(huge) == raw(huge)


def test_values_produced_are_bounded_by_the_input() -> None:
    # arrays of 0-octet elements and element descriptors produce values without octets: a
    # decode may produce 2 values per input octet + 1024 (at most 65536), then it is raw
    nulls = b"\x00\x53\x77\xe0\x02\xff\x40"  # array8 of 255 nulls: within the bound
    assert decode_record(nulls).value == json.dumps([None] * 255, separators=(",", ":")).encode()
    many = b"\x00\x53\x77\xf0\x00\x00\x00\x05\x00\x00\x10\x00\x45"  # 4096 list0
    assert decode_record(many) == raw(many)
    with pytest.raises(ValueError):
        decode_amqp_value(many[3:])
    # a descriptor applies to every element: 300 nulls under 8 descriptors is 2700 values
    described = b"\x00\x40" * 8 + b"\x40"
    arr = b"\xf0" + (len(described) + 4).to_bytes(4, "big") + (300).to_bytes(4, "big") + described
    assert decode_record(b"\x00\x53\x77" + arr) == raw(b"\x00\x53\x77" + arr)


def test_wrong_section_shapes_are_raw() -> None:
    for data in (
        bytes.fromhex("005375a10161"),  # data section holding a string, not binary
        bytes.fromhex("005374a10161"),  # application-properties that is not a map
        bytes.fromhex("005379a00161"),  # unknown section code
        bytes.fromhex("0053754040"),  # null data section
        bytes.fromhex("005375a00161" "01"),  # trailing octet after a section
        bytes.fromhex("0080" "0000000100000075" "a00161"),  # ulong descriptor, other domain
    ):
        assert decode_record(data) == raw(data)


def test_memoryview_input() -> None:
    data = encode_record(DOC_EXAMPLE)
    assert decode_record(memoryview(data)) == DOC_EXAMPLE
