# `riverlog serve --workers N`: one server made of N `riverlog serve` processes on this
# machine, run as one cluster (issue 31 item 0; docs/operations.md "Workers"). One server is
# one event loop and uses one core; N workers use N, as `riverlog cluster up` does.
# Owns the layout of DATA/workers/ (worker <id>'s data and riverlog.log in DATA/workers/<id>/,
# the ports in DATA/workers/cluster.json, the Raft password), the ports each worker takes, the
# workers' command lines and their supervision.
# Rules:
# - worker s0 takes the ports the configuration names (clients and the management API are
#   where one process would have them); the others take free ports, saved and reused while
#   free (riverlog.cluster.local.layout); the configured /metrics port is the supervising
#   process's, which answers for every worker (workers_metrics.py);
# - every worker runs the user's own command line and configuration; only the data folder,
#   the id, the ports and the cluster settings are replaced (flags given later win); the
#   tables folder is the configuration's, shared;
# - a stream created without a replication factor gets one replica
#   (riverlog.stream.initial.cluster.size, 1 unless the configuration names another), so a
#   machine's workers share its streams out instead of copying them; leaders spread as in any
#   cluster, and clients reach each stream's leader through the protocols' own metadata;
# - a worker that exits while the server runs is started again (at most once per
#   RESTART_PAUSE_S); SIGTERM or SIGINT stops every worker (SIGTERM, then SIGKILL after
#   local.STOP_GRACE_S) and the server exits 0.
from __future__ import annotations

import logging
import os
import signal
import time
from typing import Callable, Sequence

from ..config import ServerConfig
from ..data_layout import LAYOUT_FILE
from .local import WORKERS_ENV, LocalCluster, Member, layout, saved_servers, serve_command
from .workers_metrics import serve_metrics

log = logging.getLogger("riverlog.workers")

WORKERS_DIR = "workers"
AUTO = "auto"
"""``--workers auto``: one per core (``auto_count``); the default."""
INITIAL_SIZE_ENV = "LIFTBRIDGE_RIVERLOG_STREAM_INITIAL_CLUSTER_SIZE"
PEERS_ENV = "LIFTBRIDGE_RIVERLOG_MANAGEMENT_PEERS"
RESTART_PAUSE_S = 5.0
DROPPED_FLAGS = {"--workers": 1, "--raft-bootstrap-seed": 0}
"""Flags of the user's command line a worker does not get, and how many values follow."""


def worker_count(value: str, config: ServerConfig) -> int:
    """``--workers`` for ``config``: a count of at least 1, or ``auto`` (AUTO, the default).
    ``auto`` is the cores this process may run on when ``config`` can run as workers and its
    data folder is new or holds workers already (then their saved count), else 1, logging
    why (``auto_count``). Raises ValueError for anything else."""
    if value == AUTO:
        count, why = auto_count(config)
        if why:
            log.info("--workers auto: one process: %s", why)
        return count
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"--workers {value!r}: give a number of workers or 'auto'") from None
    if count < 1:
        raise ValueError(f"--workers {count}: at least 1")
    return count


def auto_count(config: ServerConfig) -> tuple[int, str | None]:
    """What ``--workers auto`` means for ``config``: ``(count, None)``, or ``(1, why)`` when it
    keeps one process: settings workers cannot run with (``check``), or a data folder that
    holds one process's data (DATA/layout or DATA/streams: it is not moved into workers).
    A data folder of workers (DATA/workers/cluster.json) keeps its saved count; a new one
    gets one worker per core this process may run on (os.sched_getaffinity)."""
    unfit = _unfit(config)
    if unfit is not None:
        return 1, _UNFIT[unfit][0]
    data = config.data_dir
    single = [n for n in (LAYOUT_FILE, "streams") if os.path.exists(os.path.join(data, n))]
    if single:
        return 1, (f"{data} holds the data of one process ({', '.join(single)}), which is "
                   f"not moved into workers; give --workers N to start workers beside it")
    saved = saved_servers(os.path.join(data, WORKERS_DIR))
    return (len(saved) if saved else cores()), None


