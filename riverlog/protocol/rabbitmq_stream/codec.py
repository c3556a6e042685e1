# The sans-IO RabbitMQ Stream codec, h11 style: bytes in, frames out (FrameDecoder.feed); frames
# in, bytes out (encode). Owns framing (u32 size prefix, max frame size), the dispatch tables
# (key, version) -> reader and frame class -> (key, version, writer) for every frame in both
# directions, and the hand-tuned hot paths (Publish, PublishConfirm, PublishError).
# Rules: no sockets, no asyncio, no connection state beyond the receive buffer; dispatch is data
# (the _CURRENT_ROWS table), never if-chains; bad peer bytes raise FrameError only.
# Dialects: a Dialect is one such table. CURRENT is the protocol spoken since RabbitMQ 3.9; the
# 2020 draft (seeds/rabbitmq-stream-PROTOCOL-draft.adoc) is draft.py's pair of Dialects, built
# from its own rows over the same frame classes where layouts agree, one per peer role (the
# draft reuses request keys for responses), chosen by the first frame (PeerProperties 0x11
# current, 15 draft).
# Wire facts: reference/rabbitmq-stream-protocol.md; 0x1f ResolveOffsetSpec and the frame_max
# check from rabbit_stream_core.erl (rabbitmq-server 5b09e556).
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from . import frames as f
from ._wire import (
    BOOL,
    BYTES,
    INT_MAP,
    MAP,
    NAME,
    OFFSET_SPEC,
    OFFSET_TYPE,
    REST,
    SHORT_BYTES,
    STR,
    TRAILING_OFFSET_SPEC,
    U8,
    U16,
    U32,
    U64,
    BodyReader,
    BodyWriter,
    Kind,
    array,
    body_reader,
    body_writer,
    optional,
    record,
)
from .constants import (DEFAULT_FRAME_MAX, MAX_METADATA_NAMES, RESPONSE_FLAG, Command,
                        ResponseCode)
from .errors import FrameError, malformed

__all__ = [
    "CURRENT",
    "Dialect",
    "FrameDecoder",
    "FrameError",
    "decode",
    "deliver_prefix",
    "encode",
    "simple_entry",
]

_U32 = struct.Struct(">I")
_KEY_VERSION = struct.Struct(">HH")
_KEY = struct.Struct(">H")
_HEADER = struct.Struct(">IHH")
_BODY = _HEADER.size  # a body starts 8 bytes into the frame: size u32, key u16, version u16
_PUBLISH_HEAD = struct.Struct(">BI")  # publisher id u8, count u32
_ENTRY_HEAD = struct.Struct(">QI")  # publishing id u64, first 4 bytes of the entry
_ENTRY_HEAD_V2 = struct.Struct(">Qh")  # publishing id u64, filter value length i16
_U64 = struct.Struct(">Q")
_ERROR_ITEM = struct.Struct(">QH")  # publishing id u64, code u16
_SUB_BATCH_BIT = 0x80000000
_MAX_ENTRY = 0x7FFFFFFF


# -- hot paths --------------------------------------------------------------------------------


def _read_publish(b: bytes) -> tuple[f.Publish, int]:
    publisher_id, entries, o = read_publish_body(b, _BODY)
    return f.Publish(publisher_id, entries), o


