# `riverlog cluster up`: a cluster of N `riverlog serve` processes on this machine, for trying
# clustering and for tests (docs/clustering.md "Three servers on one machine"). Owns the
# layout of DIR (one data folder per server, `DIR/<id>/`, its log in `DIR/<id>/riverlog.log`,
# the Raft password in `DIR/raft-password`, mode 0600, generated once; the streams' tables and
# their Iceberg catalog (SQLite) in `DIR/tables`, shared by every server; the ports of every door
# in `DIR/cluster.json`, reused by the next `up` when they are still free; a Raft port must
# be: the members know each other by it), starting the
# servers, waiting until every one is registered in the cluster metadata, and stopping them.
# Rules: every port is free when picked (never a fixed default; below the kernel's ephemeral
# range, so no outgoing connection takes it before the next start), the password never appears on
# a command line (it goes through the environment), a server that exits while starting stops
# the start, and the children are stopped with SIGTERM (SIGKILL after a grace period). What the
# servers are told of each other and tell clients (Raft members, NATS routes, advertised doors,
# the printed table) is the advertised host, never a wildcard: bound to 0.0.0.0 or ::, the
# servers advertise loopback unless told another host; Raft listens on the advertised host
# only (its port is the cluster's own, keep it off other networks when there is no need).
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from typing import Callable

PASSWORD_FILE = "raft-password"
LAYOUT_FILE = "cluster.json"
WORKERS_ENV = "RIVERLOG_WORKERS"
"""`riverlog serve --workers` from the environment; a member runs with it set to 1."""
TABLES = "tables"
"""DIR/tables: the table folder every server shares, with the Iceberg catalog's SQLite file
(riverlog.tables.iceberg.CATALOG_FILE): one catalog every member reaches."""
PORTS = ("stream", "grpc", "nats", "nats_cluster", "raft", "metrics", "management")
"""The ports each server takes, by what listens there."""
STOP_GRACE_S = 15.0
LOOPBACK = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}
"""The host a wildcard bind address is reached at on this machine."""


def advertised_host(host: str, advertise: str | None = None) -> str:
    """Where the servers bound to ``host`` are reached: ``advertise`` when given, else
    ``host``, or loopback for a wildcard (0.0.0.0, ::)."""
    return advertise or LOOPBACK.get(host, host)


def check_advertise(host: str, advertise: str | None) -> None:
    """Raise ValueError when the servers, listening on ``host``, cannot be reached at
    ``advertise``: only a wildcard ``host`` listens on every address; any other must be
    ``advertise`` or one it resolves to (socket.getaddrinfo)."""
    if not advertise or host in LOOPBACK or advertise == host:
        return
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(advertise, None)}
    except OSError:
        resolved = set()
    if host not in resolved:
        raise ValueError(f"--advertise {advertise} is no address of --host {host}: the doors and "
                         f"the NATS routes listen on --host only (bind to 0.0.0.0 or :: to be "
                         f"reached at another address)")


def _address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclasses.dataclass(frozen=True, slots=True)
class Member:
    """One server of a local cluster: its id, the port of each of PORTS, the address every
    one of them listens on (``host``) and the host the others and clients reach it at
    (``advertise``; None: advertised_host(host))."""

    id: str
    ports: dict[str, int]
    host: str = "127.0.0.1"
    advertise: str | None = None

    @property
    def advertised(self) -> str:
        """Where this server is reached: ``advertise``, else ``host`` (loopback for a
        wildcard)."""
        return advertised_host(self.host, self.advertise)


PICK_FROM = 10_000
"""New ports are picked at random from PICK_FROM up to the kernel's ephemeral range."""
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def _ephemeral_range() -> tuple[int, int] | None:
    """The kernel's ephemeral port range (Linux: EPHEMERAL_RANGE_FILE), None where unknown."""
    try:
        with open(EPHEMERAL_RANGE_FILE) as f:
            low, high = (int(v) for v in f.read().split())
    except (OSError, ValueError):
        return None
    return low, high


