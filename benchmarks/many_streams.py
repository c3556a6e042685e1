# Many streams on one server (issue 31 item 1): for each stream count, a data folder of that
# many streams (one small message each, written offline through the Broker), then a real
# `riverlog serve` started on it and measured: start time to the "serving" log line after a
# clean stop and after a SIGKILL, resident memory and open files once serving, and the first
# publish to a cold stream (declare a publisher, publish one message, wait for its confirm;
# p50/p99 over --cold streams, each publish to a stream not touched since the start). The
# clean start is the median of --repeat starts; the first FetchMetadata of every stream and
# the first management page of 100 queues after the start are timed too.
# Rules: the server runs in a process group of its own and is always stopped; the SIGKILL run
# follows cold publishes, so those partitions are the ones written since a clean close.
# Run: .venv/bin/python benchmarks/many_streams.py [--streams 100 1000 10000] [--cold 200]
#      (results: benchmarks/README.md, "Many streams")
from __future__ import annotations

import argparse
import asyncio
import base64
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from riverlog.broker.broker import Broker
from riverlog.client.blocking import Client

from _proc import free_port, rss_kib  # benchmarks/_proc.py

START_TIMEOUT_S = 300.0


def make_streams(data_dir: str, count: int) -> list[str]:
    """Create ``count`` streams ``s00000``... in ``data_dir`` offline, one message each."""
    names = [f"s{i:05d}" for i in range(count)]

    async def run() -> None:
        broker = Broker(data_dir)
        broker.open()
        for name in names:
            broker.get(name) if name in broker.streams else broker.create(name)
            broker.get(name).partitions[0].write_records([b"hello"])
            await broker.get(name).close()  # one at a time: the folder holds no open files
        await broker.close()

    asyncio.run(run())
    return names


class Server:
    """`riverlog serve` on ``data_dir`` with free ports; ``start()`` returns its start time."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.stream_port, self.grpc_port, self.http_port = free_port(), free_port(), free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> float:
        cmd = [sys.executable, "-m", "riverlog", "serve", "-d", self.data_dir,
               "--stream-port", str(self.stream_port), "-p", str(self.grpc_port),
               "--nats-port", str(free_port()), "--metrics-port", "0",
               "--management-port", str(self.http_port),
               "--level", "info"]
        began = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        for line in self.proc.stderr:
            if " serving " in line:
                took = time.monotonic() - began
                break
            if time.monotonic() - began > START_TIMEOUT_S:
                raise RuntimeError("no 'serving' line in time")
        else:
            raise RuntimeError(f"riverlog serve exited with {self.proc.wait()}")
        # keep draining stderr so the server never blocks on a full pipe
        self._drain = subprocess.Popen(["cat"], stdin=self.proc.stderr,
                                       stdout=subprocess.DEVNULL)
        return took

    def open_files(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        os.killpg(self.proc.pid, sig)
        self.proc.wait(timeout=120)
        self._drain.wait(timeout=10)


def cold_publishes(port: int, names: list[str]) -> list[float]:
    """Milliseconds from a publisher's declaration to its message's confirm, per stream."""
    took = []
    with Client(port=port) as client:
        for name in names:
            began = time.perf_counter()
            with client.publisher(name, f"p-{name}") as publisher:
                publisher.publish([b"cold"])
                publisher.flush(timeout=30)
            took.append((time.perf_counter() - began) * 1000)
    return took


def listings(server: Server) -> tuple[float, float]:
    """Milliseconds of a FetchMetadata of every stream (what `riverlog stream list` asks)
    and of the management API's first page of 100 queues, each the first after the start."""
    import grpc

    from riverlog.protocol.liftbridge import api_pb2 as pb
    from riverlog.protocol.liftbridge.api_pb2_grpc import APIStub
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        began = time.perf_counter()
        APIStub(channel).FetchMetadata(pb.FetchMetadataRequest(), timeout=60)
        fetch_ms = (time.perf_counter() - began) * 1000
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.http_port}/api/queues?page=1&page_size=100",
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    began = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as answer:
        answer.read()
    return fetch_ms, (time.perf_counter() - began) * 1000


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(count: int, cold: int, repeat: int, workdir: str) -> dict:
    data_dir = os.path.join(workdir, f"data-{count}")
    shutil.rmtree(data_dir, ignore_errors=True)
    names = make_streams(data_dir, count)
    server = Server(data_dir)
    server.start()  # the first start after the offline creation
    server.stop()
    starts = []
    for _ in range(repeat):
        starts.append(server.start())
        server.stop()
    clean_s = statistics.median(starts)
    server.start()
    time.sleep(1.0)  # let the start settle before measuring memory and files
    rss, files = rss_kib(server.proc.pid), server.open_files()
    fetch_ms, page_ms = listings(server)
    step = max(1, count // cold)
    latencies = cold_publishes(server.stream_port, names[::step][:cold])
    server.stop(signal.SIGKILL)
    killed_s = server.start()
    server.stop()
    shutil.rmtree(data_dir, ignore_errors=True)
    return {"streams": count, "clean_s": clean_s, "killed_s": killed_s, "rss_mib": rss / 1024,
            "open_files": files, "fetch_ms": fetch_ms, "page_ms": page_ms,
            "cold_p50_ms": percentile(latencies, 0.5), "cold_p99_ms": percentile(latencies, 0.99),
            "cold_n": len(latencies)}


def main() -> None:
    parser = argparse.ArgumentParser(description=(
        "Many streams on one server (issue 31 item 1): start time after a clean stop and "
        "after a SIGKILL, resident memory, open files, first publish to a cold stream."))
    parser.add_argument("--streams", type=int, nargs="+", default=[100, 1000, 10000],
                        help="stream counts to measure (default: 100 1000 10000)")
    parser.add_argument("--cold", type=int, default=200,
                        help="cold streams published to per count (default: 200)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="clean starts per count, the median shown (default: 3)")
    parser.add_argument("--workdir", default=None, help="where the data folders go "
                        "(default: a temporary folder, removed after)")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="many-streams-")
    load = os.getloadavg()[0]
    print(f"load average at start {load:.2f}")
    print("| streams | start after clean stop (s) | start after SIGKILL (s) | RSS (MiB) | "
          "open files | FetchMetadata, all (ms) | management page of 100 (ms) | "
          "cold publish p50 / p99 (ms, n) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    try:
        for count in args.streams:
            row = measure(count, args.cold, args.repeat, workdir)
            print(f"| {row['streams']} | {row['clean_s']:.2f} | {row['killed_s']:.2f} | "
                  f"{row['rss_mib']:.1f} | {row['open_files']} | {row['fetch_ms']:.0f} | "
                  f"{row['page_ms']:.0f} | {row['cold_p50_ms']:.1f} / "
                  f"{row['cold_p99_ms']:.1f} ({row['cold_n']}) |", flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