def read_publish_body(b: bytes, o: int) -> tuple[int, tuple, int]:
    """``PublisherId u8, Count u32, Count x (PublishingId u64, entry)`` from ``b[o:]``:
    ``(publisher id, ((publishing id, entry), ...), end offset)``. Entries are sliced out of
    the frame as bytes including their own header, so the broker can write them into a
    chunk's data section as they are. (Publish v1, and the draft's Publish after its stream.)"""
    publisher_id, count = _PUBLISH_HEAD.unpack_from(b, o)
    o += 5
    n = len(b)
    if count > (n - o) // 12:  # an entry is at least publishing id + 4-byte header
        raise malformed(f"Publish announces {count} entries in {n - o} bytes")
    unpack = _ENTRY_HEAD.unpack_from
    entries = []
    append = entries.append
    for _ in range(count):
        pid, head = unpack(b, o)
        s = o + 8
        if head & _SUB_BATCH_BIT:  # 1|codec:3|0:4, records u16, uncompressed u32, length u32
            o = s + 11 + _U32.unpack_from(b, s + 7)[0]
        else:
            o = s + 4 + head
        if o > n:
            raise malformed("Publish entry runs past the end of the frame")
        append((pid, b[s:o]))
    return publisher_id, tuple(entries), o


def write_publish_body(frame: f.Publish) -> list:
    """The body parts of Publish v1 (``publisher_id`` and ``entries`` of ``frame``)."""
    entries = frame.entries
    parts = [_PUBLISH_HEAD.pack(frame.publisher_id, len(entries))]
    append, pack = parts.append, _U64.pack
    for pid, entry in entries:
        append(pack(pid))
        append(entry)
    return parts


def _read_publish_v2(b: bytes) -> tuple[f.PublishV2, int]:
    publisher_id, count = _PUBLISH_HEAD.unpack_from(b, _BODY)
    o = _BODY + 5
    n = len(b)
    if count > (n - o) // 14:  # publishing id + filter length + 4-byte header
        raise malformed(f"Publish v2 announces {count} entries in {n - o} bytes")
    unpack, u32 = _ENTRY_HEAD_V2.unpack_from, _U32.unpack_from
    entries = []
    append = entries.append
    for _ in range(count):
        pid, flen = unpack(b, o)
        o += 10
        if flen >= 0:
            e = o + flen
            if e > n:
                raise malformed("filter value runs past the end of the frame")
            fv: Optional[str] = str(b[o:e], "utf-8")
            o = e
        elif flen == -1:
            fv = None
        else:
            raise malformed(f"filter value length {flen}")
        (head,) = u32(b, o)
        if head & _SUB_BATCH_BIT:
            raise malformed("sub-batch entry in Publish v2")
        e = o + 4 + head
        if e > n:
            raise malformed("Publish entry runs past the end of the frame")
        append((pid, fv, b[o:e]))
        o = e
    return f.PublishV2(publisher_id, tuple(entries)), o


def _write_publish_v2(frame: f.PublishV2) -> list:
    entries = frame.entries
    parts = [_PUBLISH_HEAD.pack(frame.publisher_id, len(entries))]
    append, pack, write_str = parts.append, _U64.pack, STR.write
    for pid, fv, entry in entries:
        append(pack(pid))
        append(write_str(fv))
        append(entry)
    return parts


def _read_publish_confirm(b: bytes) -> tuple[f.PublishConfirm, int]:
    publisher_id, count = _PUBLISH_HEAD.unpack_from(b, _BODY)
    if len(b) != _BODY + 5 + 8 * count:
        raise malformed(f"PublishConfirm announces {count} ids in {len(b) - _BODY - 5} bytes")
    ids = struct.unpack_from(f">{count}Q", b, _BODY + 5)
    return f.PublishConfirm(publisher_id, ids), len(b)


def _write_publish_confirm(frame: f.PublishConfirm) -> list:
    ids = frame.publishing_ids
    return [struct.pack(f">BI{len(ids)}Q", frame.publisher_id, len(ids), *ids)]


def _read_publish_error(b: bytes) -> tuple[f.PublishError, int]:
    publisher_id, count = _PUBLISH_HEAD.unpack_from(b, _BODY)
    start = _BODY + 5
    if len(b) != start + _ERROR_ITEM.size * count:
        raise malformed(f"PublishError announces {count} errors in {len(b) - start} bytes")
    errors = tuple(_ERROR_ITEM.iter_unpack(b[start:]))
    return f.PublishError(publisher_id, errors), len(b)


