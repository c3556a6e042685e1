# The wire format of riverlog's server-to-server forwarded publishes: the PublishAsync requests
# of one loop turn that a server sends on to the leader of their partitions as ONE NATS
# message, and the leader's ONE answer holding every request's PublishResponse. Rules: only
# riverlog's servers speak it, on `<namespace>.forward.<server id token>` (servers-only, like
# every `<namespace>.>` subject: riverlog.security.nats_auth); a batch is the MAGIC bytes, then
# each item (a PublishRequest or PublishResponse, as serialized by protobuf) prefixed with its
# length as a protobuf varint; an answer is ANSWER_MAGIC and the items, or FAILED_MAGIC and a
# UTF-8 reason (the whole batch failed: every request gets that error). Decoding never trusts
# the bytes: anything malformed raises ForwardError. No pickle, no own schema beyond framing.
from __future__ import annotations

from ..cluster.replication_subjects import subject_token
from .liftbridge.envelope import varint

MAGIC = b"RLFB"  # a batch of PublishRequests
ANSWER_MAGIC = b"RLFA"  # its answer: PublishResponses
FAILED_MAGIC = b"RLFX"  # its answer: the whole batch failed, with a reason
MAX_ITEMS_DIVISOR = 512
"""A batch holds at most ``max_payload // MAX_ITEMS_DIVISOR`` requests and half of max_payload
in bytes, so its answer (a response is at most its request's correlation id plus ~100 bytes)
fits in one NATS message too."""


class ForwardError(ValueError):
    """Bytes that are no forwarded batch or answer."""


def forward_subject(namespace: str, server_id: str) -> str:
    """``<namespace>.forward.<server id token>``: where server ``server_id`` takes the batches
    other servers forward to the partitions it leads."""
    return f"{namespace}.forward.{subject_token(server_id)}"


def encode_items(magic: bytes, items: list[bytes]) -> bytes:
    """``magic`` then every item length-prefixed (a protobuf varint)."""
    parts = [magic]
    for item in items:
        parts += (varint(len(item)), item)
    return b"".join(parts)


def framed_size(item: bytes) -> int:
    """The bytes ``item`` takes in an encoded batch."""
    return len(varint(len(item))) + len(item)


def encode_failed(reason: str) -> bytes:
    return FAILED_MAGIC + reason.encode()


def decode_items(data: bytes, magic: bytes, limit: int) -> list[bytes]:
    """The items of a batch or answer starting with ``magic``, at most ``limit`` of them.
    Raises ForwardError for anything else (wrong magic, a truncated or overlong length, more
    items than ``limit``)."""
    if data[:4] != magic:
        raise ForwardError("not a forwarded batch")
    items = []
    view = memoryview(data)
    pos, end = 4, len(data)
    while pos < end:
        size = shift = 0
        while True:
            if pos >= end or shift > 28:
                raise ForwardError("truncated item length")
            byte = data[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        if pos + size > end:
            raise ForwardError("item runs past the end")
        if len(items) >= limit:
            raise ForwardError(f"more than {limit} items")
        items.append(bytes(view[pos:pos + size]))
        pos += size
    return items


def decode_failed(data: bytes) -> str | None:
    """The reason of a whole-batch failure answer; None when ``data`` is not one."""
    if data[:4] != FAILED_MAGIC:
        return None
    return data[4:].decode(errors="replace")
