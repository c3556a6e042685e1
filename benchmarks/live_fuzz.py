# Live fuzz of the RabbitMQ Stream door: many raw socket connections send malformed frames
# (random bytes, frames of known keys with garbage bodies, truncated frames, size prefixes above
# frame_max, unknown keys and versions, draft-dialect openings with garbage after them,
# commands before authentication, well-formed commands
# naming publishers, subscriptions and streams that do not exist) to a `riverlog serve`
# subprocess, while a well-behaved rstream producer and consumer keep publishing and consuming
# on the same server. Pass: the server stays up, the rstream consumer receives exactly what was
# confirmed, in order, and the server's peak RSS (VmRSS in /proc/<pid>/status, sampled every
# 0.2 s) stays under --rss-mb.
# Rules: frames come from random.Random(seed), so a run replays with --seed; a malformed frame
# must cost only its own connection (the well-behaved client's connections never drop).
#
# Run: .venv/bin/python benchmarks/live_fuzz.py [--frames 100000] [--concurrency 64]
#      [--rss-mb 400] [--seed N]   (results: benchmarks/README.md)
# tests/test_live_fuzz.py runs run_live_fuzz() with 5,000 frames.
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import time

from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer
from rstream.recovery import BackOffRecoveryStrategy
from rstream.utils import RawMessage

from riverlog.protocol.rabbitmq_stream import CURRENT, encode, simple_entry
from riverlog.protocol.rabbitmq_stream import frames as f

from _proc import HOST, free_port, rss_kib, wait_listening  # benchmarks/_proc.py

STREAM = "live-fuzz"
FRAME_MAX = 1_048_576  # riverlog's default Tune proposal (config.RabbitStreamConfig)
_KEYS = sorted(CURRENT.readers)


# -- malformed frames ------------------------------------------------------------------------------


def _frame(key: int, version: int, body: bytes, size: int | None = None) -> bytes:
    return struct.pack(">IHH", 4 + len(body) if size is None else size, key, version) + body


def _garbage_body(rng: random.Random) -> bytes:
    """Wire-like tokens: ints, strings and arrays whose lengths may lie."""
    parts = []
    for _ in range(rng.randrange(8)):
        kind = rng.randrange(5)
        if kind == 0:
            parts.append(rng.randbytes(rng.choice((1, 2, 4, 8))))
        elif kind == 1:
            parts.append(struct.pack(">h", rng.choice((-1, 0, 3, 40, 32767))) + rng.randbytes(rng.randrange(12)))
        elif kind == 2:
            parts.append(struct.pack(">i", rng.choice((-1, 0, 1, 2, 1 << 30, 0x7FFFFFFF))))
        else:
            parts.append(rng.randbytes(rng.randrange(40)))
    return b"".join(parts)


def _nonsense_command(rng: random.Random, corr: int) -> f.Frame:
    """A well-formed frame that names things that do not exist on this connection."""
    pick = rng.randrange(8)
    if pick == 0:
        return f.Publish(rng.randrange(256), tuple((i, simple_entry(b"x" * rng.randrange(64)))
                                                   for i in range(rng.randrange(1, 20))))
    if pick == 1:
        return f.Credit(rng.randrange(256), rng.randrange(1, 100))
    if pick == 2:
        return f.Subscribe(corr, rng.randrange(256), f"missing-{rng.randrange(9)}",
                           rng.choice((1, 2, 3)), None, rng.randrange(1, 10), {})
    if pick == 3:
        return f.DeclarePublisher(corr, rng.randrange(256), None, f"missing-{rng.randrange(9)}")
    if pick == 4:
        return f.Unsubscribe(corr, rng.randrange(256))
    if pick == 5:
        return f.QueryOffset(corr, "ref", STREAM)
    if pick == 6:
        return f.Metadata(corr, tuple(f"s{rng.randrange(1000)}" for _ in range(rng.randrange(4))))
    return f.DeletePublisher(corr, rng.randrange(256))


