# The process's file descriptors at start: the soft RLIMIT_NOFILE raised to the hard limit
# (logged, both), and the log's open-file budget (riverlog/log/files.py) sized under it, so
# stream count is bounded by disk, not by descriptors, and sockets keep their share.
# Rules: never lowers a limit; a hard limit of "unlimited" raises the soft one to
# NOFILE_CEILING; the budget is ``ServerConfig.log_open_files`` when set, else half the soft
# limit (at least MIN_BUDGET); nothing here runs after start but the metric's reads.
from __future__ import annotations

import logging
import os
import resource

from ..log.files import OPEN_FILES

log = logging.getLogger("riverlog")

NOFILE_CEILING = 1 << 20  # the soft limit taken when the hard one is unlimited (Linux's nr_open)
MIN_BUDGET = 16


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns (soft, hard) after, as
    numbers of descriptors (RLIM_INFINITY as is). Logs both. An OS that refuses (ValueError,
    OSError) keeps the old soft limit, with a warning."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = NOFILE_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, wanted, exc)
    return soft, hard


def size_budget(configured: int, soft: int) -> int:
    """The log's open-file budget: ``configured`` (> 0), else half of ``soft``."""
    if configured > 0:
        return configured
    if soft == resource.RLIM_INFINITY:
        soft = NOFILE_CEILING
    return max(MIN_BUDGET, soft // 2)


def prepare(configured: int) -> None:
    """At start: raise the limit, size OPEN_FILES, and log what was decided."""
    soft, hard = raise_nofile_limit()
    budget = size_budget(configured, soft)
    OPEN_FILES.resize(budget)
    log.info("open files: soft limit %s, hard limit %s; at most %d log files open at once",
             _shown(soft), _shown(hard), budget)


def process_open_files() -> int:
    """Descriptors this process holds now (/proc/self/fd; 0 where there is no /proc)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def nofile_soft_limit() -> int:
    """The soft RLIMIT_NOFILE now (NOFILE_CEILING for unlimited)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return NOFILE_CEILING if soft == resource.RLIM_INFINITY else soft


def _shown(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)
