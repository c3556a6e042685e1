# Rolling upgrade under load (issue 31 item 3): a three-server `cluster up`-style cluster (its
# layout and command lines: riverlog.cluster.local) starts on an EARLIER riverlog, installed
# into a venv of its own from `git archive` of a fixed commit (OLDER_COMMIT), and is upgraded
# one server at a time to this checkout's riverlog (SIGTERM, start again on the same data with
# the new code) while real clients publish into one replicated stream through all three doors:
# rstream with confirms (RabbitMQ Stream), nats-py enveloped publishes with ALL acks (NATS) and
# gufo-liftbridge's publish_bulk with ALL acks (Liftbridge gRPC PublishAsync). While the
# cluster is mixed a super stream is made through an upgraded server, and every server (the
# older ones too) must hold it. At the end the stream is read back: every acknowledged message
# is there exactly once, no message twice. Figures: acked messages a second before each
# restart (steady) and from its SIGTERM until the restarted server is back in the ISR.
# Rules: messages name themselves (publisher:round:sequence); the clients of a round talk to a
# server that is not restarted in that round (what an operator's load balancer does), a
# client whose connection fails connects again (counted as a reconnect) and never resends, so
# a message stored without its ack is allowed, never twice. The older riverlog's venv takes
# its dependencies from this environment (a .pth line) and is built from PyPI's build tools;
# it is cached (RIVERLOG_UPGRADE_CACHE, else the temp folder) by commit and environment.
# Run: .venv/bin/python benchmarks/rolling_upgrade.py --help; tests/cluster/test_rolling_upgrade.py
# runs run_upgrade() with short rounds.
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request

import grpc
import nats
from gufo.liftbridge.client import LiftbridgeClient
from gufo.liftbridge.types import AckPolicy as GufoAckPolicy
from rstream import Producer
from rstream.recovery import BackOffRecoveryStrategy
from rstream.utils import RawMessage

from riverlog.cluster.features import FEATURES, VERSION
from riverlog.cluster.local import LocalCluster
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc
from riverlog.protocol.liftbridge.envelope import decode_ack, encode_publish

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OLDER_COMMIT = "0308553ee624bb08e6317c4b49dd29c07efcf252"
"""The riverlog upgraded from: main just before batched PublishAsync forwarding (7192c0d) and
so before the one-entry super stream commands (5ba1251) and the feature table. Both need their
fallback while the cluster is mixed: an older leader does not listen on `<ns>.forward.` and an
older server does not know create_super_stream_with_streams. (a28ec66, just before the super
stream commands, upgrades as well: benchmarks/README.md.)"""
HOST = "127.0.0.1"
STREAM = "upgrade"
PUBLISHERS = ("rstream", "nats", "grpc")
PAD = b"." * 48
CONNECTION_LOST = -1
"""rstream's response code for the messages outstanding on a connection that failed."""
WAIT_S = 120.0
ANSWER_TIMEOUT_S = 10.0
"""A PublishAsync call whose acks did not all come within this is given up (a reconnect)."""