def _write_publish_error(frame: f.PublishError) -> list:
    pack = _ERROR_ITEM.pack
    return [
        _PUBLISH_HEAD.pack(frame.publisher_id, len(frame.errors)),
        b"".join([pack(pid, code) for pid, code in frame.errors]),
    ]


# -- the table --------------------------------------------------------------------------------

_BROKER = record(f.Broker, U16, STR, U32)
_STREAM_METADATA = record(f.StreamMetadata, STR, U16, U16, array(U16))
_COMMAND_VERSION = record(f.CommandVersion, U16, U16, U16)
_STRINGS = array(STR)
_NAMES = array(NAME)  # stream names, binding keys: never null
_METADATA_NAMES = array(NAME, MAX_METADATA_NAMES)  # RabbitMQ: frame_max only (docs/security.md)
_R = RESPONSE_FLAG

# (frame class, key, version, layout): layout is the body's kinds in field order, or a
# (reader, writer) pair for the hand-written hot paths. C = correlation id u32.
_CURRENT_ROWS: tuple = (
    (f.DeclarePublisher, 0x0001, 1, (U32, U8, STR, NAME)),
    (f.DeclarePublisherResponse, _R | 0x0001, 1, (U32, U16)),
    (f.Publish, 0x0002, 1, (_read_publish, write_publish_body)),
    (f.PublishV2, 0x0002, 2, (_read_publish_v2, _write_publish_v2)),
    (f.PublishConfirm, 0x0003, 1, (_read_publish_confirm, _write_publish_confirm)),
    (f.PublishError, 0x0004, 1, (_read_publish_error, _write_publish_error)),
    (f.QueryPublisherSequence, 0x0005, 1, (U32, NAME, NAME)),
    (f.QueryPublisherSequenceResponse, _R | 0x0005, 1, (U32, U16, U64)),
    (f.DeletePublisher, 0x0006, 1, (U32, U8)),
    (f.DeletePublisherResponse, _R | 0x0006, 1, (U32, U16)),
    (f.Subscribe, 0x0007, 1, (U32, U8, NAME, OFFSET_SPEC, U16, optional(MAP))),
    (f.SubscribeResponse, _R | 0x0007, 1, (U32, U16)),
    (f.Deliver, 0x0008, 1, (U8, REST)),
    (f.DeliverV2, 0x0008, 2, (U8, U64, REST)),
    (f.Credit, 0x0009, 1, (U8, U16)),
    (f.CreditResponse, _R | 0x0009, 1, (U16, U8)),  # no correlation id
    (f.StoreOffset, 0x000A, 1, (NAME, NAME, U64)),
    (f.QueryOffset, 0x000B, 1, (U32, NAME, NAME)),
    (f.QueryOffsetResponse, _R | 0x000B, 1, (U32, U16, U64)),
    (f.Unsubscribe, 0x000C, 1, (U32, U8)),
    (f.UnsubscribeResponse, _R | 0x000C, 1, (U32, U16)),
    (f.Create, 0x000D, 1, (U32, NAME, MAP)),
    (f.CreateResponse, _R | 0x000D, 1, (U32, U16)),
    (f.Delete, 0x000E, 1, (U32, NAME)),
    (f.DeleteResponse, _R | 0x000E, 1, (U32, U16)),
    (f.Metadata, 0x000F, 1, (U32, _METADATA_NAMES)),
    (f.MetadataResponse, _R | 0x000F, 1, (U32, array(_BROKER), array(_STREAM_METADATA))),
    (f.MetadataUpdate, 0x0010, 1, (U16, STR)),
    (f.PeerProperties, 0x0011, 1, (U32, MAP)),
    (f.PeerPropertiesResponse, _R | 0x0011, 1, (U32, U16, MAP)),
    (f.SaslHandshake, 0x0012, 1, (U32,)),
    (f.SaslHandshakeResponse, _R | 0x0012, 1, (U32, U16, _STRINGS)),
    (f.SaslAuthenticate, 0x0013, 1, (U32, STR, BYTES)),
    (f.SaslAuthenticateResponse, _R | 0x0013, 1, (U32, U16, optional(SHORT_BYTES))),
    (f.Tune, 0x0014, 1, (U32, U32)),
    (f.TuneResponse, _R | 0x0014, 1, (U32, U32)),
    (f.Open, 0x0015, 1, (U32, STR)),
    (f.OpenResponse, _R | 0x0015, 1, (U32, U16, optional(MAP))),
    (f.Close, 0x0016, 1, (U32, U16, STR)),
    (f.CloseResponse, _R | 0x0016, 1, (U32, U16)),
    (f.Heartbeat, 0x0017, 1, ()),
    (f.Route, 0x0018, 1, (U32, NAME, NAME)),
    (f.RouteResponse, _R | 0x0018, 1, (U32, U16, _STRINGS)),
    (f.Partitions, 0x0019, 1, (U32, NAME)),
    (f.PartitionsResponse, _R | 0x0019, 1, (U32, U16, _STRINGS)),
    (f.ConsumerUpdate, 0x001A, 1, (U32, U8, BOOL)),
    (f.ConsumerUpdateResponse, _R | 0x001A, 1, (U32, U16, TRAILING_OFFSET_SPEC)),
    (f.ExchangeCommandVersions, 0x001B, 1, (U32, array(_COMMAND_VERSION))),
    (f.ExchangeCommandVersionsResponse, _R | 0x001B, 1, (U32, U16, array(_COMMAND_VERSION))),
    (f.StreamStats, 0x001C, 1, (U32, NAME)),
    (f.StreamStatsResponse, _R | 0x001C, 1, (U32, U16, INT_MAP)),
    (f.CreateSuperStream, 0x001D, 1, (U32, NAME, _NAMES, _NAMES, MAP)),
    (f.CreateSuperStreamResponse, _R | 0x001D, 1, (U32, U16)),
    (f.DeleteSuperStream, 0x001E, 1, (U32, NAME)),
    (f.DeleteSuperStreamResponse, _R | 0x001E, 1, (U32, U16)),
    (f.ResolveOffsetSpec, 0x001F, 1, (U32, NAME, OFFSET_SPEC, optional(MAP))),
    (f.ResolveOffsetSpecResponse, _R | 0x001F, 1, (U32, U16, OFFSET_TYPE, U64)),
)


