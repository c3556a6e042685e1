# A stream: a name, its settings, and its partitions; and a super stream's value (its name,
# partitions and binding keys; the registry is superstreams.py's). Owns the stream's metadata
# file (stream.json), the name rule and how per-stream settings override the server's log
# defaults.
# Rules: settings are protocol-neutral (each door translates its own arguments); a setting
# left as None takes the server default; the metadata file is written atomically.
from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any

from ..config import LogConfig
from .partition import Partition

METADATA_FILE = "stream.json"
MAX_NAME_BYTES = 255
"""The longest stream (and super stream) name, in UTF-8 bytes (RabbitMQ's limit)."""


@dataclasses.dataclass(frozen=True, slots=True)
class StreamConfig:
    """Per-stream settings; None means "the server's default". Sizes in bytes, times in ms.

    ``subject`` and ``group`` are the NATS subject and queue group (Liftbridge); ``partitions``
    is the partition count (RabbitMQ streams have one); ``table`` mirrors the stream to
    Parquet (riverlog.tables; None: ``streams.table.enabled``).
    """

    subject: str | None = None
    group: str | None = None
    partitions: int = 1
    retention_max_bytes: int | None = None
    retention_max_messages: int | None = None
    retention_max_age_ms: int | None = None
    segment_max_bytes: int | None = None
    segment_max_age_ms: int | None = None
    compact: bool | None = None
    cleaner_interval_ms: int | None = None
    optimistic_concurrency: bool = False
    # Liftbridge settings kept as given (on a single server replication_factor and min_isr
    # are recorded, not acted on); auto pause is applied by the Liftbridge doors.
    replication_factor: int = 1
    min_isr: int | None = None
    compact_max_goroutines: int | None = None
    auto_pause_time_ms: int = 0
    auto_pause_disable_if_subscribers: bool = False
    table: bool | None = None  # mirrored to Parquet (riverlog.tables); None: the server's default
    # Replicated by the cluster (riverlog.cluster): its logs do not commit their own writes,
    # replication advances the high watermark as the in-sync replicas catch up.
    replicated: bool = False
    # The RabbitMQ Create arguments RabbitMQ compares when a stream is created again (a
    # JSON object, riverlog.server.rabbitmq_stream.arguments.equivalence_arguments); None for streams
    # made otherwise (Liftbridge doors) or before it was kept: nothing to compare.
    rabbitmq_arguments: str | None = None
    # The user whose request created the stream (None: the server, or an anonymous client);
    # per-user limits count by it (Broker.check_quota).
    owner: str | None = None

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError("partitions must be >= 1")

    def log_config(self, defaults: LogConfig) -> LogConfig:
        """The defaults with this stream's overrides applied (one object for equal ones)."""
        return _log_config(defaults, tuple((f, getattr(self, f)) for f in _LOG_FIELDS
                                           if getattr(self, f) is not None))


_LOG_FIELDS = ("retention_max_bytes", "retention_max_messages", "retention_max_age_ms",
               "segment_max_bytes", "segment_max_age_ms", "compact")


@functools.lru_cache(maxsize=1024)
def _log_config(defaults: LogConfig, overrides: tuple) -> LogConfig:
    return dataclasses.replace(defaults, **dict(overrides))


_CONFIG_DEFAULTS = {f.name: f.default for f in dataclasses.fields(StreamConfig)}
_UNSET_STATE = {"paused": False, "readonly": False, "events": {}}
"""A partition's ``state()`` with no flag ever set."""


@functools.lru_cache(maxsize=4096)
def _settings(items: tuple, log_defaults: LogConfig) -> tuple[StreamConfig, LogConfig]:
    """One StreamConfig and its partitions' LogConfig for equal settings (``(name, value)``
    pairs) and defaults, as streams share them when thousands load at start."""
    config = StreamConfig(**dict(items))
    return config, config.log_config(log_defaults)