def older_python(commit: str = OLDER_COMMIT, cache: str | None = None, log=print) -> str:
    """The python of a venv holding riverlog at ``commit`` (built once, then cached under
    ``cache``, RIVERLOG_UPGRADE_CACHE or the temp folder, by commit and by this environment,
    whose packages it uses; a lock file keeps two runs from building it at once; a cached
    one that no longer imports, e.g. its environment was deleted, is built again). Raises
    RuntimeError (the commit is not in this clone and cannot be fetched, or pip failed: its
    output in the message)."""
    cache = cache or os.environ.get("RIVERLOG_UPGRADE_CACHE") or os.path.join(
        tempfile.gettempdir(), "riverlog-upgrade")
    environment = hashlib.sha256(sys.prefix.encode()).hexdigest()[:8]
    root = os.path.join(cache, f"{commit[:12]}-{environment}")
    python = os.path.join(root, "venv", "bin", "python")
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(root, "ready")) and subprocess.run(
                [python, "-c", "import riverlog.cli"], capture_output=True).returncode == 0:
            _link_nats_server(python)
            return python
        if os.path.exists(os.path.join(root, "ready")):
            log(f"the cached riverlog {commit[:12]} in {root} does not import: building it "
                f"again")
            os.remove(os.path.join(root, "ready"))
        for part in ("src", "venv"):
            shutil.rmtree(os.path.join(root, part), ignore_errors=True)
        if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            log(f"fetching {commit[:12]} (not in this clone)")
            fetched = _git("fetch", "--quiet", "origin", commit)
            if fetched.returncode != 0:
                raise RuntimeError(f"commit {commit} is not in {REPO} and cannot be fetched: "
                                   f"{fetched.stderr.strip()} (a shallow clone? fetch more "
                                   f"history)")
        src = os.path.join(root, "src")
        os.makedirs(src)
        archive = subprocess.run(["git", "-C", REPO, "archive", commit], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
        log(f"building riverlog {commit[:12]} in {root} (its build tools from PyPI)")
        subprocess.run([sys.executable, "-m", "venv", os.path.join(root, "venv")], check=True)
        purelib = subprocess.run([python, "-c", "import sysconfig; "
                                  "print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        with open(os.path.join(purelib, "riverlog_dependencies.pth"), "w") as f:
            f.write(sysconfig.get_paths()["purelib"] + "\n")  # this environment's packages
        built = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", src],
                               capture_output=True, text=True)
        if built.returncode != 0:
            raise RuntimeError(f"installing riverlog {commit[:12]} failed:\n{built.stderr}")
        _link_nats_server(python)
        open(os.path.join(root, "ready"), "w").close()
    return python


def _link_nats_server(python: str) -> None:
    """The nats-server binary of this environment beside ``python`` (riverlog looks for it
    next to its Python; the dependencies' .pth line does not bring scripts)."""
    ours = os.path.join(sysconfig.get_paths()["scripts"], "nats-server")
    theirs = os.path.join(os.path.dirname(python), "nats-server")
    if os.path.exists(ours) and not os.path.lexists(theirs):
        os.symlink(ours, theirs)


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True)


class MixedCluster(LocalCluster):
    """A LocalCluster whose member i runs ``pythons[i]``, from ``directory`` (never this
    checkout: `python -m` would import the riverlog of the working folder)."""

    def __init__(self, directory: str, pythons: list[str]) -> None:
        super().__init__(directory, len(pythons))
        self.pythons = pythons

    def command(self, member):
        command, env = super().command(member)
        return [self.pythons[self.members.index(member)], *command[1:]], env

    def _spawn(self, member) -> subprocess.Popen:
        command, env = self.command(member)
        os.makedirs(os.path.join(self.directory, member.id), exist_ok=True)
        with open(os.path.join(self.directory, member.id, "riverlog.log"), "ab") as out:
            return subprocess.Popen(command, env={**os.environ, **env}, cwd=self.directory,
                                    stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def stop_one(self, index: int) -> int:
        """SIGTERM member ``index`` and wait (SIGKILL after 30 s); its exit code."""
        proc = self.procs[index]
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def address(self, index: int, door: str) -> tuple[str, int]:
        member = self.members[index]
        return member.advertised, member.ports[door]


@dataclasses.dataclass
class Counts:
    """What one publisher saw: acked sequence numbers (with their loop time), reconnects,
    refusals (an answer that is an error) and the messages sent (unacked ones may be
    stored, once)."""

    acked: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    reconnects: int = 0
    unconfirmed: int = 0
    """Messages the client gave up on as its connection failed (rstream's CONNECTION_LOST)."""
    refused: list[str] = dataclasses.field(default_factory=list)
    sent: int = 0


def payload(publisher: str, rnd: int, seq: int) -> bytes:
    return b"%s:%d:%d:%s" % (publisher.encode(), rnd, seq, PAD)


async def _again(counts: Counts, stop: asyncio.Event, exc: BaseException, log) -> None:
    counts.reconnects += 1
    log(f"  reconnect after {type(exc).__name__}: {str(exc)[:120]}")
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), 0.5)


