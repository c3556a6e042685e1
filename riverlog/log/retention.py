# Retention: which whole segments to delete under the max bytes / max age / max messages limits.
# A pure decision over segment facts; the commit log does the deleting.
# Rules: never the active (last) segment; always the oldest first; a limit of 0 is no limit.
# Semantics follow Liftbridge's delete cleaner: remove oldest segments while over a limit.
from __future__ import annotations

from typing import Sequence

from ..config import LogConfig
from .segment import Segment


def segments_to_delete(segments: Sequence[Segment], config: LogConfig, now_ms: int) -> int:
    """How many of the oldest ``segments`` retention removes now (0 .. len - 1).

    ``now_ms`` is the wall clock in ms; a segment is too old when its newest chunk's
    timestamp is older than ``now_ms - retention_max_age_ms``.
    """
    n = 0
    last = len(segments) - 1
    if config.retention_max_age_ms:
        horizon = now_ms - config.retention_max_age_ms
        while n < last and segments[n].last_timestamp_ms < horizon:
            n += 1
    if config.retention_max_bytes:
        total = sum(s.size for s in segments[n:])
        while n < last and total > config.retention_max_bytes:
            total -= segments[n].size
            n += 1
    if config.retention_max_messages:
        total = sum(s.num_records for s in segments[n:])
        while n < last and total > config.retention_max_messages:
            total -= segments[n].num_records
            n += 1
    return n
