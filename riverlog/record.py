# riverlog.record: how one message is stored as one record (one entry of a chunk) in the
# commit log, and how any stored record is read back.
#
# What it owns: the bytes of a single record. Nothing here knows about chunks, files, sockets
# or any front door; the log stores what encode_record returns, and every door reads through
# decode_record. Full description with a byte diagram: docs/record-format.md.
#
# Rules:
# - A record is an AMQP 1.0 message (AMQP 1.0 part 3 "Messaging", section 3.2), so a RabbitMQ
#   Stream client (rstream, rbfly, Java, Go, .NET, Node) decodes it as a normal message whose
#   body is the value (one `data` section), whose application-properties are the headers
#   (strings when UTF-8: what clients show as text; the Node client reads no binary there) and
#   whose properties carry subject, reply-to and correlation-id.
# - What AMQP has no standard place for (key, nanosecond timestamp, ack inbox) goes into the
#   message-annotations under `x-opt-` symbol keys, so every field a Liftbridge reader needs
#   comes back exactly: a None key stays None, an empty key stays b"".
# - A header whose value is empty is not an application property (the Node client throws on
#   any empty one, and every gRPC publish stores `reply` empty): its name goes into the
#   `x-opt-empty-headers` annotation, a JSON array of names, and comes back as b"".
# - Records published by RabbitMQ clients are stored as they came: usually AMQP 1.0 from any
#   encoder, sometimes raw bytes. decode_record therefore reads any valid AMQP 1.0 message
#   (every primitive encoding of part 1 "Types", described types, arrays, all nine sections in
#   any order) and maps it best-effort, and reads anything that is not exactly an AMQP 1.0
#   message as raw bytes. It never raises, whatever the input, and what it produces is bounded
#   by the input (riverlog.protocol.amqp10's Budget: values per octet, 64 levels deep), so a
#   hostile record costs its readers no more than its size.
# - The AMQP 1.0 type encodings and the section parser are riverlog.protocol.amqp10's; this
#   module owns only the layout: which sections and annotations hold which Record field.
# - Encoding is the ingest hot path (NATS and gRPC doors): hand-written, no generic encoder,
#   no per-field dispatch. Measure before changing it (docs/record-format.md has the numbers).
from __future__ import annotations

import json
import struct
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Iterable

from ._compiled import twin
from .protocol.amqp10 import Described, Malformed as _Malformed, Message as _Message
from .protocol.amqp10 import Symbol, Timestamp, decode_amqp_value, parse_message
from .protocol.amqp10 import compound as _compound
from .protocol.amqp10 import encode_str as _str
from .protocol.amqp10 import text_or_binary as _text_or_binary
from .protocol.amqp10 import vbin as _vbin

__all__ = [
    "ANNOTATION_ACK_INBOX",
    "ANNOTATION_EMPTY_HEADERS",
    "ANNOTATION_KEY",
    "ANNOTATION_TIMESTAMP_NS",
    "Described",
    "Record",
    "Symbol",
    "Timestamp",
    "decode_amqp_value",
    "decode_record",
    "encode_record",
    "encode_records",
]

# Message-annotation keys (symbols) that riverlog writes. AMQP 1.0 part 3 section 3.2.10
# reserves every key not starting with "x-", and tells a container to refuse keys it does not
# understand unless they start with "x-opt-": with this prefix, any AMQP 1.0 intermediary may
# ignore them safely.
ANNOTATION_KEY = "x-opt-key"  # string (binary when not UTF-8); absent when the key is None
ANNOTATION_TIMESTAMP_NS = "x-opt-timestamp-ns"  # ulong (long when < 0), ns since the Unix epoch
ANNOTATION_ACK_INBOX = "x-opt-ack-inbox"  # string; absent when there is no ack inbox
# string: a JSON array of the names of the headers whose value is empty, in the headers'
# order; absent when there is none
ANNOTATION_EMPTY_HEADERS = "x-opt-empty-headers"


