# The 2020 draft dialect of the RabbitMQ Stream protocol, sans-IO: its two dispatch tables (what
# a server reads and writes, what a client reads and writes), its two frames that have no
# current counterpart (Publish naming its stream, CommitOffset), the draft Deliver built from a
# stored chunk, and the test that tells a draft connection apart by its first frame.
# Rules: frames keep the current protocol's meaning, so a front door serves both dialects with
# the same handlers: response codes and offset types are translated here, at the wire (draft
# numbers are the current ones minus one); fields the draft has no place for read as None and
# are left out when written. Nothing here does I/O or keeps state.
# Wire facts: seeds/rabbitmq-stream-PROTOCOL-draft.adoc (keys, layouts, types, the chunk header
# in Deliver). What the seed leaves out comes from the reference implementation it names, the
# 2020 rabbitmq-stream-java-client (Constants.java: VERSION_0 = 0, response codes OK = 0 ..
# PRECONDITION_FAILED = 16) and the 2020 broker (rabbit_stream_reader.erl: version 0 on every
# frame, CommitOffset = C, Reference, Stream, Offset:64, QueryOffset answers OK with 0 when no
# offset is stored), and from osiris 348db05 (the commit the seed cites) for sub-batch entries.
from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from isal.isal_zlib import crc32  # CRC-32 (IEEE), as the log's chunks use it

from . import frames as f
from ._wire import (
    BYTES,
    MAP,
    NAME,
    REST,
    STR,
    U8,
    U16,
    U32,
    U64,
    Kind,
    array,
    body_reader,
    body_writer,
    offset_spec,
    record,
)
from .codec import (Dialect, _read_publish_confirm, _write_publish_confirm, read_publish_body,
                    write_publish_body)
from .constants import MAX_METADATA_NAMES, ResponseCode
from .errors import malformed

__all__ = [
    "DRAFT_CLIENT",
    "DRAFT_SERVER",
    "VERSION",
    "CommitOffset",
    "Key",
    "Publish",
    "deliver_parts",
    "opens_draft",
]

VERSION = 0
"""The version of every draft frame (the seed gives none; the 2020 client and broker used 0)."""


class Key(IntEnum):
    """Draft command keys (seed, "Commands"). A response reuses its request's key."""

    Publish = 0
    PublishConfirm = 1
    Subscribe = 2
    Deliver = 3
    Credit = 4
    Unsubscribe = 5
    PublishError = 6
    MetadataUpdate = 7
    Metadata = 8
    SaslHandshake = 9
    SaslAuthenticate = 10
    Tune = 11
    Open = 12
    Close = 13
    Heartbeat = 14
    PeerProperties = 15
    CommitOffset = 16
    QueryOffset = 17
    Create = 998
    Delete = 999


_BODY = 8  # a body starts after size u32, key u16, version u16
_U16S = struct.Struct(">H")
_KEY = struct.Struct(">xxxxH")  # the key of a frame, after its size
_U64S = struct.Struct(">Q")
_DELIVER_HEAD = struct.Struct(">IHHB")  # size, key 3, version, subscription id
_STORED_HEAD = struct.Struct(">BxHI8xQQII8x")  # the log's 48-byte chunk header, fields kept
_DRAFT_CHUNK_HEAD = struct.Struct(">BHIQQII")  # the seed's chunk header in Deliver: 31 bytes
_U32S = struct.Struct(">I")
_SUB_BATCH = 0x80000000


# -- the two frames the current protocol has no counterpart for -------------------------------


@dataclass(frozen=True, slots=True)
class Publish(f.Frame):
    """Draft key 0: ``Stream string, PublisherId u8, [PublishingId u64, Message bytes]``.

    No DeclarePublisher precedes it, so no deduplication. ``entries`` is a tuple of
    ``(publishing_id, entry)`` as in ``frames.Publish``: a draft message (i32 length + bytes)
    is exactly a simple entry ``0|Len:31, bytes``, so entries go into chunks as they are. A
    negative length (null, -1) is refused: a message has bytes.
    """

    stream: str
    publisher_id: int
    entries: tuple[tuple[int, bytes], ...]


@dataclass(frozen=True, slots=True)
class CommitOffset(f.Frame):
    """Draft key 16: ``C (unused), Reference string, Stream string, Offset u64``; no reply.
    The current protocol's StoreOffset without the correlation id. (The seed's field list
    names a SubscriptionId u8 in place of the stream; its summary line, the 2020 broker and
    QueryOffset all use the stream.)"""

    correlation_id: int
    reference: str
    stream: str
    offset: int


# -- draft kinds --------------------------------------------------------------------------------


def _read_code(b: bytes, o: int) -> tuple[int, int]:
    return _U16S.unpack_from(b, o)[0] + 1, o + 2


def _write_code(code: int) -> bytes:
    if code < 1:
        raise ValueError(f"response code {code} has no draft number")
    return _U16S.pack(code - 1)


