# Message-rate history of the management API and the web view's charts, kept as RabbitMQ's
# management keeps samples: owns a fixed ring of totals per stream and for the whole server,
# taken every ``interval_s`` (5 s, 120 samples: 10 minutes), and turning a ring into
# RabbitMQ's shapes (`message_stats` with `publish`, `publish_details.rate`, and `samples`,
# `avg_rate`, `avg` when a request gives `msg_rates_age` and `msg_rates_incr`).
# Rules: memory is bounded (``size`` samples a ring; a stream's ring is dropped when its
# counters are gone); a sample reads counters only (riverlog.metrics' Prometheus counters,
# the RabbitMQ Stream door's publishers and subscriptions), never a file, on the event loop;
# rates are never negative (a counter that went back, a publisher gone, counts as no change).
from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Callable, Iterable

from prometheus_client import Counter

from ...metrics import DELIVERED_MESSAGES, PUBLISHED_MESSAGES

log = logging.getLogger("riverlog.management")

SERVER = ""  # the ring of the whole server (no stream has an empty name)
PUBLISHED, CONFIRMED, DELIVERED, LAG = 1, 2, 3, 4  # places in a sample after its time (ms)
# message_stats keys (RabbitMQ's) -> place; deliver_get is deliver plus basic.get's (none here)
RATES = (("publish", PUBLISHED), ("confirm", CONFIRMED), ("deliver", DELIVERED),
         ("deliver_get", DELIVERED))
LAG_KEY = "riverlog_consumer_lag"  # a gauge, shaped as RabbitMQ's `messages`/_details
MAX_SAMPLES_ASKED = 1000  # a msg_rates_age/msg_rates_incr asking for more is cut to this


def _counter_totals(counter: Counter) -> dict[str, float]:
    """A counter labelled by ``stream`` (and door), summed per stream."""
    totals: dict[str, float] = collections.defaultdict(float)
    for metric in counter.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                totals[sample.labels["stream"]] += sample.value
    return totals


