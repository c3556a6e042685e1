# The clean-close marker of a partition folder (``clean-close``): written by
# ``CommitLog.close`` once the segments are fsynced, it lets the next open trust the indexes
# without a recovery scan, and it carries the log's summary (offsets, bytes, segments) that
# the broker answers from while the partition is not open (broker/partition.py).
# Rules: the marker records the size and mtime (ns) of every segment and index file and is
# valid only while the folder holds those segments and each still matches, so a write,
# truncation, roll or retention after the close makes it stale without anyone removing it;
# a marker that is missing or does not parse is stale; it is written with a rename and no
# fsync of its own (a marker lost to a power cut only costs a recovery scan, and the data it
# describes was fsynced before it).
from __future__ import annotations

import json
import logging
import os
from typing import NamedTuple, Sequence

from .segment import INDEX_SUFFIX, SEGMENT_SUFFIX, Segment

log = logging.getLogger("riverlog.log")

MARKER_NAME = "clean-close"


class LogSummary(NamedTuple):
    """What a closed log answers without opening: offsets as ``CommitLog``'s (-1: none),
    ``size_bytes`` the bytes of its segment files, ``segments`` their count. A tuple, as
    10,000 streams' summaries are made at each start and written at each stop."""

    first_offset: int
    next_offset: int
    committed_offset: int
    last_message_offset: int
    size_bytes: int
    segments: int


def _stat(path: str) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def summary_of(log) -> LogSummary:
    """The summary of an open ``log`` (a ``CommitLog``, read before its files close)."""
    return LogSummary(first_offset=log.first_offset, next_offset=log.next_offset,
                      committed_offset=log.committed_offset,
                      last_message_offset=log.last_message_offset,
                      size_bytes=log.size_bytes, segments=len(log.segments))


def write_marker(directory: str, segments: Sequence[Segment],
                 summary: LogSummary | None) -> None:
    """Write the marker of ``directory`` for its ``segments``' files as they are now (closed,
    fsynced); with no ``summary`` (the close was not clean) remove any marker. An
    ``OSError`` is logged: the next open then scans, as after a crash."""
    path = os.path.join(directory, MARKER_NAME)
    try:
        if summary is None:
            remove_marker(directory)
            return
        body = {"files": _stats(directory, [os.path.basename(s.path) for s in segments]),
                "summary": summary._asdict()}
        with open(path + ".tmp", "w") as f:
            f.write(json.dumps(body))
        os.replace(path + ".tmp", path)
    except OSError as exc:
        log.warning("%s: no clean-close marker: %s", directory, exc)


def _stats(directory: str, segment_names: Sequence[str]) -> dict[str, list[int] | None]:
    """``{file name: [size, mtime ns] or None when missing}`` of each segment and index."""
    out: dict[str, list[int] | None] = {}
    for name in segment_names:
        for file in (name, name[:-len(SEGMENT_SUFFIX)] + INDEX_SUFFIX):
            try:
                out[file] = _stat(os.path.join(directory, file))
            except FileNotFoundError:
                out[file] = None
    return out


def remove_marker(directory: str) -> None:
    """Remove the marker of ``directory`` (none is fine)."""
    try:
        os.unlink(os.path.join(directory, MARKER_NAME))
    except FileNotFoundError:
        pass


def _read(directory: str) -> dict | None:
    try:
        with open(os.path.join(directory, MARKER_NAME)) as f:
            body = json.load(f)
        LogSummary(**body["summary"])
        return body if isinstance(body["files"], dict) else None
    except (OSError, ValueError, TypeError, KeyError):
        return None


def read_summary(directory: str) -> LogSummary | None:
    """The summary the marker of ``directory`` holds (valid or stale), None without one."""
    body = _read(directory)
    return None if body is None else LogSummary(**body["summary"])


def is_clean(directory: str, segment_names: Sequence[str] | None = None) -> bool:
    """Whether ``directory``, whose segment files are ``segment_names`` (None: listed here),
    was closed cleanly and not changed since: its marker names the same segments and every
    segment and index file still has the size and mtime it recorded. False for any doubt."""
    body = _read(directory)
    if body is None:
        return False
    if segment_names is None:
        segment_names = sorted(n for n in os.listdir(directory) if n.endswith(SEGMENT_SUFFIX)
                               and n[:-len(SEGMENT_SUFFIX)].isdigit())
    try:
        return _stats(directory, segment_names) == body["files"]
    except OSError:
        return False
