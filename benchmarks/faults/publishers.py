# The publishers, one per door, each recording exactly what the cluster acknowledged: rstream
# on the RabbitMQ Stream door (publisher confirms: the record is committed), the generated
# gRPC stub (Publish with AckPolicy ALL, one at a time, to the partition leader) and nats-py
# on the NATS door (enveloped publishes, AckPolicy ALL, acks to the publisher's own inbox);
# and, asked for, a gRPC publisher with AckPolicy LEADER (LeaderAckPublisher), whose acks
# promise no commit (``committed`` False: its findings are reported apart).
# Rules: a payload is "<door>:<sequence>" (payload()), each sequence sent once and never
# retried (a retry is a new sequence), so a payload stored twice is the cluster's duplicate;
# an ack counts only when the client got it (a late one after the publisher gave up on it is
# not counted: that can only under-count). Publishers run while ``running`` is set; pause()
# returns once nothing is in flight (or what is has been given up on). After an error or a
# stall each reconnects, choosing its server afresh: none relies on a client's own recovery.
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time

import grpc
import nats
from rstream import Producer
from rstream.recovery import BackOffRecoveryStrategy
from rstream.utils import RawMessage

from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.envelope import decode_ack, encode_publish

from .servers import STREAM, USER, FaultCluster, close_quietly

STALL_S = 3.0
"""No ack for this long while something is in flight: reconnect elsewhere."""
GRPC_TIMEOUT_S = 2.0
CONNECT_S = 1.5
"""A server that does not accept a client within this (stopped, cut off) is passed over."""
BATCH = 20
"""Messages per rstream send_batch and per NATS batch."""


def payload(door: str, seq: int) -> bytes:
    return b"%s:%d" % (door.encode(), seq)


def parse(value: bytes) -> tuple[str, int] | None:
    """(door, sequence) of a payload this harness wrote, else None."""
    door, _, seq = value.partition(b":")
    return (door.decode(), int(seq)) if seq.isdigit() and door.isalpha() else None


@dataclasses.dataclass(slots=True)
class Ack:
    seq: int
    offset: int | None
    """The offset the ack named (gRPC, NATS); None for a RabbitMQ confirm, which names none."""
    sent: float
    acked: float
    """time.monotonic() seconds."""
    server: str = ""
    """The server that acked it, where the publisher knows (gRPC)."""


class Publisher:
    """Base: the door's name, its acks in the order they came, errors, and the run/pause
    handshake. Subclasses implement ``session()``: publish while running, return when
    paused with nothing in flight; raise to reconnect."""

    door = ""
    committed = True
    """Its acks mean committed (confirms, ALL): a lost one is a loss the issue forbids."""

    def __init__(self, cluster: FaultCluster, rate: float) -> None:
        self.cluster = cluster
        self.rate = rate
        self.acks: list[Ack] = []
        self.errors = 0
        self.next_seq = 0
        self.running = asyncio.Event()
        self.idle = asyncio.Event()
        self.rotation = itertools.cycle(cluster.ids)

    def first_ack_after(self, t0: float) -> float | None:
        """Seconds from ``t0`` to the first ack of a message sent after it (None: none)."""
        times = [a.acked for a in itertools.takewhile(lambda a: a.acked > t0,
                                                      reversed(self.acks)) if a.sent > t0]
        return min(times) - t0 if times else None

    async def pause(self) -> None:
        self.running.clear()
        await self.idle.wait()

    def resume(self) -> None:
        self.running.set()

    async def run(self) -> None:
        while True:
            if not self.running.is_set():
                self.idle.set()
                await self.running.wait()
                self.idle.clear()
            try:
                await self.session()
            except asyncio.CancelledError:
                raise
            except Exception:  # the server died, was cut off, refused: start afresh
                self.errors += 1
                await asyncio.sleep(0.05)

    async def session(self) -> None:
        raise NotImplementedError

    def take_seq(self) -> int:
        self.next_seq += 1
        return self.next_seq

    def live_server(self) -> str:
        """The next server in rotation whose process runs (a cut-off one may come)."""
        for server in itertools.islice(self.rotation, len(self.cluster.ids)):
            if self.cluster.alive(server):
                return server
        return next(self.rotation)


class GrpcPublisher(Publisher):
    """Publish with AckPolicy ALL, one at a time, straight to the leader FetchMetadata names;
    after an error the leader is looked up again (the failed one asked last)."""

    door = "grpc"
    policy = pb.ALL

    async def target(self, leader: str | None, failed: str | None) -> str | None:
        """Where the next publish goes, given the last one's server and the one that failed
        (None: it did not)."""
        return leader if leader and not failed else await self.cluster.leader(avoid=failed)

    async def session(self) -> None:
        leader = failed = None
        while self.running.is_set():
            leader = await self.target(leader, failed)
            if leader is None:
                await asyncio.sleep(0.05)
                return
            seq = self.take_seq()
            sent = time.monotonic()
            try:
                resp = await self.cluster.stubs[leader].Publish(pb.PublishRequest(
                    stream=STREAM, value=payload(self.door, seq), ackPolicy=self.policy),
                    timeout=GRPC_TIMEOUT_S, metadata=self.cluster.auth)
            except grpc.aio.AioRpcError:
                self.errors += 1
                failed = leader
                await asyncio.sleep(0.05)  # a refusal comes at once: no busy loop
                continue
            failed = None
            self.acks.append(Ack(seq, resp.ack.offset, sent, time.monotonic(), leader))


