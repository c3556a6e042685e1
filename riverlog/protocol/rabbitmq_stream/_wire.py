# Field codecs ("kinds") for the RabbitMQ Stream wire types, and the two factories that turn a
# frame class plus a list of kinds into a body reader and a body writer. Rules: a reader is
# ``read(frame, offset) -> (value, new_offset)`` over the complete frame bytes and never reads
# past them (struct.unpack_from raises, slices are bounds-checked); a writer is
# ``write(value) -> bytes``; every wire count is checked against the bytes actually present, so
# no peer-chosen number sizes an allocation. Big-endian throughout; precompiled Structs only.
# Wire facts: reference/rabbitmq-stream-protocol.md "Framing and types" (string = i16 length,
# -1 null; bytes = i32 length, -1 null; arrays and maps = i32 count then items).
from __future__ import annotations

import struct
from dataclasses import fields
from operator import attrgetter
from typing import Any, Callable

from .constants import OffsetType, ResponseCode
from .errors import FrameError, malformed

ReadFn = Callable[[bytes, int], tuple[Any, int]]
WriteFn = Callable[[Any], bytes]

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_NULL_STRING = b"\xff\xff"
_NULL_BYTES = b"\xff\xff\xff\xff"
_OFFSET_TYPES = {int(t): t for t in OffsetType}


class Kind:
    """One wire type: ``read``/``write`` as described in the module comment. ``width`` is the
    number of consecutive dataclass fields the kind fills (2 for an offset specification);
    ``fmt`` is the struct format code of a fixed-size integer kind (rows made only of those
    are read and written with one precompiled Struct)."""

    __slots__ = ("name", "read", "write", "width", "fmt")

    def __init__(
        self, name: str, read: ReadFn, write: WriteFn, width: int = 1, fmt: str = ""
    ) -> None:
        self.name = name
        self.read = read
        self.write = write
        self.width = width
        self.fmt = fmt

    def __repr__(self) -> str:
        return f"Kind({self.name})"


def _fixed(name: str, fmt: str) -> Kind:
    s = struct.Struct(fmt)
    unpack, size = s.unpack_from, s.size

    def read(b: bytes, o: int) -> tuple[int, int]:
        return unpack(b, o)[0], o + size

    return Kind(name, read, s.pack, fmt=fmt[1:])


U8 = _fixed("u8", ">B")
U16 = _fixed("u16", ">H")
U32 = _fixed("u32", ">I")
U64 = _fixed("u64", ">Q")
I64 = _fixed("i64", ">q")


def _read_bool(b: bytes, o: int) -> tuple[bool, int]:
    v = b[o]  # IndexError when truncated: reported as a malformed frame by the codec
    if v > 1:
        raise malformed(f"boolean byte {v} is neither 0 nor 1")
    return v == 1, o + 1


BOOL = Kind("bool u8", _read_bool, lambda v: b"\x01" if v else b"\x00")


def _sized_bytes(name: str, length: struct.Struct, null: bytes) -> Kind:
    unpack, size, pack = length.unpack_from, length.size, length.pack

    def read(b: bytes, o: int) -> tuple[bytes | None, int]:
        (n,) = unpack(b, o)
        o += size
        if n < 0:
            if n == -1:
                return None, o
            raise malformed(f"{name} length {n}")
        e = o + n
        if e > len(b):
            raise malformed(f"{name} runs past the end of the frame")
        return b[o:e], e

    def write(v: bytes | None) -> bytes:
        return null if v is None else pack(len(v)) + bytes(v)

    return Kind(name, read, write)


BYTES = _sized_bytes("bytes", _I32, _NULL_BYTES)
"""i32 length + bytes, -1 = None (SaslAuthenticate data)."""
SHORT_BYTES = _sized_bytes("i16-length bytes", _I16, _NULL_STRING)
"""i16 length + bytes, -1 = None (the SaslAuthenticate challenge, encoded like a string)."""
_STRING_BYTES = _sized_bytes("string", _I16, _NULL_STRING)


def _read_str(b: bytes, o: int) -> tuple[str | None, int]:
    raw, o = _STRING_BYTES.read(b, o)
    return (None if raw is None else str(raw, "utf-8")), o


def _write_str(s: str | None) -> bytes:
    return _STRING_BYTES.write(None if s is None else s.encode("utf-8"))


STR = Kind("string", _read_str, _write_str)
"""i16 length + UTF-8, -1 = None."""


def _read_name(b: bytes, o: int) -> tuple[str, int]:
    name, o = _read_str(b, o)
    if name is None:
        raise malformed("a null (-1 length) name")
    return name, o