def malformed(rng: random.Random, corr: int, opened: bool) -> tuple[str, bytes]:
    """(kind, bytes) of one bad frame."""
    kind = rng.choice(("random", "garbage-body", "truncated", "oversized", "unknown-key",
                       "nonsense", "nonsense") + (() if opened else ("draft",)))
    if kind == "random":
        return kind, rng.randbytes(rng.randrange(1, 200))
    if kind == "garbage-body":
        key, version = rng.choice(_KEYS)
        return kind, _frame(key, version, _garbage_body(rng))
    if kind == "truncated":
        whole = encode(_nonsense_command(rng, corr))
        return kind, whole[:rng.randrange(1, len(whole))]
    if kind == "oversized":
        limit = FRAME_MAX if opened else 65536
        size = rng.choice((limit + 1, limit * 4, 0xFFFFFFFF, rng.randrange(limit + 1, 1 << 32)))
        return kind, _frame(0x0002, 1, rng.randbytes(rng.randrange(64)), size)
    if kind == "draft":  # the 2020 draft's keys (draft.py), first one PeerProperties (15)
        key = 15 if rng.random() < 0.5 else rng.randrange(1, 32)
        return kind, _frame(15, 0, _garbage_body(rng)) + _frame(key, 0, _garbage_body(rng))
    if kind == "unknown-key":
        return kind, _frame(rng.choice((0x0000, 0x0030, 0x7FFF, 0x8000, 0xFFFF, 0x0002)),
                            rng.choice((0, 3, 9, 0xFFFF)), _garbage_body(rng))
    return kind, encode(_nonsense_command(rng, corr))


# -- fuzz connections ------------------------------------------------------------------------------


async def _handshake(reader, writer) -> bool:
    """PeerProperties, SASL PLAIN, Tune echo, Open, read with riverlog's codec."""
    from riverlog.protocol.rabbitmq_stream import FrameDecoder
    decoder = FrameDecoder(max_frame_size=0)
    pending: list = []

    async def expect(cls):
        while True:
            while pending:
                frame = pending.pop(0)
                if isinstance(frame, cls):
                    return frame
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("closed during handshake")
            pending.extend(decoder.feed(data))

    writer.write(encode(f.PeerProperties(1, {"product": "live-fuzz"})))
    await expect(f.PeerPropertiesResponse)
    writer.write(encode(f.SaslHandshake(2)))
    await expect(f.SaslHandshakeResponse)
    writer.write(encode(f.SaslAuthenticate(3, "PLAIN", b"\0guest\0guest")))
    await expect(f.SaslAuthenticateResponse)
    tune = await expect(f.Tune)
    writer.write(encode(f.Tune(tune.frame_max, 0)))
    writer.write(encode(f.Open(4, "/")))
    await expect(f.OpenResponse)
    return True


@dataclasses.dataclass
class Counts:
    frames: int = 0
    connections: int = 0
    closed_by_server: int = 0
    by_kind: dict = dataclasses.field(default_factory=dict)
    client_errors: int = 0


async def fuzz_connection(port: int, rng: random.Random, counts: Counts, budget: list[int]) -> None:
    reader, writer = await asyncio.open_connection(HOST, port)
    counts.connections += 1
    try:
        opened = rng.random() < 0.6 and await asyncio.wait_for(_handshake(reader, writer), 10)
        for i in range(rng.randrange(1, 12)):
            if budget[0] <= 0:
                break
            budget[0] -= 1
            kind, data = malformed(rng, 100 + i, bool(opened))
            counts.frames += 1
            counts.by_kind[kind] = counts.by_kind.get(kind, 0) + 1
            writer.write(data)
            if kind != "nonsense":
                break  # the connection is (or should be) done for
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # a truncated frame stays truncated: the server closes at EOF
        with contextlib.suppress(asyncio.TimeoutError):
            while await asyncio.wait_for(reader.read(65536), 5):
                pass
            counts.closed_by_server += 1
    except (ConnectionError, OSError):
        counts.closed_by_server += 1
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


# -- the well-behaved client -----------------------------------------------------------------------


