# Crash under load: `riverlog serve` (a subprocess in its own process group) is SIGKILLed and
# restarted over and over while real clients publish with confirms through all three doors:
# rstream on the RabbitMQ Stream door, nats-py enveloped publishes (ack policies LEADER and ALL,
# alternating) on the NATS door and gufo-liftbridge's publish_bulk (the PublishAsync RPC) on the
# gRPC door, all into one stream. After every restart the messages written since the previous
# check are read back over gRPC Subscribe and every message confirmed/acked in the killed run
# must be there exactly once; at the end the whole stream is read and checked again: no
# confirmed message lost, no message twice, every publisher's messages in the order it sent
# them, offsets contiguous from 0.
# Rules: each publisher's messages carry (publisher, round, sequence) so a message names itself;
# the clients of a round are torn down before the next start, so no client retry can reach the
# restarted server (rstream recovery is off); messages that reached the log unconfirmed are
# allowed (counted as "unconfirmed but stored").
# NATS: riverlog is pointed at a nats-server this script runs (--nats-servers; riverlog's own
# EmbeddedNats class, so it dies with this script), and NATS clients survive the kills. The
# server is killed with killpg; its own embedded nats-server, when it runs one, dies with it
# anyway (PR_SET_PDEATHSIG, embedded_nats.py; tests/test_crash_under_load.py checks it).
#
# Run: .venv/bin/python benchmarks/crash_bench.py [--kills 100] [--policy always|interval|never]
#      [--seed N] [--min-run 0.3 --max-run 1.5] [--rate 5000]   (results: benchmarks/README.md)
# Stuck? kill -USR1 <pid> dumps the threads, kill -USR2 <pid> the asyncio tasks (stderr).
# tests/test_crash_under_load.py runs run_crash_test() with 20 kills under `always`.
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import faulthandler
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import grpc
import nats
from gufo.liftbridge.client import LiftbridgeClient
from gufo.liftbridge.types import AckPolicy as GufoAckPolicy
from rstream import Producer
from rstream.recovery import BackOffRecoveryStrategy
from rstream.utils import RawMessage

from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc
from riverlog.protocol.liftbridge.envelope import decode_ack, encode_publish
from riverlog.server.embedded_nats import EmbeddedNats

from _proc import HOST, free_port  # benchmarks/_proc.py

STREAM = "crash"
PUBLISHERS = ("rstream", "nats", "gufo")
PAD = b"." * 64  # messages of ~80 bytes
START_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 1800.0  # the last read takes the whole stream (~30k messages/s over gRPC)
TEARDOWN_S = 5.0


def payload(publisher: str, rnd: int, seq: int) -> bytes:
    return b"%s:%d:%d:%s" % (publisher.encode(), rnd, seq, PAD)


def parse(value: bytes) -> tuple[str, int, int]:
    """(publisher, round, sequence) of a message this script wrote; ValueError otherwise."""
    publisher, rnd, seq, _ = value.split(b":", 3)
    return publisher.decode(), int(rnd), int(seq)


class ServerProcess:
    """`riverlog serve` on fixed ports and a fixed data dir; start() returns once it printed
    where clients connect (every door is up by then, cli._announce)."""

    def __init__(self, data_dir: str, log_path: str, nats_url: str, policy: str) -> None:
        self.data_dir, self.log_path = data_dir, log_path
        self.stream_port, self.grpc_port = free_port(), free_port()
        self.nats_url, self.policy = nats_url, policy
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        cmd = [sys.executable, "-m", "riverlog", "serve", "-d", self.data_dir,
               "--stream-port", str(self.stream_port), "-p", str(self.grpc_port),
               "--nats-servers", self.nats_url, "--durability", self.policy,
               "--level", "warning"]
        out_path = f"{self.log_path}.out"
        with open(self.log_path, "ab") as log, open(out_path, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=log, stdin=subprocess.DEVNULL,
                                         start_new_session=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.starts += 1
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with open(out_path, "rb") as out:
                if b"riverlog serving" in out.read():
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(f"riverlog exited with {self.proc.returncode} on start "
                                   f"{self.starts}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"riverlog did not start within {START_TIMEOUT_S}s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the whole process group (riverlog and anything it started)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self) -> int:
        """SIGTERM and wait: the exit code of a clean shutdown (0)."""
        proc, self.proc = self.proc, None
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return -9

    def log_tail(self, n: int = 6000) -> str:
        with open(self.log_path, "rb") as log:
            return log.read().decode(errors="replace")[-n:]


@dataclasses.dataclass
class Report:
    policy: str
    kills: int = 0
    confirmed: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(PUBLISHERS, 0))
    lost: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    unconfirmed_stored: int = 0
    stored: int = 0
    offset_gaps: int = 0
    problems: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def total_confirmed(self) -> int:
        return sum(self.confirmed.values())

    def as_json(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "problems": self.problems[:20],
                           "total_confirmed": self.total_confirmed})


