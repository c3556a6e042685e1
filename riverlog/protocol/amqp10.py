# riverlog.protocol.amqp10: the AMQP 1.0 type system as bytes (OASIS AMQP 1.0 part 1
# "Types" and the message sections of part 3 "Messaging", section 3.2), sans-IO.
#
# What it owns: encoding the few primitives the record layout writes (str, binary, list and
# map constructors), decoding every primitive encoding of part 1 (described types, arrays,
# decimals, ...), and splitting a message into its nine sections in any order. It knows
# nothing of riverlog's record layout (riverlog.record maps messages to Records and back).
#
# Rules:
# - A decode never trusts a size or count: every read is bounded by the buffer, nesting by
#   64 levels, and what one decode may produce by ``Budget`` (values per octet), so hostile
#   bytes cost no more than their size. Anything that is not exactly a valid encoding raises
#   ``Malformed`` (internal) or ValueError (``decode_amqp_value``).
# - Decoded shapes: see ``decode_amqp_value``; symbols and timestamps keep their AMQP type
#   (``Symbol``, ``Timestamp``), described values are ``Described``.
from __future__ import annotations

import struct
import uuid
from decimal import Decimal
from typing import Any, Callable, NamedTuple

__all__ = ["Described", "Malformed", "Message", "Symbol", "Timestamp", "compound",
           "decode_amqp_value", "encode_str", "parse_message", "text_or_binary",
           "utf8_bytes", "vbin"]

_pack_u32x2 = struct.Struct(">II").pack
_VBIN8 = [bytes((0xA0, n)) for n in range(256)]  # vbin8 constructor + 1-octet size
_STR8 = [bytes((0xA1, n)) for n in range(256)]  # str8-utf8 constructor + 1-octet size


# ---------------------------------------------------------------------------------------------
# Encoding: the primitives riverlog writes (part 1 section 1.6)
# ---------------------------------------------------------------------------------------------

def vbin(n: int) -> bytes:
    return _VBIN8[n] if n < 256 else b"\xb0" + n.to_bytes(4, "big")


def encode_str(s: str) -> bytes:
    return utf8_bytes(s.encode())


def utf8_bytes(b: bytes) -> bytes:
    """str8/str32 holding ``b``, which must be UTF-8."""
    n = len(b)
    return (_STR8[n] if n < 256 else b"\xb1" + n.to_bytes(4, "big")) + b


def text_or_binary(b: bytes) -> bytes:
    """``b`` as str8/str32 when it is valid UTF-8, else as vbin8/vbin32: clients hand a string
    to applications as text (and the Node client cannot read a binary here); a reader of the
    record gets the same bytes back either way."""
    if not b.isascii():
        try:
            b.decode()
        except UnicodeDecodeError:
            return vbin(len(b)) + b
    return utf8_bytes(b)


def compound(section: bytes, small: int, body: bytes, count: int) -> bytes:
    # list8/map8 (size octet counts the count octet) when it fits, else list32/map32.
    n = len(body)
    if n < 255 and count < 256:
        return section + bytes((small, n + 1, count)) + body
    return section + bytes((small + 0x10,)) + _pack_u32x2(n + 4, count) + body


# ---------------------------------------------------------------------------------------------
# Decoding: a compact decoder for every AMQP 1.0 type encoding (part 1 sections 1.2 and 1.6)
# ---------------------------------------------------------------------------------------------


class Symbol(str):
    """An AMQP symbol (part 1 section 1.6.21): a str that remembers it was a symbol."""

    __slots__ = ()


class Timestamp(int):
    """An AMQP timestamp (part 1 section 1.6.17): milliseconds since the Unix epoch."""

    __slots__ = ()


class Described(NamedTuple):
    """A described value (part 1 section 1.2) as decoded: its descriptor and its value."""

    descriptor: Any
    value: Any


class Malformed(Exception):
    """The bytes are not exactly one valid AMQP 1.0 encoding."""


_MAX_DEPTH = 64  # nesting deeper than this is treated as malformed (never seen in practice)
# How many values one decode may produce: the items of every list, map and array, and the
# Described wrappers of array elements, counted together. Items that take octets of their own
# can never exceed the input's length; what goes beyond it comes from arrays of 0-octet
# elements (null, true, list0, ...) and from element descriptors, each applied to every
# element. So: twice the input plus a little, never more than _MAX_VALUES. A 1.8 KB message of
# nested arrays of described list0 made 65 MB of objects before this bound (issue 15, item 7).
_VALUES_PER_OCTET = 2
_VALUES_EXTRA = 1024
_MAX_VALUES = 1 << 16