@dataclass(slots=True)
class Record:
    """One message as the broker core sees it, whichever door it came through.

    - value: the payload bytes (an AMQP `data` body).
    - key: the Liftbridge message key; None (no key) is distinct from b"" (empty key).
    - headers: Liftbridge headers, str -> bytes (AMQP application-properties; the names of
      those whose value is empty in the ``x-opt-empty-headers`` message-annotation).
    - timestamp_ns: reception time, nanoseconds since the Unix epoch (signed 64-bit).
    - subject: the NATS subject the message was published on (AMQP properties.subject).
    - reply: the NATS reply subject (AMQP properties.reply-to).
    - correlation_id: Liftbridge correlation id (AMQP properties.correlation-id, a string).
    - ack_inbox: the NATS subject an ack is published to, or None.
    """

    value: bytes = b""
    key: bytes | None = None
    headers: dict[str, bytes] = field(default_factory=dict)
    timestamp_ns: int = 0
    subject: str | None = None
    reply: str | None = None
    correlation_id: str | None = None
    ack_inbox: str | None = None


# ---------------------------------------------------------------------------------------------
# Encoding (the hot path)
# ---------------------------------------------------------------------------------------------
# Every section is a described type (part 1 section 1.2) whose descriptor is a smallulong
# (0x53) holding the section code of part 3 section 3.2: 0x00 0x53 0x72 = message-annotations.

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_pack_long = struct.Struct(">q").pack
_u32 = struct.Struct(">I").unpack_from
_u32x2 = struct.Struct(">II").unpack_from
_i64 = struct.Struct(">q").unpack_from

_MA_TIMESTAMP_NAME = b"\xa3\x12" + ANNOTATION_TIMESTAMP_NS.encode()  # sym8 key
# its value: ulong, which every stream client decodes (the Node client reads no long), or
# long for a timestamp before 1970 (the same 8 octets would read as a huge ulong)
_MA_TIMESTAMP = _MA_TIMESTAMP_NAME + b"\x80"
_MA_TIMESTAMP_LONG = _MA_TIMESTAMP_NAME + b"\x81"
_MA_KEY = b"\xa3\x09" + ANNOTATION_KEY.encode()
_MA_ACK = b"\xa3\x0f" + ANNOTATION_ACK_INBOX.encode()
_MA_EMPTY = b"\xa3\x13" + ANNOTATION_EMPTY_HEADERS.encode()
_EMPTY_REPLY = b'["reply"]'  # what NATS (no reply subject) and gRPC publishes store
_MA_EMPTY_REPLY = _MA_EMPTY + bytes((0xA1, len(_EMPTY_REPLY))) + _EMPTY_REPLY
_NULL3 = b"\x40\x40\x40"  # properties: message-id, user-id, to are null

_SEC_MA = b"\x00\x53\x72"
_SEC_PROPERTIES = b"\x00\x53\x73"
_SEC_APP_PROPERTIES = b"\x00\x53\x74"
_SEC_DATA = b"\x00\x53\x75"
# message-annotations holding only the timestamp: map8 of 2 items, size = items + count octet
_MA_TIMESTAMP_ONLY = _SEC_MA + bytes((0xC1, len(_MA_TIMESTAMP) + 8 + 1, 2)) + _MA_TIMESTAMP
_MA_TIMESTAMP_LONG_ONLY = (_SEC_MA + bytes((0xC1, len(_MA_TIMESTAMP) + 8 + 1, 2))
                           + _MA_TIMESTAMP_LONG)



def _annotations(ts: int, key: bytes | None, ack: str | None, empty: bytes) -> bytes:
    # ``empty``: the encoded x-opt-empty-headers item (name and value), or b""
    if not _INT64_MIN <= ts <= _INT64_MAX:
        raise ValueError(f"timestamp_ns {ts!r} does not fit a signed 64-bit integer")
    if key is None and ack is None and not empty:
        return (_MA_TIMESTAMP_ONLY if ts >= 0 else _MA_TIMESTAMP_LONG_ONLY) + _pack_long(ts)
    body = [_MA_TIMESTAMP if ts >= 0 else _MA_TIMESTAMP_LONG, _pack_long(ts)]
    count = 2
    if key is not None:
        body += (_MA_KEY, _text_or_binary(key))
        count = 4
    if ack is not None:
        body += (_MA_ACK, _str(ack))
        count += 2
    if empty:
        body.append(empty)
        count += 2
    return _compound(_SEC_MA, 0xC1, b"".join(body), count)


