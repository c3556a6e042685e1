"""Fault harness for a riverlog cluster (issue 13, "How it is shown").

Three `riverlog serve` processes (riverlog's LocalCluster, what `riverlog cluster up` runs),
each in its own network namespace on a bridge (10.213.7.11-13; the harness at 10.213.7.1),
one stream of one partition with RF=3 and minISR=2, default replication settings. While
publishers on all three doors run (rstream with publisher confirms, gRPC Publish with
AckPolicy ALL, nats-py enveloped publishes with AckPolicy ALL) and one gRPC Subscribe
consumer per server reads its replica (readISRReplica) and an rstream Consumer reads the
replica rstream picks, faults are injected one at a time, spread evenly through the run:

  kill   SIGKILL of the partition leader, then restarted          (--kills)
  stop   SIGSTOP of the leader for --stop-s, then SIGCONT          (--stops)
  cut    the leader cut off from the other servers by the network
         (nftables in its namespace) for --cut-s, then healed      (--cuts)
  all    SIGKILL of all three servers, then all restarted          (--restarts)

After each fault, once the ISR holds all three again and with the publishers paused: the
replicas' segment files are byte-identical up to the high watermark and the bytes committed
earlier unchanged; every acknowledged message is stored exactly once, at the offset its ack
named, in the order its door sent it; every record a consumer was served is in the log at
that offset with that payload. Failover: from the fault to each door's first ack of a
message sent after it (targets for kills: p50 <= 3 s, p99 <= 6 s).

Needs root, iproute2 and nftables (apt-get install nftables). Every namespace, link and nft
table it makes is named rlfault*, and is removed at the end, on Ctrl-C or SIGTERM, and at
the next start if a run was killed. Exit status: 0 clean (findings on LEADER acks, with
--leader-acks, are listed but do not count), 1 problems found (listed; the cluster folder is
kept), 2 the cluster did not come back within 120 s.

Example: .venv/bin/python benchmarks/cluster_faults.py --kills 100 --stops 3 --cuts 3 --restarts 3
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # not grpc's line per GOAWAY of a killed server
from faults.consumers import readers  # noqa: E402  benchmarks/faults/
from faults.network import Network, NetworkError  # noqa: E402
from faults.publishers import DOORS, LeaderAckPublisher  # noqa: E402
from faults.checks import LEADER_ACK, Problem  # noqa: E402
from faults.rounds import KINDS, Round, Run, Stuck, schedule  # noqa: E402
from faults.servers import FaultCluster  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def spread(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    missing = len(values) - len(got)
    if not got:
        return f"no ack in {missing}" if missing else "-"
    text = (f"p50 {statistics.median(got):.2f} s, p99 {percentile(got, 0.99):.2f} s, "
            f"max {max(got):.2f} s (n={len(got)})")
    return text + (f", no ack within 60 s in {missing}" if missing else "")


def progress(n: int, total: int, began: float, result: Round, run: Run) -> str:
    doors = " ".join(f"{d} {'-' if t is None else f'{t:.2f}'}"
                     for d, t in result.failover.items())
    acked = sum(len(p.acks) for p in run.publishers)
    served = sum(c.total for c in run.consumers)
    problems = [p for r in run.rounds for p in r.problems]
    leader = len(problems) - len(breaches(problems))
    elapsed = time.monotonic() - began
    eta = elapsed / n * (total - n)
    return (f"[{n:>3}/{total} {elapsed / 60:5.1f} min, ~{eta / 60:.0f} min left] "
            f"{result.kind} {result.target}{' (Raft leader)' if result.raft_leader else ''}: "
            f"failover {doors} s | hw {result.high_watermark:,} | acked {acked:,} | "
            f"served {served:,} | problems {len(problems) - leader}"
            + (f" (+{leader} LEADER-ack findings)" if leader else ""))


def breaches(problems: list[Problem]) -> list[Problem]:
    """The problems that break a promise the cluster makes (LEADER acks make none that a
    failover keeps)."""
    return [p for p in problems if not p.kind.endswith(LEADER_ACK)]


def show(problems: list[Problem], where: str, most: int = 5) -> None:
    for problem in problems[:most]:
        print(f"    {where}{problem.kind}: {problem.detail}", flush=True)
    if len(problems) > most:
        print(f"    ... and {len(problems) - most} more (the summary lists them)", flush=True)


def summary(run: Run, asked: dict[str, int], seconds: float) -> dict:
    rounds = run.rounds
    out = {"asked": asked, "checked": {k: sum(r.kind == k for r in rounds) for k in KINDS},
           "seconds": round(seconds),
           "acked": {p.door: len(p.acks) for p in run.publishers},
           "publish_errors": {p.door: p.errors for p in run.publishers},
           "served": {c.label: c.total for c in run.consumers},
           "high_watermark": run.mirror.high_watermark, "failover": {}, "problems": {}}
    for kind in KINDS:
        mine = [r for r in rounds if r.kind == kind]
        if not mine:
            continue
        out["failover"][kind] = {door: spread([r.failover[door] for r in mine])
                                 for door in mine[0].failover}
        out["failover"][kind]["first ack, any door"] = spread([r.first for r in mine])
        raft = [r.first for r in mine if r.raft_leader]
        if raft and kind != "all":
            out["failover"][kind]["first ack, Raft leader hit too"] = spread(raft)
    problems = [(f"{r.kind} #{i} of {r.target}", p) for i, r in enumerate(rounds, 1)
                for p in r.problems] + [("end", p) for p in run.unchecked_reads()]
    by_fault: dict[str, int] = {}
    for where, p in problems:
        out["problems"][p.kind] = out["problems"].get(p.kind, 0) + 1
        by_fault[where] = by_fault.get(where, 0) + 1
    out["problems_by_fault"] = by_fault
    out["events"] = [f"t={t:.2f} {what}" for t, what in run.events]
    out["problem_list"] = [f"after {where}: {p.kind}: {p.detail}" for where, p in problems]
    return out


async def run(args, cluster: FaultCluster) -> tuple[Run, int]:
    doors = [*DOORS, LeaderAckPublisher] if args.leader_acks else DOORS
    publishers = [door(cluster, args.rate) for door in doors]
    consumers = readers(cluster)
    harness = Run(cluster, publishers, consumers, args.stop_s, args.cut_s, args.seed)
    await harness.until("the stream created", cluster.create_stream)
    tasks = [asyncio.create_task(x.run()) for x in [*publishers, *consumers]]
    kinds = schedule({"kill": args.kills, "stop": args.stops, "cut": args.cuts,
                      "all": args.restarts}, args.seed)
    began = time.monotonic()
    code = 0
    try:
        for n, kind in enumerate(kinds, 1):
            result = await harness.fault(kind)
            print(progress(n, len(kinds), began, result, harness), flush=True)
            show(result.problems, "")
        show((await harness.final_check()).problems, "after the last fault: ")
    except Stuck as exc:
        print(f"STUCK: {exc}", flush=True)
        code = 2
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return harness, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     prog="cluster_faults.py")
    parser.add_argument("--kills", type=int, default=10, help="leader SIGKILLs (default 10)")
    parser.add_argument("--stops", type=int, default=1, help="leader SIGSTOPs (default 1)")
    parser.add_argument("--cuts", type=int, default=1,
                        help="leader network cuts (default 1)")
    parser.add_argument("--restarts", type=int, default=1,
                        help="all three killed and restarted (default 1)")
    parser.add_argument("--stop-s", type=float, default=5.0,
                        help="seconds a SIGSTOP lasts, longer than the 3 s lag time (default 5)")
    parser.add_argument("--cut-s", type=float, default=8.0,
                        help="seconds a cut lasts (default 8)")
    parser.add_argument("--rate", type=float, default=200.0,
                        help="messages/s at most of the rstream and of the NATS publisher, "
                             "each (the gRPC one sends one at a time; default 200)")
    parser.add_argument("--leader-acks", action="store_true",
                        help="a fourth publisher: gRPC with AckPolicy LEADER, asking a "
                             "different server each time who leads (LEADER acks promise no "
                             "commit; its findings are reported as '... (LEADER ack)')")
    parser.add_argument("--seed", type=int, default=1, help="the faults' order and timing")
    parser.add_argument("--dir", help="cluster folder (default: a temporary one, removed "
                                      "unless problems were found)")
    parser.add_argument("--json", help="write the summary to this file too")
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("needs root (network namespaces and nftables)")

    def terminate(signum, frame):
        raise KeyboardInterrupt
    # for SIGINT too: asyncio.run's own handler only cancels the main task, and a
    # cancellation that a client's wait_for swallows (Python 3.11) would leave the run going
    signal.signal(signal.SIGINT, terminate)
    signal.signal(signal.SIGTERM, terminate)
    directory = args.dir or tempfile.mkdtemp(prefix="riverlog-faults-")
    network = Network(3)
    cluster = None
    harness, code = None, 2
    began = time.monotonic()
    try:
        network.setup()
        cluster = FaultCluster(directory, network)
        cluster.start()
        print(f"cluster in {directory}: servers " + ", ".join(
            f"{m.id} at {m.host}" for m in cluster.members), flush=True)
        harness, code = asyncio.run(run(args, cluster))
    except NetworkError as exc:
        print(f"network setup failed: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"interrupted: stopping the servers, removing the namespaces (the cluster "
              f"folder {directory} is kept)", file=sys.stderr)
        code = 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            if cluster is not None:
                for proc in cluster.procs:  # a stopped one cannot take SIGTERM
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGCONT)
                cluster.stop()
        finally:
            network.teardown()
    if harness is None:
        return code
    result = summary(harness, {"kill": args.kills, "stop": args.stops, "cut": args.cuts,
                               "all": args.restarts}, time.monotonic() - began)
    print(json.dumps({k: v for k, v in result.items() if k not in ("problem_list", "events")},
                     indent=1))
    lines = result["problem_list"]
    for line in [x for x in lines if LEADER_ACK not in x][:100] + \
            [x for x in lines if LEADER_ACK in x][:20]:
        print("  " + line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if lines:
        print(f"findings: the cluster folder {directory} is kept")
    elif not args.dir:
        shutil.rmtree(directory, ignore_errors=True)
    findings = [p for r in harness.rounds for p in r.problems] + harness.unchecked_reads()
    return 1 if breaches(findings) else code


if __name__ == "__main__":
    sys.exit(main())