@dataclass(frozen=True)
class Dialect:
    """One protocol dialect's dispatch tables, built from rows ``(frame class, key, version,
    layout)``.

    ``readers`` maps ``(key, version)`` to ``read(frame bytes) -> (frame, end offset)``;
    ``writers`` maps a frame class to ``(packed key+version, write(frame) -> [body parts])``;
    ``keys`` maps a frame class to its ``(key, version)``; ``publish_keys`` are the keys of
    the Publish frames it reads (they may be larger than frame_max: see ``FrameDecoder``).
    """

    name: str
    readers: Mapping[tuple[int, int], BodyReader]
    writers: Mapping[type, tuple[bytes, BodyWriter]]
    keys: Mapping[type, tuple[int, int]]
    publish_keys: frozenset[int] = frozenset()

    @classmethod
    def from_rows(cls, name: str, rows: Iterable[tuple],
                  publish_keys: Iterable[int] = ()) -> "Dialect":
        readers: dict = {}
        writers: dict = {}
        keys: dict = {}
        for frame_cls, key, version, layout in rows:
            if (key, version) in readers or frame_cls in writers:
                raise ValueError(f"{name}: duplicate row for {frame_cls.__name__}")
            if layout and not isinstance(layout[0], Kind):
                read, write = layout
            else:
                read, write = body_reader(frame_cls, layout, _BODY), body_writer(frame_cls, layout)
            readers[(key, version)] = read
            writers[frame_cls] = (_KEY_VERSION.pack(key, version), write)
            keys[frame_cls] = (key, version)
        return cls(name, readers, writers, keys, frozenset(publish_keys))