class RateHistory:
    """Samples of published, confirmed and delivered message totals and of consumer lag, per
    stream and for the whole server: one every ``interval_s`` seconds while ``start()``ed,
    the last ``size`` kept. ``connections()`` gives the RabbitMQ Stream door's connections
    (their publishers' ``confirmed`` and subscriptions' lag are read from them).

    A sample is ``(time ms, published, confirmed, delivered, lag)``: cumulative message
    counts since the process started, and the consumers' total lag in messages."""

    def __init__(self, connections: Callable[[], Iterable], interval_s: float = 5.0,
                 size: int = 120) -> None:
        if interval_s <= 0 or size < 2:
            raise ValueError("a rate history needs interval_s > 0 and size >= 2")
        self.interval_s = interval_s
        self.size = size
        self._connections = connections
        self.rings: dict[str, collections.deque] = {}
        self._confirmed_seen: dict[tuple, tuple[str, int]] = {}  # publisher -> stream, count
        self._confirmed_gone: dict[str, int] = collections.defaultdict(int)
        self._task: asyncio.Task | None = None

    # -- sampling ---------------------------------------------------------------------
    def start(self) -> None:
        """Take a sample now and every ``interval_s`` on the running loop until ``stop``."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """End the sampling (the samples stay)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # a sample must not end the history; say why once a minute
                log.exception("cannot sample message rates")
                await asyncio.sleep(60)
            await asyncio.sleep(self.interval_s)

    def _confirmed(self, connections: list) -> dict[str, int]:
        """Messages confirmed per stream: the live publishers' counts plus the last counts of
        publishers gone (RabbitMQ counts confirms per channel; riverlog's door per
        publisher)."""
        seen: dict[tuple, tuple[str, int]] = {}
        for conn in connections:
            for pub in list(conn.publishers.values()):
                seen[(id(conn), pub.id, pub.name)] = (pub.name, pub.confirmed)
        for key, (stream, count) in self._confirmed_seen.items():
            now = seen.get(key)
            if now is None or now[1] < count:  # gone, or a new publisher under an old key
                self._confirmed_gone[stream] += count
        self._confirmed_seen = seen
        totals = collections.defaultdict(int, self._confirmed_gone)
        for stream, count in seen.values():
            totals[stream] += count
        return totals

    def sample(self, now_ms: int | None = None) -> None:
        """Take one sample of every stream and of the server (``now_ms``: its time, ms since
        the epoch; now when None)."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        connections = list(self._connections())
        published = _counter_totals(PUBLISHED_MESSAGES)
        delivered = _counter_totals(DELIVERED_MESSAGES)
        confirmed = self._confirmed(connections)
        lag: dict[str, int] = collections.defaultdict(int)
        for conn in connections:
            for sub in list(conn.subscriptions.values()):
                lag[sub.name] += max(sub.partition.committed_offset + 1 - sub.offset, 0)
        streams = set(published) | set(delivered) | set(confirmed) | set(lag)
        server = [now_ms, 0, 0, 0, 0]
        for stream in streams:
            row = (now_ms, int(published.get(stream, 0)), confirmed.get(stream, 0),
                   int(delivered.get(stream, 0)), lag.get(stream, 0))
            self._ring(stream).append(row)
            for place in (PUBLISHED, CONFIRMED, DELIVERED, LAG):
                server[place] += row[place]
        self._ring(SERVER).append(tuple(server))
        for stream in set(self.rings) - streams - {SERVER}:
            del self.rings[stream]

    def _ring(self, key: str) -> collections.deque:
        ring = self.rings.get(key)
        if ring is None:
            ring = self.rings[key] = collections.deque(maxlen=self.size)
        return ring

    # -- answers ----------------------------------------------------------------------
    def message_stats(self, stream: str = SERVER, age_s: int | None = None,
                      incr_s: int | None = None) -> dict[str, Any]:
        """RabbitMQ's ``message_stats`` of ``stream`` (the server's for SERVER): for each of
        publish, confirm, deliver and deliver_get the count (messages) and ``_details``
        with ``rate`` (messages/s over the last interval); with ``age_s`` and ``incr_s``
        (seconds) also ``samples`` (``{"sample": count, "timestamp": ms}``, newest first,
        one every ``incr_s`` over the last ``age_s``), ``avg_rate`` and ``avg``. {} before a
        first sample."""
        ring = self.rings.get(stream)
        if not ring:
            return {}
        stats: dict[str, Any] = {}
        for key, place in RATES:
            stats[key] = ring[-1][place]
            stats[key + "_details"] = self._details(ring, place, age_s, incr_s)
        return stats

    def lag(self, stream: str = SERVER, age_s: int | None = None,
            incr_s: int | None = None) -> dict[str, Any]:
        """The consumers' total lag (messages) of ``stream`` as RabbitMQ gives a gauge:
        ``{"riverlog_consumer_lag": n, "riverlog_consumer_lag_details": {...}}``, the details
        as ``message_stats``' (``rate`` in messages/s). {} before a first sample."""
        ring = self.rings.get(stream)
        if not ring:
            return {}
        return {LAG_KEY: ring[-1][LAG],
                LAG_KEY + "_details": self._details(ring, LAG, age_s, incr_s)}

    def _details(self, ring: collections.deque, place: int, age_s: int | None,
                 incr_s: int | None) -> dict[str, Any]:
        rate = 0.0
        if len(ring) > 1:
            (t0, *_), (t1, *_) = ring[-2], ring[-1]
            rate = _rate(ring[-2][place], ring[-1][place], t1 - t0)
        details: dict[str, Any] = {"rate": rate}
        if age_s is None or incr_s is None or age_s <= 0 or incr_s <= 0:
            return details
        incr_ms = incr_s * 1000
        newest = ring[-1][0] // incr_ms * incr_ms
        count = min(age_s // incr_s + 1, MAX_SAMPLES_ASKED)
        samples = []
        for k in range(count):
            at = newest - k * incr_ms
            value = _at(ring, place, at)
            if value is None:
                break
            samples.append({"sample": value, "timestamp": at})
        details["samples"] = samples
        if samples:
            details["avg"] = sum(s["sample"] for s in samples) / len(samples)
            details["avg_rate"] = _rate(samples[-1]["sample"], samples[0]["sample"],
                                        samples[0]["timestamp"] - samples[-1]["timestamp"])
        return details


def _at(ring: collections.deque, place: int, at_ms: int) -> int | None:
    """The value at ``place`` of the last sample taken at or before ``at_ms``; None when the
    ring starts after it."""
    found = None
    for row in ring:
        if row[0] > at_ms:
            break
        found = row[place]
    return found


def _rate(before: int, after: int, elapsed_ms: int) -> float:
    """Messages per second from ``before`` to ``after`` over ``elapsed_ms``, never negative."""
    if elapsed_ms <= 0 or after <= before:
        return 0.0
    return round((after - before) * 1000 / elapsed_ms, 1)


def rates_window(query) -> tuple[int | None, int | None]:
    """``msg_rates_age`` and ``msg_rates_incr`` (seconds) of a request's query; (None, None)
    when either is missing. Raises ValueError for values that are not positive integers."""
    age, incr = query.get("msg_rates_age"), query.get("msg_rates_incr")
    if age is None or incr is None:
        return None, None
    age_s, incr_s = int(age), int(incr)
    if age_s <= 0 or incr_s <= 0:
        raise ValueError("msg_rates_age and msg_rates_incr must be positive")
    return age_s, incr_s
