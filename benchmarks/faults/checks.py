# What must hold after every fault, checked on the replicas' own files (read as plain bytes
# while the publishers are paused; nothing opens a CommitLog on a live server's folder):
# - the ISR replicas are byte-identical up to the end of the chunk that ends at the high
#   watermark, and what was committed at an earlier check is still there, byte for byte;
# - every chunk up to there passes its CRC, offsets run on without a gap, and no payload is
#   stored twice;
# - every acknowledged message (per door) is present exactly once, at the offset its ack named
#   when the ack names one, and a door's acknowledged messages are stored in the order it sent
#   them;
# - every record a consumer was served is in the log at that offset with that payload (a
#   server never serves a record it later truncates).
# Rules: pure functions over bytes, acks and served records, so tests can feed them made-up
# logs (tests/test_cluster_faults_checks.py); each finding is a Problem with a kind the summary
# counts. Incremental: Mirror keeps the committed log checked so far, so each round decodes only
# the chunks committed since the previous one.
from __future__ import annotations

import dataclasses
import os

from riverlog.log.chunk import (CHUNK_USER, HEADER_SIZE, ChunkFormatError, check_chunk,
                                iter_records, parse_header)
from riverlog.log.segment import SEGMENT_SUFFIX
from riverlog.record import decode_record

from .publishers import Ack, payload

KINDS = ("lost", "duplicate", "order", "offset", "diverged", "rewritten", "corrupt",
         "stale read")
"""What a Problem may be; an ack that does not mean committed adds LEADER_ACK."""
LEADER_ACK = " (LEADER ack)"


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    kind: str
    """One of KINDS."""
    detail: str


def replica_bytes(folder: str) -> bytes:
    """A partition folder's segment files, in offset order, as one byte string."""
    names = sorted((n for n in os.listdir(folder) if n.endswith(SEGMENT_SUFFIX)),
                   key=lambda n: int(n[:-len(SEGMENT_SUFFIX)]))
    parts = []
    for name in names:
        with open(os.path.join(folder, name), "rb") as f:
            parts.append(f.read())
    return b"".join(parts)


class Mirror:
    """The committed log as checked so far: its bytes (``data``), the payload at each
    offset (``values``; None for a chunk that is not a user chunk) and the offset of each
    payload (``where``)."""

    def __init__(self) -> None:
        self.data = b""
        self.values: list[bytes | None] = []
        self.where: dict[bytes, int] = {}
        self.checked_acks: dict[str, int] = {}
        """Per door: how many of its acks are checked."""
        self.last_acked: dict[str, tuple[int, int]] = {}
        """Per door: (sequence, offset) of its checked ack with the highest sequence."""

    @property
    def high_watermark(self) -> int:
        return len(self.values) - 1

    def advance(self, data: bytes, high_watermark: int) -> list[Problem]:
        """Take ``data`` (a replica's bytes) up to the chunk ending at ``high_watermark``:
        the bytes checked before must be its prefix; the chunks after are checked (CRC,
        offsets) and decoded. Returns the problems; stops at the first bad chunk."""
        if not data.startswith(self.data):
            at = next(i for i, (a, b) in enumerate(zip(self.data, data)) if a != b) \
                if len(data) >= len(self.data) else len(data)
            return [Problem("rewritten", f"committed bytes changed at byte {at} (the log "
                            f"was checked up to byte {len(self.data)}, offset "
                            f"{self.high_watermark})")]
        problems = []
        pos = len(self.data)
        while len(self.values) <= high_watermark and pos < len(data):
            try:
                header = parse_header(data, pos)
                check_chunk(data, header, pos)
                if header.first_offset != len(self.values):
                    problems.append(Problem("offset", f"chunk at byte {pos} starts at offset "
                                            f"{header.first_offset}, not {len(self.values)}"))
                    break
                if header.next_offset - 1 > high_watermark:
                    break  # not committed yet (the high watermark ends a chunk on a replica)
                start = pos + HEADER_SIZE
                records = list(iter_records(header, memoryview(data)[
                    start:start + header.data_length])) if header.chunk_type == CHUNK_USER \
                    else []
            except ChunkFormatError as exc:
                problems.append(Problem("corrupt", f"chunk at byte {pos}: {exc}"))
                break
            if header.chunk_type == CHUNK_USER:
                for offset, raw in records:
                    value = decode_record(raw).value
                    if value in self.where:
                        problems.append(Problem("duplicate", f"{value!r} at offsets "
                                                f"{self.where[value]} and {offset}"))
                    else:
                        self.where[value] = offset
                    self.values.append(value)
            else:
                self.values.extend([None] * header.num_records)
            pos += header.size
        self.data = data[:pos]
        return problems

    def check_acks(self, door: str, acks: list[Ack], committed: bool = True) -> list[Problem]:
        """The acks of ``door`` not checked yet (in ack order; every one of a later
        sequence than those checked before): each payload stored, at the offset the ack
        named, and in sequence order after the door's earlier acked messages. Acks that do
        not mean committed (``committed`` False: LEADER acks) give problems of the kinds
        followed by LEADER_ACK."""
        problems = self._check_acks(door, acks)
        return problems if committed else \
            [Problem(p.kind + LEADER_ACK, p.detail) for p in problems]

    def _check_acks(self, door: str, acks: list[Ack]) -> list[Problem]:
        start = self.checked_acks.get(door, 0)
        problems = []
        found = []
        for ack in acks[start:]:
            offset = self.where.get(payload(door, ack.seq))
            if offset is None:
                by = f" by {ack.server}" if ack.server else ""
                problems.append(Problem("lost", f"{door} #{ack.seq} acked{by} at "
                                        f"t={ack.acked:.2f} (offset {ack.offset}) is not in "
                                        f"the log (high watermark {self.high_watermark})"))
                continue
            if ack.offset is not None and ack.offset != offset:
                problems.append(Problem("offset", f"{door} #{ack.seq} acked at offset "
                                        f"{ack.offset} is stored at {offset}"))
            found.append((ack.seq, offset))
        last = self.last_acked.get(door, (-1, -1))
        for seq, offset in sorted(found):
            if offset <= last[1]:
                problems.append(Problem("order", f"{door} #{seq} at offset {offset} comes "
                                        f"before #{last[0]} at {last[1]}"))
            last = (seq, offset)
        self.last_acked[door] = last
        self.checked_acks[door] = len(acks)
        return problems

    def check_served(self, server: str,
                     served: list[tuple[int, bytes]]) -> tuple[list[Problem],
                                                              list[tuple[int, bytes]]]:
        """Records ``server`` served: each within the checked log must be the log's record
        at that offset. Returns the problems and the records past the checked log (to be
        checked later)."""
        problems, later = [], []
        for offset, value in served:
            if offset > self.high_watermark:
                later.append((offset, value))
            elif self.values[offset] != value:
                problems.append(Problem("stale read", f"{server} served {value!r} at offset "
                                        f"{offset}, where the log holds "
                                        f"{self.values[offset]!r}"))
        return problems, later


def compare_replicas(copies: dict[str, bytes], length: int) -> list[Problem]:
    """The first ``length`` bytes of every replica's ``copies`` must be the same."""
    reference_server, reference = next(iter(copies.items()))
    problems = []
    for server, data in copies.items():
        if data[:length] != reference[:length]:
            mine, theirs = data[:length], reference[:length]
            at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b),
                      min(len(mine), len(theirs)))
            problems.append(Problem("diverged", f"{server} differs from {reference_server} "
                                    f"at byte {at} of {length} (sizes {len(data)} / "
                                    f"{len(reference)})"))
    return problems