class Budget:
    """The values a decode may still produce; ``spend`` raises Malformed past the bound."""

    __slots__ = ("left",)

    def __init__(self, size: int) -> None:
        self.left = min(_MAX_VALUES, _VALUES_EXTRA + _VALUES_PER_OCTET * size)

    def spend(self, values: int) -> None:
        self.left -= values
        if self.left < 0:
            raise Malformed

_u16 = struct.Struct(">H").unpack_from
_i16 = struct.Struct(">h").unpack_from
_u32 = struct.Struct(">I").unpack_from
_i32 = struct.Struct(">i").unpack_from
_u64 = struct.Struct(">Q").unpack_from
_i64 = struct.Struct(">q").unpack_from
_f32 = struct.Struct(">f").unpack_from
_f64 = struct.Struct(">d").unpack_from
_u32x2 = struct.Struct(">II").unpack_from

_Body = Callable[[bytes, int, int, int, Budget], "tuple[Any, int]"]
_BODY: list[_Body | None] = [None] * 256  # constructor -> reader of what follows it


def _read(buf: bytes, pos: int, end: int, depth: int, budget: Budget) -> tuple[Any, int]:
    """Read one encoded value (constructor and data) at ``pos``; return (value, next pos)."""
    if pos >= end:
        raise Malformed
    code = buf[pos]
    if code == 0xA1 or code == 0xA0 or code == 0xA3:  # str8, vbin8, sym8 inline: the common
        start = pos + 2  # case in headers, properties and annotations
        if start > end:
            raise Malformed
        nxt = start + buf[pos + 1]
        if nxt > end:
            raise Malformed
        if code == 0xA0:
            return buf[start:nxt], nxt
        text = buf[start:nxt].decode("utf-8", "replace")
        return (text if code == 0xA1 else Symbol(text)), nxt
    if code == 0x40:
        return None, pos + 1
    if code == 0x00:  # described type: descriptor value, then the value
        if depth > _MAX_DEPTH:
            raise Malformed
        descriptor, pos = _read(buf, pos + 1, end, depth + 1, budget)
        value, pos = _read(buf, pos, end, depth + 1, budget)
        return Described(descriptor, value), pos
    reader = _BODY[code]
    if reader is None:
        raise Malformed
    return reader(buf, pos + 1, end, depth, budget)


def _constant(value: Any) -> _Body:
    def read(buf: bytes, pos: int, end: int, depth: int, budget: Budget) -> tuple[Any, int]:
        return value, pos

    return read


def _fixed(width: int, convert: Callable[[bytes, int], Any]) -> _Body:
    def read(buf: bytes, pos: int, end: int, depth: int, budget: Budget) -> tuple[Any, int]:
        nxt = pos + width
        if nxt > end:
            raise Malformed
        return convert(buf, pos), nxt

    return read


def _variable(size_width: int, convert: Callable[[bytes], Any]) -> _Body:
    if size_width == 1:

        def read(buf: bytes, pos: int, end: int, depth: int, budget: Budget) -> tuple[Any, int]:
            if pos >= end:
                raise Malformed
            start = pos + 1
            nxt = start + buf[pos]
            if nxt > end:
                raise Malformed
            return convert(buf[start:nxt]), nxt

    else:

        def read(buf: bytes, pos: int, end: int, depth: int, budget: Budget) -> tuple[Any, int]:
            start = pos + 4
            if start > end:
                raise Malformed
            nxt = start + _u32(buf, pos)[0]
            if nxt > end:
                raise Malformed
            return convert(buf[start:nxt]), nxt

    return read


def _bounds(buf: bytes, pos: int, end: int, wide: bool) -> tuple[int, int, int]:
    """Size and count of a compound or array: return (count, first item pos, end pos)."""
    if wide:
        if pos + 8 > end:
            raise Malformed
        size, count = _u32x2(buf, pos)
        first = pos + 8
        cend = pos + 4 + size
        if size < 4 or cend > end:
            raise Malformed
    else:
        if pos + 2 > end:
            raise Malformed
        size = buf[pos]
        count = buf[pos + 1]
        first = pos + 2
        cend = pos + 1 + size
        if size < 1 or cend > end:
            raise Malformed
    return count, first, cend