# -- the three publishers ------------------------------------------------------------------------
# Each appends the sequence numbers the server confirmed to ``acked`` (a list per publisher) and
# runs until ``stop`` is set (and is cancelled too: the flag matters because Python 3.11's
# asyncio.wait_for, used inside the client libraries, can swallow a cancellation that races with
# its result). Sequences start at 1 each round and only go up.


async def _pace(began: float, sent: int, rate: int) -> None:
    """Sleep while ``sent`` messages since loop time ``began`` are ahead of ``rate``/s."""
    ahead = sent / rate - (asyncio.get_running_loop().time() - began)
    if ahead > 0:
        await asyncio.sleep(ahead)


async def publish_rstream(port: int, rnd: int, acked: list, stop: asyncio.Event, rate: int,
                          window: int = 500) -> None:
    """Batches of 50 at ``rate`` messages/s at most, ``window`` unconfirmed at most."""
    slots = asyncio.Semaphore(window)
    loop = asyncio.get_running_loop()

    def on_confirm(status) -> None:
        slots.release()
        if status.is_confirmed:
            acked.append(status.message_id)

    producer = Producer(HOST, port, username="guest", password="guest",
                        recovery_strategy=BackOffRecoveryStrategy(enable=False))
    try:
        await producer.start()
        seq = 0
        began = loop.time()
        while not stop.is_set():
            await _pace(began, seq, rate)
            batch = []
            for _ in range(50):
                await slots.acquire()
                seq += 1
                batch.append(RawMessage(payload("rstream", rnd, seq), publishing_id=seq))
            await producer.send_batch(STREAM, batch, on_publish_confirm=on_confirm)
    finally:
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(producer.close(), 2)


async def publish_nats(nc, rnd: int, acked: list, stop: asyncio.Event, rate: int,
                       window: int = 100) -> None:
    """Enveloped publishes of ``window`` messages, then wait for their acks (2 s at most);
    ``rate`` messages/s at most.
    Acks arrive through a subscription callback (nats-py's next_msg does not end promptly
    when its task is cancelled)."""
    inbox = nc.new_inbox()
    pending: set[int] = set()
    all_acked = asyncio.Event()

    async def on_ack(msg) -> None:
        ack = decode_ack(msg.data)
        if ack is not None and ack.ackError == pb.Ack.Error.OK:
            n = int(ack.correlationId)
            if n in pending:
                pending.discard(n)
                acked.append(n)
                if not pending:
                    all_acked.set()

    sub = await nc.subscribe(inbox, cb=on_ack)
    loop = asyncio.get_running_loop()
    try:
        seq = 0
        began = loop.time()
        while not stop.is_set():
            await _pace(began, seq, rate)
            all_acked.clear()
            for _ in range(window):
                seq += 1
                policy = pb.AckPolicy.LEADER if seq % 2 else pb.AckPolicy.ALL
                pending.add(seq)
                await nc.publish(STREAM, encode_publish(pb.Message(
                    value=payload("nats", rnd, seq), ackInbox=inbox, ackPolicy=policy,
                    correlationId=str(seq))))
            await nc.flush()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(all_acked.wait(), 2)
            pending.clear()  # an ack later than that is not counted
    finally:
        pending.clear()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(sub.unsubscribe(), 1)


async def publish_gufo(grpc_port: int, rnd: int, acked: list, stop: asyncio.Event,
                       window: int = 20) -> None:
    """gufo's publish_bulk (the PublishAsync RPC), ``window`` messages at a time. Not gufo's
    publish(): it calls Publish without a deadline, which by Liftbridge's contract returns
    before the message is committed, so its return is no ack (reference/liftbridge.md)."""
    async with LiftbridgeClient([f"{HOST}:{grpc_port}"]) as lb:
        seq = 0
        while not stop.is_set():
            requests = []
            for _ in range(window):
                seq += 1
                policy = GufoAckPolicy.LEADER if seq % 2 else GufoAckPolicy.ALL
                requests.append(lb.get_publish_request(
                    payload("gufo", rnd, seq), stream=STREAM, partition=0,
                    correlation_id=str(seq), ack_policy=policy))
            async for response in lb.publish_bulk(requests):
                if response.HasField("ack") and not response.HasField("asyncError") \
                        and response.ack.ackError == pb.Ack.Error.OK:
                    acked.append(int(response.correlationId))