NAME = Kind("name", _read_name, _write_str)
"""A string that may not be null: stream, super stream and reference names, routing keys.
RabbitMQ reads every string with an unsigned 16-bit length (rabbit_stream_core.erl, ?STRING),
so -1 is a 65,535-byte string past the frame's end: the frame does not parse and the reader
closes the connection with 0x0d unknown frame (rabbit_stream_reader.erl, the ``{unknown, _}``
command); here too (FrameError 0x0d), instead of handing a None name to the handlers."""


def _read_rest(b: bytes, o: int) -> tuple[bytes, int]:
    return b[o:], len(b)


REST = Kind("rest of frame", _read_rest, lambda v: v)
"""Everything up to the end of the frame, raw (the Deliver chunk)."""


def _count(b: bytes, o: int) -> tuple[int, int]:
    (n,) = _I32.unpack_from(b, o)
    if n < 0:
        raise malformed(f"negative count {n}")
    return n, o + 4


def array(item: Kind, max_count: int | None = None) -> Kind:
    """``[item]``: i32 count then items; read as a tuple. More than ``max_count`` items:
    FrameError FRAME_TOO_LARGE (0x0e), before any is read."""
    iread, iwrite = item.read, item.write

    def read(b: bytes, o: int) -> tuple[tuple, int]:
        n, o = _count(b, o)
        if max_count is not None and n > max_count:
            raise FrameError(ResponseCode.FRAME_TOO_LARGE,
                             f"{n} items of {item.name}; at most {max_count} per frame")
        out = []
        append = out.append
        for _ in range(n):  # every item consumes >= 1 byte: a lying count fails fast
            v, o = iread(b, o)
            append(v)
        return tuple(out), o

    def write(vs: Any) -> bytes:
        return _I32.pack(len(vs)) + b"".join([iwrite(v) for v in vs])

    return Kind(f"[{item.name}]", read, write)


def string_map(value: Kind) -> Kind:
    """``{string: value}``: i32 count then (string key, value) pairs; read as a dict."""
    vread, vwrite = value.read, value.write

    def read(b: bytes, o: int) -> tuple[dict, int]:
        n, o = _count(b, o)
        out = {}
        for _ in range(n):
            k, o = _read_str(b, o)
            out[k], o = vread(b, o)
        return out, o

    def write(d: dict) -> bytes:
        return _I32.pack(len(d)) + b"".join([_write_str(k) + vwrite(v) for k, v in d.items()])

    return Kind(f"{{string: {value.name}}}", read, write)


MAP = string_map(STR)
INT_MAP = string_map(I64)


def optional(item: Kind) -> Kind:
    """A trailing part that is either absent (None: the frame ends here) or one ``item``."""
    iread, iwrite = item.read, item.write

    def read(b: bytes, o: int) -> tuple[Any, int]:
        if o == len(b):
            return None, o
        return iread(b, o)

    def write(v: Any) -> bytes:
        return b"" if v is None else iwrite(v)

    return Kind(f"[{item.name}]?", read, write)


def record(cls: type, *items: Kind) -> Kind:
    """A dataclass read field by field (``items`` in field order)."""
    names = [f.name for f in fields(cls)]
    if len(names) != len(items):
        raise TypeError(f"{cls.__name__}: {len(names)} fields, {len(items)} kinds")
    reads = [i.read for i in items]
    pairs = list(zip([i.write for i in items], [attrgetter(n) for n in names]))

    def read(b: bytes, o: int) -> tuple[Any, int]:
        vals = []
        for r in reads:
            v, o = r(b, o)
            vals.append(v)
        return cls(*vals), o

    def write(v: Any) -> bytes:
        return b"".join([w(get(v)) for w, get in pairs])

    return Kind(cls.__name__, read, write)


def _read_offset_type(b: bytes, o: int) -> tuple[OffsetType, int]:
    (t,) = _U16.unpack_from(b, o)
    try:
        return _OFFSET_TYPES[t], o + 2
    except KeyError:
        raise malformed(f"unknown offset type {t}") from None


OFFSET_TYPE = Kind("offset type u16", _read_offset_type, _U16.pack)


