# Tracking state of one partition: publisher sequences (deduplication) and stored consumer
# offsets, both carried by the log itself so they replicate with the data (osiris does so).
# Rules: the highest publishing id of every named publisher with entries in a chunk travels
# in that chunk's trailer; a stored consumer offset is a tracking delta chunk (chunk type 1,
# one simple entry of osiris tracking records, one offset of the log, never delivered to a
# consumer); at every segment roll a snapshot of all sequences and offsets is written next to
# the new segment, so opening only scans the newest segment. A reference never seen has no
# sequence (not 0): its publishing id 0 is new, as in osiris. The ``offsets.json`` of
# earlier versions is read once as the offsets before anything the log carries (upgrade).
# Wire facts: osiris_log.erl (chunk types, "Tracking format") and osiris_tracking.erl
# (record 1 = offset: type u8 | id size u8 | id | offset u64), rabbitmq/osiris 1.10.3.
from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from typing import Iterable, Mapping

from ..errors import LogError
from ..log import CommitLog
from ..log.chunk import (CHUNK_TRACKING_DELTA, CHUNK_USER, HEADER_SIZE, ChunkHeader,
                         iter_entries, parse_header)
from ..log.segment import segment_name

log = logging.getLogger("riverlog.broker")
_CRC = struct.Struct(">I")
WRITER_TAG = b"W"
SNAPSHOT_SUFFIX = ".writers"
OFFSETS_SNAPSHOT_SUFFIX = ".offsets"
OFFSETS_FILE = "offsets.json"
TRACKING_OFFSET = 1
"""osiris_tracking's record type of a stored consumer offset."""
_U64 = struct.Struct(">Q")


def encode_writer_trailer(writers: Iterable[tuple[str, int]]) -> bytes:
    """Trailer bytes recording that each publisher ``reference`` reached ``sequence``, one
    record per ``(reference, sequence)``: ``'W' | len u8 | reference (UTF-8) | sequence u64 |
    CRC-32 u32`` of what precedes it in the record. Raises ``ValueError`` for a reference
    longer than 255 bytes."""
    out = []
    for reference, sequence in writers:
        ref = reference.encode()
        if len(ref) > 255:
            raise ValueError("a publisher reference is at most 255 bytes")
        body = WRITER_TAG + bytes((len(ref),)) + ref + sequence.to_bytes(8, "big")
        out.append(body + _CRC.pack(zlib.crc32(body)))
    return b"".join(out)


def decode_writer_trailer(trailer: bytes | memoryview) -> list[tuple[str, int]] | None:
    """The ``(reference, sequence)`` records of a trailer, in order; None when it is not a
    sequence of valid records (damaged, or not written by ``encode_writer_trailer``)."""
    out = []
    pos, size = 0, len(trailer)
    while pos < size:
        if size - pos < 14 or trailer[pos] != WRITER_TAG[0]:
            return None
        end = pos + 2 + trailer[pos + 1] + 8
        if end + 4 > size or _CRC.unpack_from(trailer, end)[0] != zlib.crc32(trailer[pos:end]):
            return None
        try:
            ref = bytes(trailer[pos + 2:end - 8]).decode()
        except UnicodeDecodeError:
            return None
        out.append((ref, int.from_bytes(trailer[end - 8:end], "big")))
        pos = end + 4
    return out or None


def encode_offset_tracking(offsets: Iterable[tuple[str, int]]) -> bytes:
    """The body of a tracking delta chunk's one entry storing each ``(reference, offset)``:
    osiris tracking records ``1 | id size u8 | reference (UTF-8) | offset u64``. Raises
    ``ValueError`` for a reference longer than 255 bytes or a negative offset."""
    out = []
    for reference, offset in offsets:
        ref = reference.encode()
        if len(ref) > 255:
            raise ValueError("a consumer reference is at most 255 bytes")
        if offset < 0:
            raise ValueError(f"a stored offset is not negative: {offset}")
        out.append(bytes((TRACKING_OFFSET, len(ref))) + ref + _U64.pack(offset))
    return b"".join(out)


