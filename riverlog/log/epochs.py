# The leader-epoch checkpoint of one partition: which leader epoch wrote which offsets, as
# (epoch, start offset) entries, kept in memory and in the file `leader-epoch-checkpoint` in the
# partition's folder. A follower of a new leader asks the leader for the end offset of its own
# latest epoch (LeaderEpochOffsetRequest) and truncates its log there before fetching.
# Rules: entries have strictly increasing epochs and non-decreasing start offsets; every change
# is written crash-safely (temp file, fsync, rename, fsync of the folder) before it returns; a
# file that does not parse raises EpochCheckpointError naming the path, never a crash: the
# commit log then rebuilds the entries from the epochs of its chunks (``entries_of_chunks``).
# Semantics: Kafka's LeaderEpochFileCache (assign, endOffsetFor, truncateFromEnd,
# truncateFromStart); file format: Kafka's and Liftbridge's leader-epoch-checkpoint (text:
# version 0, entry count, one "epoch startOffset" line per entry; liftbridge-io/liftbridge
# server/commitlog/leader_epoch_cache.go, 50ac358).
from __future__ import annotations

import os
from bisect import bisect_right
from typing import Iterable, NamedTuple

from ..errors import EpochCheckpointError
from .segment import write_atomically

CHECKPOINT_NAME = "leader-epoch-checkpoint"
"""File name of the checkpoint in a partition's folder (Kafka's and Liftbridge's name)."""
VERSION = 0
"""The checkpoint file format version (the only one)."""
UNDEFINED = -1
"""``end_offset_for``'s answer for an epoch the log knows nothing after (Kafka's
UNDEFINED_EPOCH_OFFSET)."""


class EpochEntry(NamedTuple):
    """Leader ``epoch`` wrote the log from ``start_offset`` on (until the next entry's start)."""

    epoch: int
    start_offset: int


class LeaderEpochCache:
    """The (epoch, start offset) entries of one partition, saved in ``path``.

    Opening reads ``path`` when it exists (else starts empty, writing nothing). Raises
    EpochCheckpointError when the file does not parse or breaks the entry rules, and OSError
    for I/O errors. Not thread-safe: the commit log's owner calls it.
    """

    __slots__ = ("path", "latest_epoch", "_entries", "_epochs")

    def __init__(self, path: str | os.PathLike, *, load: bool = True) -> None:
        self.path = os.fspath(path)
        self._entries: list[EpochEntry] = []
        self._epochs: list[int] = []  # the entries' epochs, for bisection
        self.latest_epoch = 0
        """The newest epoch recorded, 0 when there is none (leader epochs start at 1); an
        attribute, not a property: the commit log reads it on every append."""
        if load and os.path.exists(self.path):
            with open(self.path, "rb") as f:
                self._set(_parse(self.path, f.read()))

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        """The entries, oldest epoch first."""
        return tuple(self._entries)

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that leader ``epoch`` writes from ``start_offset`` on. Nothing changes when
        ``epoch`` is the latest one already and ``start_offset`` is not before its start.
        Raises ValueError for an epoch older than the latest, a start offset before the latest
        entry's, or negative values: the caller would be writing out of order."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"epoch {epoch} and start offset {start_offset} must be >= 0")
        if self._entries:
            latest = self._entries[-1]
            if epoch < latest.epoch or start_offset < latest.start_offset:
                raise ValueError(f"leader epoch {epoch} from offset {start_offset} is out of "
                                 f"order: the latest is epoch {latest.epoch} from offset "
                                 f"{latest.start_offset} ({self.path})")
            if epoch == latest.epoch:
                return
        self._save(self._entries + [EpochEntry(epoch, start_offset)])

    def end_offset_for(self, epoch: int, log_end: int) -> int:
        """The offset right after the last one ``epoch`` wrote, as a leader answers a
        LeaderEpochOffsetRequest: ``log_end`` (the log's next offset) when ``epoch`` is the
        latest, else the start offset of the first epoch above it (also for an epoch older
        than every entry); UNDEFINED (-1) for an epoch above the latest, or no entries."""
        return self.epoch_and_end_offset_for(epoch, log_end)[1]

    def epoch_and_end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        """``(found, end)``: ``found`` is the newest epoch recorded that is not above
        ``epoch`` and ``end`` its end offset (``end_offset_for(found)``), Kafka's answer to
        OffsetsForLeaderEpoch since KIP-279. A follower whose latest epoch the leader never
        had learns from ``found`` which older epoch they share, and truncates to the lower of
        both logs' ends of it. For an epoch older than every entry: ``(epoch, start offset
        of the first entry)``; above the latest, or no entries: ``(UNDEFINED, UNDEFINED)``."""
        if not self._entries or epoch > self._epochs[-1]:
            return UNDEFINED, UNDEFINED
        i = bisect_right(self._epochs, epoch)  # entries [0, i) have an epoch <= ``epoch``
        if i == 0:
            return epoch, self._entries[0].start_offset
        if i == len(self._entries):
            return self._epochs[-1], log_end
        return self._epochs[i - 1], self._entries[i].start_offset

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget the epochs that start at ``end_offset`` or later (the log was truncated to
        end before ``end_offset``)."""
        kept = [e for e in self._entries if e.start_offset < end_offset]
        if len(kept) != len(self._entries):
            self._save(kept)

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget what precedes ``start_offset`` (retention removed it): entries starting
        before it are dropped, except the last of them, which now starts at ``start_offset``
        unless another entry starts there."""
        before = [e for e in self._entries if e.start_offset < start_offset]
        if not before:
            return
        rest = self._entries[len(before):]
        if not rest or rest[0].start_offset > start_offset:
            rest.insert(0, EpochEntry(before[-1].epoch, start_offset))
        self._save(rest)

    def replace(self, entries: Iterable[EpochEntry]) -> None:
        """Replace every entry (rebuilding from the chunks) and write the file. Raises
        ValueError when ``entries`` break the rules."""
        entries = list(entries)
        problem = _rule_broken(entries)
        if problem:
            raise ValueError(f"{self.path}: {problem}")
        self._save(entries)

    def _set(self, entries: list[EpochEntry]) -> None:
        self._entries = entries
        self._epochs = [e.epoch for e in entries]
        self.latest_epoch = self._epochs[-1] if entries else 0

    def _save(self, entries: list[EpochEntry]) -> None:
        lines = [str(VERSION), str(len(entries))] + [f"{e.epoch} {e.start_offset}" for e in entries]
        write_atomically(self.path, ("\n".join(lines) + "\n").encode())
        self._set(entries)

    def __repr__(self) -> str:
        return f"LeaderEpochCache({self.path!r}, {self._entries})"


