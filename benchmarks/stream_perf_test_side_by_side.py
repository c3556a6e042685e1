"""RabbitMQ's own stream benchmark tool, stream-perf-test, against riverlog and RabbitMQ.

Both servers run at once on loopback in a network namespace of this run (`unshare --net`,
root: RabbitMQ's fixed Erlang ports and node name are then its own): `riverlog serve`
(default settings) on 127.0.0.1:5553 and RabbitMQ (../shared/tools/rabbitmq-loopback, its
stream plugin) on 127.0.0.1:5552. For each message size and producer/consumer count, the
same stream-perf-test command runs against one server, then the other (the order alternates
from one configuration to the next), each time on a new stream that it deletes at the end:

    java -jar stream-perf-test.jar --uris rabbitmq-stream://guest:guest@127.0.0.1:PORT/%2f
        --producers N --consumers N --size S --time T --confirm-latency
        --streams sbs-<case> --delete-streams --max-length-bytes 2gb

Figures, from its output: published, confirmed and consumed msgs/s from its "Summary:"
line (consumed is the sum over the consumers: each of N consumers reads the whole stream);
confirm latency p50 and p99: the median over the run's one-second reports (stream-perf-test's
confirm-latency timer keeps one second of samples) after the first --warmup seconds; the
server's CPU time (/proc of the riverlog process or of RabbitMQ's beam.smp) per published
message; the generator's CPU (stream-perf-test's JVM, from getrusage of this script's
children) per published message, to show when the generator is the limit. With --rate, each
producer is held to that many msgs/s (stream-perf-test's --rate), so consume can be compared
at the same publish rate on both servers.

stream-perf-test is not on Maven Central; build it from github.com/rabbitmq/
rabbitmq-stream-perf-test (a release tag): `mvn -q package -DskipTests`, then
--jar target/stream-perf-test.jar.

    .venv/bin/python benchmarks/stream_perf_test_side_by_side.py --jar PATH [--time 20]
        [--sizes 100,10000] [--clients 1,10] [--rate MSGS_PER_PRODUCER]
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _proc import end_private_network, private_network, wait_listening  # noqa: E402
from liftbridge_bench import cpu_seconds  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LOOPBACK = os.path.join(HERE, "..", "..", "shared", "tools", "rabbitmq-loopback")
PORTS = {"riverlog": 5553, "rabbitmq": 5552}
SUMMARY = re.compile(r"Summary: published (\d+) msg/s, confirmed (\d+) msg/s, "
                     r"consumed (\d+) msg/s")
CHUNK_SIZE = re.compile(r"chunk size (\d+)")
SECOND = re.compile(r"^(\d+), published .*confirm latency median/75th/95th/99th "
                    r"(\d+)/(\d+)/(\d+)/(\d+) ms")


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def beam_pid() -> int:
    """RabbitMQ's Erlang VM (beam.smp) in this network namespace."""
    mine = os.readlink("/proc/self/ns/net")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip().startswith("beam") and \
                        os.readlink(f"/proc/{pid}/ns/net") == mine:
                    return int(pid)
        except OSError:
            pass
    raise RuntimeError("no beam.smp in this network namespace")


def perf_test(args, server: str, clients: int, size: int, stream: str, pid: int) -> dict:
    """One stream-perf-test run against the server of process ``pid``: its figures (msgs/s,
    latencies in ms, the server's CPU in us per published message) and the command."""
    cmd = [args.java, "-jar", args.jar, "--uris",
           f"rabbitmq-stream://guest:guest@127.0.0.1:{PORTS[server]}/%2f",
           "--producers", str(clients), "--consumers", str(clients), "--size", str(size),
           "--time", str(args.time), "--confirm-latency", "--streams", stream,
           "--delete-streams", "--max-length-bytes", "2gb"]
    if args.rate:
        cmd += ["--rate", str(args.rate)]
    began, cpu, generator = load(), cpu_seconds(pid), children_cpu_seconds()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.time + 120)
    cpu = cpu_seconds(pid) - cpu
    generator = children_cpu_seconds() - generator
    summary = SUMMARY.search(out.stdout)
    if out.returncode or not summary:
        return {"error": (out.stdout + out.stderr).strip()[-500:], "load": began}
    p50, p99 = [], []
    for line in out.stdout.splitlines():
        m = SECOND.match(line)
        if m and int(m.group(1)) > args.warmup:
            p50.append(int(m.group(2)))
            p99.append(int(m.group(5)))
    published, confirmed, consumed = (int(x) for x in summary.groups())
    chunk = CHUNK_SIZE.search(out.stdout[summary.start():])
    return {"published": published, "confirmed": confirmed, "consumed": consumed,
            "p50": statistics.median(p50) if p50 else None,
            "p99": statistics.median(p99) if p99 else None,
            "cpu": round(cpu / max(published * args.time, 1) * 1e6, 1),
            "chunk": int(chunk.group(1)) if chunk else None,
            "generator_cpu": round(generator / max(published * args.time, 1) * 1e6, 1),
            "load": f"{began} -> {load()}", "command": " ".join(cmd[1:])}


