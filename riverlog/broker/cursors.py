# Liftbridge cursors: a consumer's position per (cursor id, stream, partition), stored in the
# compacted internal stream ``__cursors`` as Liftbridge stores them, and cached in memory.
# Rules: a cursor is stored once its record is committed (Liftbridge's ack policy ALL); the
# record's key is ``<cursorId>,<stream>,<partition>`` and its value Liftbridge's ``Cursor``
# protobuf {1 stream, 2 partition, 3 cursorId, 4 offset}; the cursor partition is the
# key's CRC-32 (IEEE) modulo the partition count; on open every record of ``__cursors`` is
# read back, the newest per key wins. A cursor never set reads as -1. Bounds: a stream has at
# most ``max_per_stream`` cursors, and the streams no server has (Liftbridge takes cursors
# for any name) share one such allowance (a new one past that: CursorLimitError; ids are at most 255
# bytes, checked by the door), and ``__cursors`` is compacted in CURSORS_SEGMENT_BYTES
# segments, so what a restart reads back stays near one record per cursor.
# Wire facts: reference/liftbridge.md ("FetchCursor returns -1 ...; key <cursorId>,<stream>,
# <partition>, compacted"); the value layout and partition choice from liftbridge's
# server/cursors.go and server/protocol/internal.proto (liftbridge-io/liftbridge 50ac358).
# In a cluster (as Liftbridge's cursorManager): ``__cursors`` is a replicated stream of the
# metadata, created once every Raft member is registered, with cursors.stream.replication.factor
# replicas (-1, Liftbridge's default: every server); only a cursor partition's
# leader sets and fetches its cursors (others: FailedPrecondition "Server not leader for
# cursors partition N", clients ask the leader), and a server that becomes a cursor
# partition's leader reads that partition's cursors again from its log (Liftbridge purges
# its cache then), which holds every cursor its leader committed.
from __future__ import annotations

import asyncio
import logging
import time
import zlib

from ..errors import LogError, OffsetOutOfRangeError
from ..log.chunk import CHUNK_USER, log_unreadable
from ..record import Record, decode_record, encode_record
from .appender import Appenders
from .broker import CURSORS_STREAM, Broker
from .partition import Partition
from .stream import Stream, StreamConfig

log = logging.getLogger("riverlog.broker")
CURSORS_SEGMENT_BYTES = 16 * 1024 * 1024
"""Segment size of ``__cursors``: compaction rewrites closed segments only."""

def cursor_key(cursor_id: str, stream: str, partition: int) -> bytes:
    """The record key of a cursor: ``b"<cursorId>,<stream>,<partition>"``."""
    return f"{cursor_id},{stream},{partition}".encode()


def _stream_of(key: bytes) -> str:
    """The stream of a cursor key (the part after the cursor id's last comma)."""
    return key.decode(errors="replace").rsplit(",", 2)[-2] if key.count(b",") >= 2 else ""


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int32/int64 are 10-byte two's complement varints
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_cursor(stream: str, partition: int, cursor_id: str, offset: int) -> bytes:
    """Liftbridge's ``Cursor`` message in protobuf wire format (proto3: zero fields left out)."""
    out = bytearray()
    raw = stream.encode()
    if raw:
        out += b"\x0a" + _varint(len(raw)) + raw
    if partition:
        out += b"\x10" + _varint(partition)
    raw = cursor_id.encode()
    if raw:
        out += b"\x1a" + _varint(len(raw)) + raw
    if offset:
        out += b"\x20" + _varint(offset)
    return bytes(out)


def decode_cursor_offset(data: bytes) -> int | None:
    """The offset (field 4) of a ``Cursor`` protobuf, 0 when absent; None if malformed."""
    pos, end, offset = 0, len(data), 0
    try:
        while pos < end:
            tag, pos = read_varint(data, pos)
            number, kind = tag >> 3, tag & 7
            if kind == 0:
                value, pos = read_varint(data, pos)
                if number == 4:
                    offset = value - (1 << 64) if value >= 1 << 63 else value
            elif kind == 2:
                size, pos = read_varint(data, pos)
                pos += size
            elif kind == 1:
                pos += 8
            elif kind == 5:
                pos += 4
            else:
                return None
        return offset if pos == end else None
    except IndexError:
        return None


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """A protobuf varint at ``pos``: (value, position after it). Raises IndexError when it
    runs past the end or over 64 bits."""
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


