# Load on the RabbitMQ Stream door: --connections raw protocol connections at once on loopback
# (half publishers, half consumers, spread over --streams streams) against a `riverlog serve`
# subprocess, for --seconds per phase. Raw clients on riverlog's codec keep the load generator
# cheap enough for 1,000 connections on one core: publishers keep --window Publish frames of
# --batch messages unconfirmed; consumers subscribe from `next` with credit 10 and give one
# credit back per chunk. Each message body starts with its send time (monotonic ns), so
# publish-to-deliver latency is taken from the first message of every delivered chunk, and
# publish-to-confirm latency from every Publish frame.
# Phases (one server): `load` (the mix alone), `slow` (the same plus one slow consumer: it
# subscribes from the first offset with credit 1 and reads 4 KiB every 50 ms from a 4 KiB
# receive buffer), `load_again` (the mix alone again) -- the other consumers' delivered msgs/s
# with the slow one over the mean of the two runs without it is the ratio (>= 0.9 is the
# target); memory: `idle` first, on the fresh server (--idle connections that only handshake,
# or only connect, and stay), and after the load `huge` (connections that each send a frame_max-sized Publish frame
# header and most of its body, then stall), `deaf` (a client that sends requests and never
# reads a byte of the answers). Server RSS (VmRSS, /proc/<pid>/status) is sampled every 0.2 s.
#
# Run: .venv/bin/python benchmarks/load_bench.py [--connections 1000] [--seconds 10]
#      [--streams 100] [--batch 10] [--window 2] [--rate 0] [--idle 1000] [--huge 100]
#      [--riverlog-arg=--durability=always]   (results: benchmarks/README.md)
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

from riverlog.protocol.rabbitmq_stream import encode, simple_entry
from riverlog.protocol.rabbitmq_stream import frames as f

from _proc import HOST, free_port, rss_kib, wait_listening  # benchmarks/_proc.py
from rabbitmq_stream_bench import (KEY_CLOSE, KEY_CONFIRM, KEY_DELIVER, KEY_ERROR,
                                   KEY_HEARTBEAT, _HEAD, _U32)
from rabbitmq_stream_bench import Conn as BenchConn

_U64 = struct.Struct(">Q")
CHUNK_HEADER_BYTES = 48
FIRST_BODY = CHUNK_HEADER_BYTES + 4  # the first simple entry's body: after its u32 length


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


class Stats:
    """What the load generator measured in one phase."""

    def __init__(self) -> None:
        self.confirmed = 0
        self.delivered = 0          # records delivered to the normal consumers
        self.confirm_ms: list[float] = []
        self.deliver_ms: list[float] = []
        self.errors = 0
        self.closed = 0


class Conn(BenchConn):
    """rabbitmq_stream_bench's connection (handshake and requests through the codec, then
    ``fast``) with its own header-only path: a confirm latency per Publish frame, and the
    send time carried by the first message of every delivered chunk."""

    def __init__(self) -> None:
        super().__init__()
        self.stats: Stats | None = None
        self.sent_at: dict[int, int] = {}  # last publishing id of a frame -> send time (ns)
        self.unconfirmed = 0
        self.wakeup = asyncio.Event()

    def connection_lost(self, exc) -> None:
        super().connection_lost(exc)
        if self.stats is not None:
            self.stats.closed += 1
        self.wakeup.set()

    def data_received(self, data: bytes) -> None:
        if not self.fast:
            super().data_received(data)
            return
        buf = self.buf
        buf += data
        pos, n = 0, len(buf)
        now = time.monotonic_ns()
        stats = self.stats
        while n - pos >= 8:
            size, key, version = _HEAD.unpack_from(buf, pos)
            end = pos + 4 + size
            if end > n:
                break
            if key == KEY_CONFIRM or key == KEY_ERROR:  # publisher id u8, count u32, ids
                count = _U32.unpack_from(buf, pos + 9)[0]
                step = 8 if key == KEY_CONFIRM else 10
                for i in range(count):
                    sent = self.sent_at.pop(_U64.unpack_from(buf, pos + 13 + i * step)[0], None)
                    if sent is not None:
                        self.unconfirmed -= 1
                        if stats is not None:
                            stats.confirm_ms.append((now - sent) / 1e6)
                if stats is not None:
                    if key == KEY_ERROR:
                        stats.errors += count
                    else:
                        stats.confirmed += count
                self.wakeup.set()
            elif key == KEY_DELIVER:
                chunk = pos + 9 + (8 if version == 2 else 0)
                if stats is not None:
                    stats.delivered += _U32.unpack_from(buf, chunk + 4)[0]
                    sent = _U64.unpack_from(buf, chunk + FIRST_BODY)[0]
                    stats.deliver_ms.append((now - sent) / 1e6)
                self.transport.write(self.credit_frame)
            elif key == KEY_HEARTBEAT:
                self.transport.write(bytes(buf[pos:end]))
            elif key == KEY_CLOSE and stats is not None:
                stats.errors += 1
            pos = end
        del buf[:pos]