CODE = Kind("draft response code", _read_code, _write_code)
"""u16 response code, draft number = current ``ResponseCode`` - 1 (OK is 0 in the draft)."""


def _read_error(b: bytes, o: int) -> tuple[tuple[int, int], int]:
    code, _ = _read_code(b, o + 8)
    return (_U64S.unpack_from(b, o)[0], code), o + 10


def _write_error(item: tuple[int, int]) -> bytes:
    return _U64S.pack(item[0]) + _write_code(item[1])


_ERRORS = array(Kind("publishing error", _read_error, _write_error))
OFFSET_SPEC = offset_spec("draft offset spec", first=0)
"""0 first, 1 last, 2 next, 3 offset (u64 follows), 4 timestamp (i64 follows)."""

DROPPED = Kind("not in the draft", lambda b, o: (None, o), lambda v: b"")
"""A field of a shared frame class the draft has no place for (Subscribe properties, Open
properties): read as None, left out when written."""


# -- hand-written bodies ------------------------------------------------------------------------


def _read_publish(b: bytes) -> tuple[Publish, int]:
    stream, o = NAME.read(b, _BODY)
    publisher_id, entries, o = read_publish_body(b, o)
    for _, entry in entries:
        if entry[0] & 0x80:  # a negative message length: null (-1), or not a draft message
            raise malformed("a draft message has an int32 length of 0 or more")
    return Publish(stream, publisher_id, entries), o


def _write_publish(frame: Publish) -> list:
    return [STR.write(frame.stream), *write_publish_body(frame)]  # same field names


_read_close_request = body_reader(f.Close, (U32, CODE, STR), _BODY)
_read_close_response = body_reader(f.CloseResponse, (U32, CODE), _BODY)


def _read_close(b: bytes) -> tuple[f.Frame, int]:
    # Key 13 is both the Close request and its response: a response body is C + code (6
    # bytes), a request's also holds the reason string (at least 2 more).
    if len(b) == _BODY + 6:
        return _read_close_response(b)
    return _read_close_request(b)


_write_query_offset = body_writer(f.QueryOffsetResponse, (U32, CODE, U64))


def _write_query_offset_response(frame: f.QueryOffsetResponse) -> list:
    if frame.response_code == ResponseCode.NO_OFFSET:  # no such code in the draft
        frame = f.QueryOffsetResponse(frame.correlation_id, ResponseCode.OK, 0)
    return _write_query_offset(frame)


# -- the tables ---------------------------------------------------------------------------------

_STRINGS = array(STR)
_BROKER = record(f.Broker, U16, STR, U32)
_STREAM_METADATA = record(f.StreamMetadata, STR, CODE, U16, array(U16))
_CLOSE = (_read_close, body_writer(f.Close, (U32, CODE, STR)))
_CLOSE_RESPONSE = ((f.CloseResponse, Key.Close, VERSION, (U32, CODE)),)

# (frame class, key, layout); every draft frame has version 0. C = correlation id u32.
_FROM_CLIENT = (
    (Publish, Key.Publish, (_read_publish, _write_publish)),
    (f.Subscribe, Key.Subscribe, (U32, U8, NAME, OFFSET_SPEC, U16, DROPPED)),
    (f.Credit, Key.Credit, (U8, U16)),
    (f.Unsubscribe, Key.Unsubscribe, (U32, U8)),
    (f.Metadata, Key.Metadata, (U32, array(NAME, MAX_METADATA_NAMES))),
    (f.SaslHandshake, Key.SaslHandshake, (U32,)),
    (f.SaslAuthenticate, Key.SaslAuthenticate, (U32, STR, BYTES)),
    (f.TuneResponse, Key.Tune, (U32, U32)),  # the client's answer to the server's Tune
    (f.Open, Key.Open, (U32, STR)),
    (f.Close, Key.Close, _CLOSE),
    (f.Heartbeat, Key.Heartbeat, ()),
    (f.PeerProperties, Key.PeerProperties, (U32, MAP)),
    (CommitOffset, Key.CommitOffset, (U32, NAME, NAME, U64)),
    (f.QueryOffset, Key.QueryOffset, (U32, NAME, NAME)),
    (f.Create, Key.Create, (U32, NAME, MAP)),
    (f.Delete, Key.Delete, (U32, NAME)),
)
_FROM_SERVER = (
    (f.PublishConfirm, Key.PublishConfirm, (_read_publish_confirm, _write_publish_confirm)),
    (f.SubscribeResponse, Key.Subscribe, (U32, CODE)),
    (f.Deliver, Key.Deliver, (U8, REST)),  # chunk in the draft form: see deliver_parts
    (f.CreditResponse, Key.Credit, (CODE, U8)),
    (f.UnsubscribeResponse, Key.Unsubscribe, (U32, CODE)),
    (f.PublishError, Key.PublishError, (U8, _ERRORS)),
    (f.MetadataUpdate, Key.MetadataUpdate, (CODE, STR)),
    (f.MetadataResponse, Key.Metadata, (U32, array(_BROKER), array(_STREAM_METADATA))),
    (f.SaslHandshakeResponse, Key.SaslHandshake, (U32, CODE, _STRINGS)),
    (f.SaslAuthenticateResponse, Key.SaslAuthenticate, (U32, CODE, BYTES)),
    (f.Tune, Key.Tune, (U32, U32)),
    (f.OpenResponse, Key.Open, (U32, CODE, DROPPED)),
    (f.Close, Key.Close, _CLOSE),
    (f.Heartbeat, Key.Heartbeat, ()),
    (f.PeerPropertiesResponse, Key.PeerProperties, (U32, CODE, MAP)),
    (f.QueryOffsetResponse, Key.QueryOffset,
     (body_reader(f.QueryOffsetResponse, (U32, CODE, U64), _BODY), _write_query_offset_response)),
    (f.CreateResponse, Key.Create, (U32, CODE)),
    (f.DeleteResponse, Key.Delete, (U32, CODE)),
)


