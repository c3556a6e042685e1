# Memory measurements of the bounds tests (imported as `_memory`): the peak resident set of
# this process (the tests run riverlog in this process), reset before each measured step.
# Linux only: /proc/self/clear_refs "5" resets VmHWM (proc(5)), /proc/self/status reports it.
from __future__ import annotations

import contextlib
import re

MIB = 1024 * 1024


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return int(re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.M).group(1))


def rss() -> int:
    """The resident set of this process now, in bytes."""
    return _status_kib("VmRSS") * 1024


class Peak:
    """``growth``: the peak resident set seen inside the ``with`` block minus the resident set
    at its start, in bytes."""

    growth = 0


@contextlib.contextmanager
def peak_growth():
    """Measure how far the resident set of this process rises inside the block (a Peak)."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    start = rss()
    peak = Peak()
    try:
        yield peak
    finally:
        peak.growth = _status_kib("VmHWM") * 1024 - start
