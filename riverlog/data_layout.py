# The version of a data folder's layout (docs/commit-log.md "Versions"): DATA/LAYOUT_FILE holds
# one line, "riverlog data layout N". Owns: that file and the check made before anything in
# the folder is opened. Rules: a folder without the file was written by a riverlog before
# layouts were versioned, which is layout 1 (what LAYOUT 1 means is today's: streams/<name>/
# stream.json and partitions of osiris-format segments, indexes and epoch files, each with the
# version bytes of its own format), and it is stamped; a folder of a higher layout than LAYOUT
# is refused with LayoutTooNew, never opened (a newer riverlog wrote it: reading it could
# misread it); an unreadable file is refused too. A riverlog that changes any file of the
# folder in a way an older one would misread raises LAYOUT and reads every older layout.
from __future__ import annotations

import os

from .errors import RiverlogError

LAYOUT = 1
"""The data folder layout this riverlog writes; it reads 1..LAYOUT."""
LAYOUT_FILE = "layout"
_PREFIX = "riverlog data layout "


class LayoutError(RiverlogError, RuntimeError):
    """A data folder this riverlog cannot open: ``path`` is its layout file."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path


class LayoutTooNew(LayoutError):
    """A data folder written by a newer riverlog (a layout above LAYOUT)."""


def read_layout(data_dir: str) -> int | None:
    """The layout of ``data_dir``: None without a layout file (layout 1, or an empty
    folder). Raises LayoutError (unreadable)."""
    path = os.path.join(data_dir, LAYOUT_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise LayoutError(path, f"unreadable ({exc})") from None
    number = text.strip()[len(_PREFIX):] if text.startswith(_PREFIX) else ""
    if not number.isdigit() or int(number) < 1:
        raise LayoutError(path, f"not a riverlog layout file ({text[:60]!r}): restore it, or "
                                f"write '{_PREFIX}1' if the folder was riverlog's before")
    return int(number)


def check_and_stamp(data_dir: str) -> int:
    """Check ``data_dir`` before it is opened and stamp a folder without a layout file with
    LAYOUT (written atomically, fsynced). Returns the layout found (1 when none was). Raises
    LayoutTooNew (written by a newer riverlog: upgrade this one, never open it here),
    LayoutError, OSError."""
    found = read_layout(data_dir)
    path = os.path.join(data_dir, LAYOUT_FILE)
    if found is not None and found > LAYOUT:
        raise LayoutTooNew(path, f"data layout {found} was written by a newer riverlog; this "
                                 f"one reads layouts 1 to {LAYOUT}. Run the newer riverlog "
                                 f"(a downgrade does not read its data)")
    if found is None:
        os.makedirs(data_dir, exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(f"{_PREFIX}{LAYOUT}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        found = 1
    return found