def _properties_head(subject: str | None, reply: str | None) -> bytes:
    # message-id, user-id, to, subject, reply-to: what precedes a correlation id
    return (_NULL3 + (b"\x40" if subject is None else _str(subject))
            + (b"\x40" if reply is None else _str(reply)))


def _properties(subject: str | None, reply: str | None, corr: str | None) -> bytes:
    if corr is not None:
        return _compound(_SEC_PROPERTIES, 0xC0, _properties_head(subject, reply) + _str(corr), 6)
    if subject is None and reply is None:
        return b""
    props = _NULL3 + (b"\x40" if subject is None else _str(subject))
    if reply is None:
        return _compound(_SEC_PROPERTIES, 0xC0, props, 4)
    return _compound(_SEC_PROPERTIES, 0xC0, props + _str(reply), 5)


def _headers(headers: dict[str, bytes]) -> tuple[bytes, bytes]:
    """(application-properties section of the headers with a value, x-opt-empty-headers
    annotation item naming the others), each b"" when there is nothing to write."""
    if not headers:
        return b"", b""
    body = []
    empty = None
    for name, hval in headers.items():
        if hval == b"":
            if empty is None:
                empty = [name]
            else:
                empty.append(name)
        else:
            body.append(_str(name))
            body.append(_text_or_binary(hval))
    app = _compound(_SEC_APP_PROPERTIES, 0xC1, b"".join(body), len(body)) if body else b""
    if empty is None:
        return app, b""
    if empty == ["reply"]:
        return app, _MA_EMPTY_REPLY
    for name in empty:
        if not isinstance(name, str):
            raise TypeError(f"header name {name!r} is not a str")
    # JSON: exact for any str, and the Node client reads a string annotation
    return app, _MA_EMPTY + _str(json.dumps(empty, ensure_ascii=False, separators=(",", ":")))


def encode_record(record: Record) -> bytes:
    """Encode ``record`` as the bytes of one commit-log record: an AMQP 1.0 message.

    Sections, in the order of AMQP 1.0 part 3 section 3.2:

    - message-annotations (3.2.3), always: ``x-opt-timestamp-ns`` (ns: ulong, long when
      negative), then ``x-opt-key`` when the key is not None, ``x-opt-ack-inbox`` (string)
      when set, ``x-opt-empty-headers`` (string: a compact JSON array of the names of the
      headers whose value is b"", in the headers' order) when there are such headers.
    - properties (3.2.4), only when subject, reply or correlation_id is set: a list of
      message-id, user-id, to (all null), subject, reply-to, correlation-id (strings or null),
      trailing nulls left out.
    - application-properties (3.2.5), only when there are headers with a non-empty value:
      string -> value, in the headers' order.
    - data (3.2.6), always, holding the value (also when empty).

    The key and header values are strings (str8/str32) when they are valid UTF-8, else
    binary (vbin8/vbin32): decode_record gives the same bytes back. Encodings are from AMQP
    1.0 part 1 section 1.6: sym8, str8/str32, vbin8/vbin32, ulong, long, null, list8/list32,
    map8/map32. Returns bytes. Raises ValueError when the timestamp does not fit a signed
    64-bit long or a string is not encodable as UTF-8 (lone surrogates), OverflowError for a
    field of 4 GiB or more, TypeError (or struct.error) for a field of the wrong type.
    """
    app, empty = _headers(record.headers)
    value = record.value
    return b"".join((
        _annotations(record.timestamp_ns, record.key, record.ack_inbox, empty),
        _properties(record.subject, record.reply, record.correlation_id),
        app, _SEC_DATA, _vbin(len(value)), value))


_NOT_READ = object()  # encode_records' headers before the first record