def _list(wide: bool) -> _Body:
    def read(buf: bytes, pos: int, end: int, depth: int, budget: Budget) -> tuple[Any, int]:
        count, pos, cend = _bounds(buf, pos, end, wide)
        if count > cend - pos or depth > _MAX_DEPTH:  # each item takes >= 1 octet
            raise Malformed
        budget.spend(count)
        items = []
        append = items.append
        depth += 1
        for _ in range(count):
            item, pos = _read(buf, pos, cend, depth, budget)
            append(item)
        if pos != cend:
            raise Malformed
        return items, pos

    return read


def _map(wide: bool) -> _Body:
    def read(buf: bytes, pos: int, end: int, depth: int, budget: Budget) -> tuple[Any, int]:
        count, pos, cend = _bounds(buf, pos, end, wide)
        if count & 1 or count > cend - pos or depth > _MAX_DEPTH:
            raise Malformed
        budget.spend(count)
        result: dict[Any, Any] = {}
        depth += 1
        for _ in range(count >> 1):
            key, pos = _read(buf, pos, cend, depth, budget)
            value, pos = _read(buf, pos, cend, depth, budget)
            try:
                result[key] = value
            except TypeError:  # a list or map used as a key: keep it, as its repr
                result[repr(key)] = value
        if pos != cend:
            raise Malformed
        return result, pos

    return read


_ZERO_WIDTH = frozenset((0x40, 0x41, 0x42, 0x43, 0x44, 0x45))


def _array(wide: bool) -> _Body:
    def read(buf: bytes, pos: int, end: int, depth: int, budget: Budget) -> tuple[Any, int]:
        count, pos, cend = _bounds(buf, pos, end, wide)
        if depth > _MAX_DEPTH:
            raise Malformed
        depth += 1
        if count == 0 and pos == cend:  # lenient: an empty array without element constructor
            return [], pos
        descriptors = []
        while True:  # element constructor: format code, or 0x00 descriptor constructor
            if pos >= cend:
                raise Malformed
            code = buf[pos]
            if code != 0x00:
                break
            if len(descriptors) > _MAX_DEPTH:
                raise Malformed
            descriptor, pos = _read(buf, pos + 1, cend, depth, budget)
            descriptors.append(descriptor)
        reader = _BODY[code]
        if reader is None:
            raise Malformed
        pos += 1
        if code not in _ZERO_WIDTH and count > cend - pos:  # each element takes >= 1 octet
            raise Malformed
        budget.spend(count * (1 + len(descriptors)))  # 0-octet elements: only this bounds them
        items = []
        append = items.append
        for _ in range(count):
            item, pos = reader(buf, pos, cend, depth, budget)
            append(item)
        if pos != cend:
            raise Malformed
        for descriptor in reversed(descriptors):
            items = [Described(descriptor, item) for item in items]
        return items, pos

    return read


def _char(buf: bytes, pos: int) -> str:
    cp = _u32(buf, pos)[0]
    if cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
        return "\ufffd"
    return chr(cp)


def _bid(bits: int, total: int, exp_bits: int, bias: int, max_coefficient: int) -> Decimal:
    """IEEE 754-2008 decimal in the Binary Integer Decimal encoding (part 1 1.6.13-1.6.15)."""
    sign = bits >> (total - 1)
    if (bits >> (total - 3)) & 3 == 3:
        if (bits >> (total - 5)) & 0xF == 0xF:  # combination field 1111x: infinity or NaN
            if (bits >> (total - 6)) & 1:
                return Decimal("NaN")
            return Decimal("-Infinity" if sign else "Infinity")
        tail = total - 3 - exp_bits
        exponent = (bits >> tail) & ((1 << exp_bits) - 1)
        coefficient = (0b100 << tail) | (bits & ((1 << tail) - 1))
    else:
        tail = total - 1 - exp_bits
        exponent = (bits >> tail) & ((1 << exp_bits) - 1)
        coefficient = bits & ((1 << tail) - 1)
    if coefficient > max_coefficient:  # non-canonical: the standard reads it as zero
        coefficient = 0
    return Decimal((sign, tuple(map(int, str(coefficient))), exponent - bias))