def decode_offset_tracking(body: bytes | memoryview) -> list[tuple[str, int]] | None:
    """The ``(reference, offset)`` records of a tracking entry body, in order (records of
    other tracking types are skipped); None when it is not a sequence of osiris tracking
    records (sequence records carry 8 bytes, offset and timestamp records 8)."""
    out = []
    pos, size = 0, len(body)
    while pos < size:
        if size - pos < 2 or body[pos] > 2:
            return None
        end = pos + 2 + body[pos + 1]
        if end + 8 > size:
            return None
        if body[pos] == TRACKING_OFFSET:
            try:
                ref = bytes(body[pos + 2:end]).decode()
            except UnicodeDecodeError:
                return None
            out.append((ref, _U64.unpack_from(body, end)[0]))
        pos = end + 8
    return out


class PublisherSequences:
    """Highest publishing id per publisher reference, for deduplication; it also reads the
    stored consumer offsets the log carries into ``offsets`` (one scan, one snapshot).

    RabbitMQ semantics (reference/rabbitmq-stream-protocol.md, "Deduplication"; osiris_writer
    ``is_duplicate``): with a named publisher, a publishing id at or below the highest stored
    one is dropped and confirmed; a reference with none stored takes any id, 0 included.
    """

    def __init__(self, log: CommitLog, offsets: "ConsumerOffsets | None" = None) -> None:
        self._log = log
        self._offsets = offsets if offsets is not None else ConsumerOffsets(log.directory)
        self._seqs: dict[str, int] = {}
        self._appending: memoryview | None = None  # a follower's chunks being appended
        self._appending_pos = 0
        self._load()
        log.on_roll = self._snapshot

    def get(self, reference: str) -> int | None:
        """Highest publishing id stored for ``reference``; None when it never stored one
        (QueryPublisherSequence answers 0 then, as RabbitMQ)."""
        return self._seqs.get(reference)

    def record(self, writers: Mapping[str, int]) -> None:
        """Note each publisher's new highest publishing id (``writers``: reference -> id),
        once the chunk whose trailer holds them (``encode_writer_trailer``) is written."""
        for reference, sequence in writers.items():
            self._raise(reference, sequence)

    def _raise(self, reference: str, sequence: int) -> None:
        if sequence > self._seqs.get(reference, -1):
            self._seqs[reference] = sequence

    def _snapshot_path(self, base_offset: int, suffix: str = SNAPSHOT_SUFFIX) -> str:
        return os.path.join(self._log.directory, segment_name(base_offset) + suffix)

    def _snapshot(self, base_offset: int) -> None:
        self._note_appending(base_offset)
        _write_json(self._snapshot_path(base_offset), self._seqs)
        _write_json(self._snapshot_path(base_offset, OFFSETS_SNAPSHOT_SUFFIX),
                    dict(self._offsets.items()))

    def _load(self) -> None:
        segments = self._log.segments
        start = 0
        for i in range(len(segments) - 1, -1, -1):
            seqs = _read_json(self._snapshot_path(segments[i].base_offset))
            if seqs is not None:
                self._seqs = seqs
                offsets = _read_json(self._snapshot_path(segments[i].base_offset,
                                                         OFFSETS_SNAPSHOT_SUFFIX))
                self._offsets.restart(offsets or {})  # None: written before offsets were
                start = i
                break
        else:
            self._offsets.restart({})
        if start >= len(segments):
            return
        offset = max(segments[start].first_offset, self._log.first_offset)
        while True:
            try:
                chunks = self._log.read_chunks(offset, 4 * 1024 * 1024, committed_only=False)
            except LogError as exc:  # damaged old data: keep what was read, say so
                log.error("publisher sequences of %s: %s", self._log.directory, exc)
                return
            if not chunks:
                return
            for chunk in chunks:
                self._note(chunk.header, chunk.raw)
            offset = chunks[-1].header.next_offset

    def _note(self, h: ChunkHeader, raw: bytes | memoryview) -> None:
        """Take in what chunk ``raw`` (header ``h``) tracks: the sequences of a user chunk's
        writer trailer, the consumer offsets of a tracking delta chunk."""
        if h.chunk_type == CHUNK_TRACKING_DELTA:
            data = memoryview(raw)[HEADER_SIZE:HEADER_SIZE + h.data_length]
            try:
                bodies = [entry.payload for entry in iter_entries(data)]
            except ValueError:
                bodies = [b""]
            for body in bodies:
                found = decode_offset_tracking(body)
                if found is None:
                    log.error("%s: the tracking chunk at offset %d is not osiris tracking "
                              "records (skipped)", self._log.directory, h.first_offset)
                for reference, offset in found or ():
                    self._offsets.apply(reference, offset)
        elif h.chunk_type == CHUNK_USER and h.trailer_length > h.bloom_size:
            found = decode_writer_trailer(raw[HEADER_SIZE + h.data_length + h.bloom_size:])
            for reference, sequence in found or ():
                self._raise(reference, sequence)

    def appending(self, raw: bytes | memoryview | None) -> None:
        """Whole chunks a follower is about to append as its leader sent them
        (``CommitLog.append_chunks``, which checks them; None: the append failed): a segment
        roll among them first notes the chunks before it, so the roll's snapshot holds
        exactly what precedes the new segment."""
        self._appending, self._appending_pos = (None if raw is None else memoryview(raw)), 0

    def appended(self) -> None:
        """The chunks given to ``appending`` are in the log: note the sequences and stored
        offsets they carry (those a roll has not), so deduplication holds and QueryOffset
        answers the same when this replica leads."""
        self._note_appending(None)
        self._appending = None

    def _note_appending(self, upto: int | None) -> None:
        """Note the chunks being appended, from the first not noted yet to the one starting
        at offset ``upto`` (None: to the end)."""
        view, pos = self._appending, self._appending_pos
        while view is not None and pos < len(view):
            h = parse_header(view, pos)
            if upto is not None and h.first_offset >= upto:
                break
            self._note(h, view[pos:pos + h.size])
            pos += h.size
        self._appending_pos = pos

    def reload(self) -> None:
        """Read the sequences and offsets again from the log (after a truncation removed
        chunks)."""
        self._seqs = {}
        self._load()