def encode_records(records: Iterable[Record]) -> list[bytes]:
    """``[encode_record(r) for r in records]``, byte for byte, in one pass over a batch (the
    records of one read): what consecutive records share is encoded once — the
    message-annotations of a timestamp and ack inbox with no key, the properties up to the
    correlation id (same subject and reply), the application-properties and empty header
    names of equal headers. Raises what ``encode_record`` raises, for the first record that
    fails."""
    out = []
    append = out.append
    last_ts = last_ack = last_ma = last_sr = last_head = last_app = None
    last_headers: Any = _NOT_READ
    last_empty = b""
    ma_empty = None  # the empty header names last_ma was encoded with
    for record in records:
        headers = record.headers
        if headers != last_headers:
            last_app, last_empty = _headers(headers)
            # a copy: the caller may reuse the dict (None, as encode_record takes it, stays)
            last_headers = dict(headers) if headers else headers
        ts, key, ack = record.timestamp_ns, record.key, record.ack_inbox
        if key is None:
            if (ts != last_ts or ack != last_ack or last_empty is not ma_empty
                    or type(ts) is not int):
                last_ma = _annotations(ts, None, ack, last_empty)
                last_ts = ts
                last_ack = ack
                ma_empty = last_empty
            ma = last_ma
        else:
            ma = _annotations(ts, key, ack, last_empty)
        corr = record.correlation_id
        if corr is None:
            props = _properties(record.subject, record.reply, None)
        else:
            sr = (record.subject, record.reply)
            if sr != last_sr:
                last_head = _properties_head(*sr)
                last_sr = sr
            props = _compound(_SEC_PROPERTIES, 0xC0, last_head + _str(corr), 6)
        value = record.value
        append(b"".join((ma, props, last_app, _SEC_DATA, _vbin(len(value)), value)))
    return out


# The compiled twin (_record_c.pyx, riverlog/_compiled.py): encode_record and encode_records
# bound over the Python ones above, which stay as the reference (_py_*) and the fallback.
_py_encode_record = encode_record
_py_encode_records = encode_records


def _bind_twin(compiled) -> None:
    """Hand the twin its fallback and constants (also for tests that import it directly)."""
    compiled._bind(_py_encode_record, _MA_TIMESTAMP_NAME, _MA_KEY, _MA_ACK, _MA_EMPTY,
                   _EMPTY_REPLY, (_SEC_MA, _SEC_PROPERTIES, _SEC_APP_PROPERTIES, _SEC_DATA))


