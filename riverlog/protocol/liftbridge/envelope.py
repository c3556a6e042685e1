# The Liftbridge NATS envelope, sans-IO: bytes in, (MsgType, payload) out, and back. Every
# Liftbridge message sent over NATS (client publishes and acks, and the internal server-to-server
# requests) is an 8-byte header, an optional CRC-32C, then the payload, usually a protobuf from
# api.proto. Decoding never raises on peer bytes: anything that fails a check is "not an
# envelope" (None), and the NATS door then stores the NATS message as a plain one (value = the
# raw bytes, no key, no ack), as Liftbridge does.
#
# Wire facts: seeds/liftbridge-envelope-protocol.md (layout, magic, flags, the 15 MsgTypes) and
# reference/liftbridge.md "Envelope and NATS subjects"; the CRC's byte order (big-endian), the
# CRC-on-HeaderLen-12 rule and the ReplicationResponse payload layout from liftbridge's
# server/protocol/envelope.go (liftbridge-io/liftbridge 50ac358).
#
#    0       1       2       3       4         5           6       7       8..11
#   +-------+-------+-------+-------+---------+-----------+-------+-------+------------------+
#   | B9    | 0E    | 43    | B4    | Version | HeaderLen | Flags |MsgType| CRC-32C (BE, opt)|
#   +-------+-------+-------+-------+---------+-----------+-------+-------+------------------+
#   Version 0. Flags bit 0: a CRC-32C (Castagnoli) of the payload follows, HeaderLen 12;
#   otherwise HeaderLen 8. The payload starts at HeaderLen and runs to the end.
#
# Stricter than Liftbridge on purpose, on headers no real client writes: Liftbridge ignores
# unknown flag bits and, without the CRC flag, takes any HeaderLen; here both make the bytes
# "not an envelope". Liftbridge itself never sets the CRC flag (its acks are 8-byte headers), so
# encoding defaults to crc=False, byte-for-byte what Liftbridge sends.
#
# The internal server-to-server messages are read with ``decode_internal``, which, like
# Liftbridge's Unmarshal* functions (server/protocol/envelope.go checkEnvelope), raises
# EnvelopeError naming the failed check instead of returning None: a replica that sent bad bytes
# is answered with an error, never mistaken for a plain NATS message.
#
# decode_publish and AckTemplate run once per NATS message: a compiled twin (_envelope_c.pyx)
# replaces them when built, unless RIVERLOG_NO_EXTENSIONS is set; the code here stays the
# reference (riverlog/_compiled.py).
from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple, Optional, Union

from crc32c import crc32c as _crc32c
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as _ProtoMessage

from ..._compiled import twin
from . import api_pb2

__all__ = [
    "ACK_HEADER",
    "AckTemplate",
    "EnvelopeError",
    "FLAG_CRC32C",
    "HEADER_LEN",
    "HEADER_LEN_CRC",
    "MAGIC",
    "MESSAGE_CLASSES",
    "VERSION",
    "MsgType",
    "PUBLISH_CLASSES",
    "ReplicationResponse",
    "decode_ack",
    "decode_envelope",
    "decode_internal",
    "decode_message",
    "decode_publish",
    "decode_replication_response",
    "encode_ack",
    "encode_envelope",
    "encode_message",
    "encode_publish",
    "encode_replication_response",
    "varint",
]

Bytes = Union[bytes, bytearray, memoryview]

MAGIC = b"\xb9\x0e\x43\xb4"
"""The envelope's first four bytes (invalid UTF-8 on purpose, to avoid collisions)."""
VERSION = 0
"""The only envelope protocol version there is."""
HEADER_LEN = 8
"""HeaderLen of an envelope without CRC: magic, version, header length, flags, type."""
HEADER_LEN_CRC = 12
"""HeaderLen of an envelope whose flags have FLAG_CRC32C: the CRC follows the 8 bytes."""
FLAG_CRC32C = 0x01
"""Flags bit 0: a big-endian CRC-32C (Castagnoli) of the payload is in bytes 8..11."""


