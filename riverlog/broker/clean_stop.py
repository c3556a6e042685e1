# The clean-stop marker of the broker (``DATA/streams/.clean-stop``): written once every
# partition closed at a stop, it tells the next start that no partition needs a check (each
# one's clean-close marker is valid, log/clean_close.py) and holds every stream's metadata
# and its partitions' summaries, so that start reads one file instead of each stream's
# ``stream.json`` and listings read no partition's marker.
# Rules: the marker is fsynced when written and removed (the folder fsynced) when taken at
# start, so a crash after a start never passes for a clean stop; an entry counts only while
# its ``stream.json`` still has the size and mtime (ns) recorded, else that file is read; a
# folder the marker does not name is read as without it; a marker that does not parse is
# taken as a clean stop with no entries (each stream's file is read).
from __future__ import annotations

import json
import logging
import os
from typing import Iterable

from ..log.segment import fsync_dir

log = logging.getLogger("riverlog.broker")

CLEAN_STOP_FILE = ".clean-stop"
"""In DATA/streams; no stream folder name has a dot (broker.folder_name)."""


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def write(root: str, streams: Iterable[tuple[str, dict, list]], metadata_file: str) -> None:
    """Write the marker in ``root`` for ``streams`` (``(folder path, metadata, partitions'
    summaries)``, a summary None when not known) whose metadata files are called
    ``metadata_file``. Raises ``OSError``."""
    entries = {os.path.basename(folder): {"stat": _stat(os.path.join(folder, metadata_file)),
                                          "metadata": data, "summaries": summaries}
               for folder, data, summaries in streams}
    path = os.path.join(root, CLEAN_STOP_FILE)
    with open(path + ".tmp", "w") as f:
        f.write(json.dumps(entries, separators=(",", ":")))  # json.dump: 10x slower
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    fsync_dir(root)


def take(root: str) -> dict[str, dict] | None:
    """Read and remove the marker of ``root``: None when the last stop was not clean, else
    ``{folder name: {"stat": ..., "metadata": ...}}``. Raises ``OSError`` when it cannot be
    removed."""
    path = os.path.join(root, CLEAN_STOP_FILE)
    try:
        with open(path) as f:
            entries = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s cannot be read (%s): each stream's metadata file is read", path, exc)
        entries = {}
    os.unlink(path)
    fsync_dir(root)
    return entries if isinstance(entries, dict) else {}


def metadata_of(entries: dict[str, dict], name: str, folder: str,
                metadata_file: str) -> tuple[dict, list] | None:
    """The metadata and the partitions' summaries (a list, maybe shorter, of lists or None)
    the marker's ``entries`` hold for the stream folder called ``name`` at path ``folder``
    if its metadata file is unchanged since, else None (read the file)."""
    entry = entries.get(name)
    if not isinstance(entry, dict) or entry.get("stat") is None:
        return None
    if _stat(f"{folder}/{metadata_file}") != entry["stat"]:
        return None
    summaries = entry.get("summaries")
    return entry.get("metadata"), summaries if isinstance(summaries, list) else []
