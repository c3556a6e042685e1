# The table worker's tie to its server: the worker process (riverlog.tables.writer) never
# commits to a table once the server that started it is gone. A SIGKILLed server's worker
# that went on with its pass could commit it after the restarted server's new worker removed
# that pass's files as leftovers: a snapshot listing missing files.
# Rules: the worker binds itself at start to the server's pid (the server passes it): on
# Linux the kernel SIGKILLs the worker when its parent dies (prctl PR_SET_PDEATHSIG; a commit
# in flight then either landed before or never does), and the parent is checked once the
# signal is asked for, so a server that died before is seen; everywhere, ``check()`` right
# before each commit exits the worker at once when its parent is no longer the server (an
# orphan is given another parent). The death signal comes with the exit of the parent
# *thread* that started the worker, not of its process: the server starts the worker from
# its event loop's thread, which runs as long as the server (a worker killed early is
# started again). A worker not bound (run by hand or by a test) is never stopped.
from __future__ import annotations

import logging
import os
import signal
import sys

log = logging.getLogger("riverlog.tables")

EXIT_ORPHANED = 4
"""The worker's exit code when its server is gone."""
PR_SET_PDEATHSIG = 1

_parent: int | None = None


def bind(parent: int) -> None:
    """Tie this process to its parent ``parent`` (a pid): killed when it dies (Linux), and
    exit now (EXIT_ORPHANED) when it died already."""
    global _parent
    _parent = parent
    if sys.platform.startswith("linux"):
        import ctypes
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL,
                                                   0, 0, 0) != 0:
            log.warning("the table worker cannot ask to die with its server (prctl: %s); it "
                        "checks before each commit", os.strerror(ctypes.get_errno()))
    check()


def check() -> None:
    """Exit this process at once (EXIT_ORPHANED, nothing more done) when it is bound and
    its parent is gone; nothing otherwise."""
    if _parent is not None and os.getppid() != _parent:
        log.error("the server (pid %d) is gone: the table worker exits without committing",
                  _parent)
        os._exit(EXIT_ORPHANED)
