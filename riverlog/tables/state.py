# What the server tells a table writer about a partition, and what the writer answers: the
# values of the worker's JSON lines (riverlog.tables.writer's loop), shared by the Parquet
# mirror and the Iceberg writer. Rules: plain values only (they cross a pipe as JSON).
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PartitionState:
    """What the server tells about one table-enabled partition: the stream's ``created_ns``,
    the partition's ``log_dir``, its segments ``[(base offset, next offset)]`` oldest first,
    ``first`` (oldest offset kept), ``committed`` (newest committed offset, -1: none) and
    ``leader_epoch`` (the partition's leader epoch at this server: 1 on a single server)."""

    stream: str
    partition: int
    created_ns: int
    log_dir: str
    segments: list[tuple[int, int]]
    first: int
    committed: int
    leader_epoch: int = 1


@dataclasses.dataclass(frozen=True)
class Status:
    """A partition's table after a pass: offsets ``[first, end)`` (None: empty), files,
    bytes, and the error that stopped the pass (None: up to date)."""

    stream: str
    partition: int
    first: int | None
    end: int | None
    files: int
    bytes: int
    error: str | None = None
