# Stored records as serialized Liftbridge `Message`s (api.proto): what a Subscribe sends, built
# straight from the record bytes. The read-side mirror of record.encode_records.
#
# What it owns: the protobuf bytes of a Message (offset=1, key=2, value=3, timestamp=4,
# stream=5, partition=6, subject=7, replySubject=8, headers=9 map<string, bytes>; varints,
# length-delimited fields, proto3 defaults left out as protobuf leaves them out) and the
# mapping of a stored record onto it: subject and replySubject are the `subject`/`reply`
# headers when present (UTF-8, invalid sequences replaced), else the record's own; a key of
# None is empty; the timestamp defaults to the chunk's.
#
# Rules:
# - Exactly what decode_record + pb.Message(...).SerializeToString() give, parsed: for the
#   records riverlog writes (record.py's own layout, as its _decode_own fast path accepts it)
#   the bytes are built here in one pass; any other record (a RabbitMQ client's AMQP message,
#   raw bytes, anything _decode_own refuses) goes that old way. Tests hold the two to equal
#   parsed Messages over generated records.
# - No Record and no Message object per record: what consecutive records share (stream and
#   partition; subject, reply and headers, which are equal bytes in the stored records) is
#   encoded once per encoder and looked up by those bytes.
# - Hot path (Subscribe): measure before changing it (benchmarks/subscribe_serialize_bench.py).
#   A compiled twin of extend (_messages_c.pyx) is bound over it when built, unless
#   RIVERLOG_NO_EXTENSIONS is set; the code here stays the reference (riverlog/_compiled.py).
from __future__ import annotations

from typing import Iterable

from ..._compiled import twin
from ...record import (_MA_ACK, _MA_EMPTY, _MA_EMPTY_REPLY, _MA_KEY, _MA_TIMESTAMP_NAME, _NULL3,
                       _SEC_APP_PROPERTIES, _SEC_DATA, _SEC_MA, _SEC_PROPERTIES, _add_empty_headers,
                       _i64, _own_compound, _own_str, _own_text_or_bin, _u32, _u32x2,
                       decode_record)
from . import api_pb2 as pb
from .envelope import varint

__all__ = ["MessageEncoder", "message_of_record"]

_BYTE = [bytes((i,)) for i in range(128)]
_CONTINUED = [bytes((i | 0x80,)) for i in range(128)]  # a low 7-bit group with more to come
_TS_NAME_END = len(_MA_TIMESTAMP_NAME)
_KEY_LEN = len(_MA_KEY)
_ACK_LEN = len(_MA_ACK)
_EMPTY_LEN = len(_MA_EMPTY)
_KEY_AT = 6 + _TS_NAME_END + 9  # where a key's name starts in a map8 message-annotations
_KEY_VALUE_AT = _KEY_AT + len(_MA_KEY)  # and its value
_OFFSET_SMALL = [b"\x08" + b for b in _BYTE]  # the offset field of offsets 0-127
_CACHE_MAX = 1024
"""Distinct message-annotations, and distinct (empty header names, subject and reply,
application-properties), an encoder keeps read; past that it starts over (records whose keys
or headers all differ are read in full every time)."""
_CACHED_BYTES_MAX = 4096
"""Record bytes longer than this (large headers or annotations) are read every time, never
kept as a cache key: an encoder keeps at most ~_CACHE_MAX x this many bytes per cache, 4 MiB,
whatever a publisher puts in its records."""


def _varint(v: int) -> bytes:
    """The protobuf varint of an int64/int32 ``v``: a negative one as its 64-bit two's
    complement (10 bytes)."""
    return varint(v if v >= 0 else v + (1 << 64))


def _field(tag: bytes, data: bytes) -> bytes:
    """A length-delimited field: ``tag``, the length of ``data``, ``data``."""
    return tag + varint(len(data)) + data


def message_of_record(raw: bytes, offset: int, default_ns: int, stream: str,
                      partition: int) -> tuple[bytes, int]:
    """The serialized Message of the stored record ``raw`` at ``offset`` made the general
    way (decode_record, then a pb.Message), and its value's length in bytes. For records
    MessageEncoder cannot read itself. Raises ValueError when a field cannot be a protobuf
    string (a stream name with a lone surrogate)."""
    record = decode_record(raw, default_ns)
    headers = record.headers
    subject = headers.get("subject")
    reply = headers.get("reply")
    return pb.Message(
        offset=offset, key=record.key or b"", value=record.value,
        timestamp=record.timestamp_ns, stream=stream, partition=partition,
        subject=subject.decode("utf-8", "replace") if subject is not None
        else (record.subject or ""),
        replySubject=reply.decode("utf-8", "replace") if reply is not None
        else (record.reply or ""),
        headers=headers).SerializeToString(), len(record.value)