# -- reading back and checking ---------------------------------------------------------------------


async def read_from(grpc_port: int, offset: int) -> list[tuple[int, bytes]]:
    """(offset, value) of every message from ``offset`` to the newest (gRPC Subscribe with
    STOP_LATEST, the Liftbridge handshake message dropped)."""
    async with grpc.aio.insecure_channel(f"{HOST}:{grpc_port}") as channel:
        stub = api_pb2_grpc.APIStub(channel)
        call = stub.Subscribe(pb.SubscribeRequest(
            stream=STREAM, partition=0, startPosition=pb.StartPosition.OFFSET,
            startOffset=offset, stopPosition=pb.StopPosition.STOP_LATEST))
        out = []
        first = True
        try:
            async for msg in call:
                if first:
                    first = False
                    if msg == pb.Message():
                        continue
                out.append((msg.offset, msg.value))
        except grpc.aio.AioRpcError as exc:  # how Subscribe ends at the stop offset
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
        return out


def check(report: Report, messages: list[tuple[int, bytes]], start: int,
          confirmed: dict[tuple[str, int], set[int]], rounds: set[int]) -> None:
    """Check ``messages`` (read from offset ``start``) against what was confirmed in
    ``rounds``: each confirmed message present exactly once, each publisher in order."""
    seen: dict[tuple[str, int, int], int] = {}
    last: dict[str, tuple[int, int]] = {}
    expected = start
    for offset, value in messages:
        if offset != expected:
            report.offset_gaps += 1
            report.problems.append(f"offset {offset} follows {expected - 1}")
        expected = offset + 1
        try:
            name, rnd, seq = parse(value)
        except ValueError:
            report.problems.append(f"offset {offset}: foreign message {value[:40]!r}")
            continue
        if (name, rnd, seq) in seen:
            report.duplicates += 1
            report.problems.append(f"{name} round {rnd} seq {seq} at offsets "
                                   f"{seen[name, rnd, seq]} and {offset}")
        seen[name, rnd, seq] = offset
        if name in last and last[name] >= (rnd, seq):
            report.out_of_order += 1
            report.problems.append(f"{name} ({rnd}, {seq}) at {offset} after {last[name]}")
        last[name] = (rnd, seq)
    for (name, rnd), seqs in confirmed.items():
        if rnd not in rounds:
            continue
        missing = [s for s in seqs if (name, rnd, s) not in seen]
        if missing:
            report.lost += len(missing)
            report.problems.append(f"{name} round {rnd}: {len(missing)} confirmed messages "
                                   f"missing, e.g. {sorted(missing)[:5]}")


# -- the run ---------------------------------------------------------------------------------------


async def _ensure_stream(grpc_port: int) -> None:
    async with grpc.aio.insecure_channel(f"{HOST}:{grpc_port}") as channel:
        stub = api_pb2_grpc.APIStub(channel)
        try:
            await stub.CreateStream(pb.CreateStreamRequest(name=STREAM, subject=STREAM),
                                    timeout=10)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise


async def _one_round(server: ServerProcess, nc, rnd: int, rng: random.Random,
                     min_run: float, max_run: float, rate: int) -> dict[str, list[int]]:
    """Publish through the three doors, SIGKILL the server at a random moment, tear the
    clients down. Returns the confirmed sequences per publisher."""
    acked = {name: [] for name in PUBLISHERS}
    stop = asyncio.Event()
    tasks = [asyncio.create_task(publish_rstream(server.stream_port, rnd, acked["rstream"], stop,
                                                 rate), name="rstream"),
             asyncio.create_task(publish_nats(nc, rnd, acked["nats"], stop, rate), name="nats"),
             asyncio.create_task(publish_gufo(server.grpc_port, rnd, acked["gufo"], stop),
                                 name="gufo")]
    loop = asyncio.get_running_loop()
    # mostly once every door has confirmed something; sometimes while clients still connect
    if rng.random() < 0.85:
        deadline = loop.time() + 10
        while not all(acked.values()) and loop.time() < deadline:
            if any(t.done() for t in tasks):
                break
            await asyncio.sleep(0.01)
    await asyncio.sleep(rng.uniform(min_run, max_run))
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise RuntimeError(f"round {rnd}: a publisher failed while the server was up") \
                from task.exception()
    await asyncio.to_thread(server.kill)
    stop.set()
    for task in tasks:
        task.cancel()
    # a client library may sit on a dead socket despite the cancel: give up on it after a while
    # (it holds no live connection: the server it spoke to is gone)
    _, stuck = await asyncio.wait(tasks, timeout=TEARDOWN_S)
    for task in stuck:
        print(f"  round {rnd}: {task.get_name()} did not end {TEARDOWN_S} s after cancel",
              file=sys.stderr)
        task.print_stack(file=sys.stderr)
    return acked