class MsgType(IntEnum):
    """The envelope's MsgType byte (seeds/liftbridge-envelope-protocol.md, "MsgType").

    Publish and Ack are client-facing; 2..14 are internal server-to-server messages.
    """

    Publish = 0  # client-published Message
    Ack = 1  # server-published Ack, to the message's ackInbox
    ReplicationRequest = 2
    ReplicationResponse = 3  # not protobuf: see ReplicationResponse
    RaftJoinRequest = 4
    RaftJoinResponse = 5
    LeaderEpochOffsetRequest = 6
    LeaderEpochOffsetResponse = 7
    PropagatedRequest = 8
    PropagatedResponse = 9
    ServerInfoRequest = 10
    ServerInfoResponse = 11
    PartitionStatusRequest = 12
    PartitionStatusResponse = 13
    PartitionNotification = 14


MESSAGE_CLASSES: dict[MsgType, Optional[type[_ProtoMessage]]] = {
    MsgType.Publish: api_pb2.Message,
    MsgType.Ack: api_pb2.Ack,
    MsgType.ReplicationRequest: api_pb2.ReplicationRequest,
    MsgType.ReplicationResponse: None,
    MsgType.RaftJoinRequest: api_pb2.RaftJoinRequest,
    MsgType.RaftJoinResponse: api_pb2.RaftJoinResponse,
    MsgType.LeaderEpochOffsetRequest: api_pb2.LeaderEpochOffsetRequest,
    MsgType.LeaderEpochOffsetResponse: api_pb2.LeaderEpochOffsetResponse,
    MsgType.PropagatedRequest: api_pb2.PropagatedRequest,
    MsgType.PropagatedResponse: api_pb2.PropagatedResponse,
    MsgType.ServerInfoRequest: api_pb2.ServerInfoRequest,
    MsgType.ServerInfoResponse: api_pb2.ServerInfoResponse,
    MsgType.PartitionStatusRequest: api_pb2.PartitionStatusRequest,
    MsgType.PartitionStatusResponse: api_pb2.PartitionStatusResponse,
    MsgType.PartitionNotification: api_pb2.PartitionNotification,
}
"""The protobuf class of each MsgType's payload (None: ReplicationResponse, not protobuf)."""

_TYPE_OF_CLASS = {cls: t for t, cls in MESSAGE_CLASSES.items() if cls is not None}

# Dispatch as data: the 8 header bytes of every valid envelope, with and without CRC, mapped to
# (MsgType, has CRC). Any other 8 bytes (magic, version, HeaderLen, flags or type wrong) are
# not an envelope; one dict lookup does every header check at once.
_HEADER = {t: MAGIC + bytes((VERSION, HEADER_LEN, 0, t)) for t in MsgType}
_HEADER_CRC = {t: MAGIC + bytes((VERSION, HEADER_LEN_CRC, FLAG_CRC32C, t)) for t in MsgType}
_DECODE = {h: (t, False) for t, h in _HEADER.items()}
_DECODE.update({h: (t, True) for t, h in _HEADER_CRC.items()})
_PUBLISH_HEADER = _HEADER[MsgType.Publish]  # decode_publish's fast path
ACK_HEADER = _HEADER[MsgType.Ack]
"""The 8 header bytes of an Ack envelope without CRC (what Liftbridge sends): header + Ack
protobuf bytes is ``encode_ack(ack)``."""

_REPLICATION = struct.Struct(">Qq")
_U64_MAX = (1 << 64) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


