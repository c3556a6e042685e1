"""lift-bench against one `riverlog serve`, this tree beside another one (issue 29).

go-liftbridge's example/lift-bench publishes 1,000,000 enveloped 10-byte NATS messages with
AckPolicy.ALL, all before it awaits the first ack, and times until every ack came. This runs
it against one `riverlog serve` (the embedded nats-server) from this tree and, with
--baseline, from another checkout of riverlog (e.g. `git worktree add /tmp/base <commit>`,
with the generated api_pb2*.py copied into it), alternating, --runs times each, and prints
per run and as medians: lift-bench's msgs/s and the server process's CPU seconds (user +
system, /proc; the nats-server child's not counted). Runs in a private network namespace
(lift-bench has fixed addresses: gRPC localhost:9292, NATS 127.0.0.1:4222; root).

    .venv/bin/python benchmarks/lift_bench_cpu.py --lift-bench /tmp/lb/lift-bench \\
        --baseline /tmp/base [--runs 3]

lift-bench: github.com/liftbridge-io/go-liftbridge, `go build ./example/lift-bench` (none of
it is committed; see benchmarks/liftbridge_side_by_side.py).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _proc import cpu_seconds, end_private_network, private_network, wait_listening  # noqa: E402

TREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_run(lift_bench: str, tree: str, work: str, timeout: float) -> tuple[float, float]:
    """(lift-bench msgs/s, server CPU s) of one run against riverlog from ``tree``."""
    data = tempfile.mkdtemp(dir=work)
    env = {**os.environ, "PYTHONPATH": tree}
    server = subprocess.Popen(
        [sys.executable, "-m", "riverlog", "serve", "-d", data, "--port", "9292",
         "--nats-port", "4222", "--stream-port", "0", "--metrics-port", "0",
         "--management-port", "0", "--level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=work)
    try:
        wait_listening(9292, server)
        time.sleep(1)
        before = cpu_seconds(server.pid)
        out = subprocess.run([lift_bench], capture_output=True, text=True, timeout=timeout)
        cpu = cpu_seconds(server.pid) - before
        rate = float(out.stdout.rsplit("Msgs/sec:", 1)[1].split()[0])
        return rate, cpu
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lift-bench", required=True, help="the lift-bench binary")
    parser.add_argument("--baseline", help="another riverlog checkout to run beside this one")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=150.0, help="s per lift-bench run")
    args = parser.parse_args()
    private_network()
    try:
        trees = [("this tree", TREE)] + ([("baseline", args.baseline)] if args.baseline else [])
        print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
        results: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in trees}
        with tempfile.TemporaryDirectory() as work:
            for run in range(args.runs):
                for name, tree in trees:
                    rate, cpu = one_run(args.lift_bench, tree, work, args.timeout)
                    results[name].append((rate, cpu))
                    print(f"run {run + 1} {name:10s} {rate:10,.0f} msgs/s  server CPU "
                          f"{cpu:5.2f} s ({cpu:.2f} us/msg)", flush=True)
        for name, got in results.items():
            print(f"median {name:10s} {statistics.median(r for r, _ in got):10,.0f} msgs/s  "
                  f"server CPU {statistics.median(c for _, c in got):5.2f} s")
    finally:
        end_private_network()


if __name__ == "__main__":
    main()