def _print_tasks() -> None:
    for task in asyncio.all_tasks():
        task.print_stack(file=sys.stderr)


async def run_crash_test(kills: int, policy: str, workdir: str, seed: int | None = None,
                         min_run: float = 0.3, max_run: float = 1.5, rate: int = 5000,
                         log=print) -> Report:
    """Kill and restart `riverlog serve` ``kills`` times under load; returns the Report
    (``lost``, ``duplicates``, ``out_of_order`` and ``offset_gaps`` must all be 0)."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, _print_tasks)
    seed = random.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    report = Report(policy)
    began = time.monotonic()
    natsd = EmbeddedNats(HOST, 0)  # a child of this process: dies with it (PR_SET_PDEATHSIG)
    await natsd.start()
    server = ServerProcess(os.path.join(workdir, "data"), os.path.join(workdir, "server.log"),
                           natsd.url, policy)
    async def nats_error(exc):
        log(f"nats error: {exc!r}")
    nc = await nats.connect(natsd.url, max_reconnect_attempts=-1, error_cb=nats_error)
    confirmed: dict[tuple[str, int], set[int]] = {}
    checked_from = 0
    try:
        server.start()
        await _ensure_stream(server.grpc_port)
        for rnd in range(1, kills + 1):
            if rnd > 1:
                t0 = time.monotonic()
                server.start()
                t1 = time.monotonic()
                # what the killed run confirmed is all at or after checked_from
                messages = await asyncio.wait_for(read_from(server.grpc_port, checked_from),
                                                  READ_TIMEOUT_S)
                log(f"  restart {t1 - t0:.2f} s, read {len(messages)} from offset "
                    f"{checked_from} in {time.monotonic() - t1:.2f} s")
                check(report, messages, checked_from, confirmed, {rnd - 1})
                checked_from = messages[-1][0] + 1 if messages else checked_from
            acked = await _one_round(server, nc, rnd, rng, min_run, max_run, rate)
            report.kills += 1
            for name, seqs in acked.items():
                confirmed[name, rnd] = set(seqs)
                report.confirmed[name] += len(seqs)
            log(f"round {rnd}: confirmed " + " ".join(f"{n}={len(s)}" for n, s in acked.items())
                + f"; lost so far {report.lost}")
        server.start()
        messages = await asyncio.wait_for(read_from(server.grpc_port, 0), READ_TIMEOUT_S)
        whole = Report(policy)
        check(whole, messages, 0, confirmed, set(range(1, kills + 1)))
        for name in ("lost", "duplicates", "out_of_order", "offset_gaps"):
            setattr(report, name, max(getattr(report, name), getattr(whole, name)))
        report.problems += whole.problems
        report.stored = len(messages)
        report.unconfirmed_stored = len(messages) - report.total_confirmed
        rc = server.stop()
        if rc != 0:
            report.problems.append(f"riverlog exited with {rc} after SIGTERM")
    except BaseException:
        server.kill()
        raise
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
        await natsd.stop()
        log(f"seed {seed}")
    report.seconds = round(time.monotonic() - began, 1)
    return report


def main() -> None:
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: where is it stuck?
    parser = argparse.ArgumentParser(description="SIGKILL riverlog serve under load from three doors; count confirmed and lost messages.")
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--policy", choices=("always", "interval", "never"), default="always")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--min-run", type=float, default=0.3,
                        help="seconds of publishing before a kill, at least")
    parser.add_argument("--max-run", type=float, default=1.5)
    parser.add_argument("--rate", type=int, default=5000,
                        help="rstream and nats messages/s at most, each (gufo waits for its acks)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="riverlog-crash-") as workdir:
        report = asyncio.run(run_crash_test(args.kills, args.policy, workdir, args.seed,
                                            args.min_run, args.max_run, args.rate))
    print(report.as_json())
    if report.lost or report.duplicates or report.out_of_order or report.offset_gaps or \
            report.problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
