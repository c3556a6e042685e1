"""`riverlog serve --workers N`: publish throughput with 1, 2, ... workers (issue 31 item 0).

For each N of --workers, a new `riverlog serve --workers N` (a fresh data folder, default
settings otherwise) gets --publishers streams, created on worker s0's RabbitMQ Stream port
without a replication factor (so one replica each, leaders spread over the workers). Then
--publishers generator processes, one per stream, each connect straight to the worker that
leads their stream (FetchMetadata's leader, the ports from the table `serve --workers`
prints, as a client following RabbitMQ's Metadata would) and publish --messages each:
Publish frames of --batch --size-byte messages, encoded before the clock starts, at most
--window unconfirmed (rabbitmq_stream_bench.py's raw publisher). The figure is every
publisher's messages over the time from the first one's start to the last one's last
confirm. Also: the workers' CPU time per message (/proc of every worker process, the
supervisor and the nats-servers left out), and the generator's own CPU (the sum of its
processes' CPU over the run's time, in cores), so it shows when the generator is the limit.

    .venv/bin/python benchmarks/workers_scaling.py [--workers 1,2] [--publishers 4]
        [--messages 500000] [--batch 100] [--size 100] [--window 20000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _proc import free_port  # noqa: E402
from rabbitmq_stream_bench import (  # noqa: E402
    f, measure_publish, process_cpu_seconds, publish_frames, with_admin)

from riverlog.protocol.liftbridge import api_pb2 as pb  # noqa: E402
from riverlog.protocol.liftbridge import api_pb2_grpc  # noqa: E402


ONE = "one"
"""The table's only row for `--workers 1` (one process: no table printed)."""


def start(workers: int, data: str) -> tuple[subprocess.Popen, dict[str, dict[str, str]]]:
    """`riverlog serve --workers N` on free ports; the process and its workers' table (for
    one worker, a row ONE of its own doors and pid)."""
    ports = [free_port() for _ in range(5)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "riverlog", "serve", "--workers", str(workers), "-d", data,
         "--stream-port", str(ports[0]), "--port", str(ports[1]), "--nats-port",
         str(ports[2]), "--metrics-port", str(ports[3]), "--management-port", str(ports[4]),
         "--level", "warning"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"serve --workers {workers} ended: {proc.wait()}")
        if line.startswith("riverlog serving"):
            break
        lines.append(line.rstrip())
    if workers == 1:
        return proc, {ONE: {"RabbitMQ Stream": f"127.0.0.1:{ports[0]}",
                            "Liftbridge gRPC": f"127.0.0.1:{ports[1]}", "pid": str(proc.pid)}}
    head = [h.strip() for h in lines[0].split("  ") if h]
    return proc, {c[0]: dict(zip(head, c)) for c in (li.split() for li in lines[1:])}


def leaders(grpc_address: str, streams: list[str]) -> dict[str, str]:
    """stream -> the id of the worker leading it, once FetchMetadata lists them all."""
    with grpc.insecure_channel(grpc_address) as channel:
        api = api_pb2_grpc.APIStub(channel)
        for _ in range(300):
            meta = api.FetchMetadata(pb.FetchMetadataRequest(), timeout=10)
            found = {s.name: list(s.partitions.values())[0].leader
                     for s in meta.streamMetadata if s.partitions}
            if all(found.get(n) for n in streams):
                return {n: found[n] for n in streams}
            time.sleep(0.1)
    raise RuntimeError("the streams have no leaders")


def publisher(port: int, stream: str, args, ready, go, results) -> None:
    """One generator process: its frames encoded, then (on ``go``) published to ``port``."""
    frames = publish_frames(args.messages, args.batch, args.size)
    ready.release()
    go.wait()
    cpu0, t0 = time.process_time(), time.time()
    asyncio.run(measure_publish(port, stream, frames, args.batch, args.window))
    results.put((t0, time.time(), time.process_time() - cpu0))


def run_once(workers: int, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="workers-bench-") as data:
        proc, table = start(workers, data)
        try:  # (a start that fails leaves nothing: serve stops its workers itself)
            s0_port = int(next(iter(table.values()))["RabbitMQ Stream"].rsplit(":", 1)[1])
            streams = [f"scale-{i}" for i in range(args.publishers)]
            for name in streams:
                r = asyncio.run(with_admin(s0_port, lambda c, n=name: c.request(
                    f.Create(c.next_corr(), n, {}))))
                assert r.response_code == 1, r
            first = next(iter(table.values()))
            led = leaders(first["Liftbridge gRPC"], streams)
            if ONE in table:  # one process: its own server id leads every stream
                led = {n: ONE for n in led}
            ctx = multiprocessing.get_context("spawn")
            ready, go, results = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
            procs = [ctx.Process(target=publisher, args=(
                int(table[led[n]]["RabbitMQ Stream"].rsplit(":", 1)[1]), n, args, ready, go,
                results)) for n in streams]
            for p in procs:
                p.start()
            for _ in procs:
                ready.acquire()
            pids = [int(row["pid"]) for row in table.values()]
            cpu0 = sum(process_cpu_seconds(pid) for pid in pids)
            go.set()
            got = [results.get(timeout=600) for _ in procs]
            cpu = sum(process_cpu_seconds(pid) for pid in pids) - cpu0
            for p in procs:
                p.join()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    total = args.messages // args.batch * args.batch * args.publishers
    elapsed = max(t1 for _, t1, _ in got) - min(t0 for t0, _, _ in got)
    return {"rate": total / elapsed, "server_us": 1e6 * cpu / total,
            "server_cores": cpu / elapsed,
            "generator_cores": sum(c for _, _, c in got) / elapsed,
            "leaders": sorted(led.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    ap.add_argument("--publishers", type=int, default=4, help="streams = generator processes")
    ap.add_argument("--messages", type=int, default=500_000, help="per publisher")
    ap.add_argument("--batch", type=int, default=100, help="messages per Publish frame")
    ap.add_argument("--size", type=int, default=100, help="message bytes")
    ap.add_argument("--window", type=int, default=20_000, help="max unconfirmed messages")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs, load {'/'.join(f'{x:.1f}' for x in os.getloadavg())}")
    rows = []
    for workers in (int(w) for w in args.workers.split(",")):
        runs = [run_once(workers, args) for _ in range(args.repeat)]
        for run in runs:
            print(f"workers {workers}: {run}", flush=True)
        median = {k: statistics.median(r[k] for r in runs)
                  for k in ("rate", "server_us", "server_cores", "generator_cores")}
        rows.append((workers, median, runs[0]["leaders"]))
    print(f"\nload at the end {'/'.join(f'{x:.1f}' for x in os.getloadavg())}; medians of "
          f"{args.repeat}; {args.publishers} publishers x {args.messages:,} x {args.size} B")
    print("| workers | msgs/s | workers' CPU us/msg | workers' cores | generator cores | "
          "leaders |")
    print("|---|---|---|---|---|---|")
    for workers, m, led in rows:
        print(f"| {workers} | {m['rate']:,.0f} | {m['server_us']:.2f} | "
              f"{m['server_cores']:.2f} | {m['generator_cores']:.2f} | {','.join(led)} |")


if __name__ == "__main__":
    main()