class EnvelopeError(ValueError):
    """Bytes that are not the envelope ``decode_internal`` expected; ``reason`` names the
    check that failed (header, magic, version, HeaderLen, flags, MsgType, CRC-32C, payload)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"bad Liftbridge envelope: {reason}")
        self.reason = reason


def encode_envelope(msg_type: int, payload: Bytes, crc: bool = False) -> bytes:
    """Frame ``payload`` as an envelope of type ``msg_type``.

    With ``crc`` the header is 12 bytes and carries the payload's CRC-32C, big-endian
    (seeds/liftbridge-envelope-protocol.md "CRC-32C"; byte order from liftbridge's envelope.go).
    The default, no CRC, is what Liftbridge itself sends. Raises ValueError for an unknown type.
    """
    try:
        header = (_HEADER_CRC if crc else _HEADER)[msg_type]
    except KeyError:
        raise ValueError(f"unknown envelope MsgType {msg_type!r}") from None
    if crc:
        return b"".join((header, _crc32c(payload).to_bytes(4, "big"), payload))
    return b"".join((header, payload))


def decode_envelope(data: Bytes) -> Optional[tuple[MsgType, bytes]]:
    """Return ``(msg_type, payload)`` if ``data`` is a valid envelope, else None.

    None when any check fails: shorter than the header, wrong magic, version other than 0,
    HeaderLen other than 8 (no CRC) or 12 (CRC flag), unknown flag bits, MsgType above 14, or
    a CRC-32C that does not match the payload. Never raises for bytes-like input. The payload
    is not parsed: see decode_message / decode_publish / decode_ack for that.
    """
    if type(data) is not bytes:
        data = bytes(data)
    entry = _DECODE.get(data[:8])
    if entry is None:
        return None
    msg_type, crc = entry
    if not crc:
        return msg_type, data[8:]
    payload = data[12:]
    if len(data) < 12 or _crc32c(payload) != int.from_bytes(data[8:12], "big"):
        return None
    return msg_type, payload


def encode_message(message: _ProtoMessage, crc: bool = False) -> bytes:
    """Serialize an api_pb2 message and frame it with the MsgType its class travels as.

    ``api_pb2.Message`` goes as Publish, ``api_pb2.Ack`` as Ack, ``api_pb2.ServerInfoRequest``
    as ServerInfoRequest, and so on (MESSAGE_CLASSES). Raises TypeError for any other class.
    """
    try:
        msg_type = _TYPE_OF_CLASS[type(message)]
    except KeyError:
        raise TypeError(f"{type(message).__name__} is not carried in a Liftbridge envelope") from None
    return encode_envelope(msg_type, message.SerializeToString(), crc)


def decode_message(data: Bytes) -> Optional[tuple[MsgType, object]]:
    """Decode an envelope and parse its payload: ``(msg_type, message)`` or None.

    ``message`` is an instance of ``MESSAGE_CLASSES[msg_type]``, or a ReplicationResponse for
    MsgType.ReplicationResponse. None when the envelope fails a check (decode_envelope) or the
    payload does not parse.
    """
    decoded = decode_envelope(data)
    if decoded is None:
        return None
    msg_type, payload = decoded
    try:
        return msg_type, _parse_payload(msg_type, payload)
    except EnvelopeError:
        return None


def encode_publish(message: api_pb2.Message, crc: bool = False) -> bytes:
    """Frame a client publish: an api_pb2.Message as MsgType.Publish.

    Over NATS the publisher's expected offset (optimistic concurrency) travels in
    ``Message.offset``; go-liftbridge sends -1 for "next" (reference/liftbridge.md).
    """
    return encode_envelope(MsgType.Publish, message.SerializeToString(), crc)


def decode_publish(data: Bytes) -> Optional[api_pb2.Message]:
    """The api_pb2.Message of a Publish envelope, or None if ``data`` is not one. (The compiled
    twin may give a PublishMessage instead: the same attributes, headers a dict, equal to the
    api_pb2.Message of the same fields; PUBLISH_CLASSES names both.)

    None covers every reason Liftbridge stores a NATS message as plain: a failed envelope check,
    another MsgType, or a payload that is not a valid Message protobuf.
    """
    if type(data) is not bytes:
        data = bytes(data)
    if data[:8] == _PUBLISH_HEADER:
        payload = data[8:]
    else:
        decoded = decode_envelope(data)
        if decoded is None or decoded[0] is not MsgType.Publish:
            return None
        payload = decoded[1]
    try:
        return api_pb2.Message.FromString(payload)
    except DecodeError:
        return None


def encode_ack(ack: api_pb2.Ack, crc: bool = False) -> bytes:
    """Frame an ack (api_pb2.Ack as MsgType.Ack), to be published to the message's ackInbox."""
    return encode_envelope(MsgType.Ack, ack.SerializeToString(), crc)


def decode_ack(data: Bytes) -> Optional[api_pb2.Ack]:
    """The api_pb2.Ack of an Ack envelope, or None if ``data`` is not one."""
    decoded = decode_envelope(data)
    if decoded is None or decoded[0] is not MsgType.Ack:
        return None
    try:
        return api_pb2.Ack.FromString(decoded[1])
    except DecodeError:
        return None


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int (protobuf encoding guide, "Varints")."""
    if n < 0x80:
        return _BYTE[n]
    if n < 0x4000:  # the offsets and lengths of most acks: two or three bytes, no loop
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if n < 0x200000:
        return bytes(((n & 0x7F) | 0x80, (n >> 7 & 0x7F) | 0x80, n >> 14))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_BYTE = [bytes((i,)) for i in range(128)]


class AckTemplate:
    """Serialized api_pb2.Ack of successful writes (ackError OK) to one partition with one ack
    policy and one reception time, built from bytes prepared once: ``ack(offset, ack_inbox,
    correlation_id, commit_ns)`` (inbox and correlation id as UTF-8 bytes, times in ns) returns
    ``prefix`` (b"" or ACK_HEADER) followed by the bytes ``api_pb2.Ack(...).SerializeToString()``
    gives for the same fields: fields in number order, proto3 defaults (0, "") left out
    (api.proto: Ack stream, partitionSubject, msgSubject = 1..3, offset = 4, ackInbox = 5,
    correlationId = 6, ackPolicy = 7, receptionTimestamp = 8, commitTimestamp = 9; ackError
    OK = 0 is not written). With ``prefix=ACK_HEADER`` that is ``encode_ack``'s envelope."""

    __slots__ = ("head", "policy", "reception_ns", "_commit_ns", "_tail", "_inbox", "_inbox_field")

    def __init__(self, stream: str, partition_subject: str, msg_subject: str, policy: int,
                 reception_ns: int, prefix: bytes = b"") -> None:
        self.head = prefix + api_pb2.Ack(stream=stream, partitionSubject=partition_subject,
                                         msgSubject=msg_subject).SerializeToString()
        self.policy = policy
        self.reception_ns = reception_ns
        self._commit_ns: int | None = None
        self._tail = b""
        self._inbox = b""  # the last ack inbox and its encoded field
        self._inbox_field = b""

    def ack(self, offset: int, ack_inbox: bytes, correlation_id: bytes, commit_ns: int) -> bytes:
        if commit_ns != self._commit_ns:
            self._commit_ns = commit_ns
            self._tail = api_pb2.Ack(ackPolicy=self.policy, receptionTimestamp=self.reception_ns,
                                     commitTimestamp=commit_ns).SerializeToString()
        if ack_inbox != self._inbox:
            self._inbox = ack_inbox
            self._inbox_field = b"\x2a" + varint(len(ack_inbox)) + ack_inbox if ack_inbox else b""
        return b"".join((
            self.head,
            b"\x20" + varint(offset) if offset else b"",
            self._inbox_field,
            b"\x32" + varint(len(correlation_id)) + correlation_id if correlation_id else b"",
            self._tail))


class ReplicationResponse(NamedTuple):
    """MsgType 3, a follower's fetch answer; not protobuf (reference/liftbridge.md: envelope
    header, u64 leader epoch, i64 high watermark, then raw log entries; big-endian, 8-byte
    header without CRC, per liftbridge's envelope.go WriteReplicationResponseHeader)."""

    leader_epoch: int
    high_watermark: int
    entries: bytes


def encode_replication_response(leader_epoch: int, high_watermark: int, entries: Bytes = b"") -> bytes:
    """Frame a ReplicationResponse: header, u64 leader epoch, i64 high watermark, entries.

    Raises ValueError when ``leader_epoch`` is not a u64 or ``high_watermark`` not an i64.
    """
    if not 0 <= leader_epoch <= _U64_MAX:
        raise ValueError(f"leader epoch {leader_epoch} is not a u64")
    if not _I64_MIN <= high_watermark <= _I64_MAX:
        raise ValueError(f"high watermark {high_watermark} is not an i64")
    return b"".join((_HEADER[MsgType.ReplicationResponse], _REPLICATION.pack(leader_epoch, high_watermark), entries))


def decode_replication_response(data: Bytes) -> Optional[ReplicationResponse]:
    """The ReplicationResponse in an envelope, or None (bad envelope, other type, < 16 bytes)."""
    fast = _replication_response_fast(data)
    if fast is not None:
        return fast
    decoded = decode_envelope(data)
    if decoded is None or decoded[0] is not MsgType.ReplicationResponse:
        return None
    return _parse_replication_response(decoded[1])


_REPLICATION_HEADER = _HEADER[MsgType.ReplicationResponse]
_REPLICATION_AT = HEADER_LEN + _REPLICATION.size  # where the entries start


def _replication_response_fast(data: Bytes) -> Optional[ReplicationResponse]:
    """A follower's fetch answer as Liftbridge frames it (8-byte header, no CRC) with one copy
    of its entries (decode_envelope then _parse_replication_response copy them twice: ~0.7 ms
    per MiB here); None for anything else, which the general path decides."""
    if (type(data) is bytes and len(data) >= _REPLICATION_AT
            and data.startswith(_REPLICATION_HEADER)):
        leader_epoch, high_watermark = _REPLICATION.unpack_from(data, HEADER_LEN)
        return ReplicationResponse(leader_epoch, high_watermark, data[_REPLICATION_AT:])
    return None


def _parse_replication_response(payload: bytes) -> Optional[ReplicationResponse]:
    if len(payload) < _REPLICATION.size:
        return None
    leader_epoch, high_watermark = _REPLICATION.unpack_from(payload)
    return ReplicationResponse(leader_epoch, high_watermark, payload[_REPLICATION.size :])



def decode_internal(data: Bytes, expected: MsgType) -> Union[_ProtoMessage, ReplicationResponse]:
    """Decode an envelope that must be of type ``expected``: an instance of
    ``MESSAGE_CLASSES[expected]``, or a ReplicationResponse for MsgType.ReplicationResponse.

    Raises EnvelopeError when the checks of decode_envelope fail, the MsgType is another one,
    the payload is not a valid protobuf of that class, or a ReplicationResponse payload is
    shorter than its 16 bytes of leader epoch and high watermark (liftbridge's envelope.go
    "not enough data").
    """
    if expected is MsgType.ReplicationResponse:
        fast = _replication_response_fast(data)
        if fast is not None:
            return fast
    decoded = decode_envelope(data)
    if decoded is None:
        raise EnvelopeError(_why_not_an_envelope(bytes(data)))
    msg_type, payload = decoded
    if msg_type is not expected:
        raise EnvelopeError(f"MsgType mismatch: expected {expected.name}, got {msg_type.name}")
    return _parse_payload(msg_type, payload)


def _parse_payload(msg_type: MsgType, payload: bytes) -> Union[_ProtoMessage, ReplicationResponse]:
    """The message an envelope of ``msg_type`` carries in ``payload``: an instance of
    ``MESSAGE_CLASSES[msg_type]``, or a ReplicationResponse. Raises EnvelopeError when the
    payload is not a valid protobuf of that class or a ReplicationResponse payload is
    shorter than its 16 bytes of leader epoch and high watermark."""
    cls = MESSAGE_CLASSES[msg_type]
    if cls is None:
        parsed = _parse_replication_response(payload)
        if parsed is None:
            raise EnvelopeError(f"ReplicationResponse payload of {len(payload)} bytes, "
                                f"needs at least {_REPLICATION.size}")
        return parsed
    try:
        return cls.FromString(payload)
    except DecodeError as exc:
        raise EnvelopeError(f"payload is not a valid {cls.__name__} protobuf: {exc}") from None


def _why_not_an_envelope(data: bytes) -> str:
    """The first check of decode_envelope that ``data`` fails (it fails one)."""
    if len(data) < HEADER_LEN:
        return f"{len(data)} bytes, shorter than the {HEADER_LEN}-byte header"
    if data[:4] != MAGIC:
        return f"magic number {data[:4].hex()}, expected {MAGIC.hex()}"
    version, header_len, flags, msg_type = data[4:8]
    if version != VERSION:
        return f"unknown envelope version {version}"
    if flags & ~FLAG_CRC32C:
        return f"unknown flag bits 0x{flags:02x}"
    want = HEADER_LEN_CRC if flags & FLAG_CRC32C else HEADER_LEN
    if header_len != want:
        return f"HeaderLen {header_len} with flags 0x{flags:02x}, expected {want}"
    if msg_type > max(MsgType):
        return f"unknown MsgType {msg_type}"
    if len(data) < HEADER_LEN_CRC:
        return f"{len(data)} bytes, shorter than the {HEADER_LEN_CRC}-byte header with CRC-32C"
    return "CRC-32C mismatch"


# The compiled twin (_envelope_c.pyx, riverlog/_compiled.py): decode_publish and AckTemplate
# bound over the Python ones above, which stay as the reference (_py_*) and the fallback.
_py_decode_publish = decode_publish
_PyAckTemplate = AckTemplate
def _bind_twin(compiled) -> None:
    """Hand the twin what it falls back on (also for tests that import it directly)."""
    compiled._bind(varint)


_c = twin(__name__, "_envelope_c")
PUBLISH_CLASSES: tuple[type, ...] = (api_pb2.Message,)
"""The classes decode_publish may return (api_pb2.Message, and the twin's PublishMessage)."""
if _c is not None:
    _bind_twin(_c)
    PUBLISH_CLASSES += (_c.PublishMessage,)
    decode_publish = _c.decode_publish  # noqa: F811
    AckTemplate = _c.AckTemplate  # type: ignore[misc] # noqa: F811
