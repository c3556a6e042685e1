"""RabbitMQ Stream throughput, riverlog and RabbitMQ side by side, with one load generator.

Publish: Publish frames of --batch 100-byte messages are encoded before the clock starts and
written over one raw asyncio connection with at most --window messages unconfirmed (below
RabbitMQ's 50,000 back-pressure mark); the figure is messages/s from the first write to the
last PublishConfirm. Consume: subscriptions from `first` on the stream just written, one
after the other (a new connection each) for at least --min-seconds, with --credit chunks
granted up front and one more per Deliver (as rstream does); records are counted from each
chunk header, nothing is decoded. Both servers merge the Publish frames that queue up into
one chunk (RabbitMQ: one gen_batch_server batch, growing from 32 to at most 8,192 messages
while frames keep coming; riverlog: the frames of one event-loop turn, at most 4,096 messages
and ~960 KiB);
msgs/chunk is printed.
The generator reports its own CPU use, so it can be seen not to be the bottleneck, and the
server's CPU time per message (from /proc: riverlog's process, RabbitMQ's beam.smp found by
its listening port), a cost that other load on the machine moves much less than the rates.

Filtered consumer (riverlog only: RabbitMQ 3.10 has no filtering): a stream of
--filter-chunks chunks of --filter-per-chunk messages, published with Publish v2, one chunk
per frame; chunk i carries the filter value "v{i % --filter-every}", so 1 chunk in 10 holds
"v0". The same stream is read from `first` twice: unfiltered (every chunk is sent; the
consumer must look at all of them) and with Subscribe property filter.0=v0 (the server skips
the chunks whose bloom filter rules "v0" out). The figure of both is *wanted messages per
second*: the messages carrying "v0" that reached the consumer, divided by the time from the
new connection to the last delivered chunk (as for Consume; records are counted from chunk
headers, nothing is decoded, which favours the unfiltered read). The ratio filtered /
unfiltered is the gain; bloom false positives (chunks sent that hold no "v0") are printed.

Run:
  .venv/bin/python benchmarks/rabbitmq_stream_bench.py --target riverlog   # starts riverlog itself
  .venv/bin/python benchmarks/rabbitmq_stream_bench.py --target rabbitmq   # ../shared/tools/rabbitmq-loopback
  .venv/bin/python benchmarks/rabbitmq_stream_bench.py --target both       # both, and the ratios
  .venv/bin/python benchmarks/rabbitmq_stream_bench.py --target riverlog --case filtered
Options: --messages 1000000 --batch 100 --batch 1000 --repeat 3 --window 20000 --credit 16
  --min-seconds 2 --case throughput --case filtered (default: both)
  --filter-chunks 2000 --filter-per-chunk 500 --filter-every 10
  --rabbitmq-port 5552 (STREAM_PORT for the loopback tool; used as is if something listens)
  --riverlog-arg=--durability=always (extra `riverlog serve` flags, repeatable)
  --vhost perf (connections open that virtual host, created on both servers first: what a
  virtual host costs on the publish and consume paths, against a run on `/`)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass

from riverlog.log.bloom import ChunkFilter, build_bloom
from riverlog.protocol.rabbitmq_stream import FrameDecoder, encode, simple_entry
from riverlog.protocol.rabbitmq_stream import frames as f

HERE = os.path.dirname(os.path.abspath(__file__))
LOOPBACK = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "tools", "rabbitmq-loopback"))
HOST = "127.0.0.1"
VHOST = "/"
"""The virtual host every connection opens (--vhost); a server is given it before the run."""
_HEAD = struct.Struct(">IHH")
_U32 = struct.Struct(">I")
KEY_CONFIRM, KEY_ERROR, KEY_DELIVER, KEY_HEARTBEAT, KEY_CLOSE = 0x0003, 0x0004, 0x0008, 0x0017, 0x0016


# -- a minimal raw connection -----------------------------------------------------------------


class Conn(asyncio.Protocol):
    """Handshake and requests through riverlog's codec; then a fast path that only reads frame
    headers (counting confirmed ids or delivered records) without building frame objects."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(max_frame_size=0)
        self.frames: asyncio.Queue = asyncio.Queue()
        self.fast = False
        self.buf = bytearray()
        self.confirmed = 0
        self.errors = 0
        self.records = 0
        self.chunks = 0
        self.sub_id = 0
        self.credit_frame = b""
        self.done = asyncio.get_running_loop().create_future()
        self.done.add_done_callback(lambda fut: fut.cancelled() or fut.exception())  # no "never retrieved"
        self.target = 0
        self.on_progress = None
        self.corr = 0

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"server closed the connection ({exc})"))

    def data_received(self, data: bytes) -> None:
        if not self.fast:
            for frame in self.decoder.feed(data):
                self.frames.put_nowait(frame)
            return
        buf = self.buf
        buf += data
        pos, n = 0, len(buf)
        unpack = _HEAD.unpack_from
        while n - pos >= 8:
            size, key, _ = unpack(buf, pos)
            end = pos + 4 + size
            if end > n:
                break
            if key == KEY_CONFIRM:  # publisher id u8, count u32, ids
                self.confirmed += _U32.unpack_from(buf, pos + 9)[0]
            elif key == KEY_DELIVER:  # sub id u8 [committed u64 if v2], chunk: records at +4
                version = _HEAD.unpack_from(buf, pos)[2]
                chunk = pos + 9 + (8 if version == 2 else 0)
                self.records += _U32.unpack_from(buf, chunk + 4)[0]
                self.chunks += 1
                self.transport.write(self.credit_frame)
            elif key == KEY_ERROR:
                self.errors += _U32.unpack_from(buf, pos + 9)[0]
                self.confirmed += _U32.unpack_from(buf, pos + 9)[0]
            elif key == KEY_HEARTBEAT:
                self.transport.write(buf[pos:end])
            elif key == KEY_CLOSE:
                if not self.done.done():
                    self.done.set_exception(ConnectionError("server sent Close"))
            pos = end
        del buf[:pos]
        if self.on_progress is not None:
            self.on_progress()

    # requests
    def next_corr(self) -> int:
        self.corr += 1
        return self.corr

    async def request(self, frame: f.Frame) -> f.Frame:
        self.transport.write(encode(frame))
        while True:
            got = await asyncio.wait_for(self.frames.get(), 30)
            if getattr(got, "correlation_id", None) == frame.correlation_id and type(got) is not type(frame):
                return got

    async def handshake(self) -> None:
        await self.request(f.PeerProperties(self.next_corr(), {"product": "riverlog-bench"}))
        await self.request(f.SaslHandshake(self.next_corr()))
        r = await self.request(f.SaslAuthenticate(self.next_corr(), "PLAIN", b"\0guest\0guest"))
        assert r.response_code == 1, r
        while True:
            tune = await asyncio.wait_for(self.frames.get(), 30)
            if isinstance(tune, f.Tune):
                break
        self.transport.write(encode(f.Tune(tune.frame_max, 0)))  # no heartbeats while measuring
        r = await self.request(f.Open(self.next_corr(), VHOST))
        assert r.response_code == 1, r