class Stream:
    """A named stream and its partitions (``partitions[i]`` is partition i)."""

    def __init__(self, name: str, directory: str, config: StreamConfig,
                 log_defaults: LogConfig, created_ns: int | None = None,
                 log_config: LogConfig | None = None) -> None:
        """``log_config``: ``config.log_config(log_defaults)`` when the caller has it."""
        self.name = name
        self.directory = directory
        self.config = config
        self.created_ns = created_ns if created_ns is not None else time.time_ns()
        self.resume_all = False
        """Paused with Liftbridge's resumeAll (single server; in memory only, as Liftbridge)."""
        if log_config is None:
            log_config = config.log_config(log_defaults)
        self.own_log_config = log_config
        """The partitions' LogConfig without a policy (``apply_policy``)."""
        self.policy_overrides: dict[str, int] = {}
        self.partitions = [Partition(name, i, f"{directory}/{i}", log_config,
                                     auto_commit=not config.replicated)
                           for i in range(config.partitions)]

    def apply_policy(self, overrides: dict[str, int]) -> None:
        """Give the partitions ``own_log_config`` with ``overrides`` (LogConfig fields, a
        RabbitMQ policy's: riverlog.server.policy_table.log_overrides; empty: none), at once
        on open logs: retention applies at the next housekeeping or segment roll, a segment
        size to the segments rolled after. Not saved in the metadata (the policy is kept
        apart). Raises ValueError for a bad value (LogConfig's check)."""
        config = (dataclasses.replace(self.own_log_config, **overrides) if overrides
                  else self.own_log_config)
        self.policy_overrides = dict(overrides)
        for partition in self.partitions:
            partition.set_config(config)

    def metadata(self, defaults_too: bool = True) -> dict[str, Any]:
        """What the metadata file holds: name, created_ns, config, partition_state; without
        ``defaults_too`` the config leaves out the settings at their default and
        partition_state the partitions' flags when none is set (smaller, read back the
        same)."""
        config = {k: getattr(self.config, k) for k in _CONFIG_DEFAULTS}  # flat: asdict's
        states = [p.state() for p in self.partitions]
        if not defaults_too:
            config = {k: v for k, v in config.items() if v != _CONFIG_DEFAULTS[k]}
            if states == [_UNSET_STATE] * len(states):
                states = []
        return {"name": self.name, "created_ns": self.created_ns, "config": config,
                "partition_state": states}

    def save_metadata(self) -> None:
        data = self.metadata()
        path = os.path.join(self.directory, METADATA_FILE)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    @classmethod
    def load(cls, directory: str, log_defaults: LogConfig) -> "Stream":
        """Open a stream folder. Raises ``OSError``/``ValueError`` for a missing or bad
        metadata file (the caller reports and skips the folder)."""
        with open(os.path.join(directory, METADATA_FILE)) as f:
            return cls.from_metadata(directory, json.load(f), log_defaults)

    @classmethod
    def from_metadata(cls, directory: str, data: dict, log_defaults: LogConfig) -> "Stream":
        """The stream of folder ``directory`` whose metadata (``metadata()``) is ``data``.
        Raises ``ValueError``, ``TypeError`` or ``KeyError`` for bad metadata."""
        config, log_config = _settings(tuple(data["config"].items()), log_defaults)
        stream = cls(data["name"], directory, config, log_defaults, data.get("created_ns"),
                     log_config)
        for partition, state in zip(stream.partitions, data.get("partition_state") or ()):
            partition.load_state(state)
        return stream

    async def close(self) -> None:
        for partition in self.partitions:
            await partition.close()

    def __repr__(self) -> str:
        return f"Stream({self.name!r}, partitions={len(self.partitions)})"


@dataclasses.dataclass(frozen=True, slots=True)
class SuperStream:
    """``partitions[i]`` is bound with ``binding_keys[i]``; the order is the partition order."""

    name: str
    partitions: tuple[str, ...]
    binding_keys: tuple[str, ...]

    def route(self, routing_key: str) -> list[str]:
        """The partitions whose binding key equals ``routing_key`` (exact match, as a
        direct exchange), in partition order; empty when none matches."""
        return [p for p, k in zip(self.partitions, self.binding_keys) if k == routing_key]

    def partition_index(self, stream: str) -> int:
        """Position of ``stream`` among the partitions, -1 when it is not one."""
        try:
            return self.partitions.index(stream)
        except ValueError:
            return -1

    def without(self, stream: str) -> "SuperStream":
        """This super stream with partition ``stream`` unbound (itself when it is none)."""
        if stream not in self.partitions:
            return self
        kept = [(p, k) for p, k in zip(self.partitions, self.binding_keys) if p != stream]
        return SuperStream(self.name, tuple(p for p, _ in kept), tuple(k for _, k in kept))
