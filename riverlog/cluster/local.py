# `riverlog cluster up`: a cluster of N `riverlog serve` processes on this machine, for trying
# clustering and for tests (docs/clustering.md "Three servers on one machine"). Owns the
# layout of DIR (one data folder per server, `DIR/<id>/`, its log in `DIR/<id>/riverlog.log`,
# the Raft password in `DIR/raft-password`, mode 0600, generated once; the ports of every door
# in `DIR/cluster.json`, reused by the next `up` when they are still free; a Raft port must
# be: the members know each other by it), starting the
# servers, waiting until every one is registered in the cluster metadata, and stopping them.
# Rules: every port is free when picked (never a fixed default), the password never appears on
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
PORTS = ("stream", "grpc", "nats", "nats_cluster", "raft", "metrics")
"""The ports each server takes, by what listens there."""
STOP_GRACE_S = 15.0
LOOPBACK = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}
"""The host a wildcard bind address is reached at on this machine."""


def advertised_host(host: str, advertise: str | None = None) -> str:
    """Where the servers bound to ``host`` are reached: ``advertise`` when given, else
    ``host``, or loopback for a wildcard (0.0.0.0, ::)."""
    return advertise or LOOPBACK.get(host, host)


def _address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclasses.dataclass(frozen=True, slots=True)
class Member:
    """One server of a local cluster: its id and the port of each of PORTS."""

    id: str
    ports: dict[str, int]


def _free(host: str, port: int = 0) -> int:
    """``port`` when it can be listened on (0: a free one); 0 when it is taken."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError:
            return 0
        return s.getsockname()[1]


def layout(directory: str, servers: int, host: str) -> list[Member]:
    """The members of the cluster in ``directory``: those of its LAYOUT_FILE (a port taken
    since is replaced by a free one, except a Raft port), else ``servers`` new ones with
    free ports, ids s0, s1, ... The layout is saved. Raises ValueError when the saved layout
    has another server count than ``servers``, or a saved Raft port is taken."""
    path = os.path.join(directory, LAYOUT_FILE)
    saved: list[dict] = []
    if os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)["servers"]
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
        members.append(Member(saved[i]["id"] if saved else f"s{i}", ports))
    os.makedirs(directory, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump({"servers": [dataclasses.asdict(m) for m in members]}, f, indent=1)
    os.replace(path + ".tmp", path)
    return members


def raft_password(directory: str) -> str:
    """The cluster's Raft password: DIR/raft-password, made (0600) with a random one first."""
    path = os.path.join(directory, PASSWORD_FILE)
    try:
        with open(path) as f:
            return f.read().strip()
    except FileNotFoundError:
        pass
    password = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")
    return password


def serve_command(member: Member, members: list[Member], directory: str, host: str,
                  advertised: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The `riverlog serve` command line of ``member`` and the environment it adds (the Raft
    settings, the password among them). The doors listen on ``host``; the servers reach each
    other, and tell clients to connect, at ``advertised`` (default: advertised_host(host)),
    where Raft listens too."""
    advertised = advertised or advertised_host(host)
    p = member.ports
    others = [m for m in members if m is not member]
    command = [sys.executable, "-m", "riverlog", "serve", "-d",
               os.path.join(directory, member.id), "--id", member.id, "--host", host,
               "--stream-port", str(p["stream"]), "--port", str(p["grpc"]),
               "--nats-port", str(p["nats"]), "--nats-cluster-port", str(p["nats_cluster"]),
               "--metrics-port", str(p["metrics"])]
    if advertised != host:
        command += ["--advertised-host", advertised]
    if others:
        command += ["--nats-routes", ",".join(_address(advertised, m.ports["nats_cluster"])
                                              for m in others)]
    env = {"LIFTBRIDGE_RIVERLOG_RAFT_ADDRESS": _address(advertised, p["raft"]),
           "LIFTBRIDGE_RIVERLOG_RAFT_PEERS": ",".join(
               f"{m.id}={_address(advertised, m.ports['raft'])}" for m in others),
           "LIFTBRIDGE_CLUSTERING_RAFT_BOOTSTRAP_PEERS": ",".join(m.id for m in members),
           "LIFTBRIDGE_RIVERLOG_RAFT_PASSWORD": raft_password(directory)}
    return command, env


def registered(host: str, member: Member) -> int:
    """How many servers ``member``'s FetchMetadata lists (0 while it does not answer)."""
    import grpc

    from ..protocol.liftbridge import api_pb2 as pb
    from ..protocol.liftbridge.api_pb2_grpc import APIStub
    try:
        with grpc.insecure_channel(_address(host, member.ports["grpc"])) as channel:
            return len(APIStub(channel).FetchMetadata(pb.FetchMetadataRequest(),
                                                      timeout=2).brokers)
    except grpc.RpcError:
        return 0


def table(members: list[Member], host: str, pids: list[int]) -> str:
    """Where each door of each server is reached (at ``host``, the advertised one) and its
    process id, one line per server."""
    head = ("server", "RabbitMQ Stream", "Liftbridge gRPC", "NATS", "NATS routes", "Raft",
            "metrics", "pid")
    rows = [head] + [(m.id, *(_address(host, m.ports[n]) for n in PORTS), str(pid))
                     for m, pid in zip(members, pids)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


class LocalCluster:
    """N `riverlog serve` processes. ``start()``, ``wait_registered()``, ``restart(i)``,
    ``stop()``; ``members`` and ``procs`` in the same order. Their doors listen on ``host``
    and are reached at ``advertised`` (advertised_host: ``advertise``, or loopback for a
    wildcard ``host``)."""

    def __init__(self, directory: str, servers: int, host: str = "127.0.0.1",
                 advertise: str | None = None) -> None:
        if servers < 1:
            raise ValueError("--servers must be at least 1")
        self.directory = os.path.abspath(directory)
        self.host = host
        self.advertised = advertised_host(host, advertise)
        self.members = layout(self.directory, servers, host)
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        self.procs = [self._spawn(member) for member in self.members]

    def restart(self, index: int) -> None:
        """Start member ``index`` again (its process exited, e.g. killed to try a failover)
        with the same ports and data."""
        self.procs[index] = self._spawn(self.members[index])

    def _spawn(self, member: Member) -> subprocess.Popen:
        command, env = serve_command(member, self.members, self.directory, self.host,
                                     self.advertised)
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
            waiting = [m for m in waiting
                       if registered(self.advertised, m) < len(self.members)]
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