CURRENT = Dialect.from_rows("current", _CURRENT_ROWS, publish_keys=(Command.Publish,))
"""The protocol spoken by RabbitMQ >= 3.9 and every maintained client."""


# -- decoding ---------------------------------------------------------------------------------


def _decode_frame(readers: Mapping, frame: bytes) -> f.Frame:
    if len(frame) < _BODY:
        raise malformed(f"frame of {len(frame) - 4} bytes has no key and version")
    kv = _KEY_VERSION.unpack_from(frame, 4)
    read = readers.get(kv)
    if read is None:
        raise FrameError(
            ResponseCode.UNKNOWN_FRAME, f"unknown frame key 0x{kv[0]:04x} version {kv[1]}"
        )
    try:
        result, end = read(frame)
    except FrameError as exc:
        exc.message = f"key 0x{kv[0]:04x} v{kv[1]}: {exc.message}"
        raise
    except (struct.error, ValueError, IndexError, OverflowError) as exc:
        # struct.error: truncated body; ValueError: bad UTF-8 or an unknown enum value.
        raise malformed(f"key 0x{kv[0]:04x} v{kv[1]}: truncated or garbled body ({exc})") from None
    if end != len(frame):
        raise malformed(f"key 0x{kv[0]:04x} v{kv[1]}: {len(frame) - end} trailing bytes")
    return result


def decode(data: bytes, dialect: Dialect = CURRENT) -> f.Frame:
    """Decode exactly one complete frame, ``data`` being its wire bytes including the u32 size
    prefix. Raises FrameError (0x0d) if ``data`` is not exactly one well-formed frame; applies
    no frame size limit (use FrameDecoder for a stream of bytes)."""
    data = bytes(data)
    if len(data) < 4 or _U32.unpack_from(data)[0] != len(data) - 4:
        raise malformed("size prefix does not match the data")
    return _decode_frame(dialect.readers, data)