async def connect(port: int) -> Conn:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(Conn, HOST, port)
    conn.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await conn.handshake()
    return conn


# -- the measurements ---------------------------------------------------------------------------


def message_entry(size: int) -> bytes:
    body = bytes(range(size % 256)) + b"x" * max(0, size - size % 256)
    return simple_entry(body[:size])


def publish_frames(total: int, batch: int, size: int) -> list[bytes]:
    entry = message_entry(size)
    frames, pid = [], 1
    for _ in range(total // batch):
        frames.append(encode(f.Publish(1, tuple((pid + k, entry) for k in range(batch)))))
        pid += batch
    return frames


async def measure_publish(port: int, stream: str, frames: list[bytes], batch: int, window: int) -> tuple[float, float]:
    conn = await connect(port)
    r = await conn.request(f.DeclarePublisher(conn.next_corr(), 1, "", stream))
    assert r.response_code == 1, r
    total = len(frames) * batch
    conn.fast = True
    can_send = asyncio.Event()
    conn.on_progress = can_send.set
    cpu0, t0 = time.process_time(), time.perf_counter()
    sent = 0
    write = conn.transport.write
    for frame in frames:
        while sent - conn.confirmed >= window:
            if conn.done.done():
                conn.done.result()
            can_send.clear()
            await can_send.wait()
        write(frame)
        sent += batch
        if sent % (batch * 8) == 0:
            await asyncio.sleep(0)  # let confirms in
    while conn.confirmed < total:
        if conn.done.done():
            conn.done.result()
        can_send.clear()
        await asyncio.wait_for(can_send.wait(), 60)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if conn.errors:
        raise RuntimeError(f"{conn.errors} PublishErrors")
    conn.transport.close()
    return total / elapsed, cpu / elapsed


async def consume_once(port: int, stream: str, total: int, credit: int,
                       properties: dict[str, str] | None = None) -> tuple[int, int]:
    conn = await connect(port)
    conn.credit_frame = encode(f.Credit(0, 1))
    done = asyncio.Event()
    conn.on_progress = lambda: conn.records >= total and done.set()
    conn.fast = True
    conn.transport.write(encode(f.Subscribe(conn.next_corr(), 0, stream, 1, None, credit,
                                            properties)))
    try:
        await asyncio.wait_for(done.wait(), 300)
    finally:
        conn.transport.close()
    return conn.records, conn.chunks


async def measure_consume(port: int, stream: str, total: int, credit: int,
                          min_seconds: float, properties: dict[str, str] | None = None
                          ) -> tuple[float, float, float]:
    """Read the whole stream from `first` (``total`` records delivered: with a filter in
    ``properties``, those of the chunks it lets through), on a new connection each pass,
    until at least ``min_seconds`` have passed; returns messages/s, generator CPU share,
    records per chunk."""
    records = chunks = 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    while True:
        r, c = await consume_once(port, stream, total, credit, properties)
        records, chunks = records + r, chunks + c
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            break
    return records / elapsed, (time.process_time() - cpu0) / elapsed, records / max(chunks, 1)


async def with_admin(port: int, fn):
    conn = await connect(port)
    try:
        return await fn(conn)
    finally:
        conn.transport.close()


async def run_case(port: int, total: int, batch: int, size: int, window: int, credit: int,
                   min_seconds: float, server_cpu) -> dict:
    """One stream published then consumed; rates, the generator's CPU share, records per
    chunk, and the server's CPU nanoseconds per message (``server_cpu()``: its process CPU
    seconds so far), which a busy machine moves much less than the rates."""
    stream = f"bench-{uuid.uuid4().hex[:8]}"
    frames = publish_frames(total, batch, size)
    r = await with_admin(port, lambda c: c.request(f.Create(c.next_corr(), stream, {})))
    assert r.response_code == 1, r
    try:
        cpu0, t0 = server_cpu(), time.perf_counter()
        pub, pub_cpu = await measure_publish(port, stream, frames, batch, window)
        cpu1, t1 = server_cpu(), time.perf_counter()
        del frames
        con, con_cpu, per_chunk = await measure_consume(port, stream, total, credit, min_seconds)
        cpu2, t2 = server_cpu(), time.perf_counter()
    finally:
        await with_admin(port, lambda c: c.request(f.Delete(c.next_corr(), stream)))
    return {"publish": pub, "consume": con, "publish_cpu": pub_cpu, "consume_cpu": con_cpu,
            "per_chunk": per_chunk, "publish_ns": 1e9 * (cpu1 - cpu0) / (pub * (t1 - t0)),
            "consume_ns": 1e9 * (cpu2 - cpu1) / (con * (t2 - t1))}


async def publish_filtered(port: int, stream: str, chunks: int, per_chunk: int, size: int,
                           every: int) -> None:
    """Chunk i: one Publish v2 frame of ``per_chunk`` messages with filter value
    "v{i % every}", sent once the previous frame is confirmed (so each is its own chunk)."""
    conn = await connect(port)
    r = await conn.request(f.DeclarePublisher(conn.next_corr(), 1, "", stream))
    assert r.response_code == 1, r
    conn.fast = True
    progress = asyncio.Event()
    conn.on_progress = progress.set
    entry, pid = message_entry(size), 1
    for i in range(chunks):
        value = f"v{i % every}"
        conn.transport.write(encode(f.PublishV2(1, tuple((pid + k, value, entry)
                                                         for k in range(per_chunk)))))
        pid += per_chunk
        while conn.confirmed < pid - 1:
            if conn.done.done():
                conn.done.result()
            progress.clear()
            await asyncio.wait_for(progress.wait(), 60)
    conn.transport.close()
    if conn.errors:
        raise RuntimeError(f"{conn.errors} PublishErrors")


async def run_filtered(port: int, args) -> dict:
    """The filtered-consumer case (see the module doc): wanted messages/s without and with
    the filter, and the chunks the filter let through."""
    chunks, per_chunk, every = args.filter_chunks, args.filter_per_chunk, args.filter_every
    stream = f"bench-filter-{uuid.uuid4().hex[:8]}"
    wanted = ChunkFilter(["v0"])
    # which chunks the server sends: those whose bloom filter may hold "v0" (a few false
    # positives among the other values are possible, and are sent)
    passing = sum(wanted.matches(build_bloom([f"v{i % every}"])) for i in range(chunks))
    wanted_chunks = len(range(0, chunks, every))
    r = await with_admin(port, lambda c: c.request(f.Create(c.next_corr(), stream, {})))
    assert r.response_code == 1, r
    try:
        await publish_filtered(port, stream, chunks, per_chunk, args.size, every)
        total = chunks * per_chunk
        plain, plain_cpu, _ = await measure_consume(port, stream, total, args.credit,
                                                    args.min_seconds)
        filtered, filtered_cpu, _ = await measure_consume(
            port, stream, passing * per_chunk, args.credit, args.min_seconds, {"filter.0": "v0"})
    finally:
        await with_admin(port, lambda c: c.request(f.Delete(c.next_corr(), stream)))
    return {"unfiltered": plain * wanted_chunks / chunks, "unfiltered_cpu": plain_cpu,
            "filtered": filtered * wanted_chunks / passing, "filtered_cpu": filtered_cpu,
            "false_positive_chunks": passing - wanted_chunks}


# -- servers ------------------------------------------------------------------------------------


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def listener_pid(port: int) -> int:
    """The process listening on ``port`` (from ``ss``)."""
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True).stdout
    return int(out.split("pid=", 1)[1].split(",", 1)[0])


