# The high-watermark checkpoint of one replicated partition: the file `high-watermark` in the
# partition's folder, holding the newest offset known committed (decimal text, one line).
# A replicated log does not commit its own writes (``CommitLog(auto_commit=False)``), so after a
# restart its high watermark would be unknown until replication re-established it; the
# checkpoint restores it. Rules: only offsets already committed are written, and the writer
# (riverlog/cluster/replication.py) writes it off the hot path, so it lags the true high
# watermark: a restart never exposes an uncommitted record, and may hide the newest committed
# ones until the leader's next answer (or, on a leader, its ISR's next fetch) commits them
# again. Written crash-safely (segment.write_atomically). A file that does not parse is
# reported (``problem``) and read as "nothing committed", which hides, never exposes.
# Kafka keeps the same value per log folder in `replication-offset-checkpoint`.
from __future__ import annotations

import os
import threading

from .segment import write_atomically

CHECKPOINT_NAME = "high-watermark"
"""File name of the checkpoint in a partition's folder."""


class HighWatermarkCheckpoint:
    """The checkpoint in ``directory``. ``offset`` is the value read at open or last
    written (-1: nothing committed, or no readable file; then ``problem`` says why when the
    file exists but does not parse). ``write`` raises OSError."""

    __slots__ = ("path", "offset", "problem", "_lock")

    def __init__(self, directory: str | os.PathLike) -> None:
        self.path = os.path.join(os.fspath(directory), CHECKPOINT_NAME)
        self.offset = -1
        self.problem: str | None = None
        self._lock = threading.Lock()  # a worker thread and the event loop may both write
        try:
            with open(self.path, "rb") as f:
                raw = f.read(64)
        except FileNotFoundError:
            return
        text = raw.decode("ascii", "replace")
        if text.endswith("\n") and text[:-1].isdigit():
            self.offset = int(text[:-1])
        else:
            self.problem = f"{self.path}: not a high watermark ({raw[:32]!r}); read as none"

    def write(self, offset: int) -> None:
        """Record ``offset`` (>= -1) as committed; nothing is written when it is unchanged.
        Thread-safe."""
        with self._lock:
            if offset == self.offset:
                return
            if offset < 0:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
            else:
                write_atomically(self.path, b"%d\n" % offset)
            self.offset = offset
