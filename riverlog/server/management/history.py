# Message-rate history of the management API and the web view's charts, kept as RabbitMQ's
# management keeps samples: owns a fixed ring of totals per stream and for the whole server,
# taken every ``interval_s`` (5 s, 120 samples: 10 minutes), and turning a ring into
# RabbitMQ's shapes (`message_stats` with `publish`, `publish_details.rate`, and `samples`,
# `avg_rate`, `avg` when a request gives `msg_rates_age` and `msg_rates_incr`).
# Rules: memory is bounded: a ring is one array of ``size`` samples of 5 integers (120
# samples: 4.8 KB; 10,000 streams ~50 MB), made when a stream is first counted, dropped when
# its counters are gone; a stream's sample is appended only when it changed (the last one
# stands for the times after it). A sample reads counters only, never a file: riverlog.metrics'
# Prometheus counters in a worker thread (prometheus_client's collect costs ~5 us a stream
# and counter: 10,000 streams would hold the event loop ~60 ms), the RabbitMQ Stream door's
# publishers and subscriptions on the event loop. Rates are never negative (a counter that
# went back, a publisher gone, counts as no change).
from __future__ import annotations

import array
import asyncio
import collections
import logging
import time
from typing import Any, Callable, Iterable

from prometheus_client import Counter

from ...metrics import DELIVERED_MESSAGES, PUBLISHED_MESSAGES
from ...vhost_names import internal

log = logging.getLogger("riverlog.management")

SERVER = ""  # the ring of the whole server (no stream has an empty name)
PUBLISHED, CONFIRMED, DELIVERED, LAG = 1, 2, 3, 4  # places in a sample after its time (ms)
# message_stats keys (RabbitMQ's) -> place; deliver_get is deliver plus basic.get's (none here)
RATES = (("publish", PUBLISHED), ("confirm", CONFIRMED), ("deliver", DELIVERED),
         ("deliver_get", DELIVERED))
LAG_KEY = "riverlog_consumer_lag"  # a gauge, shaped as RabbitMQ's `messages`/_details
MAX_SAMPLES_ASKED = 1000  # a msg_rates_age/msg_rates_incr asking for more is cut to this


def _counter_totals(counter: Counter) -> dict[str, float]:
    """A counter labelled by ``vhost``, ``stream`` (and door), summed per stream (keyed by
    broker name, riverlog.vhost_names)."""
    totals: dict[str, float] = collections.defaultdict(float)
    for metric in counter.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                labels = sample.labels
                totals[internal(labels["vhost"], labels["stream"])] += sample.value
    return totals


def counted() -> tuple[dict[str, float], dict[str, float]]:
    """(published, delivered) messages per stream since the process started, every door's
    (thread-safe: prometheus_client's counters take their locks)."""
    return _counter_totals(PUBLISHED_MESSAGES), _counter_totals(DELIVERED_MESSAGES)