def _u128(buf: bytes, pos: int) -> int:
    return int.from_bytes(buf[pos : pos + 16], "big")


def _utf8(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _symbol(raw: bytes) -> Symbol:
    return Symbol(raw.decode("utf-8", "replace"))  # ASCII by the spec; be lenient


def _install() -> None:
    b = _BODY
    b[0x40] = _constant(None)  # null
    b[0x41] = _constant(True)
    b[0x42] = _constant(False)
    b[0x43] = _constant(0)  # uint0
    b[0x44] = _constant(0)  # ulong0
    b[0x45] = lambda buf, pos, end, depth, budget: ([], pos)  # list0 (a fresh list each time)
    b[0x56] = _fixed(1, lambda buf, pos: buf[pos] != 0)  # boolean
    b[0x50] = _fixed(1, lambda buf, pos: buf[pos])  # ubyte
    b[0x52] = b[0x50]  # smalluint
    b[0x53] = b[0x50]  # smallulong
    b[0x51] = _fixed(1, lambda buf, pos: buf[pos] - 256 if buf[pos] > 127 else buf[pos])  # byte
    b[0x54] = b[0x51]  # smallint
    b[0x55] = b[0x51]  # smalllong
    b[0x60] = _fixed(2, lambda buf, pos: _u16(buf, pos)[0])  # ushort
    b[0x61] = _fixed(2, lambda buf, pos: _i16(buf, pos)[0])  # short
    b[0x70] = _fixed(4, lambda buf, pos: _u32(buf, pos)[0])  # uint
    b[0x71] = _fixed(4, lambda buf, pos: _i32(buf, pos)[0])  # int
    b[0x72] = _fixed(4, lambda buf, pos: _f32(buf, pos)[0])  # float
    b[0x73] = _fixed(4, _char)  # char (UTF-32BE)
    b[0x74] = _fixed(4, lambda buf, pos: _bid(_u32(buf, pos)[0], 32, 8, 101, 10**7 - 1))
    b[0x80] = _fixed(8, lambda buf, pos: _u64(buf, pos)[0])  # ulong
    b[0x81] = _fixed(8, lambda buf, pos: _i64(buf, pos)[0])  # long
    b[0x82] = _fixed(8, lambda buf, pos: _f64(buf, pos)[0])  # double
    b[0x83] = _fixed(8, lambda buf, pos: Timestamp(_i64(buf, pos)[0]))  # timestamp (ms64)
    b[0x84] = _fixed(8, lambda buf, pos: _bid(_u64(buf, pos)[0], 64, 10, 398, 10**16 - 1))
    b[0x94] = _fixed(16, lambda buf, pos: _bid(_u128(buf, pos), 128, 14, 6176, 10**34 - 1))
    b[0x98] = _fixed(16, lambda buf, pos: uuid.UUID(bytes=bytes(buf[pos : pos + 16])))
    b[0xA0] = _variable(1, bytes)  # vbin8
    b[0xB0] = _variable(4, bytes)  # vbin32
    b[0xA1] = _variable(1, _utf8)  # str8-utf8
    b[0xB1] = _variable(4, _utf8)  # str32-utf8
    b[0xA3] = _variable(1, _symbol)  # sym8
    b[0xB3] = _variable(4, _symbol)  # sym32
    b[0xC0] = _list(False)
    b[0xD0] = _list(True)
    b[0xC1] = _map(False)
    b[0xD1] = _map(True)
    b[0xE0] = _array(False)
    b[0xF0] = _array(True)


_install()


def decode_amqp_value(data: bytes) -> Any:
    """Decode exactly one AMQP 1.0 encoded value (part 1) that fills all of ``data``.

    Python shapes: null None; boolean bool; (u)byte/short/int/long int; float/double float;
    decimal32/64/128 decimal.Decimal; char str; timestamp Timestamp (int, ms); uuid
    uuid.UUID; binary bytes; string str (invalid UTF-8 replaced); symbol Symbol (str); list
    and array list; map dict (unhashable keys as their repr); described Described. Raises
    ValueError when ``data`` is not exactly one valid encoding, or would decode into more
    values than ``decode_record`` allows.
    """
    data = bytes(data)
    try:
        value, pos = _read(data, 0, len(data), 0, Budget(len(data)))
    except Malformed:
        raise ValueError("not a valid AMQP 1.0 encoding") from None
    if pos != len(data):
        raise ValueError("trailing bytes after the AMQP 1.0 value")
    return value


# Section codes of AMQP 1.0 part 3 section 3.2 and their symbolic descriptors.
_HEADER, _DELIVERY_ANN, _MESSAGE_ANN, _PROPERTIES, _APP_PROPERTIES = 0x70, 0x71, 0x72, 0x73, 0x74
_DATA, _SEQUENCE, _VALUE, _FOOTER = 0x75, 0x76, 0x77, 0x78
_SECTION_BY_SYMBOL = {
    "amqp:header:list": _HEADER,
    "amqp:delivery-annotations:map": _DELIVERY_ANN,
    "amqp:message-annotations:map": _MESSAGE_ANN,
    "amqp:properties:list": _PROPERTIES,
    "amqp:application-properties:map": _APP_PROPERTIES,
    "amqp:data:binary": _DATA,
    "amqp:amqp-sequence:list": _SEQUENCE,
    "amqp:amqp-value:*": _VALUE,
    "amqp:footer:map": _FOOTER,
}
_LIST_SECTIONS = (_HEADER, _PROPERTIES, _SEQUENCE)
_MAP_SECTIONS = (_DELIVERY_ANN, _MESSAGE_ANN, _APP_PROPERTIES, _FOOTER)


class Message:
    __slots__ = (
        "annotations",
        "properties",
        "app_properties",
        "data",
        "sequence",
        "has_sequence",
        "value",
        "has_value",
    )

    def __init__(self) -> None:
        self.annotations: dict | None = None
        self.properties: list | None = None
        self.app_properties: dict | None = None
        self.data: list[bytes] = []
        self.sequence: list[Any] = []
        self.has_sequence = False
        self.value: Any = None
        self.has_value = False


def parse_message(buf: bytes) -> Message:
    """Split ``buf`` into AMQP 1.0 sections (part 3 section 3.2, in any order, descriptors as
    smallulong, ulong or symbol); raise Malformed unless all of it is sections."""
    msg = Message()
    pos = 0
    end = len(buf)
    budget = Budget(end)  # one for all sections
    while pos < end:
        if buf[pos] != 0x00 or pos + 2 >= end:
            raise Malformed
        code = buf[pos + 1]
        if code == 0x53:  # smallulong descriptor: the usual form
            section = buf[pos + 2]
            pos += 3
        elif code == 0x80:  # ulong descriptor: domain 0x00000000 in the high half
            if pos + 10 > end:
                raise Malformed
            section = _u64(buf, pos + 2)[0]
            pos += 10
        elif code == 0xA3 or code == 0xB3:  # symbolic descriptor, e.g. "amqp:data:binary"
            name, pos = _BODY[code](buf, pos + 2, end, 0, budget)  # type: ignore[misc]
            section = _SECTION_BY_SYMBOL.get(name, -1)
        else:
            raise Malformed
        if section == _DATA:  # fast path: the body of nearly every message
            code = buf[pos] if pos < end else -1
            if code == 0xA0:
                value, pos = _BODY[0xA0](buf, pos + 1, end, 0, budget)  # type: ignore[misc]
            elif code == 0xB0:
                value, pos = _BODY[0xB0](buf, pos + 1, end, 0, budget)  # type: ignore[misc]
            else:
                raise Malformed
            msg.data.append(value)
            continue
        if not _HEADER <= section <= _FOOTER:
            raise Malformed
        value, pos = _read(buf, pos, end, 1, budget)
        if section in _LIST_SECTIONS:
            if value is None and section != _SEQUENCE:
                value = []
            if type(value) is not list:
                raise Malformed
            if section == _PROPERTIES:
                msg.properties = value
            elif section == _SEQUENCE:
                msg.sequence.extend(value)
                msg.has_sequence = True
        elif section in _MAP_SECTIONS:
            if value is None:
                value = {}
            if type(value) is not dict:
                raise Malformed
            if section == _MESSAGE_ANN:
                msg.annotations = value
            elif section == _APP_PROPERTIES:
                msg.app_properties = value
        else:  # amqp-value
            msg.value = value
            msg.has_value = True
    return msg

