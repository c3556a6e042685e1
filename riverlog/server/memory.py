# Giving freed memory back to the operating system after a burst. CPython hands blocks over
# 512 bytes to the C allocator, and glibc keeps freed heap pages for reuse: after many
# subscribers each held and sent large messages, the resident set stays at the burst's peak
# although nothing holds the memory any more (2,000 gRPC subscribers of 100 KB messages:
# +1 GB, still +1 GB after they cancelled; issue 15, item 13). Rules: ``release_soon()`` is
# cheap and may be called at every end of a subscription; it runs glibc's malloc_trim(0)
# (which returns free pages anywhere in the heap, madvise MADV_DONTNEED) at most once per
# RELEASE_INTERVAL_S, in a worker thread (ctypes releases the GIL), never on the event loop;
# where the C library has no malloc_trim (musl, macOS) it does nothing.
from __future__ import annotations

import asyncio
import ctypes
import logging

log = logging.getLogger("riverlog.memory")

RELEASE_INTERVAL_S = 1.0


def _malloc_trim():
    # The symbols already loaded into the process (the C library's among them): no
    # ctypes.util.find_library, which runs ldconfig in a subprocess at import.
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()
_scheduled_on: asyncio.AbstractEventLoop | None = None  # the loop a release is due on


def release_soon() -> None:
    """Hand freed memory back to the OS within RELEASE_INTERVAL_S (once for many calls).
    Needs a running event loop."""
    global _scheduled_on
    loop = asyncio.get_running_loop()
    if _TRIM is None or _scheduled_on is loop:
        return
    _scheduled_on = loop  # another loop's pending release (a closed loop's) does not count
    loop.call_later(RELEASE_INTERVAL_S, _release)


def _release() -> None:
    global _scheduled_on
    _scheduled_on = None
    future = asyncio.get_running_loop().run_in_executor(None, _TRIM, 0)
    future.add_done_callback(_released)


def _released(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.debug("malloc_trim failed: %s", future.exception())