async def publish_rstream(port: int, rnd: int, counts: Counts, stop: asyncio.Event, log,
                          rate: int) -> None:
    """Batches of 20 with confirms, 200 unconfirmed at most, ``rate`` messages/s at most."""
    loop = asyncio.get_running_loop()
    seq = 0
    while not stop.is_set():
        slots = asyncio.Semaphore(200)

        def on_confirm(status, slots=slots) -> None:
            slots.release()
            if status.is_confirmed:
                counts.acked.append((status.message_id, loop.time()))
            elif status.response_code == CONNECTION_LOST:  # rstream's own: a reconnect
                counts.unconfirmed += 1
            else:
                counts.refused.append(f"rstream confirm {status.response_code}")
        producer = Producer(HOST, port, username="guest", password="guest",
                            recovery_strategy=BackOffRecoveryStrategy(enable=False))
        try:
            await producer.start()
            while not stop.is_set():
                batch = []
                for _ in range(20):
                    await slots.acquire()
                    seq += 1
                    batch.append(RawMessage(payload("rstream", rnd, seq), publishing_id=seq))
                await producer.send_batch(STREAM, batch, on_publish_confirm=on_confirm)
                counts.sent += len(batch)
                await asyncio.sleep(20 / rate)
            await asyncio.sleep(1.0)  # the last confirms
        except Exception as exc:  # the connection failed: a new producer
            await _again(counts, stop, exc, log)
        finally:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(producer.close(), 2)


async def publish_nats(port: int, rnd: int, counts: Counts, stop: asyncio.Event, log,
                       rate: int) -> None:
    """Enveloped publishes with ALL acks, 50 at a time, each round's acks awaited 5 s."""
    loop = asyncio.get_running_loop()
    seq = 0
    while not stop.is_set():
        try:
            nc = await nats.connect(f"nats://{HOST}:{port}", allow_reconnect=False,
                                    connect_timeout=2)
        except Exception as exc:
            await _again(counts, stop, exc, log)
            continue
        pending: set[int] = set()
        done = asyncio.Event()

        async def on_ack(msg) -> None:
            ack = decode_ack(msg.data)
            if ack is None:
                return
            n = int(ack.correlationId)
            if n in pending:
                pending.discard(n)
                if ack.ackError == pb.Ack.Error.OK:
                    counts.acked.append((n, loop.time()))
                else:
                    counts.refused.append(f"nats ack error {ack.ackError}")
                if not pending:
                    done.set()
        try:
            inbox = nc.new_inbox()
            await nc.subscribe(inbox, cb=on_ack)
            while not stop.is_set():
                done.clear()
                for _ in range(50):
                    seq += 1
                    pending.add(seq)
                    await nc.publish(STREAM, encode_publish(pb.Message(
                        value=payload("nats", rnd, seq), ackInbox=inbox,
                        ackPolicy=pb.AckPolicy.ALL, correlationId=str(seq))))
                counts.sent += 50
                await nc.flush()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(done.wait(), 5)
                pending.clear()  # later acks are not counted
                await asyncio.sleep(50 / rate)
        except Exception as exc:
            await _again(counts, stop, exc, log)
        finally:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(nc.close(), 2)


async def publish_grpc(port: int, rnd: int, counts: Counts, stop: asyncio.Event, log,
                       rate: int) -> None:
    """gufo's publish_bulk (PublishAsync) with ALL acks, 50 requests a call."""
    loop = asyncio.get_running_loop()
    seq = 0
    while not stop.is_set():
        try:
            async with LiftbridgeClient([f"{HOST}:{port}"]) as lb:
                while not stop.is_set():
                    requests = []
                    for _ in range(50):
                        seq += 1
                        requests.append(lb.get_publish_request(
                            payload("grpc", rnd, seq), stream=STREAM, partition=0,
                            correlation_id=str(seq), ack_policy=GufoAckPolicy.ALL))
                    counts.sent += 50

                    async def call(requests=requests) -> None:
                        async for response in lb.publish_bulk(requests):
                            if response.HasField("asyncError"):
                                counts.refused.append(f"grpc {response.asyncError.message}")
                            elif response.ack.ackError == pb.Ack.Error.OK:
                                counts.acked.append((int(response.correlationId),
                                                     loop.time()))
                    await asyncio.wait_for(call(), ANSWER_TIMEOUT_S)  # else: connect again
                    await asyncio.sleep(50 / rate)
        except (Exception, asyncio.TimeoutError) as exc:
            await _again(counts, stop, exc, log)


