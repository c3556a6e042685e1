# Tracking state of one partition: publisher sequences (deduplication) and stored consumer
# offsets, both carried by the log itself so they replicate with the data (osiris does so).
# Rules: the highest publishing id of every named publisher with entries in a chunk travels
# in that chunk's trailer as an osiris sequence record (trailers of the old layout, 'W'
# records with a CRC each, are still read); a stored consumer offset is a tracking delta
# chunk (chunk type 1, one simple entry of osiris tracking records, one offset of the log,
# never delivered to a consumer); at every segment roll a snapshot of all sequences and
# offsets is written next to the new segment, so opening only scans the newest segment; at a
# clean close one as of the log's end is written, which the next open takes instead of that
# scan when the log's clean-close marker holds (log/clean_close.py) and it ends where it
# did. A reference never seen has no sequence (not 0): its publishing id 0 is new, as in
# osiris. The ``offsets.json`` of
# earlier versions is read once as the offsets before anything the log carries (upgrade).
# Wire facts: osiris_log.erl (chunk types, "Tracking format") and osiris_tracking.erl
# (records: type u8 | id size u8 | id | u64; 0 = sequence, 1 = offset), rabbitmq/osiris 1.10.3.
from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from typing import Iterable, Mapping

from ..errors import LogError
from ..log import CommitLog
from ..log.chunk import (CHUNK_TRACKING_DELTA, CHUNK_USER, HEADER_SIZE, LEGACY_WRITER_TAG,
                         ChunkHeader, chunk_extent, iter_entries, parse_header, trailer_of)
from ..log.segment import segment_name

log = logging.getLogger("riverlog.broker")
_CRC = struct.Struct(">I")
SNAPSHOT_SUFFIX = ".writers"
OFFSETS_SNAPSHOT_SUFFIX = ".offsets"
OFFSETS_FILE = "offsets.json"
CLOSE_SNAPSHOT = "tracking-at-close"
"""The sequences and stored offsets as of a clean close (``save_at_close``)."""
TRACKING_SEQUENCE, TRACKING_OFFSET, TRACKING_TIMESTAMP = 0, 1, 2
"""osiris_tracking's record types: a publisher's sequence, a stored consumer offset, a
timestamp."""
_U64 = struct.Struct(">Q")


def _encode_tracking(kind: int, items: Iterable[tuple[str, int]], what: str) -> bytes:
    """osiris tracking records ``kind u8 | id size u8 | id (UTF-8) | value u64`` (the layout
    of osiris_tracking:flush). Raises ``ValueError`` for an id over 255 bytes or a negative
    value."""
    out = []
    for reference, value in items:
        ref = reference.encode()
        if len(ref) > 255:
            raise ValueError(f"a {what} reference is at most 255 bytes")
        if value < 0:
            raise ValueError(f"a tracked {what} value is not negative: {value}")
        out.append(bytes((kind, len(ref))) + ref + _U64.pack(value))
    return b"".join(out)


def _decode_tracking(body: bytes | memoryview) -> list[tuple[int, str, int]] | None:
    """The ``(kind, reference, value)`` of a run of osiris tracking records, in order;
    None when the bytes are not exactly such a run (a kind above 2, a size past the end, an
    id that is not UTF-8)."""
    out = []
    pos, size = 0, len(body)
    while pos < size:
        if size - pos < 2 or body[pos] > TRACKING_TIMESTAMP:
            return None
        end = pos + 2 + body[pos + 1]
        if end + 8 > size:
            return None
        try:
            ref = bytes(body[pos + 2:end]).decode()
        except UnicodeDecodeError:
            return None
        out.append((body[pos], ref, _U64.unpack_from(body, end)[0]))
        pos = end + 8
    return out


def encode_writer_trailer(writers: Iterable[tuple[str, int]]) -> bytes:
    """A chunk's trailer recording that each publisher ``reference`` reached ``sequence``:
    one osiris sequence record ``0 | id size u8 | reference (UTF-8) | sequence u64`` per
    ``(reference, sequence)``, as osiris_writer writes them (osiris_tracking:flush); the
    chunk's trailer check (``log/chunk.py``) covers them. Raises ``ValueError`` for a
    reference longer than 255 bytes."""
    return _encode_tracking(TRACKING_SEQUENCE, writers, "publisher")