class _Foreign(Exception):
    """A record that is not in riverlog's own layout (or breaks it somewhere)."""


class MessageEncoder:
    """Serialized Messages of one partition's stored records (one per Subscribe).

    ``stream``: the stream's name, ``partition``: its index; both are encoded once, here.
    Raises ValueError when the name cannot be UTF-8 (a lone surrogate)."""

    __slots__ = ("stream", "partition", "foreign", "value_bytes", "_constant", "_heads",
                 "_suffixes", "_ts", "_ts_field", "_high", "_high_bytes", "_n", "_n_field")

    def __init__(self, stream: str, partition: int) -> None:
        self.stream = stream
        self.partition = partition
        self.foreign = 0
        """Records encoded the general way (message_of_record), so far."""
        self.value_bytes = 0
        """The value bytes of every Message appended, so far."""
        name = stream.encode()
        self._constant = ((_field(b"\x2a", name) if name else b"")
                          + (b"\x30" + _varint(partition) if partition else b""))
        # message-annotations by their bytes, or with a key by those before and after it
        self._heads: dict[bytes | tuple[bytes, bytes], tuple[bytes, bytes, bytes, int]] = {}
        self._suffixes: dict[tuple[bytes, bytes, bytes], bytes] = {}
        self._ts = 0  # the last timestamp read, and its field (none for 0)
        self._ts_field = b""
        self._n = 0  # the last value length, and its field's tag and varint
        self._n_field = b""
        self._high = 0  # offset >> 7 of the last offset of 128 or more, and its varint
        self._high_bytes = b"\x00"

    def extend(self, out: list[bytes], records: Iterable[tuple[int, bytes]], start: int,
               stop: int, default_ns: int) -> bool:
        """Append to ``out`` the Messages of ``records`` ((offset, record bytes) of one
        chunk, ascending) whose offset is >= ``start``, up to ``stop`` included (< 0: no
        stop), and add their values' bytes to ``value_bytes``. ``default_ns``: the chunk's
        timestamp in ns, for records without their own. Returns whether the stop offset was
        reached. Raises what iterating ``records`` raises (ChunkFormatError: what was
        appended before stays, and is counted), and ValueError as message_of_record does."""
        append = out.append
        heads = self._heads
        suffixes = self._suffixes
        for offset, raw in records:
            if offset < start:
                continue
            # riverlog's own layout, read as record.py's _decode_own reads it (the same
            # checks): anything it would not accept raises (_Foreign, or an error from a
            # short buffer) and is read the general way
            try:
                # message-annotations (timestamp, key, ack inbox, empty header names): read
                # once per distinct bytes (records without a key in a read share them)
                head = None
                if raw[3] == 0xC1:  # map8, what riverlog writes
                    pos = 5 + raw[4]
                    if not raw.startswith(_MA_KEY, _KEY_AT):
                        head = heads.get(raw[:pos])
                    else:  # the key apart: the bytes before and after it looked up
                        code = raw[_KEY_VALUE_AT]
                        key_end = _KEY_VALUE_AT + 2 + raw[_KEY_VALUE_AT + 1]
                        if (code == 0xA0 or code == 0xA1) and key_end <= pos:
                            head = heads.get((raw[:_KEY_AT], raw[key_end:pos]))
                            if head is not None:
                                key = raw[_KEY_VALUE_AT + 2:key_end]
                                if code == 0xA1 and not key.isascii():  # _own_text_or_bin's way
                                    key = key.decode("utf-8", "replace").encode()
                                head = (head[0], b"\x12" + varint(len(key)) + key if key else b"",
                                        head[2])
                if head is None:
                    head = self._head(raw)
                    pos = head[3]
                ts_field, key_field, empty = head[:3]

                # properties: subject, reply-to, correlation id (not part of a Message)
                subject_reply = b""
                if raw.startswith(_SEC_PROPERTIES, pos):
                    code = raw[pos + 3]
                    if code == 0xC0:
                        count, first, end = raw[pos + 5], pos + 6, pos + 5 + raw[pos + 4]
                    elif code == 0xD0:
                        size, count = _u32x2(raw, pos + 4)
                        first, end = pos + 12, pos + 8 + size
                    else:
                        raise _Foreign
                    if not 4 <= count <= 6 or not raw.startswith(_NULL3, first):
                        raise _Foreign
                    first += 3
                    pos = first
                    for i in range(count - 3):  # subject, reply-to, correlation id: str or null
                        if i == 2:
                            subject_reply = raw[first:pos]
                        code = raw[pos]
                        if code == 0xA1:
                            pos += 2 + raw[pos + 1]
                        elif code == 0x40:
                            pos += 1
                        elif code == 0xB1:
                            pos += 5 + _u32(raw, pos + 1)[0]
                        else:
                            raise _Foreign
                    if pos != end or end > len(raw):  # (pos only grows: no string ran past raw)
                        raise _Foreign
                    if count < 6:
                        subject_reply = raw[first:pos]

                # application-properties: read (and checked) once per distinct bytes, in _suffix
                app = b""
                if raw.startswith(_SEC_APP_PROPERTIES, pos):
                    code = raw[pos + 3]
                    if code == 0xC1:
                        end = pos + 5 + raw[pos + 4]
                    elif code == 0xD1:
                        end = pos + 8 + _u32(raw, pos + 4)[0]
                    else:
                        raise _Foreign
                    app = raw[pos:end]
                    pos = end

                # data: the value, to the end of the record
                if not raw.startswith(_SEC_DATA, pos):
                    raise _Foreign
                code = raw[pos + 3]
                if code == 0xB0:
                    n = _u32(raw, pos + 4)[0]
                    pos += 8
                elif code == 0xA0:
                    n = raw[pos + 4]
                    pos += 5
                else:
                    raise _Foreign
                if pos + n != len(raw):
                    raise _Foreign

                suffix = suffixes.get((empty, subject_reply, app))
                if suffix is None:
                    suffix = self._suffix(empty, subject_reply, app)

                if 0 <= offset < 0x80:
                    offset_field = _OFFSET_SMALL[offset]
                elif offset > 0:
                    high = offset >> 7
                    if high != self._high:
                        self._high = high
                        self._high_bytes = _varint(high)
                    offset_field = b"\x08" + _CONTINUED[offset & 0x7F] + self._high_bytes
                else:
                    offset_field = b"\x08" + _varint(offset)
                if n != self._n:
                    self._n = n
                    self._n_field = b"\x1a" + varint(n) if n else b""
                message = b"".join((offset_field, key_field, self._n_field, raw[pos:], ts_field,
                                    suffix))

            except Exception:  # not our own layout: read the general way
                self.foreign += 1
                message, n = message_of_record(raw, offset, default_ns, self.stream,
                                               self.partition)
            append(message)
            self.value_bytes += n
            if offset == stop:
                return True
        return False

    def _head(self, raw: bytes) -> tuple[bytes, bytes, bytes, int]:
        """(timestamp field, key field, the x-opt-empty-headers item, the position after
        the section) of the message-annotations section that starts ``raw``; each field b""
        when protobuf leaves it out, the item b"" when absent. Remembers them by the
        section's bytes, or for a map8 with a str8/vbin8 key by the bytes before and after
        the key (its field is then made by the caller)."""
        if not raw.startswith(_SEC_MA):
            raise _Foreign
        code = raw[3]
        if code == 0xC1:
            count, pos, end = raw[5], 6, 5 + raw[4]
        elif code == 0xD1:
            size, count = _u32x2(raw, 4)
            pos, end = 12, 8 + size
        else:
            raise _Foreign
        if not raw.startswith(_MA_TIMESTAMP_NAME, pos):
            raise _Foreign
        pos += _TS_NAME_END
        code = raw[pos]
        ts = _i64(raw, pos + 1)[0]
        if code != 0x81 and (code != 0x80 or ts < 0):
            raise _Foreign
        pos += 9
        seen = 2
        key = None
        if seen < count and raw.startswith(_MA_KEY, pos):
            key, pos = _own_text_or_bin(raw, pos + _KEY_LEN)
            seen = 4
        if seen < count and raw.startswith(_MA_ACK, pos):
            pos = _skip_str(raw, pos + _ACK_LEN)
            seen += 2
        empty = b""
        if seen < count and raw.startswith(_MA_EMPTY, pos):
            if raw.startswith(_MA_EMPTY_REPLY, pos):
                empty = _MA_EMPTY_REPLY
            else:
                empty = raw[pos:_skip_str(raw, pos + _EMPTY_LEN)]
            pos += len(empty)
            seen += 2
        if seen != count or pos != end:
            raise _Foreign
        if ts != self._ts:
            self._ts = ts
            self._ts_field = b"\x20" + _varint(ts) if ts else b""
        heads = self._heads
        if len(heads) >= _CACHE_MAX:
            heads.clear()
        if key is None:
            head = (self._ts_field, b"", empty, end)
            if end <= _CACHED_BYTES_MAX:
                heads[raw[:end]] = head
            return head
        if raw[3] == 0xC1 and (raw[_KEY_VALUE_AT] == 0xA0 or raw[_KEY_VALUE_AT] == 0xA1):
            key_end = _KEY_VALUE_AT + 2 + raw[_KEY_VALUE_AT + 1]  # map8, a str8 or vbin8 key
            if end - key_end <= _CACHED_BYTES_MAX:
                heads[(raw[:_KEY_AT], raw[key_end:end])] = (self._ts_field, b"", empty, end)
        return self._ts_field, b"\x12" + varint(len(key)) + key if key else b"", empty, end

    def _suffix(self, empty: bytes, subject_reply: bytes, app: bytes) -> bytes:
        """Fields 5-9 (stream, partition, subject, replySubject, headers) for these bytes
        of a record: the x-opt-empty-headers item, the properties' subject and reply-to,
        the application-properties section (each b"" when absent). Remembers them."""
        headers: dict[str, bytes] = {}
        if empty == _MA_EMPTY_REPLY:
            headers["reply"] = b""
        elif empty:
            _add_empty_headers(headers, _own_str(empty, _EMPTY_LEN)[0])
        if app:
            count, pos, end = _own_compound(app, 3, 0xC1)
            if count & 1:
                raise _Foreign
            for _ in range(count >> 1):
                name, pos = _own_str(app, pos)
                headers[name], pos = _own_text_or_bin(app, pos)
            if pos != end:
                raise _Foreign
        subject = headers.get("subject")
        reply = headers.get("reply")
        if subject is None or reply is None:
            own_subject = own_reply = None
            if subject_reply:
                own_subject, pos = _str_or_null(subject_reply, 0)
                if pos < len(subject_reply):
                    own_reply = _str_or_null(subject_reply, pos)[0]
            if subject is None:
                subject = own_subject
            if reply is None:
                reply = own_reply
        parts = [self._constant]
        for tag, text in ((b"\x3a", subject), (b"\x42", reply)):
            if text:  # bytes from a header (made valid UTF-8 here), or UTF-8 from a str
                text = text.decode("utf-8", "replace").encode()
                parts.append(_field(tag, text))
        for name, hval in headers.items():
            entry = _field(b"\x0a", name.encode()) + _field(b"\x12", hval)
            parts.append(_field(b"\x4a", entry))
        suffix = b"".join(parts)
        if len(empty) + len(subject_reply) + len(app) <= _CACHED_BYTES_MAX:
            if len(self._suffixes) >= _CACHE_MAX:
                self._suffixes.clear()
            self._suffixes[(empty, subject_reply, app)] = suffix
        return suffix