async def _metadata(cluster: MixedCluster, index: int) -> pb.FetchMetadataResponse | None:
    host, port = cluster.address(index, "grpc")
    try:
        async with grpc.aio.insecure_channel(f"{host}:{port}") as channel:
            return await api_pb2_grpc.APIStub(channel).FetchMetadata(
                pb.FetchMetadataRequest(), timeout=5)
    except grpc.aio.AioRpcError:
        return None


async def until(what: str, check, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"still not: {what}")
        await asyncio.sleep(0.2)


async def _partition(cluster: MixedCluster, index: int, stream: str = STREAM):
    answer = await _metadata(cluster, index)
    for found in () if answer is None else answer.streamMetadata:
        if found.name == stream and 0 in found.partitions:
            return found.partitions[0]
    return None


async def in_sync(cluster: MixedCluster, index: int) -> bool:
    """Whether server ``index`` sees every replica of the stream in the ISR, with a leader."""
    part = await _partition(cluster, index)
    return part is not None and bool(part.leader) and len(part.isr) == len(cluster.members)


async def _back(cluster: MixedCluster, index: int) -> bool:
    """``in_sync`` as server ``index`` tells; raises RuntimeError once it exited."""
    if cluster.procs[index].poll() is not None:
        raise RuntimeError(f"server {index} exited with {cluster.procs[index].returncode} (see "
                           f"{cluster.directory}/{cluster.members[index].id}/riverlog.log)")
    return await in_sync(cluster, index)


async def read_all(cluster: MixedCluster, index: int) -> list[bytes]:
    """Every message of the stream, read from its leader (as server ``index`` tells)."""
    part = await until("a leader", lambda: _partition(cluster, index))
    leader = [m.id for m in cluster.members].index(part.leader)
    host, port = cluster.address(leader, "grpc")
    async with grpc.aio.insecure_channel(f"{host}:{port}") as channel:
        stub = api_pb2_grpc.APIStub(channel)
        meta = await stub.FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(
            stream=STREAM, partition=0), timeout=10)
        newest = meta.metadata.newestOffset
        out: list[bytes] = []
        if newest < 0:
            return out
        call = stub.Subscribe(pb.SubscribeRequest(
            stream=STREAM, partition=0, startPosition=pb.StartPosition.EARLIEST),
            timeout=300)
        async for msg in call:
            if msg == pb.Message():
                continue
            out.append(msg.value)
            if msg.offset >= newest:
                break
        call.cancel()
    return out


@dataclasses.dataclass
class Report:
    """The run's figures (rates in acked messages/s, all doors together) and problems."""

    steady: list[float] = dataclasses.field(default_factory=list)
    restarting: list[float] = dataclasses.field(default_factory=list)
    restart_s: list[float] = dataclasses.field(default_factory=list)
    by_door: list[dict[str, list[float]]] = dataclasses.field(default_factory=list)
    """Per restart, each door's [steady, while restarting] acked/s."""
    acked: dict[str, int] = dataclasses.field(default_factory=dict)
    reconnects: dict[str, int] = dataclasses.field(default_factory=dict)
    unconfirmed: dict[str, int] = dataclasses.field(default_factory=dict)
    refused: list[str] = dataclasses.field(default_factory=list)
    stored: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)

    def as_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)


def _rate(counts: dict[str, Counts], start: float, end: float) -> float:
    acked = sum(1 for c in counts.values() for _, t in c.acked if start <= t < end)
    return acked / max(end - start, 1e-9)


