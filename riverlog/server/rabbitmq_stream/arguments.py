# Create arguments of the RabbitMQ Stream door: what a Create (or CreateSuperStream) frame's
# argument map means as a StreamConfig, checked as RabbitMQ checks it.
# Rules: a bad value raises InvalidArgumentError (the door answers PRECONDITION_FAILED, 0x11);
# arguments RabbitMQ takes but riverlog has no use for are checked, then logged and ignored;
# no I/O, no broker state.
# Sources: rabbit_stream_manager:validate_stream_queue_arguments,
# rabbit_stream_queue:check_max_segment_size_bytes/check_filter_size, initial_cluster_size.
from __future__ import annotations

import json
import logging
import re
from typing import Callable

from ...broker import StreamConfig
from ...config import MIN_SEGMENT_MAX_BYTES
from ...errors import InvalidArgumentError
from ...log import bloom
from ...tables import TABLE_ARGUMENT

log = logging.getLogger("riverlog.rabbitmq_stream")

_AGE = re.compile(r"^\s*(\d+)\s*([YMDhms])\s*$")
_AGE_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000, "h": 3_600_000,
           "m": 60_000, "s": 1000}
# Create argument limits, RabbitMQ's (rabbit_stream_manager:validate_stream_queue_arguments,
# rabbit_stream_queue:check_max_segment_size_bytes/check_filter_size): anything else is taken.
MAX_SEGMENT_SIZE_BYTES = 3_000_000_000
LEADER_LOCATORS = frozenset(("client-local", "balanced", "random", "least-leaders",
                             "min-masters"))
# arguments checked as RabbitMQ checks them, then without effect (chunk filters keep
# bloom.DEFAULT_SIZE; the initial cluster size counts in a cluster only)
_CHECKED_ONLY: dict[str, Callable[[str], bool]] = {
    "initial-cluster-size": lambda value: int(value) >= 1,
    "queue-leader-locator": lambda value: value in LEADER_LOCATORS,
    "stream-filter-size-bytes": lambda value: bloom.MIN_SIZE <= int(value) <= bloom.MAX_SIZE,
    "x-queue-type": lambda value: True,
}


# the queue arguments RabbitMQ compares when a stream is declared again, and whether as
# integers (rabbit_stream_queue capabilities' queue_arguments, rabbit_stream_manager:
# stream_queue_arguments; x-queue-type is "stream" on both sides)
_EQUIVALENT: dict[str, bool] = {
    "max-length-bytes": True, "max-age": False, "stream-max-segment-size-bytes": True,
    "stream-filter-size-bytes": True, "initial-cluster-size": True,
    "queue-leader-locator": False}


def max_age_ms(value: str) -> int:
    """Milliseconds of a RabbitMQ ``max-age`` (``7D``, ``12h``, ``30s``; units Y M D h m s,
    rabbit_amqqueue:check_max_age). Raises ValueError for anything else."""
    m = _AGE.match(value)
    if not m:
        raise ValueError(value)
    return int(m.group(1)) * _AGE_MS[m.group(2)]


def equivalence_arguments(arguments: dict[str, str]) -> str:
    """The Create ``arguments`` RabbitMQ compares on a Create of an existing stream, as a
    JSON object with sorted keys (integers as integers, the others as written: ``7D`` and
    ``168h`` differ, as in RabbitMQ). Raises ValueError for an integer argument that is
    none (stream_config_from_arguments refuses it first)."""
    return json.dumps({key: int(value) if _EQUIVALENT[key] else value
                       for key, value in arguments.items() if key in _EQUIVALENT},
                      sort_keys=True)


def stream_config_for(arguments: dict[str, str], placement) -> StreamConfig:
    """``stream_config_from_arguments`` on a server with ``placement``
    (riverlog.broker.placement.Placement): in a cluster, its size and its
    ``initial_cluster_size`` for a stream that names none."""
    if not placement.clustered:
        return stream_config_from_arguments(arguments)
    return stream_config_from_arguments(arguments, len(placement.servers()),
                                        placement.initial_cluster_size)


def stream_config_from_arguments(arguments: dict[str, str], cluster_size: int | None = None,
                                 default_size: int | None = None) -> StreamConfig:
    """Translate Create arguments to a StreamConfig, validating them as RabbitMQ does:
    ``max-length-bytes``; ``max-age`` (e.g. ``7D``, ``12h``, ``30s``; units Y M D h m s);
    ``stream-max-segment-size-bytes`` up to 3,000,000,000, raised to the commit log's
    smallest segment (MIN_SEGMENT_MAX_BYTES) when below it, as RabbitMQ takes any smaller
    value; ``initial-cluster-size`` (at least 1): in a cluster of ``cluster_size`` servers
    the replication factor, at most every server; when not given ``default_size`` (at most
    every server) or, None, every server (rabbit_stream_queue:initial_cluster_size,
    rabbit_queue_location:select_members), on a
    single server (``cluster_size`` None) checked only; ``queue-leader-locator`` (one of
    LEADER_LOCATORS) and ``stream-filter-size-bytes`` (16..255) are checked, then ignored
    with a log line, as are unknown arguments; riverlog's ``x-riverlog-table``
    (``true``/``false``: mirror the stream to Parquet). Raises ``InvalidArgumentError``."""
    kwargs = {}
    if cluster_size is not None:
        kwargs["replication_factor"] = -1 if default_size is None else min(default_size,
                                                                           cluster_size)
    for key, value in arguments.items():
        try:
            if key == "initial-cluster-size" and cluster_size is not None:
                if int(value) < 1:
                    raise ValueError(value)
                kwargs["replication_factor"] = min(int(value), cluster_size)
            elif key == "max-length-bytes":
                kwargs["retention_max_bytes"] = int(value)
            elif key == "stream-max-segment-size-bytes":
                size = int(value)
                if size > MAX_SEGMENT_SIZE_BYTES:
                    raise ValueError(value)
                if size < MIN_SEGMENT_MAX_BYTES:
                    log.info("Create: %s=%s raised to %d bytes, the smallest segment", key,
                             value, MIN_SEGMENT_MAX_BYTES)
                kwargs["segment_max_bytes"] = max(size, MIN_SEGMENT_MAX_BYTES)
            elif key == "max-age":
                kwargs["retention_max_age_ms"] = max_age_ms(value)
            elif key == TABLE_ARGUMENT:
                kwargs["table"] = {"true": True, "false": False}[value.strip().lower()]
            elif key in _CHECKED_ONLY:
                if not _CHECKED_ONLY[key](value):
                    raise ValueError(value)
                log.info("Create: argument %s=%s has no effect here", key, value)
            else:
                log.info("Create: unknown argument %s=%s ignored", key, value)
        except (ValueError, KeyError):
            raise InvalidArgumentError(f"bad value for {key}: {value!r}") from None
    return StreamConfig(**kwargs, rabbitmq_arguments=equivalence_arguments(arguments))

