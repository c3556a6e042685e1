# Tracking state of one partition: publisher sequences (deduplication) and stored consumer
# offsets. Rules: the highest publishing id of every named publisher with entries in a chunk
# travels in that chunk's trailer, so it is exactly as durable as the data; at every segment
# roll a snapshot of all publisher sequences is written next to the new segment, so opening
# only scans the newest segment's trailers. A reference never seen has no sequence (not 0):
# its publishing id 0 is new, as in osiris. Consumer offsets are kept in memory and saved to
# one file (atomically) at most every second and on close.
from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from typing import Iterable, Mapping

from ..errors import LogError
from ..log import CommitLog
from ..log.chunk import HEADER_SIZE, ChunkHeader, parse_header
from ..log.segment import segment_name

log = logging.getLogger("riverlog.broker")
_CRC = struct.Struct(">I")
WRITER_TAG = b"W"
SNAPSHOT_SUFFIX = ".writers"
OFFSETS_FILE = "offsets.json"


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


class PublisherSequences:
    """Highest publishing id per publisher reference, for deduplication.

    RabbitMQ semantics (reference/rabbitmq-stream-protocol.md, "Deduplication"; osiris_writer
    ``is_duplicate``): with a named publisher, a publishing id at or below the highest stored
    one is dropped and confirmed; a reference with none stored takes any id, 0 included.
    """

    def __init__(self, log: CommitLog) -> None:
        self._log = log
        self._seqs: dict[str, int] = {}
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

    def _snapshot_path(self, base_offset: int) -> str:
        return os.path.join(self._log.directory, segment_name(base_offset) + SNAPSHOT_SUFFIX)

    def _snapshot(self, base_offset: int) -> None:
        path = self._snapshot_path(base_offset)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self._seqs, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _load(self) -> None:
        segments = self._log.segments
        start = 0
        for i in range(len(segments) - 1, -1, -1):
            try:
                with open(self._snapshot_path(segments[i].base_offset)) as f:
                    seqs = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(seqs, dict):
                self._seqs = {str(k): int(v) for k, v in seqs.items() if isinstance(v, int)}
                start = i
                break
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
        """Raise the sequences the writer trailer of chunk ``raw`` (header ``h``) records."""
        if h.trailer_length > h.bloom_size:
            found = decode_writer_trailer(raw[HEADER_SIZE + h.data_length + h.bloom_size:])
            for reference, sequence in found or ():
                self._raise(reference, sequence)

    def replicated(self, raw: bytes | memoryview) -> None:
        """Note the sequences of whole chunks a follower appended as its leader sent them
        (``CommitLog.append_chunks``, which checked them), so deduplication holds when this
        replica leads."""
        view, pos = memoryview(raw), 0
        while pos < len(view):
            h = parse_header(view, pos)
            self._note(h, view[pos:pos + h.size])
            pos += h.size

    def reload(self) -> None:
        """Read the sequences again from the log (after a truncation removed chunks)."""
        self._seqs = {}
        self._load()


class ConsumerOffsets:
    """Offsets stored by consumers (RabbitMQ StoreOffset/QueryOffset), by reference."""

    def __init__(self, directory: str) -> None:
        self._path = os.path.join(directory, OFFSETS_FILE)
        self._offsets: dict[str, int] = {}
        self._dirty = False
        try:
            with open(self._path) as f:
                data = json.load(f)
            if isinstance(data, dict):
                self._offsets = {str(k): int(v) for k, v in data.items() if isinstance(v, int)}
        except (OSError, ValueError):
            pass

    def store(self, reference: str, offset: int) -> None:
        self._offsets[reference] = offset
        self._dirty = True

    def query(self, reference: str) -> int | None:
        """The stored offset, or None when ``reference`` never stored one."""
        return self._offsets.get(reference)

    def items(self) -> list[tuple[str, int]]:
        """Every (reference, stored offset), a copy."""
        return list(self._offsets.items())

    def save(self) -> None:
        """Write the offsets to disk (atomically) if they changed since the last save."""
        if not self._dirty:
            return
        tmp = self._path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self._offsets, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
        self._dirty = False
