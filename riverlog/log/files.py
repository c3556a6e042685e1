# The open-file budget of the process: the descriptors of segment and index files, as an LRU
# (``OpenFiles``), so the number of streams is not capped by RLIMIT_NOFILE. A ``LazyFile`` is
# opened on its first use and closed again when the budget needs its descriptor for another.
# Rules: a descriptor is only used between ``acquire`` and ``release`` (the ``LazyFile``
# methods do both), and a file in use is never closed: fsyncs run in worker threads while the
# event loop reads and appends, so the budget is guarded by a lock; when the OS has no
# descriptor left (EMFILE, ENFILE) the least recently used idle file is closed and the open
# tried again; only when none is idle does the one operation fail, with
# ``ResourceExhaustedError``. The budget may exceed ``capacity`` only while every file in it
# is in use.
from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator

from ..errors import ResourceExhaustedError

DEFAULT_CAPACITY = 1024
SPARES = 4  # descriptors held back for cleanups (``spare``): rmtree needs one per level
OUT_OF_FILES = (errno.EMFILE, errno.ENFILE)
"""The errno values of an open that found no descriptor (the process's, the system's)."""


class OpenFiles:
    """At most ``capacity`` open log files (least recently used closed first). ``opened``
    counts the opens since start (a file reopened after eviction counts again)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("the open-file budget must be at least 1 file")
        self.capacity = capacity
        self.opened = 0
        self._open: OrderedDict[LazyFile, int] = OrderedDict()
        self._lock = threading.Lock()
        self._spares: list[int] = []

    def __len__(self) -> int:
        """Log files open now."""
        return len(self._open)

    def acquire(self, file: LazyFile) -> int:
        """The descriptor of ``file`` (opened now when it is not open), pinned until
        ``release``. Raises ``ResourceExhaustedError`` when the OS has no descriptor and no
        idle file can give one back; ``OSError`` for other failures of the open."""
        with self._lock:
            fd = self._open.get(file)
            if fd is None:
                fd = self._open_locked(file)
            else:
                self._open.move_to_end(file)
            file.pins += 1
            return fd

    def release(self, file: LazyFile) -> None:
        with self._lock:
            file.pins -= 1
            if not file.pins and file.close_when_idle:
                self._close_locked(file)

    def close(self, file: LazyFile) -> None:
        """Close ``file``'s descriptor now, or when its last user releases it (it may be
        opened again by a later use)."""
        with self._lock:
            if file.pins:
                file.close_when_idle = True
            else:
                self._close_locked(file)

    def close_under(self, directory: str) -> None:
        """Close every file under ``directory`` (a folder being removed: its files must not
        keep their disk space while the budget holds them)."""
        prefix = os.path.join(directory, "")
        with self._lock:
            for file in [f for f in self._open if f.path.startswith(prefix)]:
                if file.pins:
                    file.close_when_idle = True
                else:
                    self._close_locked(file)

    def keep_spares(self) -> None:
        """Hold SPARES descriptors (on /dev/null) back for ``spare`` (as many as can be had)."""
        with self._lock:
            while len(self._spares) < SPARES:
                try:
                    self._spares.append(os.open(os.devnull, os.O_RDONLY))
                except OSError:
                    return

    @contextmanager
    def spare(self) -> Iterator[None]:
        """Give the spare descriptors back to the OS for the block (a cleanup after the
        process ran out of them), and hold them again after it."""
        with self._lock:
            spares, self._spares = self._spares, []
        for fd in spares:
            os.close(fd)
        try:
            yield
        finally:
            self.keep_spares()

    def resize(self, capacity: int) -> None:
        """A new ``capacity`` (closing idle files above it)."""
        if capacity < 1:
            raise ValueError("the open-file budget must be at least 1 file")
        with self._lock:
            self.capacity = capacity
            while len(self._open) > capacity and self._evict_locked():
                pass

    def _open_locked(self, file: LazyFile) -> int:
        while len(self._open) >= self.capacity and self._evict_locked():
            pass
        while True:
            try:
                fd = os.open(file.path, file.flags, 0o644)
                break
            except OSError as exc:
                if exc.errno not in OUT_OF_FILES:
                    raise
                if not self._evict_locked():
                    raise ResourceExhaustedError(
                        f"no file descriptor to open {file.path}: {exc.strerror} "
                        f"({len(self._open)} log files open, all in use)") from None
        self.opened += 1
        self._open[file] = fd
        file.close_when_idle = False
        return fd

    def _evict_locked(self) -> bool:
        """Close the least recently used idle file; False when every open file is in use."""
        for file in self._open:
            if not file.pins:
                self._close_locked(file)
                return True
        return False

    def _close_locked(self, file: LazyFile) -> None:
        fd = self._open.pop(file, None)
        file.close_when_idle = False
        if fd is not None:
            os.close(fd)


def _sendfile_to(in_fd: int, out_fd: int, pos: int, count: int) -> int:
    return os.sendfile(out_fd, in_fd, pos, count)


OPEN_FILES = OpenFiles()
"""The process's budget: every segment and index file of every log (the server sizes it at
start from RLIMIT_NOFILE, riverlog/server/fd_limit.py)."""


class LazyFile:
    """A file at ``path`` opened with ``flags`` (mode 0o644 when created) through a budget
    (``OPEN_FILES`` unless given), on first use. Each method pins the descriptor for its one
    system call. Errors: ``ResourceExhaustedError`` when no descriptor can be had, else the
    system call's ``OSError``."""

    __slots__ = ("path", "flags", "budget", "pins", "close_when_idle")

    def __init__(self, path: str, flags: int, budget: OpenFiles | None = None) -> None:
        self.path = path
        self.flags = flags
        self.budget = budget or OPEN_FILES
        self.pins = 0
        self.close_when_idle = False

    def _call(self, call, *args):
        budget = self.budget
        fd = budget.acquire(self)
        try:
            return call(fd, *args)
        finally:
            budget.release(self)

    def pread(self, n: int, pos: int) -> bytes:
        return self._call(os.pread, n, pos)

    def preadv(self, buffers: list, pos: int) -> int:
        return self._call(os.preadv, buffers, pos)

    def sendfile(self, out_fd: int, pos: int, count: int) -> int:
        """os.sendfile of ``count`` bytes from ``pos`` of this file to ``out_fd``: bytes sent."""
        return self._call(_sendfile_to, out_fd, pos, count)

    def pwrite(self, data: bytes, pos: int) -> int:
        return self._call(os.pwrite, data, pos)

    def fsync(self) -> None:
        self._call(os.fsync)

    def ftruncate(self, size: int) -> None:
        self._call(os.ftruncate, size)

    def size(self) -> int:
        """The file's size in bytes (fstat)."""
        return self._call(os.fstat).st_size

    def links(self) -> int:
        """The file's hard links (fstat): 0 once its name was removed while it was open."""
        return self._call(os.fstat).st_nlink

    def pin(self) -> None:
        """Open the file now (if closed) and keep this descriptor, on this inode, until
        ``unpin``: the budget does not close it meanwhile, so a rename over its path does
        not change what it reads (compaction). Raises as ``acquire``."""
        self.budget.acquire(self)

    def unpin(self) -> None:
        """End one ``pin`` (the descriptor is closed now if the file was closed meanwhile)."""
        self.budget.release(self)

    def open(self) -> None:
        """Open (creating, with O_CREAT) the file now: what a new segment does at once. Later
        opens never create it: a file removed from its folder while closed for the budget
        is an error (FileNotFoundError), not a new empty file written at an old position."""
        self.budget.acquire(self)
        self.budget.release(self)
        self.flags &= ~os.O_CREAT

    def close(self, final: bool = False) -> None:
        """Close the descriptor (when its last user is done). A later use opens the file
        again, but after a ``final`` close never creates it: a segment deleted by retention
        is not made again, empty, by a reader that still held it (it gets
        FileNotFoundError, as it got EBADF when descriptors were held for the log's life)."""
        if final:
            self.flags &= ~os.O_CREAT
        self.budget.close(self)