_c = twin(__name__, "_record_c")
if _c is not None:
    _bind_twin(_c)
    encode_record = _c.encode_record  # noqa: F811
    encode_records = _c.encode_records  # noqa: F811


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return int(value) if isinstance(value, Timestamp) else value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.hex()
    if isinstance(value, (Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, Described):
        return {"descriptor": _jsonable(value.descriptor), "value": _jsonable(value.value)}
    if isinstance(value, dict):
        return {_text(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return repr(value)


def _to_bytes(value: Any) -> bytes:
    """Best-effort bytes for a foreign AMQP value (a header value or a non-binary body)."""
    if type(value) is bytes:
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if value is None:
        return b""
    if value is True:
        return b"true"
    if value is False:
        return b"false"
    if isinstance(value, int):
        return str(int(value)).encode()
    if isinstance(value, float):
        return repr(value).encode()
    if isinstance(value, (Decimal, uuid.UUID)):
        return str(value).encode()
    return json.dumps(_jsonable(value), ensure_ascii=False, separators=(",", ":")).encode()


def _text(value: Any) -> str:
    """Best-effort str for a foreign AMQP value (a header key, subject or correlation id)."""
    if type(value) is str:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.hex()
    return _to_bytes(value).decode("utf-8", "replace")


def _add_empty_headers(headers: dict[str, bytes], names: str) -> None:
    """Add ``name: b""`` to ``headers`` for each string of the JSON array ``names`` (an
    ``x-opt-empty-headers`` value) that is encodable as UTF-8; anything else is ignored."""
    try:
        parsed = json.loads(names)
    except (ValueError, RecursionError):
        return
    if type(parsed) is list:
        for name in parsed:
            if type(name) is str:
                try:
                    name.encode()
                except UnicodeEncodeError:  # a lone surrogate escaped in the JSON
                    continue
                headers[name] = b""


def _own_variable(buf: bytes, pos: int, short_code: int) -> tuple[bytes, int]:
    """The bytes of a str8/sym8/vbin8 (``short_code``) or its 32-bit form (``short_code``
    + 0x10) at ``pos``, and the position after it."""
    code = buf[pos]
    if code == short_code:
        start = pos + 2
        nxt = start + buf[pos + 1]
    elif code == short_code + 0x10:
        start = pos + 5
        nxt = start + _u32(buf, pos + 1)[0]
    else:
        raise _Malformed
    if nxt > len(buf):
        raise _Malformed
    return buf[start:nxt], nxt


def _own_str(buf: bytes, pos: int) -> tuple[str, int]:
    raw, nxt = _own_variable(buf, pos, 0xA1)
    return raw.decode("utf-8", "replace"), nxt


def _own_bin(buf: bytes, pos: int) -> tuple[bytes, int]:
    return _own_variable(buf, pos, 0xA0)


def _own_text_or_bin(buf: bytes, pos: int) -> tuple[bytes, int]:
    """What _text_or_binary wrote at ``pos``: the bytes of a binary, or of a string as the
    general parser gives them (UTF-8, invalid sequences replaced)."""
    if (buf[pos] & 0xEF) == 0xA0:  # vbin8 or vbin32
        return _own_variable(buf, pos, 0xA0)
    raw, nxt = _own_variable(buf, pos, 0xA1)
    return (raw if raw.isascii() else raw.decode("utf-8", "replace").encode()), nxt


def _own_compound(buf: bytes, pos: int, small: int) -> tuple[int, int, int]:
    """(count, first item, end) of the list8/map8 (``small``) or list32/map32 at ``pos``."""
    code = buf[pos]
    if code == small:
        return buf[pos + 2], pos + 3, pos + 2 + buf[pos + 1]
    if code == small + 0x10:
        size, count = _u32x2(buf, pos + 1)
        return count, pos + 9, pos + 5 + size
    raise _Malformed


def _decode_own(buf: bytes) -> Record | None:
    """Fast path for exactly the layout encode_record writes; None (or _Malformed, or any
    error from a short buffer) when ``buf`` deviates from it in any way. The general parser
    gives the same Record for every input this accepts; tests hold the two to that."""
    if not buf.startswith(_SEC_MA):
        return None
    count, pos, end = _own_compound(buf, 3, 0xC1)
    if not buf.startswith(_MA_TIMESTAMP_NAME, pos):
        return None
    pos += len(_MA_TIMESTAMP_NAME) + 1
    record = Record(timestamp_ns=_i64(buf, pos)[0])
    code = buf[pos - 1]
    if code != 0x81 and (code != 0x80 or record.timestamp_ns < 0):  # a ulong over 2**63 - 1
        return None
    pos += 8
    seen = 2
    if seen < count and buf.startswith(_MA_KEY, pos):
        record.key, pos = _own_text_or_bin(buf, pos + len(_MA_KEY))
        seen = 4
    if seen < count and buf.startswith(_MA_ACK, pos):
        record.ack_inbox, pos = _own_str(buf, pos + len(_MA_ACK))
        seen += 2
    if seen < count and buf.startswith(_MA_EMPTY, pos):
        if buf.startswith(_MA_EMPTY_REPLY, pos):
            record.headers["reply"] = b""
            pos += len(_MA_EMPTY_REPLY)
        else:
            names, pos = _own_str(buf, pos + len(_MA_EMPTY))
            _add_empty_headers(record.headers, names)
        seen += 2
    if seen != count or pos != end:
        return None

    if buf.startswith(_SEC_PROPERTIES, pos):
        count, pos, end = _own_compound(buf, pos + 3, 0xC0)
        if not 4 <= count <= 6 or not buf.startswith(_NULL3, pos):
            return None
        pos += 3
        fields = []
        for _ in range(count - 3):
            if buf[pos] == 0x40:
                fields.append(None)
                pos += 1
            else:
                text, pos = _own_str(buf, pos)
                fields.append(text)
        if pos != end:
            return None
        record.subject = fields[0]
        if count > 4:
            record.reply = fields[1]
            if count > 5:
                record.correlation_id = fields[2]

    if buf.startswith(_SEC_APP_PROPERTIES, pos):
        count, pos, end = _own_compound(buf, pos + 3, 0xC1)
        if count & 1:
            return None
        headers = record.headers
        for _ in range(count >> 1):
            name, pos = _own_str(buf, pos)
            headers[name], pos = _own_text_or_bin(buf, pos)
        if pos != end:
            return None

    if not buf.startswith(_SEC_DATA, pos):
        return None
    record.value, pos = _own_bin(buf, pos + 3)
    if pos != len(buf):
        return None
    return record


def decode_record(data: bytes, default_timestamp_ns: int = 0) -> Record:
    """Read one stored record, whoever wrote it. Never raises.

    - An AMQP 1.0 message (part 3 section 3.2: sections in any order, descriptors as
      smallulong, ulong or symbol) becomes a Record with:
      value = the concatenated `data` sections (3.2.6); else the items of the
      `amqp-sequence` sections (3.2.7) as a JSON array; else the `amqp-value` (3.2.8) as
      bytes (binary as is, string/symbol as UTF-8, numbers as decimal text, true/false,
      null as b"", lists/maps/described values as JSON); b"" when there is no body.
      headers = the names in the message-annotation ``x-opt-empty-headers`` (a JSON array
      of strings) with the value b"", then the application-properties (3.2.5), keys as str,
      values as bytes by the same rule (a name in both gets the application property's
      value, at its first place): the order they come in the record.
      subject, reply = properties.subject and reply-to (3.2.4); correlation_id =
      properties.correlation-id as text (ulong in decimal, uuid in canonical form, binary as
      UTF-8 or else hex). key, timestamp_ns, ack_inbox = the message-annotations (3.2.3)
      ``x-opt-key`` (binary, or string as UTF-8), ``x-opt-timestamp-ns`` (ns: long, or ulong
      up to 2**63 - 1) and ``x-opt-ack-inbox`` (string); timestamp_ns is
      ``default_timestamp_ns`` when absent (pass the chunk's timestamp, in ns).
    - Anything that is not exactly an AMQP 1.0 message (raw bytes, truncated or trailing
      garbage, unknown constructors, nesting deeper than 64) becomes
      Record(value=data, timestamp_ns=default_timestamp_ns): no key, no headers. So does a
      message that would decode into more than 2 values per octet + 1024 (at most 65536
      values: items of lists, maps and arrays, and the descriptors of array elements), which
      keeps what a hostile record costs to read proportional to its size.
    """
    if type(data) is not bytes:
        data = bytes(data)
    try:
        record = _decode_own(data)
        if record is not None:
            return record
    except Exception:  # not our own layout after all: the general parser decides
        pass
    try:
        msg = parse_message(data)
        return _to_record(msg, default_timestamp_ns)
    except Exception:  # malformed, or a defect here: the bytes are still the value
        return Record(value=data, timestamp_ns=default_timestamp_ns)


def _to_record(msg: _Message, default_timestamp_ns: int) -> Record:
    if msg.data:
        value = msg.data[0] if len(msg.data) == 1 else b"".join(msg.data)
    elif msg.has_sequence:
        value = _to_bytes(msg.sequence)
    elif msg.has_value:
        value = _to_bytes(msg.value)
    else:
        value = b""
    record = Record(value=value, timestamp_ns=default_timestamp_ns)

    ann = msg.annotations
    if ann:
        key = ann.get(ANNOTATION_KEY)
        if type(key) is bytes:
            record.key = key
        elif isinstance(key, str):
            record.key = key.encode("utf-8")
        ts = ann.get(ANNOTATION_TIMESTAMP_NS)
        if type(ts) is int and _INT64_MIN <= ts <= _INT64_MAX:  # long or ulong
            record.timestamp_ns = ts
        ack = ann.get(ANNOTATION_ACK_INBOX)
        if isinstance(ack, str):
            record.ack_inbox = ack if type(ack) is str else str.__str__(ack)

    props = msg.properties
    if props:
        n = len(props)
        if n > 3 and props[3] is not None:
            record.subject = _text(props[3])
        if n > 4 and props[4] is not None:
            record.reply = _text(props[4])
        if n > 5 and props[5] is not None:
            record.correlation_id = _text(props[5])

    if ann:
        names = ann.get(ANNOTATION_EMPTY_HEADERS)
        if isinstance(names, str):
            _add_empty_headers(record.headers, names)
    app = msg.app_properties
    if app:
        headers = record.headers
        for name, hval in app.items():
            headers[name if type(name) is str else _text(name)] = (
                hval if type(hval) is bytes else _to_bytes(hval)
            )
    return record
