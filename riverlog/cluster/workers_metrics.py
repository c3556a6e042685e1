# The one /metrics of `riverlog serve --workers N` (riverlog.cluster.workers): when Prometheus
# scrapes the server, every worker's own /metrics is scraped and the samples are answered as
# one exposition, each with a `worker` label (the worker's id), plus `riverlog_worker_up`
# (1: its /metrics answered within SCRAPE_TIMEOUT_S, 0: not; its samples are then absent).
# Rules: parsing and writing the text format are prometheus_client's; families of the same
# name from several workers become one family; a worker that does not answer never fails the
# scrape; nothing here runs on a data path (a daemon thread of the supervising process).
from __future__ import annotations

import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from ..prometheus_http import serve_registry

SCRAPE_TIMEOUT_S = 5.0
WORKER_LABEL = "worker"


def _scrape(url: str) -> str | None:
    """The exposition text at ``url``; None when it does not answer in time."""
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as answer:
            return answer.read().decode("utf-8")
    except (OSError, ValueError):
        return None


class WorkersCollector(Collector):
    """Collects the /metrics of ``targets`` (worker id -> its /metrics URL), scraped in
    parallel at each collect()."""

    def __init__(self, targets: Mapping[str, str]) -> None:
        self.targets = dict(targets)
        self._pool = ThreadPoolExecutor(max(1, len(self.targets)),
                                        thread_name_prefix="workers-metrics")

    def collect(self) -> Iterable[Metric]:
        texts = dict(zip(self.targets, self._pool.map(_scrape, self.targets.values())))
        up = GaugeMetricFamily("riverlog_worker_up", "1 when the worker's /metrics answered "
                               "this scrape, 0 when not", labels=[WORKER_LABEL])
        merged: dict[str, Metric] = {}
        for worker, text in texts.items():
            up.add_metric([worker], 0.0 if text is None else 1.0)
            if text is None:
                continue
            for family in text_string_to_metric_families(text):
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation,
                                                        family.type, family.unit)
                for s in family.samples:
                    into.add_sample(s.name, {**s.labels, WORKER_LABEL: worker}, s.value,
                                    s.timestamp, s.exemplar)
        yield up
        yield from merged.values()


def serve_metrics(host: str, port: int, targets: Mapping[str, str]) -> tuple[object, int]:
    """Serve GET /metrics of every worker of ``targets`` on ``host``:``port`` (0: a free
    one) from a daemon thread. Returns (the HTTP server, to ``shutdown()``; the port).
    Raises OSError when the port cannot be listened on."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkersCollector(targets))
    server = serve_registry(host, port, registry)
    return server, server.server_port