def _role(name: str, reads: tuple, writes: tuple, publish_keys: tuple = ()) -> Dialect:
    """A Dialect that reads the frames of one direction and writes those of the other (the
    draft reuses request keys for responses, so one table cannot hold both directions)."""
    r = Dialect.from_rows(name, [(cls, key, VERSION, layout) for cls, key, layout in reads],
                          publish_keys)
    w = Dialect.from_rows(name, [(cls, key, VERSION, layout) for cls, key, layout in writes])
    c = Dialect.from_rows(name, _CLOSE_RESPONSE)  # shares key 13 with Close: its own table
    return Dialect(name, r.readers, {**w.writers, **c.writers}, {**w.keys, **c.keys},
                   r.publish_keys)


DRAFT_SERVER = _role("draft (server side)", _FROM_CLIENT, _FROM_SERVER, (Key.Publish,))
"""A server's dialect for a draft connection: reads client frames, writes server frames."""
DRAFT_CLIENT = _role("draft (client side)", _FROM_SERVER, _FROM_CLIENT)
"""A draft client's dialect: reads server frames, writes client frames."""


def opens_draft(head: bytes) -> bool | None:
    """Whether a connection's first bytes open with the draft's PeerProperties (key 15); None
    while they cannot tell yet: fewer than 6 bytes (size u32, key u16), unless the size is too
    small to hold a key (False: the current decoder refuses that frame). The current protocol
    opens with PeerProperties 0x0011; 0x000f is Metadata there, never a first frame."""
    if len(head) >= 6:
        return _KEY.unpack_from(head)[0] == Key.PeerProperties
    if len(head) >= 4 and _U32S.unpack_from(head)[0] < 2:
        return False
    return None


# -- Deliver ------------------------------------------------------------------------------------


def _draft_entries(data: memoryview) -> list | None:
    """The data section in osiris 348db05's entry format, as buffers to join, or None when it
    holds no sub-batch (simple entries are the same in both). A current sub-batch header is
    ``1|Codec:3|0:4, Records u16, UncompressedLen u32, Len u32``; the draft's has no
    UncompressedLen."""
    parts = None
    pos = start = 0
    end = len(data)
    unpack = _U32S.unpack_from
    while pos < end:
        (head,) = unpack(data, pos)
        if head & _SUB_BATCH:
            if parts is None:
                parts = []
            parts.append(data[start:pos + 3])  # what precedes, flags|codec, records
            parts.append(data[pos + 7:pos + 11])  # length; the body follows
            start = pos + 11
            pos = start + unpack(data, pos + 7)[0]
        else:
            pos += 4 + head
    if parts is not None:
        parts.append(data[start:])
    return parts


def deliver_parts(subscription_id: int, chunk: memoryview | bytes) -> list:
    """The draft Deliver frame (key 3) of a stored chunk, as buffers for ``writelines``.

    ``chunk`` is the chunk as the log holds it: the 48-byte header then exactly the data
    section (no trailer). The seed's chunk header is 31 bytes: magic/version u8, entries u16,
    records u32, epoch u64, chunk id u64, CRC-32 u32, data length u32 (no chunk type,
    timestamp, trailer or bloom fields). The data section goes as it is, unless it holds
    sub-batches: those are rewritten to the draft's header, with the CRC and length redone.
    """
    view = memoryview(chunk)
    magic, entries, records, epoch, first, crc, length = _STORED_HEAD.unpack_from(view)
    data = view[_STORED_HEAD.size:_STORED_HEAD.size + length]
    redone = _draft_entries(data)
    if redone is not None:
        data = b"".join(redone)
        crc, length = crc32(data), len(data)
    head = _DELIVER_HEAD.pack(5 + _DRAFT_CHUNK_HEAD.size + length, Key.Deliver, VERSION,
                              subscription_id)
    return [head + _DRAFT_CHUNK_HEAD.pack(magic, entries, records, epoch, first, crc, length),
            data]