def listening(port: int) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=1).close()
        return True
    except OSError:
        return False


class Riverlog:
    name = "riverlog"

    def __init__(self, extra: list[str]) -> None:
        self.extra = extra

    def __enter__(self) -> "Riverlog":
        self.dir = tempfile.mkdtemp(prefix="riverlog-bench-")
        with socket.socket() as s:
            s.bind((HOST, 0))
            self.port = s.getsockname()[1]
        self.log = open(os.path.join(self.dir, "server.log"), "wb")
        cmd = [sys.executable, "-m", "riverlog", "serve", "-d", os.path.join(self.dir, "data"),
               "--stream-port", str(self.port), "--level", "warning", "--workers", "1",
               *self.extra]
        with socket.socket() as s:
            s.bind((HOST, 0))
            http_port = s.getsockname()[1]
        cmd += ["--management-port", str(http_port)]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not (listening(self.port) and listening(http_port)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.flush()
                raise SystemExit("riverlog did not start:\n" + open(self.log.name).read()[-4000:])
            time.sleep(0.05)
        if VHOST != "/":  # as RabbitMQ's management API is asked: the vhost, guest's rights
            quoted = urllib.parse.quote(VHOST, safe="")
            for path, body in ((f"/api/vhosts/{quoted}", {}), (f"/api/permissions/{quoted}/guest",
                               {"configure": ".*", "write": ".*", "read": ".*"})):
                request = urllib.request.Request(
                    f"http://{HOST}:{http_port}{path}", data=json.dumps(body).encode(),
                    method="PUT", headers={"Content-Type": "application/json",
                                           "Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
                urllib.request.urlopen(request, timeout=10).close()
        self.describe = f"riverlog on {HOST}:{self.port} ({' '.join(self.extra) or 'default flags'})"
        return self

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.proc.pid)

    def __exit__(self, *exc) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class RabbitMQ:
    name = "rabbitmq"

    def __init__(self, port: int) -> None:
        self.port = port
        self.started = False

    def __enter__(self) -> "RabbitMQ":
        if not listening(self.port):
            env = {**os.environ, "STREAM_PORT": str(self.port)}
            subprocess.run(["bash", LOOPBACK, "start"], env=env, check=True, timeout=300)
            self.started = True
        version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"],
                                 capture_output=True, text=True).stdout or "?"
        self.describe = f"RabbitMQ {version} on {HOST}:{self.port}" + (" (started here)" if self.started else "")
        self.pid = listener_pid(self.port)  # beam.smp
        if VHOST != "/":
            for ctl in (["add_vhost", VHOST], ["set_permissions", "-p", VHOST, "guest", ".*", ".*",
                                                ".*"]):
                subprocess.run(["rabbitmqctl", "-n", "rabbit@localhost", *ctl], timeout=60,
                               capture_output=True)
        return self

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid)

    def __exit__(self, *exc) -> None:
        if self.started:
            subprocess.run(["bash", LOOPBACK, "stop"], env={**os.environ, "STREAM_PORT": str(self.port)},
                           timeout=120)