class Ring:
    """The last ``size`` samples, oldest first, in one array of 8-byte integers: ``append``,
    ``len``, ``ring[i]`` (negative from the newest) and iteration give samples as tuples."""

    WIDTH = 5  # time ms, published, confirmed, delivered, lag
    __slots__ = ("values", "size", "start", "count")

    def __init__(self, size: int) -> None:
        self.values = array.array("q", bytes(8 * self.WIDTH * size))
        self.size, self.start, self.count = size, 0, 0

    def append(self, row: tuple[int, ...]) -> None:
        if self.count < self.size:
            at = (self.start + self.count) % self.size
            self.count += 1
        else:  # full: the newest takes the oldest's place
            at, self.start = self.start, (self.start + 1) % self.size
        self.values[at * self.WIDTH:(at + 1) * self.WIDTH] = array.array("q", row)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[int, ...]:
        if not -self.count <= index < self.count:
            raise IndexError(index)
        at = (self.start + index % self.count) % self.size * self.WIDTH
        return tuple(self.values[at:at + self.WIDTH])

    def __iter__(self):
        return (self[i] for i in range(self.count))

    def at(self, at_ms: int) -> tuple[int, ...] | None:
        """The last sample taken at or before ``at_ms``; None when the ring starts after it
        (a binary search: samples are appended in time order)."""
        low, high = 0, self.count  # the first sample after at_ms is in [low, high]
        while low < high:
            middle = (low + high) // 2
            if self.values[(self.start + middle) % self.size * self.WIDTH] <= at_ms:
                low = middle + 1
            else:
                high = middle
        return self[low - 1] if low else None


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
        self.rings: dict[str, Ring] = {}
        self.times: collections.deque[int] = collections.deque(maxlen=2)  # last two, ms
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
                self.sample(counts=await asyncio.to_thread(counted))
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

    def sample(self, now_ms: int | None = None,
               counts: tuple[dict[str, float], dict[str, float]] | None = None) -> None:
        """Take one sample of every stream and of the server (``now_ms``: its time, ms since
        the epoch; now when None; ``counts``: what ``counted()`` just read, read here when
        None)."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        connections = list(self._connections())
        published, delivered = counted() if counts is None else counts
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
            self._append(stream, row)
            for place in (PUBLISHED, CONFIRMED, DELIVERED, LAG):
                server[place] += row[place]
        self._append(SERVER, tuple(server))
        self.times.append(now_ms)
        for stream in set(self.rings) - streams - {SERVER}:
            del self.rings[stream]

    def _append(self, key: str, row: tuple[int, ...]) -> None:
        """Append ``row`` to ``key``'s ring unless it holds what the ring's newest does."""
        ring = self.rings.get(key)
        if ring is None:
            ring = self.rings[key] = Ring(self.size)
        elif ring[-1][1:] == row[1:]:
            return
        ring.append(row)

    # -- answers ----------------------------------------------------------------------
    def message_stats(self, stream: str = SERVER, age_s: int | None = None,
                      incr_s: int | None = None) -> dict[str, Any]:
        """RabbitMQ's ``message_stats`` of ``stream`` (the server's for SERVER): for each of
        publish, confirm, deliver and deliver_get the count (messages) and ``_details``
        with ``rate`` (messages/s over the last interval); with ``age_s`` and ``incr_s``
        (seconds) also ``samples`` (``{"sample": count, "timestamp": ms}``, newest first,
        one every ``incr_s`` over the last ``age_s``), ``avg_rate`` and ``avg``. {} before a
        first sample."""
        view = self._view(stream, age_s, incr_s)
        if view is None:
            return {}
        stats: dict[str, Any] = {}
        for key, place in RATES:
            stats[key] = view[0][place]
            stats[key + "_details"] = _details(place, *view)
        return stats

    def lag(self, stream: str = SERVER, age_s: int | None = None,
            incr_s: int | None = None) -> dict[str, Any]:
        """The consumers' total lag (messages) of ``stream`` as RabbitMQ gives a gauge:
        ``{"riverlog_consumer_lag": n, "riverlog_consumer_lag_details": {...}}``, the details
        as ``message_stats``' (``rate`` in messages/s). {} before a first sample."""
        view = self._view(stream, age_s, incr_s)
        if view is None:
            return {}
        return {LAG_KEY: view[0][LAG], LAG_KEY + "_details": _details(LAG, *view)}

    def _view(self, stream: str, age_s: int | None, incr_s: int | None) -> tuple | None:
        """What the details of ``stream`` are made of, read from its ring once: (the newest
        sample, the one in force at the sample before the last or None, the seconds between
        them, [(timestamp ms, sample)] newest first when ``age_s``/``incr_s`` ask, else
        None); None without a ring."""
        ring = self.rings.get(stream)
        if not ring:
            return None
        before, elapsed_ms = None, 0
        if len(self.times) == 2:  # from the sample before the last to the last
            before, elapsed_ms = ring.at(self.times[0]), self.times[1] - self.times[0]
        window = None
        if age_s is not None and incr_s is not None and age_s > 0 and incr_s > 0:
            incr_ms = incr_s * 1000
            newest = self.times[-1] // incr_ms * incr_ms
            window = []
            for k in range(min(age_s // incr_s + 1, MAX_SAMPLES_ASKED)):
                row = ring.at(newest - k * incr_ms)
                if row is None:
                    break
                window.append((newest - k * incr_ms, row))
        return ring[-1], before, elapsed_ms, window


def _details(place: int, last: tuple, before: tuple | None, elapsed_ms: int,
             window: list | None) -> dict[str, Any]:
    """The ``_details`` of the value at ``place`` of a ``RateHistory._view``."""
    rate = 0.0 if before is None else _rate(before[place], last[place], elapsed_ms)
    details: dict[str, Any] = {"rate": rate}
    if window is None:
        return details
    samples = details["samples"] = [{"sample": row[place], "timestamp": at}
                                    for at, row in window]
    if samples:
        details["avg"] = sum(s["sample"] for s in samples) / len(samples)
        details["avg_rate"] = _rate(samples[-1]["sample"], samples[0]["sample"],
                                    samples[0]["timestamp"] - samples[-1]["timestamp"])
    return details


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