def _skip_str(raw: bytes, pos: int) -> int:
    """The position after the str8/str32 at ``pos``; _Foreign for anything else."""
    code = raw[pos]
    if code == 0xA1:
        end = pos + 2 + raw[pos + 1]
    elif code == 0xB1:
        end = pos + 5 + _u32(raw, pos + 1)[0]
    else:
        raise _Foreign
    if end > len(raw):
        raise _Foreign
    return end


def _str_or_null(raw: bytes, pos: int) -> tuple[bytes | None, int]:
    """(the UTF-8 bytes of the str or None for the null at ``pos``, the position after)."""
    if raw[pos] == 0x40:
        return None, pos + 1
    end = _skip_str(raw, pos)
    return raw[pos + (2 if raw[pos] == 0xA1 else 5):end], end


# The compiled twin (_messages_c.pyx, riverlog/_compiled.py): MessageEncoder with its extend;
# the class above stays the reference (_PyMessageEncoder) and reads every record the twin
# leaves to it.
_PyMessageEncoder = MessageEncoder


def _bind_twin(compiled) -> type:
    """Hand the twin the reference extend and constants; the MessageEncoder class with the
    twin's extend (also for tests that import the twin directly)."""
    compiled._bind(_PyMessageEncoder.extend, _MA_KEY, _KEY_AT, _SEC_PROPERTIES, _NULL3,
                   _SEC_APP_PROPERTIES, _SEC_DATA)

    class MessageEncoder(_PyMessageEncoder):
        __doc__ = _PyMessageEncoder.__doc__
        __slots__ = ()
        extend = compiled.extend

    return MessageEncoder


_c = twin(__name__, "_messages_c")
if _c is not None:
    MessageEncoder = _bind_twin(_c)  # type: ignore[misc] # noqa: F811