class CursorsDisabledError(LogError):
    """Cursors are off (``cursors.stream.partitions`` is 0)."""


class NotCursorLeaderError(LogError):
    """In a cluster: this server does not lead the cursor partition that holds the cursor
    (Liftbridge answers FailedPrecondition; the client asks the leader)."""


class CursorLimitError(LogError):
    """A stream (or the streams that do not exist, together) has ``max_per_stream``
    cursors already (gRPC: RESOURCE_EXHAUSTED)."""


class _CommitWaiter:
    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future = asyncio.get_running_loop().create_future()

    def written(self, offset: int) -> None:
        pass

    def committed(self, offset: int) -> None:
        if not self.future.done():
            self.future.set_result(offset)

    def failed(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


class Cursors:
    """The cursor store over ``__cursors``. ``open()`` after the broker is open."""

    def __init__(self, broker: Broker, appenders: Appenders, partitions: int,
                 subject: str, replication_factor: int = -1,
                 max_per_stream: int = 10_000) -> None:
        self.broker = broker
        self.appenders = appenders
        self.partitions = partitions
        self.replication_factor = replication_factor  # in a cluster; -1: every server
        self.subject = subject
        self.max_per_stream = max_per_stream
        self._cache: dict[bytes, int] = {}
        self._counts: dict[str, int] = {}  # stream -> its cursors, stored or being stored

    @property
    def enabled(self) -> bool:
        return self.partitions > 0

    def stream_config(self) -> StreamConfig:
        """The settings of ``__cursors``: compacted, ``partitions`` partitions; in a cluster
        ``replication_factor`` replicas each (cursors.stream.replication.factor; -1, the
        default as Liftbridge's: every server)."""
        return StreamConfig(subject=self.subject, partitions=self.partitions, compact=True,
                            replication_factor=self.replication_factor,
                            segment_max_bytes=CURSORS_SEGMENT_BYTES)

    def open(self) -> Stream | None:
        """Create ``__cursors`` if cursors are on and it does not exist, then load every
        stored cursor. Returns the stream (None when cursors are off, or in a cluster, where
        the metadata makes it). A cluster member drops a ``__cursors`` it holds from a life
        alone: the cluster's replicated one replaces it."""
        if not self.enabled:
            return None
        stream = self.broker.streams.get(CURSORS_STREAM)
        placement = self.broker.placement
        if placement.clustered:
            placement.add_leader_listener(self._leader_changed)
            if stream is not None and not stream.config.replicated:
                log.warning("%s of this server alone (%d cursor partition(s)) dropped: the "
                            "cluster's replicated one replaces it", CURSORS_STREAM,
                            len(stream.partitions))
                self.broker.delete(CURSORS_STREAM)
            return None
        if stream is None:
            stream = self.broker.create(CURSORS_STREAM, self.stream_config(), internal=True)
        for partition in stream.partitions:
            self._load(partition)
        log.info("loaded %d cursor(s)", len(self._cache))
        return stream

    def _leader_changed(self, stream: str, index: int) -> None:
        """This server took over cursor partition ``index``: read its cursors from its log
        again (what this cache holds of it may be older than what other leaders set)."""
        local = self.broker.streams.get(CURSORS_STREAM)
        if stream != CURSORS_STREAM or local is None or index >= len(local.partitions) or \
                not self.broker.placement.leads(stream, index):
            return
        for key in [k for k in self._cache if zlib.crc32(k) % len(local.partitions) == index]:
            del self._cache[key]
            self._count(key, -1)
        self._load(local.partitions[index], committed_only=False)
        log.info("leading cursor partition %d: its cursors read from its log", index)

    def _load(self, partition: Partition, committed_only: bool = True) -> None:
        """Take every cursor record of ``partition`` into the cache, the newest per key
        wins. ``committed_only`` False: also what a new leader holds beyond its high
        watermark (all of it is committed once its followers caught up with it)."""
        unreadable = log_unreadable(log, CURSORS_STREAM)
        offset = partition.first_offset
        while True:
            try:
                chunks = partition.log.read_chunks(offset, 1024 * 1024,
                                                   committed_only=committed_only)
            except OffsetOutOfRangeError:
                offset = partition.first_offset
                continue
            except LogError as exc:
                log.error("reading %s: %s (cursors after it are not loaded)", partition, exc)
                break
            if not chunks:
                break
            for chunk in chunks:
                offset = chunk.header.next_offset
                if chunk.header.chunk_type != CHUNK_USER:
                    continue
                try:
                    records = list(chunk.records(unreadable))
                except ValueError as exc:
                    log.error("cursor chunk at %d unreadable: %s", chunk.header.first_offset,
                              exc)
                    continue
                for _, raw in records:
                    record = decode_record(raw)
                    value = decode_cursor_offset(record.value)
                    if record.key is not None and value is not None:
                        if record.key not in self._cache:
                            self._count(record.key, 1)
                        self._cache[record.key] = value

    def _stream(self) -> Stream:
        if not self.enabled:
            raise CursorsDisabledError("cursors are disabled (cursors.stream.partitions is 0)")
        stream = self.broker.streams.get(CURSORS_STREAM)
        if stream is None:
            raise CursorsDisabledError("the cursors stream does not exist")
        return stream

    def partition_of(self, key: bytes) -> int:
        """The ``__cursors`` partition that holds ``key`` (CRC-32 IEEE of the key, modulo)."""
        return zlib.crc32(key) % len(self._stream().partitions)

    def _bucket(self, key: bytes) -> str:
        """Whose allowance a cursor counts in: its stream's, or "" for the streams that
        exist nowhere (so names that are no stream cannot multiply the allowance)."""
        stream = _stream_of(key)
        if stream in self.broker.streams or stream in (self.broker.placement.streams() or ()):
            return stream
        return ""

    def _count(self, key: bytes, change: int) -> None:
        bucket = self._bucket(key)
        count = self._counts.get(bucket, 0) + change
        if count > 0:
            self._counts[bucket] = count
        else:
            self._counts.pop(bucket, None)

    def items(self) -> list[tuple[str, str, int, int]]:
        """Every stored cursor as (cursor id, stream, partition, offset), a copy. The key
        does not say where a comma belongs; the stream is taken as the part after the
        cursor id's last comma."""
        out = []
        for key, offset in list(self._cache.items()):
            cursor_id, stream, partition = (key.decode(errors="replace").rsplit(",", 2)
                                            + ["", ""])[:3]
            if partition.isdigit():
                out.append((cursor_id, stream, int(partition), offset))
        return out

    def _led(self, key: bytes) -> tuple[int, Partition]:
        """The index and partition of ``__cursors`` holding ``key``, which this server must
        lead. Raises ``CursorsDisabledError``, ``NotCursorLeaderError``."""
        cursors = self._stream()
        index = zlib.crc32(key) % len(cursors.partitions)
        if not self.broker.placement.leads(CURSORS_STREAM, index):
            raise NotCursorLeaderError(f"Server not leader for cursors partition {index}")
        return index, cursors.partitions[index]

    def get(self, cursor_id: str, stream: str, partition: int) -> int:
        """The stored offset, or -1 when never set. Raises ``CursorsDisabledError``,
        ``NotCursorLeaderError``."""
        key = cursor_key(cursor_id, stream, partition)
        self._led(key)
        return self._cache.get(key, -1)

    async def set(self, cursor_id: str, stream: str, partition: int, offset: int) -> None:
        """Store ``offset`` and return once the record is committed. Raises
        ``CursorsDisabledError``, ``NotCursorLeaderError``, ``CursorLimitError`` (a new
        cursor past ``max_per_stream``), ``LogClosedError`` or ``OSError``."""
        key = cursor_key(cursor_id, stream, partition)
        index, part = self._led(key)
        subject = self.subject if index == 0 else f"{self.subject}.{index}"
        new = key not in self._cache
        if new:
            bucket = self._bucket(key)
            if self._counts.get(bucket, 0) >= self.max_per_stream:
                whose = f"stream {stream[:64]!r}" if bucket else "streams that do not exist"
                raise CursorLimitError(f"{whose} {'has' if bucket else 'have'} "
                                       f"{self.max_per_stream} cursors, the "
                                       f"most allowed (riverlog.cursors.max.per.stream)")
            self._count(key, 1)  # held while it is stored, so concurrent sets count it
            self._cache[key] = -1
        record = encode_record(Record(
            value=encode_cursor(stream, partition, cursor_id, offset), key=key,
            headers={"subject": subject.encode(), "reply": b""}, timestamp_ns=time.time_ns(),
            subject=subject))
        waiter = _CommitWaiter()
        try:
            self.appenders.get(part).append(record, waiter)
            await waiter.future
        except BaseException:
            if new and self._cache.get(key) == -1:
                del self._cache[key]
                self._count(key, -1)
            raise
        self._cache[key] = offset