def cores() -> int:
    """The cores this process may run on (its CPU affinity; os.cpu_count where that is not
    known), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS)
        return os.cpu_count() or 1


_UNFIT = {
    "cluster": ("it is a cluster member (riverlog.raft.*)",
                "--workers runs its own cluster: drop the clustering settings "
                "(riverlog.raft.*) or run one worker"),
    "nats": ("it uses an external NATS (--nats-servers)",
             "--workers runs an embedded nats-server per worker: drop --nats-servers or "
             "run one worker"),
    "advertised": ("it advertises a port",
                   "--workers: each worker tells clients its own port; drop the advertised "
                   "port or run one worker"),
}
"""Why a configuration cannot run as workers: key -> (what ``auto`` logs, check's error)."""


def _unfit(config: ServerConfig) -> str | None:
    """The _UNFIT key of the first setting ``config`` has that workers cannot run with."""
    if config.cluster is not None:
        return "cluster"
    if config.nats is not None and config.nats.servers:
        return "nats"
    if config.rabbitmq_stream.advertised_port is not None or (
            config.grpc is not None and config.grpc.advertised_port is not None):
        return "advertised"
    return None


def check(config: ServerConfig) -> None:
    """Raise ValueError when ``config`` cannot run as workers: they are a cluster of their
    own (no clustering settings), on an embedded nats-server each (no --nats-servers), and
    each tells clients its own port (no advertised port)."""
    unfit = _unfit(config)
    if unfit is not None:
        raise ValueError(_UNFIT[unfit][1])


def members(config: ServerConfig, count: int) -> list[Member]:
    """The workers of the server of ``config``: ``count`` members (ids s0, s1, ...) whose
    ports are saved in DATA/workers/cluster.json, the first on the ports ``config`` names
    (a port 0 there: the saved free one). Raises ValueError (see local.layout)."""
    host = config.rabbitmq_stream.host
    found = layout(os.path.join(config.data_dir, WORKERS_DIR), count, host,
                   config.rabbitmq_stream.advertised_host)
    named = {"stream": config.rabbitmq_stream.port,
             "grpc": config.grpc.port if config.grpc is not None else 0,
             "nats": config.nats.port if config.nats is not None else 0,
             "management": config.management.port if config.management is not None else 0}
    first = {**found[0].ports, **{k: v for k, v in named.items() if v}}
    clash = {v for k, v in first.items() if k in named} & {
        p for m in found[1:] for p in m.ports.values()}
    if clash:  # a saved free port of another worker is now one the configuration names
        raise ValueError(f"port {min(clash)} is named by the configuration and saved for "
                         f"another worker in {config.data_dir}/{WORKERS_DIR}/cluster.json; "
                         f"delete that file to pick new ports")
    return [Member(found[0].id, first, found[0].host, found[0].advertise), *found[1:]]


def worker_arguments(argv: Sequence[str]) -> list[str]:
    """The user's `serve` arguments (after ``serve``) a worker is started with: all but
    DROPPED_FLAGS (``--flag value`` or ``--flag=value``)."""
    out, skip = [], 0
    for arg in argv:
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name in DROPPED_FLAGS:
            skip = DROPPED_FLAGS[name] if "=" not in arg else 0
            continue
        out.append(arg)
    return out


class Workers(LocalCluster):
    """The N workers of one server: a LocalCluster in DATA/workers whose members run the
    user's `serve` arguments ``argv`` with their own data folder, id, ports and cluster
    settings, and ``initial_size`` replicas for a stream that names none."""

    def __init__(self, config: ServerConfig, count: int, argv: Sequence[str],
                 initial_size: int = 1) -> None:
        check(config)
        directory = os.path.join(config.data_dir, WORKERS_DIR)
        super().__init__(directory, count, config.rabbitmq_stream.host,
                         config.rabbitmq_stream.advertised_host,
                         members=members(config, count))
        self.arguments = worker_arguments(argv)
        table_dir = config.table_dir  # a folder, or a URI (s3://...) as it is
        self.table_dir = table_dir if "://" in table_dir else os.path.abspath(table_dir)
        self.initial_size = initial_size
        self.management = config.management is not None
        self.metrics = config.metrics  # None: no /metrics; else the supervisor's
        self.metrics_port = 0  # where the supervisor serves it, once ``run`` started

    def command(self, member: Member) -> tuple[list[str], dict[str, str]]:
        command, env = serve_command(member, self.members, self.directory)
        command[command.index("--table-dir") + 1] = self.table_dir
        if not self.management:  # the user turned them off: no worker has one
            command += ["--no-management"]
        if self.metrics is None:
            command += ["--no-metrics"]
        serve = command.index("serve") + 1
        command[serve:serve] = self.arguments  # the worker's own flags come later and win
        peers = ",".join(f"http://{_host(m.advertised)}:{m.ports['management']}"
                         for m in self.members if m is not member)
        return command, {**env, INITIAL_SIZE_ENV: str(self.initial_size), PEERS_ENV: peers}

    def supervise(self, stopping: Callable[[], bool]) -> None:
        """Until ``stopping()``: start again a worker that exited (at most once per
        RESTART_PAUSE_S each), logging its exit code."""
        started = {m.id: time.monotonic() for m in self.members}
        while not stopping():
            for index, member in enumerate(self.members):
                code = self.procs[index].poll()
                if code is None or time.monotonic() - started[member.id] < RESTART_PAUSE_S:
                    continue
                log.error("worker %s exited with code %s (see %s); starting it again",
                          member.id, code,
                          os.path.join(self.directory, member.id, "riverlog.log"))
                self.restart(index)
                started[member.id] = time.monotonic()
            time.sleep(0.2)


def run(workers: Workers, announce: Callable[[Workers], None],
        timeout: float = 120.0) -> None:
    """Serve the workers' /metrics (when configured), start ``workers``, wait until each is
    registered in the cluster metadata, tell ``announce``, supervise them until SIGINT or
    SIGTERM, then stop them all. Raises OSError (the /metrics port), RuntimeError (a worker
    exited while starting) or TimeoutError, after stopping them."""
    metrics = None
    if workers.metrics is not None:
        metrics, workers.metrics_port = serve_metrics(
            workers.metrics.host, workers.metrics.port,
            {m.id: f"http://{_host(m.advertised)}:{m.ports['metrics']}/metrics"
             for m in workers.members})
    stop: list[int] = []

    def on_signal(signum, frame) -> None:
        stop.append(signum)
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        workers.start()
        try:
            workers.wait_registered(timeout, stopping=lambda: bool(stop))
            if not stop:
                announce(workers)
                workers.supervise(lambda: bool(stop))
        finally:
            workers.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if metrics is not None:
            metrics.shutdown()


def _host(host: str) -> str:
    """``host`` as a URL writes it (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host
