# The manifest of one partition's table: which Parquet files hold which offsets. Owns the
# table folder layout (TABLE_DIR/<stream folder>/<partition>/), the manifest file format
# (manifest.json) and how files are published and retired.
# Rules: a Parquet file is visible only once it is listed here; each file, then the
# manifest, appears whole in one step (riverlog.tables.storage: a rename where the
# filesystem has one, one upload on object stores), so a crash at any point leaves the last
# manifest and complete files only.
# Listed files hold ascending, non-overlapping ranges ``[start, end)`` of record offsets (a
# range may hold fewer rows than offsets after compaction; a gap between two files is
# offsets retention removed from the log before the table got them). A file a newer one
# replaces is kept as ``retired`` for RETIRE_GRACE_MS, so queries planned on the old manifest
# can still read it; anything else in the folder is a leftover of a crash (``orphans``).
from __future__ import annotations

import dataclasses
import json
import posixpath
from typing import Iterable

from ..errors import RiverlogError
from .storage import Storage

MANIFEST = "manifest.json"
VERSION = 1
PARQUET_SUFFIX = ".parquet"
RETIRE_GRACE_MS = 10 * 60 * 1000


class ManifestError(RiverlogError):
    """A manifest that cannot be read or breaks its rules (the message says which)."""


def partition_dir(root: str, stream: str, partition: int) -> str:
    """The folder of ``partition`` of ``stream``'s table under ``root`` (a Storage's root;
    the stream's folder name is the one the broker uses under DATA/streams)."""
    return posixpath.join(stream_dir(root, stream), str(partition))


def stream_dir(root: str, stream: str) -> str:
    """The folder of ``stream``'s table under ``root``."""
    from ..broker.broker import folder_name  # the broker's import is not for Spark workers
    return posixpath.join(root, folder_name(stream))


@dataclasses.dataclass(frozen=True)
class TableFile:
    """One listed Parquet file: ``name`` in the partition folder, offsets ``[start, end)``,
    ``rows`` (records in it) and ``size`` (bytes of the file). ``segment`` is the base
    offset of the log segment its records came from; ``sealed`` when it holds that whole
    sealed segment (``source``: the segment file's (inode, size) it was written from, so a
    compaction that rewrote the segment is noticed)."""

    name: str
    start: int
    end: int
    rows: int
    size: int
    segment: int
    sealed: bool = False
    source: tuple[int, int] | None = None


def file_name(start: int, end: int, generation: int) -> str:
    """``<start>-<end>-<generation>.parquet`` (20-digit offsets: names sort by offset; the
    generation makes a rewritten range a new name, never an overwrite)."""
    return f"{start:020d}-{end:020d}-{generation}{PARQUET_SUFFIX}"


@dataclasses.dataclass
class Manifest:
    """The files of one partition's table. ``created_ns`` is the stream's creation time: a
    stream deleted and created again under the same name gets a new table.
    ``generation`` counts publications; ``retired`` lists (name, retired at ms)."""

    stream: str
    partition: int
    created_ns: int
    generation: int = 0
    files: list[TableFile] = dataclasses.field(default_factory=list)
    retired: list[tuple[str, int]] = dataclasses.field(default_factory=list)

    @property
    def first(self) -> int | None:
        """First offset the table holds (None when empty; see ``files`` for gaps)."""
        return self.files[0].start if self.files else None

    @property
    def end(self) -> int | None:
        """Offset after the last one the table holds (None when empty)."""
        return self.files[-1].end if self.files else None

    def overlapping(self, start: int, end: int) -> list[TableFile]:
        """Listed files holding any offset of ``[start, end)``, in offset order."""
        return [f for f in self.files if f.start < end and f.end > start]

    def publish(self, new: TableFile, replaces: Iterable[TableFile], now_ms: int) -> None:
        """List ``new`` in place of ``replaces`` (which are retired). Raises ManifestError
        when the result would overlap."""
        gone = set(replaces)
        files = sorted([f for f in self.files if f not in gone] + [new], key=lambda f: f.start)
        _check_ordered(files)
        self.files = files
        self.retired += [(f.name, now_ms) for f in gone]
        self.generation += 1

    def drop_before(self, offset: int, now_ms: int) -> list[TableFile]:
        """Retire the files whose every offset is below ``offset`` (retention); returns
        them."""
        gone = [f for f in self.files if f.end <= offset]
        if gone:
            self.files = self.files[len(gone):]
            self.retired += [(f.name, now_ms) for f in gone]
            self.generation += 1
        return gone

    def expired(self, now_ms: int) -> list[str]:
        """Forget retired files older than RETIRE_GRACE_MS; returns their names (to delete)."""
        old = [name for name, at in self.retired if now_ms - at >= RETIRE_GRACE_MS]
        self.retired = [(name, at) for name, at in self.retired if now_ms - at < RETIRE_GRACE_MS]
        return old

    def orphans(self, names: Iterable[str]) -> list[str]:
        """Of the file ``names`` in the partition folder, those that are neither listed,
        retired nor the manifest: leftovers of a crash."""
        known = {f.name for f in self.files} | {name for name, _ in self.retired} | {MANIFEST}
        return [n for n in names if n not in known]

    # -- file -------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"version": VERSION, "stream": self.stream, "partition": self.partition,
                "created_ns": self.created_ns, "generation": self.generation,
                "files": [dataclasses.asdict(f) for f in self.files],
                "retired": [list(r) for r in self.retired]}

    @classmethod
    def from_json(cls, data: object) -> "Manifest":
        """Raises ManifestError for anything but what ``to_json`` writes."""
        try:
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise ValueError(f"not a version {VERSION} manifest")
            files = []
            for f in data["files"]:
                source = f.get("source")
                files.append(TableFile(
                    str(f["name"]), _int(f["start"]), _int(f["end"]), _int(f["rows"]),
                    _int(f["size"]), _int(f["segment"]), bool(f["sealed"]),
                    None if source is None else (_int(source[0]), _int(source[1]))))
            for f in files:
                if (posixpath.basename(f.name) != f.name or not f.name.endswith(PARQUET_SUFFIX)
                        or f.rows > f.end - f.start):
                    raise ValueError(f"bad file entry {f.name!r}")
            _check_ordered(files)
            return cls(str(data["stream"]), _int(data["partition"]), _int(data["created_ns"]),
                       _int(data["generation"]), files,
                       [(str(name), _int(at)) for name, at in data["retired"]])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError,
                ManifestError) as exc:
            raise ManifestError(f"damaged manifest: {exc}") from None

    def save(self, storage: Storage, directory: str) -> None:
        """Replace ``directory``/manifest.json on ``storage`` in one step."""
        data = json.dumps(self.to_json(), separators=(",", ":")).encode()
        storage.put(posixpath.join(directory, MANIFEST), lambda out: out.write(data))


def load(storage: Storage, directory: str) -> Manifest | None:
    """The manifest in ``directory`` on ``storage``; None when there is none. Raises
    ManifestError when it is damaged (not JSON, missing fields, ranges that overlap),
    OSError when it cannot be read."""
    raw = storage.read_bytes(posixpath.join(directory, MANIFEST))
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"damaged manifest {directory}/{MANIFEST}: {exc}") from None
    return Manifest.from_json(data)


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _check_ordered(files: list[TableFile]) -> None:
    for f in files:
        if f.start < 0 or f.end <= f.start:
            raise ManifestError(f"file {f.name}: empty or negative range {f.start}..{f.end}")
    for a, b in zip(files, files[1:]):
        if a.end > b.start:
            raise ManifestError(f"files {a.name} and {b.name} overlap ({a.end} > {b.start})")