class GoodClient:
    """An rstream producer publishing numbered messages with confirms and a consumer reading
    the stream from the first offset; ``check()`` says whether both saw the same thing."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.confirmed: list[int] = []
        self.consumed: list[int] = []
        self.errors: list[str] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        auth = {"username": "guest", "password": "guest"}
        producer = Producer(HOST, self.port, recovery_strategy=BackOffRecoveryStrategy(False), **auth)
        consumer = Consumer(HOST, self.port, **auth)

        async def on_message(msg, ctx):
            self.consumed.append(int(bytes(msg).split(b":")[0]))

        def on_confirm(status):
            if status.is_confirmed:
                self.confirmed.append(status.message_id)
            else:
                self.errors.append(f"publish {status.message_id} refused: {status.response_code}")

        try:
            await producer.start()
            await producer.create_stream(STREAM, exists_ok=True)
            await consumer.start()
            await consumer.subscribe(STREAM, on_message, offset_specification=
                                     ConsumerOffsetSpecification(OffsetType.FIRST, None))
            seq = 0
            while not self.stop.is_set():
                batch = [RawMessage(b"%d:%s" % (seq + i + 1, b"v" * 100), publishing_id=seq + i + 1)
                         for i in range(100)]
                seq += 100
                await producer.send_batch(STREAM, batch, on_publish_confirm=on_confirm)
                await asyncio.sleep(0.02)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while (len(self.confirmed) < seq or len(self.consumed) < len(self.confirmed)) \
                    and loop.time() < deadline:
                await asyncio.sleep(0.05)
        except Exception as exc:  # reported, and the run fails
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.close(), 5)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.close(), 5)

    def check(self) -> list[str]:
        problems = list(self.errors)
        if not self.confirmed:
            problems.append("the rstream producer got no confirm")
        if sorted(self.confirmed) != list(range(1, len(self.confirmed) + 1)):
            problems.append("confirms are not 1..n")
        if self.consumed != list(range(1, len(self.consumed) + 1)):
            problems.append("the consumer did not read 1..n in order")
        if len(self.consumed) < len(self.confirmed):
            problems.append(f"consumed {len(self.consumed)} of {len(self.confirmed)} confirmed")
        return problems


# -- the run ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    frames: int
    connections: int
    closed_by_server: int
    by_kind: dict
    seconds: float
    frames_per_s: int
    good_confirmed: int
    good_consumed: int
    rss_start_mib: float
    rss_peak_mib: float
    rss_end_mib: float
    server_alive: bool
    problems: list

    def as_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


async def run_live_fuzz(frames: int, concurrency: int, workdir: str, rss_mb: int,
                        seed: int | None = None) -> Result:
    seed = random.randrange(1 << 30) if seed is None else seed
    port = free_port()
    log_path = os.path.join(workdir, "server.log")
    cmd = [sys.executable, "-m", "riverlog", "serve", "-d", os.path.join(workdir, "data"),
           "--stream-port", str(port), "-p", "0", "--nats-port", "0", "--level", "error"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    problems: list[str] = []
    try:
        await asyncio.to_thread(wait_listening, port, proc)
        rss_start = peak = rss_kib(proc.pid)
        good = GoodClient(port)
        good_task = asyncio.create_task(good.run())
        await asyncio.sleep(0.5)
        counts = Counts()
        budget = [frames]
        rng = random.Random(seed)
        began = time.monotonic()

        async def worker(n: int) -> None:
            wrng = random.Random(rng.random() + n)
            while budget[0] > 0:
                try:
                    await fuzz_connection(port, wrng, counts, budget)
                except (ConnectionError, OSError, asyncio.TimeoutError):
                    counts.client_errors += 1

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, rss_kib(proc.pid))
                await asyncio.sleep(0.2)

        sampler = asyncio.create_task(sample())
        await asyncio.gather(*(worker(n) for n in range(concurrency)))
        seconds = time.monotonic() - began
        good.stop.set()
        await good_task
        sampler.cancel()
        peak = max(peak, rss_kib(proc.pid))
        rss_end = rss_kib(proc.pid)
        alive = proc.poll() is None
        problems += good.check()
        if not alive:
            problems.append(f"riverlog died with {proc.returncode}")
        if peak > rss_mb * 1024:
            problems.append(f"peak RSS {peak / 1024:.0f} MiB above {rss_mb} MiB")
        return Result(counts.frames, counts.connections, counts.closed_by_server,
                      counts.by_kind, round(seconds, 1), int(counts.frames / seconds),
                      len(good.confirmed), len(good.consumed), round(rss_start / 1024, 1),
                      round(peak / 1024, 1), round(rss_end / 1024, 1), alive,
                      problems + [f"seed {seed}"] * bool(problems))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main() -> None:
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    parser = argparse.ArgumentParser(description="Malformed frames against a live riverlog while "
                                                 "rstream publishes and consumes.")
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rss-mb", type=int, default=400)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="riverlog-live-fuzz-") as workdir:
        result = asyncio.run(run_live_fuzz(args.frames, args.concurrency, workdir, args.rss_mb,
                                           args.seed))
    print(result.as_json())
    sys.exit(1 if result.problems else 0)


if __name__ == "__main__":
    main()