def _write_json(path: str, data: dict) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file, fsynced, renamed)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_json(path: str) -> dict[str, int] | None:
    """The ``{str: int}`` map of a snapshot file; None when missing or unreadable."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return {str(k): v for k, v in data.items() if isinstance(v, int)}


class ConsumerOffsets:
    """Offsets stored by consumers (RabbitMQ StoreOffset/QueryOffset), by reference: what
    the log's tracking chunks say (``PublisherSequences`` reads them in), over the
    ``offsets.json`` an earlier version saved in ``directory`` (read once, never written)."""

    def __init__(self, directory: str) -> None:
        self._legacy = _read_json(os.path.join(directory, OFFSETS_FILE)) or {}
        self._offsets: dict[str, int] = dict(self._legacy)

    def restart(self, snapshot: Mapping[str, int]) -> None:
        """Start again from ``snapshot`` (a segment's offsets snapshot, or {}) over the
        legacy file's offsets, before the log's tracking chunks after it are applied."""
        self._offsets = {**self._legacy, **snapshot}

    def apply(self, reference: str, offset: int) -> None:
        """``reference`` stored ``offset`` (a tracking record of the log)."""
        self._offsets[reference] = offset

    def query(self, reference: str) -> int | None:
        """The stored offset, or None when ``reference`` never stored one."""
        return self._offsets.get(reference)

    def items(self) -> list[tuple[str, int]]:
        """Every (reference, stored offset), a copy."""
        return list(self._offsets.items())
