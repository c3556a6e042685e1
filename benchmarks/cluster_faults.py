"""Fault harness for a riverlog cluster (issue 13, "How it is shown"): three `riverlog serve`
processes started with riverlog's own LocalCluster (what `riverlog cluster up` runs), one
stream of one partition with RF=3 and minISR=2, a publisher on the gRPC door with ALL acks
(riverlog's generated stub; every attempt sends a new unique id as the value, never a retry
of an old one, so a value stored twice is the server's duplicate) that re-resolves the
partition leader through FetchMetadata after every error, and faults injected in a loop:

- ``--kills`` times: SIGKILL of the partition leader, wait for the first ALL ack of a publish
  sent after the kill (the failover time), restart the killed server, wait until the ISR
  holds all three again;
- ``--stops`` times: SIGSTOP of the leader for ``--stop-s`` (longer than the lag time, 3 s
  by default), SIGCONT, same measurement and wait.

After each fault, with the publisher paused: every acknowledged id is present exactly once
and in acknowledgement order on every ISR replica (gRPC Subscribe with readISRReplica from
the earliest offset to the leader's high watermark), no value is stored twice, and the
replicas' partition folders are byte-identical up to the high watermark (segment files read
as plain bytes, chunk headers walked with riverlog.log.chunk; nothing opens a CommitLog).

Prints a summary (faults, acked, lost, duplicates, failover p50/p99) and exits 1 on any loss,
duplicate, order or byte mismatch, 2 when the cluster did not come back in time.

Usage: .venv/bin/python benchmarks/cluster_faults.py [--kills 10] [--stops 1] [--dir DIR]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
import urllib.request

import grpc

from riverlog.broker.broker import STREAMS_DIR, folder_name
from riverlog.cluster.local import LocalCluster
from riverlog.log.chunk import parse_header
from riverlog.log.segment import SEGMENT_SUFFIX
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.api_pb2_grpc import APIStub

STREAM = "faults"
PUBLISH_TIMEOUT_S = 2.0
WAIT_S = 120.0


class Stuck(Exception):
    """The cluster did not reach a state within WAIT_S."""


class Harness:
    """The cluster, one gRPC channel per server, the publisher's records and the figures."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.ids = [m.id for m in cluster.members]
        self.stubs = {m.id: APIStub(grpc.aio.insecure_channel(
            f"{cluster.advertised}:{m.ports['grpc']}")) for m in cluster.members}
        self.acked: list[tuple[int, int, float, float]] = []
        """(id, offset, sent at, acked at), monotonic seconds, in acknowledgement order."""
        self.next_id = 0
        self.errors = 0
        self.publishing = asyncio.Event()
        self.idle = asyncio.Event()
        self.failovers: list[float] = []
        self.raft_failovers: list[float] = []
        """Those of faults that hit the Raft leader too (an election comes first)."""
        self.problems: list[str] = []
        self.checked_faults = 0

    # -- metadata ---------------------------------------------------------------------
    async def partition(self, server: str) -> pb.PartitionMetadata | None:
        try:
            meta = await self.stubs[server].FetchMetadata(
                pb.FetchMetadataRequest(streams=[STREAM]), timeout=1)
        except grpc.aio.AioRpcError:
            return None
        for stream in meta.streamMetadata:
            if stream.name == STREAM and not stream.error and 0 in stream.partitions:
                return stream.partitions[0]
        return None

    async def leader(self, avoid: str | None = None) -> str | None:
        """The leader some live server names (asking ``avoid`` last), or None."""
        for server in sorted(self.ids, key=lambda s: s == avoid):
            if self.cluster.procs[self.ids.index(server)].poll() is not None:
                continue
            part = await self.partition(server)
            if part is not None and part.leader:
                return part.leader
        return None

    def raft_leader(self) -> str | None:
        """The server whose /metrics says it leads the metadata Raft."""
        for member, proc in zip(self.cluster.members, self.cluster.procs):
            if proc.poll() is not None:
                continue
            url = f"http://{self.cluster.advertised}:{member.ports['metrics']}/metrics"
            try:
                with urllib.request.urlopen(url, timeout=1) as r:
                    if "riverlog_raft_leader 1.0" in r.read().decode():
                        return member.id
            except OSError:
                continue
        return None

    async def until(self, what: str, check):
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            result = await check()
            if result:
                return result
            await asyncio.sleep(0.1)
        raise Stuck(f"still not after {WAIT_S:.0f} s: {what}")

    async def steady(self):
        """(leader, its partition metadata) once the leader sees all three in its ISR."""
        async def check():
            leader = await self.leader()
            part = leader and await self.partition(leader)
            return (leader, part) if part and part.leader == leader and \
                len(part.isr) == len(self.ids) else None
        return await self.until("the ISR holds every server", check)

    # -- publisher --------------------------------------------------------------------
    async def publish_forever(self) -> None:
        leader = None
        while True:
            if not self.publishing.is_set():
                self.idle.set()
                await self.publishing.wait()
                self.idle.clear()
            if leader is None:
                leader = await self.leader()
                if leader is None:
                    await asyncio.sleep(0.05)
                    continue
            value, self.next_id = self.next_id, self.next_id + 1
            sent = time.monotonic()
            try:
                resp = await self.stubs[leader].Publish(pb.PublishRequest(
                    stream=STREAM, value=str(value).encode(), ackPolicy=pb.ALL),
                    timeout=PUBLISH_TIMEOUT_S)
            except grpc.aio.AioRpcError:
                self.errors += 1
                failed, leader = leader, None
                await asyncio.sleep(0.02)
                leader = await self.leader(avoid=failed)
                continue
            self.acked.append((value, resp.ack.offset, sent, time.monotonic()))

    async def pause(self) -> None:
        self.publishing.clear()
        await self.idle.wait()

    # -- faults -----------------------------------------------------------------------
    async def fault(self, kind: str, stop_s: float) -> None:
        leader, _ = await self.steady()
        raft = await asyncio.to_thread(self.raft_leader) == leader
        index = self.ids.index(leader)
        proc = self.cluster.procs[index]
        self.publishing.set()
        await self.until("a first ack", lambda: asyncio.sleep(0, bool(self.acked)))
        t0 = time.monotonic()
        proc.send_signal(signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        if kind == "kill":
            proc.wait()

        async def failed_over():
            return any(sent > t0 for _, _, sent, _ in self.acked[-50:])
        await self.until(f"an ack after the {kind} of {leader}", failed_over)
        self.failovers.append(min(acked for _, _, sent, acked in self.acked[-50:]
                                  if sent > t0) - t0)
        if raft:
            self.raft_failovers.append(self.failovers[-1])
        if kind == "kill":
            self.cluster.restart(index)
        else:
            await asyncio.sleep(max(0.0, stop_s - (time.monotonic() - t0)))
            proc.send_signal(signal.SIGCONT)
        await self.steady()
        await self.pause()
        await self.check(f"{kind} #{len(self.failovers)} of {leader}"
                         + (" (Raft leader)" if raft else ""))

    # -- checks -----------------------------------------------------------------------
    async def read_replica(self, server: str, high_watermark: int) -> list[tuple[int, bytes]]:
        out = []
        stream = self.stubs[server].Subscribe(pb.SubscribeRequest(
            stream=STREAM, startPosition=pb.EARLIEST, readISRReplica=True,
            stopPosition=pb.STOP_OFFSET, stopOffset=high_watermark), timeout=WAIT_S)
        try:
            async for message in stream:
                out.append((message.offset, message.value))
        except grpc.aio.AioRpcError as exc:  # Liftbridge ends a stop position so
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
        return out[1:]  # the first is Liftbridge's empty one: the subscription is made

    def replica_bytes(self, server: str, high_watermark: int) -> bytes:
        """The bytes of the replica's segments up to the end of the chunk holding
        ``high_watermark`` (plain reads, chunk headers walked)."""
        folder = os.path.join(self.cluster.directory, server, STREAMS_DIR,
                              folder_name(STREAM), "0")
        names = sorted((n for n in os.listdir(folder) if n.endswith(SEGMENT_SUFFIX)),
                       key=lambda n: int(n[:-len(SEGMENT_SUFFIX)]))
        out = bytearray()
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                data = f.read()
            pos = 0
            while pos < len(data):
                header = parse_header(data, pos)
                out += data[pos:pos + header.size]
                pos += header.size
                if header.next_offset > high_watermark:
                    return bytes(out)
        return bytes(out)

    async def check(self, after: str) -> None:
        newest_acked = max((offset for _, offset, *_ in self.acked), default=-1)

        async def committed():  # a new leader's high watermark moves on with its followers
            leader, part = await self.steady()
            return (leader, part) if part.highWatermark >= newest_acked else None
        try:
            leader, part = await self.until(f"the high watermark at offset {newest_acked}",
                                            committed)
        except Stuck:
            leader, part = await self.steady()
            self.problems.append(f"after {after}: the high watermark stays at "
                                 f"{part.highWatermark}, below the acked offset {newest_acked}")
        high_watermark = part.highWatermark

        async def caught_up():
            parts = [await self.partition(s) for s in part.isr]
            return all(p is not None and p.highWatermark >= high_watermark for p in parts)
        await self.until("every ISR replica at the high watermark", caught_up)
        acked_order = [value for value, *_ in self.acked]
        acked = set(acked_order)
        copies = {}
        for server in part.isr:
            records = await self.read_replica(server, high_watermark)
            odd = [(o, v) for o, v in records if not v.isdigit()]
            if odd:
                self.problems.append(f"after {after}: {server} holds {len(odd)} records no "
                                     f"publisher sent, first {odd[:3]}")
            values = [int(v) for _, v in records if v.isdigit()]
            seen: dict[int, int] = {}
            for v in values:
                seen[v] = seen.get(v, 0) + 1
            lost = [v for v in acked_order if v not in seen]
            twice = [v for v, n in seen.items() if n > 1]
            stored = [v for v in values if v in acked]
            if lost:
                self.problems.append(f"after {after}: {server} lacks {len(lost)} acked ids, "
                                     f"first {lost[:5]}")
            if twice:
                self.problems.append(f"after {after}: {server} stores {len(twice)} ids twice, "
                                     f"first {twice[:5]}")
            if stored != sorted(stored) or (not lost and stored != acked_order):
                self.problems.append(f"after {after}: {server} holds the acked ids out of "
                                     "order")
            copies[server] = self.replica_bytes(server, high_watermark)
        if len(set(copies.values())) > 1:
            sizes = {s: len(b) for s, b in copies.items()}
            self.problems.append(f"after {after}: replicas differ up to the high watermark "
                                 f"{high_watermark} (bytes {sizes})")
        self.checked_faults += 1
        print(f"{after}: failover {self.failovers[-1]:.2f} s, {len(self.acked)} acked, "
              f"hw {high_watermark}, ISR {list(part.isr)}, problems {len(self.problems)}",
              flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def run(args, cluster: LocalCluster) -> int:
    harness = Harness(cluster)
    await harness.until("a stream created", lambda: create(harness))
    publisher = asyncio.create_task(harness.publish_forever())
    started = time.monotonic()
    code = 0
    try:
        for kind in ["kill"] * args.kills + ["stop"] * args.stops:
            await harness.fault(kind, args.stop_s)
    except Stuck as exc:
        print(f"STUCK: {exc}", flush=True)
        code = 2
    finally:
        publisher.cancel()
    failovers = harness.failovers
    print(f"\n{harness.checked_faults} faults checked ({args.kills} kills, {args.stops} stops "
          f"asked) in {time.monotonic() - started:.0f} s; {len(harness.acked)} acked, "
          f"{harness.errors} publish errors")
    if failovers:
        print(f"failover p50 {statistics.median(failovers):.2f} s, p99 "
              f"{percentile(failovers, 0.99):.2f} s, max {max(failovers):.2f} s")
    if harness.raft_failovers:
        print(f"of which {len(harness.raft_failovers)} hit the Raft leader too: p50 "
              f"{statistics.median(harness.raft_failovers):.2f} s, max "
              f"{max(harness.raft_failovers):.2f} s")
    lost = sum("lacks" in p for p in harness.problems)
    print(f"problems: {len(harness.problems)} (checks reporting loss: {lost})")
    for problem in harness.problems:
        print("  " + problem)
    return 1 if harness.problems else code


async def create(harness: Harness) -> bool:
    try:
        await harness.stubs[harness.ids[0]].CreateStream(pb.CreateStreamRequest(
            name=STREAM, subject=STREAM, replicationFactor=3,
            minIsr=pb.NullableInt32(value=2)), timeout=10)
    except grpc.aio.AioRpcError as exc:
        return exc.code() == grpc.StatusCode.ALREADY_EXISTS
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="SIGKILLs of the leader")
    parser.add_argument("--stops", type=int, default=1, help="SIGSTOPs of the leader")
    parser.add_argument("--stop-s", type=float, default=5.0,
                        help="how long a SIGSTOP lasts (longer than the 3 s lag time)")
    parser.add_argument("--dir", help="cluster folder (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="riverlog-faults-") as tmp:
        cluster = LocalCluster(args.dir or tmp, 3)
        cluster.start()
        try:
            cluster.wait_registered()
            return asyncio.run(run(args, cluster))
        finally:
            for proc in cluster.procs:  # a stopped one cannot take SIGTERM
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
            cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