async def connect(port: int, handshake: bool = True, rcvbuf: int = 0) -> Conn:
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await loop.sock_connect(sock, (HOST, port))
    _, conn = await loop.create_connection(Conn, sock=sock)
    if handshake:
        await conn.handshake()
    return conn


# -- roles -----------------------------------------------------------------------------------------


async def publisher(conn: Conn, stream: str, batch: int, window: int, size: int,
                    stop: asyncio.Event, period: float = 0.0) -> None:
    """Publish frames of ``batch`` messages, ``window`` unconfirmed at most, one every
    ``period`` s (0: as fast as confirms allow)."""
    r = await conn.request(f.DeclarePublisher(conn.next_corr(), 1, None, stream))
    assert r.response_code == 1, r
    conn.fast = True
    pad = b"p" * max(0, size - 8)
    pid = 0
    write = conn.transport.write
    loop = asyncio.get_running_loop()
    next_at = loop.time() + period * (hash(stream) % 1000) / 1000  # spread the publishers
    while not stop.is_set() and not conn.done.done():
        if period:
            if loop.time() < next_at:
                await asyncio.sleep(next_at - loop.time())
            next_at += period
        if conn.unconfirmed >= window:
            conn.wakeup.clear()
            await conn.wakeup.wait()
            continue
        now = time.monotonic_ns()
        body = simple_entry(_U64.pack(now) + pad)
        frame = encode(f.Publish(1, tuple((pid + k + 1, body) for k in range(batch))))
        conn.sent_at[pid + batch] = now  # the frame's last id: confirmed once the frame is
        pid += batch
        conn.unconfirmed += 1
        write(frame)
        await asyncio.sleep(0)


async def consumer(conn: Conn, stream: str, sub_id: int = 1, credit: int = 10,
                   offset_type: int = 3) -> None:
    """offset_type 3 = next (reference/rabbitmq-stream-protocol.md "Subscribe")."""
    conn.credit_frame = encode(f.Credit(sub_id, 1))
    r = await conn.request(f.Subscribe(conn.next_corr(), sub_id, stream, offset_type, None,
                                       credit, {}))
    assert r.response_code == 1, r
    conn.fast = True


async def slow_consumer(port: int, stream: str, stop: asyncio.Event) -> int:
    """Credit 1, a 4 KiB receive buffer, 4 KiB read every 50 ms; returns bytes read."""
    conn = await connect(port, rcvbuf=4096)
    conn.credit_frame = encode(f.Credit(1, 1))
    r = await conn.request(f.Subscribe(conn.next_corr(), 1, stream, 1, None, 1, {}))  # first
    assert r.response_code == 1, r
    conn.fast = True
    conn.transport.pause_reading()
    sock = conn.transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    got = 0
    while not stop.is_set():
        conn.transport.resume_reading()
        await asyncio.sleep(0)
        conn.transport.pause_reading()
        got += 1
        await asyncio.sleep(0.05)
    conn.transport.close()
    return got


# -- the server and the phases -----------------------------------------------------------------------