def offset_spec(name: str, first: int = OffsetType.FIRST) -> Kind:
    """``OffsetType u16 [Offset u64 | Timestamp i64]`` filling fields (offset_type, offset); the
    value is present exactly for OFFSET and TIMESTAMP. ``first`` is the wire number of FIRST:
    1 in the current protocol (OffsetType's own numbers), 0 in the 2020 draft, whose types
    are the same list shifted down by one. Fields always hold ``OffsetType`` values."""
    shift = OffsetType.FIRST - first

    def read(b: bytes, o: int) -> tuple[tuple[OffsetType, int | None], int]:
        (w,) = _U16.unpack_from(b, o)
        t = _OFFSET_TYPES.get(w + shift)
        if not t:  # unknown, or NONE (0): only ConsumerUpdateResponse may carry that
            raise malformed(f"offset type {w} in an offset specification")
        o += 2
        if t == 4:
            return (t, _U64.unpack_from(b, o)[0]), o + 8
        if t == 5:
            return (t, _I64.unpack_from(b, o)[0]), o + 8
        return (t, None), o

    def write(v: tuple[int, int | None]) -> bytes:
        t, offset = v
        if t == 4 or t == 5:
            if offset is None:
                raise ValueError(f"offset type {t} needs an offset")
            return _U16.pack(t - shift) + (_U64 if t == 4 else _I64).pack(offset)
        if offset is not None or not 1 <= t <= 3:
            raise ValueError(f"offset type {t} takes no offset (got {offset!r})")
        return _U16.pack(t - shift)

    return Kind(name, read, write, width=2)


OFFSET_SPEC = offset_spec("offset spec")
"""The current protocol's offset specification (Subscribe, ResolveOffsetSpec)."""


def _read_trailing_spec(b: bytes, o: int) -> tuple[tuple[OffsetType, int | None], int]:
    t, o = _read_offset_type(b, o)
    if o == len(b):
        if t == 4 or t == 5:
            raise malformed(f"offset type {t} without its value")
        return (t, None), o
    return (t, (_I64 if t == 5 else _U64).unpack_from(b, o)[0]), o + 8


def _write_trailing_spec(v: tuple[int, int | None]) -> bytes:
    t, offset = v
    if offset is None:
        if t == 4 or t == 5:
            raise ValueError(f"offset type {t} needs an offset")
        return _U16.pack(t)
    return _U16.pack(t) + (_I64 if t == 5 else _U64).pack(offset)


TRAILING_OFFSET_SPEC = Kind("trailing offset spec", _read_trailing_spec, _write_trailing_spec, 2)
"""ConsumerUpdateResponse's spec: type 0..5, then a value that is required for OFFSET/TIMESTAMP
and optional otherwise (rstream always appends a u64); it ends the frame."""


BodyReader = Callable[[bytes], tuple[Any, int]]
BodyWriter = Callable[[Any], list]


def body_reader(cls: type, kinds: tuple[Kind, ...], start: int) -> BodyReader:
    """``read(frame) -> (cls instance, end offset)``: reads ``kinds`` from ``frame[start:]``."""
    _check_width(cls, kinds)
    if kinds and all(k.fmt for k in kinds):
        fixed = struct.Struct(">" + "".join(k.fmt for k in kinds))
        unpack, end = fixed.unpack_from, start + fixed.size

        def read_fixed(b: bytes) -> tuple[Any, int]:
            return cls(*unpack(b, start)), end

        read_fixed.__qualname__ = f"read_{cls.__name__}"
        return read_fixed
    steps = [(k.read, k.width == 1) for k in kinds]

    def read(b: bytes) -> tuple[Any, int]:
        o = start
        vals: list = []
        for r, single in steps:
            v, o = r(b, o)
            if single:
                vals.append(v)
            else:
                vals.extend(v)
        return cls(*vals), o

    read.__qualname__ = f"read_{cls.__name__}"
    return read


def body_writer(cls: type, kinds: tuple[Kind, ...]) -> BodyWriter:
    """``write(frame) -> [bytes, ...]``: the body parts of ``frame``, in wire order."""
    names = _check_width(cls, kinds)
    if kinds and all(k.fmt for k in kinds):
        pack = struct.Struct(">" + "".join(k.fmt for k in kinds)).pack
        get_all = attrgetter(*names)
        if len(names) == 1:

            def write_one(frame: Any) -> list:
                return [pack(get_all(frame))]

            return write_one

        def write_fixed(frame: Any) -> list:
            return [pack(*get_all(frame))]

        write_fixed.__qualname__ = f"write_{cls.__name__}"
        return write_fixed
    steps = []
    i = 0
    for k in kinds:
        steps.append((k.write, attrgetter(*names[i : i + k.width])))
        i += k.width

    def write(frame: Any) -> list:
        return [w(get(frame)) for w, get in steps]

    write.__qualname__ = f"write_{cls.__name__}"
    return write


def _check_width(cls: type, kinds: tuple[Kind, ...]) -> list[str]:
    names = [f.name for f in fields(cls)]
    if sum(k.width for k in kinds) != len(names):
        raise TypeError(f"{cls.__name__}: fields {names} do not match kinds {kinds}")
    return names
