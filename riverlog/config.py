# The typed configuration of riverlog. For now: the commit log's options (segments, retention,
# compaction, durability). Rules: defaults are safe for production; every size is in bytes and
# every duration in milliseconds; validation happens here, once, with messages that name the key.
from __future__ import annotations

import dataclasses
import enum


class Durability(enum.Enum):
    """When appended chunks are fsynced (see docs/durability.md for what survives what).

    - ``ALWAYS``: every append is fsynced before it is reported durable (and committed).
    - ``INTERVAL``: appends are committed at once; the log fsyncs at most every
      ``fsync_interval_ms`` ms when it has unsynced data.
    - ``NEVER``: the OS decides when dirty pages reach the disk.
    """

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@dataclasses.dataclass(frozen=True, slots=True)
class LogConfig:
    """Options of one partition's commit log.

    Sizes in bytes, durations in ms; 0 for a retention limit means "no limit".
    Raises ``ValueError`` naming the key when a value is out of range.
    """

    segment_max_bytes: int = 256 * 1024 * 1024
    segment_max_age_ms: int = 7 * 24 * 3600 * 1000
    retention_max_bytes: int = 0
    retention_max_age_ms: int = 0
    retention_max_messages: int = 0
    compact: bool = False
    durability: Durability = Durability.INTERVAL
    fsync_interval_ms: int = 200
    verify_on_open: bool = False
    verify_reads: bool = True

    def __post_init__(self) -> None:
        if not 4096 <= self.segment_max_bytes <= 0xFFFF_FFFF:
            raise ValueError("segment_max_bytes must be between 4096 and 4294967295 bytes")
        for name in ("segment_max_age_ms", "retention_max_bytes", "retention_max_age_ms",
                     "retention_max_messages", "fsync_interval_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if not isinstance(self.durability, Durability):
            object.__setattr__(self, "durability", Durability(self.durability))