class Server:
    def __init__(self, workdir: str, extra: list[str]) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-m", "riverlog", "serve", "-d", os.path.join(workdir, "data"),
               "--stream-port", str(self.port), "-p", "0", "--nats-port", "0", "--level",
               "error", *extra]
        self.log = open(os.path.join(workdir, "server.log"), "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        wait_listening(self.port, self.proc)
        self.peak = 0

    def rss_mib(self) -> float:
        return round(rss_kib(self.proc.pid) / 1024, 1)

    async def sample(self) -> None:
        while True:
            self.peak = max(self.peak, rss_kib(self.proc.pid))
            await asyncio.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


async def open_many(port: int, n: int, **kwargs) -> list[Conn]:
    """``n`` connections, 50 handshakes at a time."""
    gate = asyncio.Semaphore(50)

    async def one() -> Conn:
        async with gate:
            return await connect(port, **kwargs)
    return await asyncio.gather(*(one() for _ in range(n)))


async def measure(pubs: list[Conn], subs: list[Conn], seconds: float) -> dict:
    stats = Stats()
    for conn in pubs + subs:
        conn.stats = stats
    await asyncio.sleep(seconds)
    for conn in pubs + subs:
        conn.stats = None
    return {
        "published_msgs_per_s": round(stats.confirmed / seconds),
        "delivered_msgs_per_s": round(stats.delivered / seconds),
        "confirm_p50_ms": round(percentile(stats.confirm_ms, 50), 2),
        "confirm_p99_ms": round(percentile(stats.confirm_ms, 99), 2),
        "deliver_p50_ms": round(percentile(stats.deliver_ms, 50), 2),
        "deliver_p99_ms": round(percentile(stats.deliver_ms, 99), 2),
        "publish_errors": stats.errors, "connections_closed": stats.closed,
    }


async def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="riverlog-load-") as workdir:
        server = Server(workdir, args.riverlog_arg)
        sampler = asyncio.create_task(server.sample())
        result: dict = {"connections": args.connections, "streams": args.streams, "rate": args.rate,
                        "batch": args.batch, "window": args.window, "size": args.size,
                        "seconds": args.seconds, "rss_start_mib": server.rss_mib()}
        try:
            result["idle"] = await idle_phase(server, args)
            admin = await connect(server.port)
            streams = [f"load-{i}" for i in range(args.streams)]
            for name in streams:
                await admin.request(f.Create(admin.next_corr(), name, {}))
            n_pub = args.connections // 2
            pubs = await open_many(server.port, n_pub)
            subs = await open_many(server.port, args.connections - n_pub)
            for i, conn in enumerate(subs):
                await consumer(conn, streams[i % len(streams)])
            stop = asyncio.Event()
            period = n_pub * args.batch / args.rate if args.rate else 0.0
            tasks = [asyncio.create_task(publisher(conn, streams[i % len(streams)], args.batch,
                                                   args.window, args.size, stop, period))
                     for i, conn in enumerate(pubs)]
            await asyncio.sleep(2)  # warm-up
            result["load"] = await measure(pubs, subs, args.seconds)
            result["rss_load_mib"] = round(server.peak / 1024, 1)
            slow_stop = asyncio.Event()
            slow = asyncio.create_task(slow_consumer(server.port, streams[0], slow_stop))
            await asyncio.sleep(1)
            result["slow"] = await measure(pubs, subs, args.seconds)
            slow_stop.set()
            await slow
            await asyncio.sleep(1)
            result["load_again"] = await measure(pubs, subs, args.seconds)
            base = (result["load"]["delivered_msgs_per_s"]
                    + result["load_again"]["delivered_msgs_per_s"]) / 2
            result["slow_ratio"] = round(result["slow"]["delivered_msgs_per_s"] / max(1, base), 3)
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            result["rss_after_load_mib"] = server.rss_mib()
            for conn in pubs + subs:
                conn.transport.close()
            await asyncio.sleep(1)
            result["rss_after_close_mib"] = server.rss_mib()
            result["memory"] = await memory_phases(server, args)
            result["peak_rss_mib"] = round(server.peak / 1024, 1)
            result["server_alive"] = server.proc.poll() is None
        finally:
            sampler.cancel()
            server.stop()
        return result


async def idle_phase(server: Server, args) -> dict:
    """On the fresh server (freed memory is not given back to the OS, so later phases would
    reuse it and hide the cost): half handshaken, half only connected."""
    base = server.rss_mib()
    idle = await open_many(server.port, args.idle // 2)
    idle += await open_many(server.port, args.idle - args.idle // 2, handshake=False)
    await asyncio.sleep(1)
    out = {"idle_connections": len(idle), "idle_rss_delta_mib": round(server.rss_mib() - base, 1)}
    for conn in idle:
        conn.transport.close()
    await asyncio.sleep(1)
    return out


async def memory_phases(server: Server, args) -> dict:
    out = {}
    # frame_max-sized Publish frames that never finish (1 MiB negotiated)
    base = server.rss_mib()
    huge = await open_many(server.port, args.huge)
    size = 1_048_576
    head = _HEAD.pack(size, 0x0002, 1)
    for conn in huge:
        conn.transport.write(head + b"\0" * (size - 64 * 1024))
    await asyncio.sleep(2)
    out["huge_connections"] = len(huge)
    out["huge_rss_delta_mib"] = round(server.rss_mib() - base, 1)
    over = await connect(server.port)
    over.transport.write(_HEAD.pack(size + 1, 0x0002, 1) + b"\0" * 1024)
    out["frame_above_frame_max_closed"] = False
    try:
        await asyncio.wait_for(over.done, 10)
    except ConnectionError:
        out["frame_above_frame_max_closed"] = True  # Close 0x0e, then the socket
    for conn in huge:
        conn.transport.close()
    await asyncio.sleep(1)

    # a client that asks and never reads: do the answers pile up in the server?
    base = server.rss_mib()
    deaf = await connect(server.port)
    deaf.transport.pause_reading()
    request = encode(f.Metadata(1, tuple(f"stream-{i:04d}" for i in range(200))))
    t0 = time.monotonic()
    sent = 0
    while time.monotonic() - t0 < 5:
        deaf.transport.write(request * 50)
        sent += 50
        await asyncio.sleep(0.001)
        if deaf.transport.get_write_buffer_size() > 64 * 1024 * 1024:
            break  # the server stopped reading us: our side piles up instead
    await asyncio.sleep(1)
    out["deaf_requests_sent"] = sent
    out["deaf_server_stopped_reading"] = deaf.transport.get_write_buffer_size() > 16 * 1024 * 1024
    out["deaf_rss_delta_mib"] = round(server.rss_mib() - base, 1)
    deaf.transport.abort()
    return out


def main() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    parser = argparse.ArgumentParser(description="1,000 connections on the RabbitMQ Stream door.")
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--window", type=int, default=2)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rate", type=int, default=0,
                        help="messages/s offered by all publishers together (0: as fast as "
                             "confirms allow, the saturation figure)")
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--huge", type=int, default=100)
    parser.add_argument("--riverlog-arg", action="append", default=[])
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
