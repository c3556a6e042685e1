"""What the management API costs (issue 21): (1) the publish path while the API is polled once
a second as a dashboard does (/api/overview, /api/queues, /api/stream/connections,
/api/stream/publishers, /api/stream/consumers), against the same publishing with nobody
polling; (2) how long one answer takes with many connections and streams.

The server is `riverlog serve` in a subprocess (its own event loop and CPU, as deployed);
publishing uses riverlog's own RabbitMQ Stream client (riverlog.client), 100-byte messages in
batches of 1,000, at most 20,000 unconfirmed; connections for (2) are riverlog.client
connections, each with one publisher.

Run:
  .venv/bin/python benchmarks/management_bench.py [--messages 500000] [--rounds 3]
        [--connections 1000] [--streams 1000]
Prints the server's CPU time per poll round (the direct cost), then messages/s and the
server's CPU time per message with and without polling (median of the rounds, alternating;
the poller is a process of its own) and their ratio, then per endpoint the median and worst
of 10 answers' wall time.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _proc import HOST, cpu_seconds, free_port, wait_listening  # noqa: E402

from riverlog.client.async_client import AsyncClient  # noqa: E402

AUTH = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
POLLED = ("/api/overview", "/api/queues", "/api/stream/connections",
          "/api/stream/publishers", "/api/stream/consumers")


def get(port: int, path: str) -> float:
    """Seconds one GET takes, its body read."""
    request = urllib.request.Request(f"http://{HOST}:{port}{path}", headers=AUTH)
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()
        assert response.status == 200, response.status
    return time.perf_counter() - started


def serve(data: str) -> tuple[subprocess.Popen, int, int]:
    stream_port, management_port = free_port(), free_port()
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "riverlog"), "serve", "-d", data,
         "--stream-port", str(stream_port), "--management-port", str(management_port),
         "--no-metrics", "-p", str(free_port()), "--nats-port", str(free_port()),
         "-l", "warning"], stdout=subprocess.DEVNULL)
    wait_listening(stream_port, proc)
    wait_listening(management_port, proc)
    return proc, stream_port, management_port


async def publish(stream_port: int, stream: str, messages: int,
                  server_pid: int) -> tuple[float, float]:
    """(messages per second, server CPU microseconds per message) of one publisher, every
    message confirmed."""
    client = await AsyncClient.connect(HOST, stream_port)
    try:
        publisher = await client.publisher(stream)
        batch = [b"x" * 100] * 1000
        cpu, started = cpu_seconds(server_pid), time.perf_counter()
        for _ in range(messages // len(batch)):
            await publisher.publish(batch)
        await publisher.flush(timeout=300)
        elapsed = time.perf_counter() - started
        return messages / elapsed, (cpu_seconds(server_pid) - cpu) / messages * 1e6
    finally:
        await client.close()


def poll(management_port: int) -> None:
    """GET every POLLED path once a second, until killed (run as its own process, so that
    its work does not slow the measuring client down: ``--poll PORT``)."""
    while True:
        started = time.monotonic()
        for path in POLLED:
            get(management_port, path)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))


async def publish_cost(messages: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as data:
        proc, stream_port, management_port = serve(data)
        try:
            client = await AsyncClient.connect(HOST, stream_port)
            await client.create_stream("bench")
            await client.close()
            for path in POLLED:  # warm: the login is checked (bcrypt) once, then remembered
                get(management_port, path)
            cpu = cpu_seconds(proc.pid)
            for _ in range(50):
                for path in POLLED:
                    get(management_port, path)
            print(f"server CPU per poll round ({len(POLLED)} GETs): "
                  f"{(cpu_seconds(proc.pid) - cpu) / 50 * 1000:.1f} ms")
            plain, polled = [], []
            for _ in range(rounds):
                plain.append(await publish(stream_port, "bench", messages, proc.pid))
                poller = subprocess.Popen([sys.executable, __file__, "--poll",
                                           str(management_port)])
                try:
                    polled.append(await publish(stream_port, "bench", messages, proc.pid))
                finally:
                    poller.terminate()
                    poller.wait(30)
            for what, index, unit in (("throughput", 0, "msg/s"),
                                      ("server CPU", 1, "us/msg")):
                a = statistics.median(r[index] for r in plain)
                b = statistics.median(r[index] for r in polled)
                print(f"{what}: nobody polling {a:,.2f} {unit}; polled once a second "
                      f"{b:,.2f} {unit}; ratio {b / a:.3f} (runs: "
                      f"{[round(r[index], 2) for r in plain]} / "
                      f"{[round(r[index], 2) for r in polled]})")
        finally:
            proc.terminate()
            proc.wait(30)


async def answer_times(connections: int, streams: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, connections + 512)), hard))
    with tempfile.TemporaryDirectory() as data:
        proc, stream_port, management_port = serve(data)
        clients = []
        try:
            admin = await AsyncClient.connect(HOST, stream_port)
            for i in range(streams):
                await admin.create_stream(f"s{i}")
            for i in range(connections):
                client = await AsyncClient.connect(HOST, stream_port,
                                                   connection_name=f"bench-{i}")
                publisher = await client.publisher(f"s{i % streams}")
                await publisher.publish([b"m"])
                clients.append(client)
            print(f"{connections} connections (one publisher each), {streams} streams:")
            for path in POLLED:
                times = [await asyncio.to_thread(get, management_port, path)
                         for _ in range(10)]
                print(f"  GET {path}: median {statistics.median(times) * 1000:.0f} ms, "
                      f"worst {max(times) * 1000:.0f} ms")
        finally:
            for client in clients:
                await client.close()
            proc.terminate()
            proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--poll", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.poll:
        poll(args.poll)
        return
    asyncio.run(publish_cost(args.messages, args.rounds))
    asyncio.run(answer_times(args.connections, args.streams))


if __name__ == "__main__":
    main()