class LeaderAckPublisher(GrpcPublisher):
    """Publish with AckPolicy LEADER (acked once the leader wrote it, before any follower
    has it: docs/clustering.md), asking a different server each time who leads and
    publishing there, so it also reaches a restarted server whose metadata is still stale.
    Not a guarantee the issue asks to keep: its findings are counted apart (--leader-acks)."""

    door = "leader"
    policy = pb.LEADER
    committed = False

    async def target(self, leader: str | None, failed: str | None) -> str | None:
        return await self.cluster.leader(first=next(self.rotation))


class _Pipelined(Publisher):
    """What the pipelined publishers share: a batch of BATCH every BATCH / ``rate``
    seconds whatever is still in flight (so a failover is seen within one batch interval),
    messages in flight by sequence (their send time), given up on after STALL_S, and the
    stall rule: nothing acked for STALL_S since a message was sent means the connection
    leads nowhere (TimeoutError: reconnect elsewhere)."""

    def __init__(self, cluster: FaultCluster, rate: float) -> None:
        super().__init__(cluster, rate)
        self.in_flight: dict[int, float] = {}
        self.unacked_since: float | None = None

    def acked(self, seq: int, offset: int | None) -> None:
        sent = self.in_flight.pop(seq, None)
        if sent is None:
            return  # given up on already
        self.unacked_since = None
        self.acks.append(Ack(seq, offset, sent, time.monotonic()))

    def nacked(self, seq: int) -> None:
        self.in_flight.pop(seq, None)

    async def pump(self, send) -> None:
        """While running, ``await send(sequences)`` every batch interval; once paused, wait
        until nothing is in flight (acked, refused or given up on), then return."""
        self.unacked_since = None
        while self.running.is_set() or self.in_flight:
            began = time.monotonic()
            if self.running.is_set():
                seqs = [self.take_seq() for _ in range(BATCH)]
                for seq in seqs:
                    self.in_flight[seq] = began
                if self.unacked_since is None:
                    self.unacked_since = began
                await asyncio.wait_for(send(seqs), STALL_S)
            for seq in [s for s, sent in self.in_flight.items() if began - sent > STALL_S]:
                del self.in_flight[seq]
            if self.unacked_since is not None and began - self.unacked_since > STALL_S:
                raise TimeoutError("no ack")
            await asyncio.sleep(max(0.0, BATCH / self.rate - (time.monotonic() - began)))

    async def closed(self, closing) -> None:
        """Give up what is in flight, close the client (close_quietly)."""
        self.in_flight.clear()
        await close_quietly(closing)


class RstreamPublisher(_Pipelined):
    """rstream's Producer, seeded at a server in rotation (it publishes to the leader it
    reads in Metadata), send_batch of BATCH with a confirm callback, paced to ``rate``;
    a new Producer after an error or a stall (its own recovery off)."""

    door = "rstream"

    async def session(self) -> None:
        host, port = self.cluster.stream_address(self.live_server())
        producer = Producer(host, port, username=USER, password=self.cluster.password,
                            recovery_strategy=BackOffRecoveryStrategy(enable=False))

        def on_confirm(status) -> None:
            if status.is_confirmed:
                self.acked(status.message_id, None)
            else:
                self.nacked(status.message_id)
        try:
            await asyncio.wait_for(producer.start(), CONNECT_S)
            await self.pump(lambda seqs: producer.send_batch(
                STREAM, [RawMessage(payload(self.door, s), publishing_id=s) for s in seqs],
                on_publish_confirm=on_confirm))
        finally:
            await self.closed(producer.close())


class NatsPublisher(_Pipelined):
    """nats-py connected to a server in rotation (the others as reconnect targets),
    enveloped publishes with AckPolicy ALL and an ack inbox of its own, paced to ``rate``;
    no ack for STALL_S makes it connect elsewhere (its server may
    be cut off from the leader)."""

    door = "nats"

    async def session(self) -> None:
        first = self.live_server()
        urls = self.cluster.nats_urls()
        start = self.cluster.ids.index(first)

        async def quiet(exc: Exception) -> None:  # nats-py logs each with a traceback
            pass
        nc = await nats.connect(servers=urls[start:] + urls[:start], user=USER,
                                password=self.cluster.password, dont_randomize=True,
                                connect_timeout=CONNECT_S, reconnect_time_wait=0.2,
                                max_reconnect_attempts=-1, error_cb=quiet)

        async def on_ack(msg) -> None:
            ack = decode_ack(msg.data)
            if ack is None or not ack.correlationId.isdigit():
                return
            if ack.ackError == pb.Ack.Error.OK:
                self.acked(int(ack.correlationId), ack.offset)
            else:
                self.nacked(int(ack.correlationId))
        try:
            inbox = nc.new_inbox()
            await nc.subscribe(inbox, cb=on_ack)

            async def send(seqs: list[int]) -> None:
                for seq in seqs:
                    await nc.publish(STREAM, encode_publish(pb.Message(
                        value=payload(self.door, seq), ackInbox=inbox,
                        ackPolicy=pb.AckPolicy.ALL, correlationId=str(seq))))
                await nc.flush(timeout=STALL_S)
            await self.pump(send)
        finally:
            await self.closed(nc.close())


DOORS = (RstreamPublisher, GrpcPublisher, NatsPublisher)