def children_cpu_seconds() -> float:
    """User and system CPU seconds of this script's children that have ended."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def start_riverlog(work: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "riverlog", "serve", "-d", os.path.join(work, "riverlog"),
         "--stream-port", str(PORTS["riverlog"]), "--port", "0", "--nats-port", "0",
         "--no-metrics", "--level", "warning"],
        stdout=open(os.path.join(work, "riverlog.log"), "ab"), stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True)
    wait_listening(PORTS["riverlog"], proc)
    return proc


def rabbitmq(action: str, work: str) -> None:
    env = {**os.environ, "STREAM_PORT": str(PORTS["rabbitmq"]), "AMQP_PORT": "5672"}
    subprocess.run([LOOPBACK, action, os.path.join(work, "rabbitmq")], env=env, check=True,
                   timeout=180)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--jar", required=True, help="stream-perf-test.jar")
    parser.add_argument("--java", default="java")
    parser.add_argument("--time", type=int, default=20, help="seconds per run")
    parser.add_argument("--warmup", type=int, default=3,
                        help="first seconds left out of the latency medians")
    parser.add_argument("--sizes", default="100,10000", help="message sizes in bytes")
    parser.add_argument("--clients", default="1,10", help="producer (= consumer) counts")
    parser.add_argument("--rate", type=int, default=0,
                        help="msgs/s per producer (stream-perf-test --rate); 0: unlimited")
    args = parser.parse_args()
    if not os.path.isfile(args.jar):
        raise SystemExit(f"--jar {args.jar}: no such file")
    private_network()
    work = tempfile.mkdtemp(prefix="spt-side-")
    os.chmod(work, 0o755)  # RabbitMQ runs as the rabbitmq user
    riverlog = None
    rows = []
    try:
        riverlog = start_riverlog(work)
        rabbitmq("start", work)
        pids = {"riverlog": riverlog.pid, "rabbitmq": beam_pid()}
        configs = [(int(c), int(s)) for s in args.sizes.split(",")
                   for c in args.clients.split(",")]
        for n, (clients, size) in enumerate(configs):
            order = ("riverlog", "rabbitmq") if n % 2 == 0 else ("rabbitmq", "riverlog")
            got = {}
            for server in order:
                got[server] = perf_test(args, server, clients, size, f"sbs-{server}-{n}",
                                        pids[server])
                print(f"{server} x{clients} {size} B: {got[server]}", flush=True)
            rows.append((clients, size, got))
    finally:
        try:
            rabbitmq("stop", work)
        finally:
            if riverlog is not None:
                riverlog.send_signal(signal.SIGTERM)
                riverlog.wait(30)
            time.sleep(1)
            end_private_network()
            shutil.rmtree(work, ignore_errors=True)
    rate = f", {args.rate} msgs/s per producer" if args.rate else ""
    print(f"\n{os.cpu_count()} CPUs, {args.time} s per run{rate}, load at the end {load()}")
    print("| producers = consumers | size | figure | riverlog | RabbitMQ | ratio |")
    print("|---|---|---|---|---|---|")
    for clients, size, got in rows:
        r, q = got["riverlog"], got["rabbitmq"]
        if "error" in r or "error" in q:
            print(f"| {clients} | {size} | error | {r.get('error', 'ok')[:120]} | "
                  f"{q.get('error', 'ok')[:120]} | |")
            continue
        for key, label in (("published", "publish msg/s"), ("confirmed", "confirm msg/s"),
                           ("consumed", "consume msg/s"), ("p50", "confirm p50 ms"),
                           ("p99", "confirm p99 ms"), ("cpu", "server CPU us/published msg"),
                           ("generator_cpu", "generator CPU us/published msg"),
                           ("chunk", "messages per chunk consumed")):
            a, b = r[key], q[key]
            ratio = f"{a / b:.2f}x" if a is not None and b else "-"
            print(f"| {clients} | {size} | {label} | {a} | {b} | {ratio} |")
        print(f"| {clients} | {size} | load | {r['load']} | {q['load']} | |")


if __name__ == "__main__":
    main()