class FrameDecoder:
    """Incremental frame decoder: ``feed(bytes) -> [Frame, ...]``, buffering partial frames.

    ``max_frame_size`` bounds the u32 size field of a frame (the bytes after the size itself,
    as rabbit_stream_core.erl checks it), 0 meaning no limit. A server starts at
    ``INITIAL_FRAME_MAX`` (8192) and raises it to the negotiated frame_max after Open; a new
    value takes effect on the next ``feed``. A Publish frame (``dialect.publish_keys``) may be
    larger, up to ``max_publish_frame_size`` when that is larger still: RabbitMQ 3.9 to 4.2
    take any incoming frame whatever its size, and clients rely on it for Publish (rstream's
    ``send_batch`` sends its whole batch as one frame). A frame above its limit is refused as
    soon as its size field and key arrive, without buffering its body. ``dialect`` may be
    swapped between feeds (after the first frame tells the dialect apart).

    Errors are final: after a FrameError every later ``feed`` raises FrameError again (the
    connection must be closed with ``error.code``). Frames that preceded the bad one in the same
    call are on ``error.frames``.
    """

    __slots__ = ("max_frame_size", "max_publish_frame_size", "dialect", "_buf", "_need",
                 "_error")

    def __init__(self, max_frame_size: int = DEFAULT_FRAME_MAX, dialect: Dialect = CURRENT,
                 max_publish_frame_size: int = 0) -> None:
        self.max_frame_size = max_frame_size
        self.max_publish_frame_size = max_publish_frame_size
        self.dialect = dialect
        self._buf = bytearray()
        self._need = 4  # bytes the buffer must hold before a frame can complete
        self._error: Optional[FrameError] = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet decoded (a partial frame)."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[f.Frame]:
        """Add received bytes; return the frames they complete, in order (often empty).

        Raises FrameError as documented on the class.
        """
        if self._error is not None:
            raise FrameError(self._error.code, f"decoder failed earlier: {self._error.message}")
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:
                return []
            src = bytes(buf)
            buf.clear()
        elif not data:
            return []
        else:
            src = data if type(data) is bytes else bytes(data)
        out: list[f.Frame] = []
        n = len(src)
        pos = 0
        limit = self.max_frame_size
        readers = self.dialect.readers
        need = 4
        try:
            while n - pos >= 4:
                (size,) = _U32.unpack_from(src, pos)
                if limit and size > limit:
                    if n - pos < 6:  # its key decides: wait for it
                        need = 6
                        break
                    self._check_large(size, _KEY.unpack_from(src, pos + 4)[0])
                end = pos + 4 + size
                if end > n:
                    need = 4 + size
                    break
                out.append(_decode_frame(readers, src[pos:end]))
                pos = end
        except FrameError as exc:
            exc.frames = tuple(out)
            self._error = exc
            raise
        if pos < n:
            buf += memoryview(src)[pos:]
        self._need = need
        return out

    def _check_large(self, size: int, key: int) -> None:
        """Raise FrameError (0x0e) unless a frame of ``size`` bytes (above max_frame_size)
        with ``key`` is a Publish frame within ``max_publish_frame_size``."""
        publish = key in self.dialect.publish_keys
        limit = max(self.max_publish_frame_size, self.max_frame_size) if publish \
            else self.max_frame_size
        if size > limit:
            raise FrameError(ResponseCode.FRAME_TOO_LARGE, f"{'Publish frame' if publish else 'frame'}"
                             f" of {size} bytes is larger than the limit of {limit}")


# -- encoding ---------------------------------------------------------------------------------


def encode(frame: f.Frame, dialect: Dialect = CURRENT) -> bytes:
    """The wire bytes of ``frame`` (size prefix included) in ``dialect``.

    Raises TypeError for an object that is not a frame of the dialect and ValueError for field
    values that do not fit their wire types (a u8 id above 255, a string over 32767 bytes, an
    offset type without its offset, ...).
    """
    try:
        key_version, write = dialect.writers[type(frame)]
    except KeyError:
        raise TypeError(f"{type(frame).__name__} is not a frame of the {dialect.name} dialect") from None
    try:
        parts = write(frame)
        size = 4 + sum(map(len, parts))
        return b"".join((_U32.pack(size), key_version, *parts))
    except (struct.error, OverflowError, AttributeError, TypeError) as exc:
        raise ValueError(f"cannot encode {type(frame).__name__}: {exc}") from None


def deliver_prefix(subscription_id: int, chunk_size: int, committed_chunk_id: Optional[int] = None) -> bytes:
    """The bytes of a Deliver frame that precede its chunk (v1, or v2 when
    ``committed_chunk_id`` is given), so a front door can send ``prefix`` then the chunk bytes
    straight from the file (writelines/sendfile) without building the frame in memory.
    ``chunk_size`` is the chunk's length in bytes (48-byte header + data section)."""
    if committed_chunk_id is None:
        return _HEADER.pack(4 + 1 + chunk_size, 0x0008, 1) + bytes((subscription_id,))
    return (
        _HEADER.pack(4 + 9 + chunk_size, 0x0008, 2)
        + bytes((subscription_id,))
        + _U64.pack(committed_chunk_id)
    )


def simple_entry(payload: bytes) -> bytes:
    """A simple publish/chunk entry: ``0|Len:31`` then ``payload`` (the entry form Publish
    carries). Raises ValueError for payloads of 2 GiB or more."""
    if len(payload) > _MAX_ENTRY:
        raise ValueError("entry payload must be shorter than 2**31 bytes")
    return _U32.pack(len(payload)) + payload