# -- main -----------------------------------------------------------------------------------------


@dataclass
class Result:
    median: float
    best: float
    cpu: float


def summarize(runs: list[dict], key: str) -> Result:
    values = [r[key] for r in runs]
    return Result(statistics.median(values), max(values), statistics.median(r[key + "_cpu"] for r in runs))


async def bench(server, args) -> dict:
    results = {}
    if "filtered" in args.case and server.name == "riverlog":
        runs = [await run_filtered(server.port, args) for _ in range(args.repeat)]
        per = {k: summarize(runs, k) for k in ("unfiltered", "filtered")}
        for k, r in per.items():
            print(f"  {server.name:9} {k:10} consumer: {r.median:12,.0f} wanted msg/s median "
                  f"({r.best:,.0f} best), generator CPU {r.cpu:4.0%}", flush=True)
        print(f"  {server.name:9} filtered / unfiltered: "
              f"{per['filtered'].median / per['unfiltered'].median:5.1f}x "
              f"({args.filter_chunks:,} chunks of {args.filter_per_chunk}, 1 in "
              f"{args.filter_every} wanted, {runs[0]['false_positive_chunks']} false-positive "
              f"chunks)", flush=True)
    if "throughput" not in args.case:
        return results
    for batch in args.batch:
        runs = [await run_case(server.port, args.messages, batch, args.size, args.window, args.credit,
                               args.min_seconds, server.cpu_seconds) for _ in range(args.repeat)]
        results[batch] = {k: summarize(runs, k) for k in ("publish", "consume")}
        for k in ("publish", "consume"):
            r = results[batch][k]
            print(f"  {server.name:9} {k:8} batch {batch:5}: {r.median:12,.0f} msg/s median "
                  f"({r.best:,.0f} best, {r.median * args.size / 1e6:6.1f} MB/s), "
                  f"generator CPU {r.cpu:4.0%}, server {statistics.median(x[k + '_ns'] for x in runs):,.0f}"
                  f" CPU ns/msg"
                  + (f", {statistics.median(x['per_chunk'] for x in runs):,.0f} msgs/chunk" if k == "consume" else ""),
                  flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=["riverlog", "rabbitmq", "both"], default="both")
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, action="append", help="messages per Publish frame (100, 1000)")
    ap.add_argument("--size", type=int, default=100, help="message bytes")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--window", type=int, default=20_000, help="max unconfirmed messages")
    ap.add_argument("--credit", type=int, default=16, help="initial credit (chunks); +1 per Deliver")
    ap.add_argument("--min-seconds", type=float, default=2.0, help="consume passes last at least this")
    ap.add_argument("--rabbitmq-port", type=int, default=int(os.environ.get("STREAM_PORT", 5552)))
    ap.add_argument("--riverlog-arg", action="append", default=[], help="extra `riverlog serve` flag")
    ap.add_argument("--vhost", default="/", help="the virtual host the connections open "
                    "(created on both servers first, guest given every right)")
    ap.add_argument("--case", action="append", choices=["throughput", "filtered"],
                    help="what to measure (default: both; filtered runs on riverlog only)")
    ap.add_argument("--filter-chunks", type=int, default=2000)
    ap.add_argument("--filter-per-chunk", type=int, default=500)
    ap.add_argument("--filter-every", type=int, default=10, help="1 chunk in N holds the value")
    args = ap.parse_args()
    global VHOST
    VHOST = args.vhost
    args.batch = args.batch or [100, 1000]
    args.case = args.case or ["throughput", "filtered"]
    print(f"{args.messages:,} messages of {args.size} bytes, batches {args.batch}, best/median of "
          f"{args.repeat}, window {args.window:,}, credit {args.credit}, virtual host {VHOST!r}; "
          f"{os.cpu_count()} CPUs", flush=True)
    servers = []
    if args.target in ("riverlog", "both"):
        servers.append(Riverlog(args.riverlog_arg))
    if args.target in ("rabbitmq", "both"):
        servers.append(RabbitMQ(args.rabbitmq_port))
    results = {}
    for server in servers:
        with server:
            print(server.describe, flush=True)
            results[server.name] = asyncio.run(bench(server, args))
    if len(results) == 2 and "throughput" in args.case:
        print("ratio riverlog / rabbitmq (medians):")
        for batch in args.batch:
            for k in ("publish", "consume"):
                ratio = results["riverlog"][batch][k].median / results["rabbitmq"][batch][k].median
                print(f"  {k:8} batch {batch:5}: {ratio:5.2f}x")


if __name__ == "__main__":
    main()