async def run_upgrade(workdir: str, steady_s: float = 3.0, after_s: float = 2.0,
                      rate: int = 500, older: str | None = None, log=print,
                      commit: str = OLDER_COMMIT) -> Report:
    """The whole run in ``workdir``; ``rate``: messages/s per door at most. Returns the
    Report (``problems`` empty when nothing acked was lost or doubled and every check held).
    ``older``: the python of an earlier riverlog's venv; else ``commit`` built (older_python)."""
    pythons = [older or older_python(commit, log=log)] * 3
    cluster = MixedCluster(os.path.join(workdir, "cluster"), pythons)
    report = Report()
    loop = asyncio.get_running_loop()
    all_counts: dict[tuple[str, int], Counts] = {}
    cluster.start()
    try:
        await asyncio.to_thread(cluster.wait_registered)
        host, port = cluster.address(0, "grpc")
        async with grpc.aio.insecure_channel(f"{host}:{port}") as channel:
            await api_pb2_grpc.APIStub(channel).CreateStream(pb.CreateStreamRequest(
                name=STREAM, subject=STREAM, replicationFactor=3,
                minIsr=pb.NullableInt32(value=2)), timeout=30)
        await until("the stream in sync", lambda: in_sync(cluster, 0))
        for step in range(3):
            via = (step + 1) % 3
            stop = asyncio.Event()
            counts = {name: Counts() for name in PUBLISHERS}
            all_counts.update({(name, step): c for name, c in counts.items()})
            doors = {"rstream": publish_rstream, "nats": publish_nats, "grpc": publish_grpc}
            ports = {"rstream": "stream", "nats": "nats", "grpc": "grpc"}
            vias = {n: via for n in PUBLISHERS}
            if step:  # gRPC through the upgraded s0, a follower of an older leader at first
                vias["grpc"] = 0
            tasks = [loop.create_task(doors[n](cluster.address(vias[n], ports[n])[1], step,
                                               counts[n], stop, log, rate))
                     for n in PUBLISHERS]
            began = loop.time()
            await asyncio.sleep(steady_s)
            report.steady.append(_rate(counts, began + 1.0, loop.time()))
            restart = loop.time()
            log(f"step {step}: restarting server {cluster.members[step].id} on this riverlog")
            code = await asyncio.to_thread(cluster.stop_one, step)
            if code != 0:
                report.problems.append(f"server {step} exited with {code} on SIGTERM")
            cluster.pythons[step] = sys.executable
            cluster.restart(step)
            await until(f"server {step} back in the ISR", lambda: _back(cluster, step))
            back = loop.time()
            report.restart_s.append(back - restart)
            report.restarting.append(_rate(counts, restart, back))
            report.by_door.append({n: [_rate({n: c}, began + 1.0, restart),
                                       _rate({n: c}, restart, back)]
                                   for n, c in counts.items()})
            if step == 0:
                await _super_stream_while_mixed(cluster, report)
            await asyncio.sleep(after_s)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
        await _features_everywhere(cluster, report)
        messages = await read_all(cluster, 0)
    finally:
        await asyncio.to_thread(cluster.stop)
    _check(report, messages, all_counts)
    return report


async def _super_stream_while_mixed(cluster: MixedCluster, report: Report) -> None:
    """A super stream made through the upgraded server 0 while 1 and 2 run the older
    riverlog: every server must list its partition streams (the older commands were used)."""
    host, port = cluster.address(0, "stream")
    producer = Producer(host, port, username="guest", password="guest")
    try:
        await producer.start()
        client = await producer.default_client
        await client.create_super_stream("mixed", ["mixed-0", "mixed-1"], ["0", "1"])
    finally:
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(producer.close(), 2)

    async def everywhere() -> bool:
        for index in range(3):
            answer = await _metadata(cluster, index)
            names = set() if answer is None else {s.name for s in answer.streamMetadata}
            if not {"mixed-0", "mixed-1"} <= names:
                return False
        return True
    try:
        await until("the mixed super stream on every server", everywhere, 30)
    except TimeoutError as exc:
        report.problems.append(str(exc))