def _free(host: str, port: int = 0) -> int:
    """``port`` when it can be listened on (0: a free one); 0 when it is taken. Probed as
    the servers' listeners bind (SO_REUSEADDR: what a stopped server left in TIME_WAIT does
    not count). A new port is picked below the kernel's ephemeral range where it is known:
    a port saved in a layout is reused at the next start, and one from the ephemeral range
    could meanwhile be any outgoing connection's local port (a Raft port then makes the
    start fail: it cannot change)."""
    if port:
        return port if _binds(host, port) else 0
    span = _ephemeral_range()
    if span is not None and span[0] - PICK_FROM >= 1000:
        for _ in range(100):
            candidate = secrets.randbelow(span[0] - PICK_FROM) + PICK_FROM
            if _binds(host, candidate):
                return candidate
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _binds(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def saved_servers(directory: str) -> list[dict]:
    """The servers of the layout saved in ``directory`` (its LAYOUT_FILE: each an ``id``,
    ``ports`` by name, ``host``, ``advertise``); empty when none is saved. Raises ``OSError``,
    ``ValueError`` or ``KeyError`` for a file that cannot be read as a layout."""
    path = os.path.join(directory, LAYOUT_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)["servers"]


def layout(directory: str, servers: int, host: str,
           advertise: str | None = None) -> list[Member]:
    """The members of the cluster in ``directory``: those of its LAYOUT_FILE (a port taken
    since is replaced by a free one, except a Raft port), else ``servers`` new ones with
    free ports, ids s0, s1, ... The layout is saved. Raises ValueError when the saved layout
    has another server count than ``servers``, or a saved Raft port is taken."""
    path = os.path.join(directory, LAYOUT_FILE)
    saved = saved_servers(directory)
    if saved:
        if len(saved) != servers:
            raise ValueError(f"{directory} holds a cluster of {len(saved)} servers, not "
                             f"{servers} (use another directory, or --servers {len(saved)})")
    members = []
    taken: set[int] = set()
    for i in range(servers):
        old = saved[i]["ports"] if saved else {}
        ports = {}
        for name in PORTS:
            port = old.get(name, 0)
            port = _free(host, port) if port and port not in taken else 0
            if not port and old.get(name) and name == "raft":
                raise ValueError(
                    f"the Raft port {old[name]} of server {saved[i]['id']} is taken: the "
                    f"Raft members know each other by it (their journals and snapshots keep "
                    f"it), so it cannot change; free it, or use another directory")
            while not port or port in taken:
                port = _free(host)
            taken.add(port)
            ports[name] = port
        members.append(Member(saved[i]["id"] if saved else f"s{i}", ports, host, advertise))
    os.makedirs(directory, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump({"servers": [dataclasses.asdict(m) for m in members]}, f, indent=1)
    os.replace(path + ".tmp", path)
    return members


def raft_password(directory: str) -> str:
    """The cluster's Raft password: DIR/raft-password, made (0600) with a random one first
    (DIR too, when missing: members given to LocalCluster save no layout that would make it)."""
    path = os.path.join(directory, PASSWORD_FILE)
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        pass
    password = secrets.token_urlsafe(32)
    os.makedirs(directory, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")
    return password


def serve_command(member: Member, members: list[Member],
                  directory: str) -> tuple[list[str], dict[str, str]]:
    """The `riverlog serve` command line of ``member`` and the environment it adds (the Raft
    settings, the password among them). Every door of a member, /metrics included, listens
    on its ``host``; the servers reach each other, and tell clients to connect, at their
    ``advertised`` hosts, where Raft listens too."""
    p = member.ports
    advertised = member.advertised
    others = [m for m in members if m is not member]
    command = [sys.executable, "-m", "riverlog", "serve", "-d",
               os.path.join(directory, member.id), "--id", member.id, "--host", member.host,
               "--stream-port", str(p["stream"]), "--port", str(p["grpc"]),
               "--nats-port", str(p["nats"]), "--nats-cluster-port", str(p["nats_cluster"]),
               "--metrics-host", member.host, "--metrics-port", str(p["metrics"]),
               "--table-dir", os.path.join(directory, TABLES)]
    # a layout saved before the management API has no port for it: a free one then
    command += ["--management-host", member.host,
                "--management-port", str(p.get("management", 0))]
    if advertised != member.host:
        command += ["--advertised-host", advertised]
    if others:
        command += ["--nats-routes", ",".join(_address(m.advertised, m.ports["nats_cluster"])
                                              for m in others)]
    env = {"LIFTBRIDGE_RIVERLOG_RAFT_ADDRESS": _address(advertised, p["raft"]),
           "LIFTBRIDGE_RIVERLOG_RAFT_PEERS": ",".join(
               f"{m.id}={_address(m.advertised, m.ports['raft'])}" for m in others),
           "LIFTBRIDGE_CLUSTERING_RAFT_BOOTSTRAP_PEERS": ",".join(m.id for m in members),
           "LIFTBRIDGE_RIVERLOG_RAFT_PASSWORD": raft_password(directory),
           WORKERS_ENV: "1"}  # one process (an env var: older versions have no --workers)
    return command, env


def registered(member: Member) -> int:
    """How many servers ``member``'s FetchMetadata lists (0 while it does not answer)."""
    import grpc

    from ..protocol.liftbridge import api_pb2 as pb
    from ..protocol.liftbridge.api_pb2_grpc import APIStub
    try:
        with grpc.insecure_channel(_address(member.advertised, member.ports["grpc"])) as channel:
            return len(APIStub(channel).FetchMetadata(pb.FetchMetadataRequest(),
                                                      timeout=2).brokers)
    except grpc.RpcError:
        return 0


def table(members: list[Member], pids: list[int]) -> str:
    """Where each door of each server is reached (its advertised host) and its process id,
    one line per server."""
    head = ("server", "RabbitMQ Stream", "Liftbridge gRPC", "NATS", "NATS routes", "Raft",
            "metrics", "management", "pid")
    rows = [head] + [(m.id, *(_address(m.advertised, m.ports[n]) for n in PORTS), str(pid))
                     for m, pid in zip(members, pids)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


class LocalCluster:
    """N `riverlog serve` processes. ``start()``, ``wait_registered()``, ``restart(i)``,
    ``stop()``; ``members`` and ``procs`` in the same order. Their doors listen on ``host``
    and are reached at each member's ``advertised`` host (``advertise``, or loopback for a
    wildcard ``host``). ``members`` given: those (their hosts and ports as they are, nothing
    saved) instead of DIR's layout. ``command(member)`` is what a member is started with; a
    subclass may wrap it (e.g. to run each member in its own network namespace)."""

    def __init__(self, directory: str, servers: int, host: str = "127.0.0.1",
                 advertise: str | None = None, members: list[Member] | None = None) -> None:
        if servers < 1:
            raise ValueError("--servers must be at least 1")
        check_advertise(host, advertise)
        self.directory = os.path.abspath(directory)
        self.members = members or layout(self.directory, servers, host, advertise)
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        self.procs = [self._spawn(member) for member in self.members]

    def restart(self, index: int) -> None:
        """Start member ``index`` again (its process exited, e.g. killed to try a failover)
        with the same ports and data."""
        self.procs[index] = self._spawn(self.members[index])

    def command(self, member: Member) -> tuple[list[str], dict[str, str]]:
        """The command line ``member`` starts with and the environment it adds."""
        return serve_command(member, self.members, self.directory)

    def _spawn(self, member: Member) -> subprocess.Popen:
        command, env = self.command(member)
        os.makedirs(os.path.join(self.directory, member.id), exist_ok=True)
        with open(os.path.join(self.directory, member.id, "riverlog.log"), "ab") as out:
            return subprocess.Popen(
                command, env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)

    def exited(self) -> list[tuple[str, int]]:
        """(server id, exit code) of the servers that exited."""
        return [(m.id, p.returncode) for m, p in zip(self.members, self.procs)
                if p.poll() is not None]

    def wait_registered(self, timeout: float = 120.0,
                        stopping: Callable[[], bool] = lambda: False) -> None:
        """Return once every server's FetchMetadata lists every server. Raises
        RuntimeError naming a server that exited, TimeoutError."""
        deadline = time.monotonic() + timeout
        waiting = list(self.members)
        while waiting and not stopping():
            gone = self.exited()
            if gone:
                raise RuntimeError(f"server {gone[0][0]} exited with code {gone[0][1]} (see "
                                   f"{os.path.join(self.directory, gone[0][0], 'riverlog.log')})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"servers {', '.join(m.id for m in waiting)} not registered "
                                   f"within {timeout:.0f} s")
            waiting = [m for m in waiting if registered(m) < len(self.members)]
            if waiting:
                time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM every server, SIGKILL those still running after STOP_GRACE_S."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