def decode_writer_trailer(trailer: bytes | memoryview) -> list[tuple[str, int]] | None:
    """The ``(reference, sequence)`` sequence records of a trailer, in order (offset and
    timestamp records, which osiris may put there too, are skipped); None when it holds
    none or is not a run of osiris tracking records."""
    found = _decode_tracking(trailer)
    if found is None:
        return None
    return [(ref, value) for kind, ref, value in found if kind == TRACKING_SEQUENCE] or None


def decode_legacy_writer_trailer(trailer: bytes | memoryview) -> list[tuple[str, int]] | None:
    """The ``(reference, sequence)`` records of a trailer in the old layout, in order:
    ``'W' | len u8 | reference (UTF-8) | sequence u64 | CRC-32 u32`` of what precedes it in
    the record (docs/commit-log.md, "The old trailer layout"); None when it is not a run of
    valid records (damaged)."""
    out = []
    pos, size = 0, len(trailer)
    while pos < size:
        if size - pos < 14 or trailer[pos] != LEGACY_WRITER_TAG:
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
    return _encode_tracking(TRACKING_OFFSET, offsets, "consumer")


def decode_offset_tracking(body: bytes | memoryview) -> list[tuple[str, int]] | None:
    """The ``(reference, offset)`` records of a tracking entry body, in order (records of
    other tracking types are skipped); None when it is not a sequence of osiris tracking
    records (in a delta, sequence, offset and timestamp records all carry 8 bytes)."""
    found = _decode_tracking(body)
    return None if found is None else [(ref, value) for kind, ref, value in found
                                       if kind == TRACKING_OFFSET]


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

    def save_at_close(self) -> None:
        """Just before the log's clean close: keep the sequences and stored offsets as of
        its end (``CLOSE_SNAPSHOT``, no fsync), so the next open, when the log's clean-close
        marker holds and it ends at the same offset, takes them instead of scanning the
        newest segment. An ``OSError`` is logged (the next open scans)."""
        body = {"next_offset": self._log.next_offset, "sequences": self._seqs,
                "offsets": dict(self._offsets.items())}
        path = os.path.join(self._log.directory, CLOSE_SNAPSHOT)
        try:
            with open(path + ".tmp", "w") as f:
                json.dump(body, f)
            os.replace(path + ".tmp", path)
        except OSError as exc:
            log.warning("%s: %s not written: %s", self._log.directory, CLOSE_SNAPSHOT, exc)

    def _load_at_close(self) -> bool:
        """Take (and remove: it serves one open) the close snapshot when it describes this
        log as opened: trusted (log/clean_close.py) and ending where it ended."""
        path = os.path.join(self._log.directory, CLOSE_SNAPSHOT)
        try:
            with open(path) as f:
                body = json.load(f)
            os.unlink(path)
        except FileNotFoundError:
            return False
        except (OSError, ValueError):
            body = None
        if (not isinstance(body, dict) or not self._log.report.trusted
                or body.get("next_offset") != self._log.next_offset):
            return False
        seqs, offsets = body.get("sequences"), body.get("offsets")
        if not isinstance(seqs, dict) or not isinstance(offsets, dict):
            return False
        self._seqs = {str(k): v for k, v in seqs.items() if isinstance(v, int)}
        self._offsets.restart({str(k): v for k, v in offsets.items() if isinstance(v, int)})
        return True

    def _load(self) -> None:
        if self._load_at_close():
            return
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
        elif h.chunk_type == CHUNK_USER and h.trailer_length:
            records, legacy = trailer_of(h, raw)
            found = (decode_legacy_writer_trailer if legacy else decode_writer_trailer)(records)
            if found is None and len(records):
                log.error("%s: the trailer of the chunk at offset %d cannot be read "
                          "(skipped)", self._log.directory, h.first_offset)
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
            size = chunk_extent(view, h, pos)  # checked by append_chunks
            self._note(h, view[pos:pos + size])
            pos += size
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