async def _features_everywhere(cluster: MixedCluster, report: Report) -> None:
    """Once every server runs this riverlog, each one's /metrics tells the cluster version
    and every feature active (the servers announced their version when they started)."""
    wanted = [f"riverlog_cluster_version {float(VERSION)}"] + [
        f'riverlog_feature_active{{feature="{name}"}} 1.0' for name in FEATURES]

    def scraped(index: int) -> str:
        host, port = cluster.address(index, "metrics")
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as answer:
                return answer.read().decode()
        except OSError:
            return ""

    async def everywhere() -> bool:
        texts = [await asyncio.to_thread(scraped, i) for i in range(len(cluster.members))]
        return all(line in text for text in texts for line in wanted)
    try:
        await until("every feature active on every server", everywhere, 60)
    except TimeoutError as exc:
        report.problems.append(str(exc))


def _check(report: Report, messages: list[bytes], counts: dict[tuple[str, int], Counts]) -> None:
    stored: dict[tuple[str, int, int], int] = {}
    for value in messages:
        publisher, rnd, seq, _ = value.split(b":", 3)
        key = (publisher.decode(), int(rnd), int(seq))
        stored[key] = stored.get(key, 0) + 1
    report.stored = len(messages)
    twice = [k for k, n in stored.items() if n > 1]
    if twice:
        report.problems.append(f"{len(twice)} messages stored more than once, e.g. {twice[:5]}")
    for (name, rnd), c in counts.items():
        report.acked[name] = report.acked.get(name, 0) + len(c.acked)
        report.reconnects[name] = report.reconnects.get(name, 0) + c.reconnects
        report.unconfirmed[name] = report.unconfirmed.get(name, 0) + c.unconfirmed
        report.refused += c.refused
        lost = [seq for seq, _ in c.acked if (name, rnd, seq) not in stored]
        if lost:
            report.problems.append(f"{name} round {rnd}: {len(lost)} acked messages lost, "
                                   f"e.g. {lost[:5]}")
        if not c.acked:
            report.problems.append(f"{name} round {rnd}: nothing acked")
        if len({seq for seq, _ in c.acked}) != len(c.acked):
            report.problems.append(f"{name} round {rnd}: a message acked twice")
    if report.refused:
        report.problems.append(f"{len(report.refused)} refusals: {report.refused[:5]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(
        "A three-server cluster started on an earlier riverlog (--commit, built into a cached "
        "venv) is upgraded one server at a time to this checkout while rstream, nats-py and "
        "gufo-liftbridge publish with confirms / ALL acks; prints the acked rates before and "
        "during each restart and exits 1 when an acked message was lost or doubled, a client "
        "was refused, or a check failed (results: benchmarks/README.md)."))
    parser.add_argument("--steady", type=float, default=20.0,
                        help="seconds of publishing before each restart (default 20)")
    parser.add_argument("--after", type=float, default=10.0,
                        help="seconds of publishing after each server is back (default 10)")
    parser.add_argument("--rate", type=int, default=2000,
                        help="messages/s per door at most (default 2000)")
    parser.add_argument("--commit", default=OLDER_COMMIT,
                        help=f"the earlier riverlog's commit (default {OLDER_COMMIT[:12]})")
    parser.add_argument("--older", default=None,
                        help="the python of an older riverlog's venv (default: build "
                             f"{OLDER_COMMIT[:12]} and cache it)")
    parser.add_argument("--workdir", default=None, help="where the cluster lives (a temp "
                        "folder by default, removed after)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = asyncio.run(run_upgrade(args.workdir or tmp, args.steady, args.after,
                                         args.rate, args.older, commit=args.commit))
    print(report.as_json())
    for step, (steady, during, took) in enumerate(zip(report.steady, report.restarting,
                                                      report.restart_s)):
        print(f"restart {step}: steady {steady:,.0f} acked/s, while restarting {during:,.0f} "
              f"acked/s for {took:.1f} s")
        print("  " + ", ".join(f"{door} {a:,.0f} -> {b:,.0f}"
                               for door, (a, b) in report.by_door[step].items()))
    sys.exit(1 if report.problems else 0)


if __name__ == "__main__":
    main()