def entries_of_chunks(chunks: Iterable[tuple[int, int]]) -> list[EpochEntry]:
    """The entries a log's chunks imply: ``chunks`` is ``(first offset, epoch)`` per chunk in
    offset order; an entry starts at each chunk whose epoch is above every epoch before it
    (a lower one, which riverlog never writes, is taken as part of the current epoch)."""
    entries: list[EpochEntry] = []
    for first, epoch in chunks:
        if not entries or epoch > entries[-1].epoch:
            entries.append(EpochEntry(epoch, first))
    return entries


def _parse(path: str, raw: bytes) -> list[EpochEntry]:
    def bad(reason: str) -> EpochCheckpointError:
        return EpochCheckpointError(path, reason)

    try:
        lines = raw.decode("ascii").split("\n")
    except UnicodeDecodeError:
        raise bad("not ASCII text") from None
    if lines[-1] != "":
        raise bad("the last line is not complete")
    lines.pop()
    if len(lines) < 2 or not lines[0].isdigit() or not lines[1].isdigit():
        raise bad("no version and entry count lines")
    if int(lines[0]) != VERSION:
        raise bad(f"unknown version {lines[0]}")
    if int(lines[1]) != len(lines) - 2:
        raise bad(f"says {lines[1]} entries, holds {len(lines) - 2}")
    entries = []
    for n, line in enumerate(lines[2:], start=3):
        fields = line.split(" ")
        if len(fields) != 2 or not all(f.isdigit() for f in fields):
            raise bad(f"line {n} is not 'epoch startOffset': {line[:80]!r}")
        entries.append(EpochEntry(int(fields[0]), int(fields[1])))
    problem = _rule_broken(entries)
    if problem:
        raise bad(problem)
    return entries


def _rule_broken(entries: list[EpochEntry]) -> str | None:
    """Why ``entries`` break the rules (increasing epochs, non-decreasing offsets), or None."""
    for before, after in zip(entries, entries[1:]):
        if after.epoch <= before.epoch or after.start_offset < before.start_offset:
            return f"entry {tuple(after)} out of order after {tuple(before)}"
    if any(e.epoch < 0 or e.start_offset < 0 or e.epoch >= 1 << 63 or e.start_offset >= 1 << 63
           for e in entries):
        return "an epoch or offset outside 0..2^63-1"
    return None
