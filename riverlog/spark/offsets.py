# Offset planning on the driver: which partitions the listed streams have, what offsets are
# available, how earliest/latest/JSON/timestamp specs resolve, data-loss checks, splitting
# ranges into tasks (minPartitions) and read limits (maxOffsetsPerTrigger).
# Rules: offsets are the JSON-safe nested dict ``{stream: {"partition": offset}}`` (string
# partition keys, as Spark hands them back); ranges are half-open ``[start, end)`` record
# offsets; only this module maps (stream, partition) to a RabbitMQ stream name (a RabbitMQ
# stream is one partition: partition 0 is the stream itself).
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ..client import Client
from ..errors import RiverlogError
from .options import EARLIEST, LATEST

Offsets = dict[str, dict[str, int]]
Held = Callable[[str, int, int], int]


class DataLossError(RiverlogError):
    """Records a query expected are gone (retention removed them, or the stream was
    recreated); raised when ``failOnDataLoss`` is true."""


@dataclass(frozen=True)
class Range:
    """Records ``[start, end)`` of ``partition`` of ``stream``."""

    stream: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(self.end - self.start, 0)


def address(stream: str, partition: int) -> str:
    """The RabbitMQ Stream name serving ``partition`` of ``stream``. Raises ValueError for
    a partition the RabbitMQ door does not serve."""
    if partition != 0:
        raise ValueError(f"stream {stream!r} has no partition {partition} on the RabbitMQ "
                         "Stream door (a RabbitMQ stream is one partition)")
    return stream


def partitions_of(client: Client, stream: str) -> list[int]:
    """Partition numbers of ``stream``. Raises ValueError when the stream does not exist."""
    code = client.metadata(stream)[stream][0]
    if code != 1:
        raise ValueError(f"stream {stream!r} does not exist on {client.host}:{client.port}")
    return [0]


def available(client: Client, streams: tuple[str, ...],
              held: Held | None = None) -> tuple[Offsets, Offsets]:
    """``(first, end)``: per partition, the oldest offset kept and the offset after the
    newest committed record. ``held(stream, partition, log first)``: the oldest offset
    kept counting the stream's table (riverlog.tables.read.TableFiles.first)."""
    first: Offsets = {}
    end: Offsets = {}
    for stream in streams:
        first[stream], end[stream] = {}, {}
        for p in partitions_of(client, stream):
            lo, hi = client.offset_range(address(stream, p))
            if held is not None:
                lo = held(stream, p, lo)
            first[stream][str(p)], end[stream][str(p)] = lo, hi
    return first, end


def resolve(client: Client, spec: object, default: str, first: Offsets, end: Offsets,
            timestamp_ms: int | None = None) -> Offsets:
    """Offsets for ``spec`` ("earliest", "latest", a JSON dict with -2/-1 sentinels; None
    means ``default``) or, when ``timestamp_ms`` is given, the first offset of the first
    chunk stored at or after it (``end`` when there is none). Partitions missing from a
    JSON spec take ``default``."""
    out: Offsets = {}
    for stream, parts in first.items():
        out[stream] = {}
        for p in parts:
            if timestamp_ms is not None:
                found = client.offset_for_timestamp(address(stream, int(p)), timestamp_ms)
                out[stream][p] = end[stream][p] if found is None else found
                continue
            s = spec if spec is not None else default
            if isinstance(s, dict):
                value = s.get(stream, {}).get(p)
                s = default if value is None else value
            if s == "earliest" or s == EARLIEST:
                out[stream][p] = first[stream][p]
            elif s == "latest" or s == LATEST:
                out[stream][p] = end[stream][p]
            else:
                out[stream][p] = int(s)
    return out


def check_loss(start: Offsets, first: Offsets, end: Offsets, fail: bool) -> Offsets:
    """``start`` with every offset below the partition's first kept offset (or past its end:
    the stream was recreated) moved to the first kept offset; raises DataLossError instead
    when ``fail``."""
    out: Offsets = {}
    for stream, parts in start.items():
        out[stream] = {}
        for p, offset in parts.items():
            lo, hi = first.get(stream, {}).get(p), end.get(stream, {}).get(p)
            if lo is not None and offset < lo:
                if fail:
                    raise DataLossError(
                        f"stream {stream!r} partition {p}: offsets {offset}..{lo - 1} are no "
                        "longer available (removed by retention); set failOnDataLoss=false "
                        "to skip them")
                offset = lo
            elif hi is not None and offset > hi:
                if fail:
                    raise DataLossError(
                        f"stream {stream!r} partition {p}: offset {offset} is past the end "
                        f"({hi}): the stream was deleted and recreated; set "
                        "failOnDataLoss=false to start again from its first offset")
                offset = lo if lo is not None else hi
            out[stream][p] = offset
    return out


def ranges(start: Offsets, end: Offsets) -> list[Range]:
    """One Range per partition present in both, possibly empty."""
    out = []
    for stream, parts in end.items():
        for p, hi in parts.items():
            lo = start.get(stream, {}).get(p, hi)
            out.append(Range(stream, int(p), lo, max(lo, hi)))
    return out


def split(rs: list[Range], min_partitions: int | None) -> list[Range]:
    """Drop empty ranges; with ``min_partitions`` larger than their number, cut each range
    into ``ceil(size * min_partitions / total)`` nearly equal pieces (Kafka's rule), so the
    work spreads over at least that many tasks."""
    rs = [r for r in rs if r.size > 0]
    if not min_partitions or len(rs) >= min_partitions:
        return rs
    total = sum(r.size for r in rs)
    out = []
    for r in rs:
        pieces = min(max(1, math.ceil(r.size * min_partitions / total)), r.size)
        step = r.size / pieces
        bounds = [r.start + round(i * step) for i in range(pieces)] + [r.end]
        out += [Range(r.stream, r.partition, a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    return out


def limit(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """End offsets reading at most ``max_rows`` records in total from ``start``, shared out
    in proportion to each partition's backlog (Kafka's maxOffsetsPerTrigger rule: a share
    below one record rounds up, otherwise down)."""
    lags = {(s, p): max(hi - start.get(s, {}).get(p, hi), 0)
            for s, parts in latest.items() for p, hi in parts.items()}
    total = sum(lags.values())
    out: Offsets = {s: dict(parts) for s, parts in latest.items()}
    if total <= max_rows:
        return out
    for (s, p), lag in lags.items():
        begin = start.get(s, {}).get(p, latest[s][p])
        share = max_rows * lag / total
        take = math.ceil(share) if share < 1 else math.floor(share)
        out[s][p] = min(begin + take, latest[s][p])
    return out
