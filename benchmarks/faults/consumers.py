# The consumers, recording every (offset, payload) a server served them: one gRPC Subscribe
# per server with readISRReplica (so a follower, the old leader and a cut-off server serve
# from their own replica), and one rstream Consumer on the RabbitMQ Stream door, which rstream
# attaches to a replica it picks from Metadata. Rules: a consumer goes on after an error (its
# server killed, stopped, cut off, restarting) from the offset after the last one it got, on
# the same server (Subscribe) or wherever rstream attaches next; the records it served are
# handed to the checks with take() and must all be found in the final log
# (checks.Mirror.check_served).
from __future__ import annotations

import asyncio
import itertools

from rstream import Consumer, ConsumerOffsetSpecification, OffsetType
from rstream.recovery import BackOffRecoveryStrategy

from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.record import decode_record

from .servers import STREAM, USER, FaultCluster, close_quietly

RETRY_S = 0.3


class Reader:
    """Base: ``label``, ``served`` (offset, payload) in the order served until take()n, the
    offset to go on from, counts. Subclasses implement ``session()``, which reads until an
    error ends it."""

    def __init__(self, cluster: FaultCluster, label: str) -> None:
        self.cluster = cluster
        self.label = label
        self.next_offset = 0
        self.served: list[tuple[int, bytes]] = []
        self.total = 0
        self.errors = 0

    def take(self) -> list[tuple[int, bytes]]:
        served, self.served = self.served, []
        return served

    def got(self, offset: int, value: bytes) -> None:
        self.served.append((offset, value))
        self.total += 1
        self.next_offset = offset + 1

    async def run(self) -> None:
        while True:
            try:
                await self.session()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.errors += 1
            await asyncio.sleep(RETRY_S)

    async def session(self) -> None:
        raise NotImplementedError


class SubscribeReader(Reader):
    """gRPC Subscribe with readISRReplica on ``server``, for ever."""

    def __init__(self, cluster: FaultCluster, server: str) -> None:
        super().__init__(cluster, f"{server} (gRPC Subscribe)")
        self.server = server

    async def session(self) -> None:
        call = self.cluster.stubs[self.server].Subscribe(pb.SubscribeRequest(
            stream=STREAM, startPosition=pb.StartPosition.OFFSET,
            startOffset=self.next_offset, readISRReplica=True), metadata=self.cluster.auth)
        try:
            async for message in call:
                if message == pb.Message():
                    continue  # Liftbridge's empty first message: the subscription is made
                self.got(message.offset, message.value)
        finally:
            call.cancel()


class RstreamReader(Reader):
    """rstream's Consumer seeded at a server in rotation; rstream subscribes on a replica
    (a follower when Metadata names one). Records are read as the Liftbridge doors read
    them (riverlog.record.decode_record), so payloads compare with the log's. A session
    ends when rstream's connection closes."""

    def __init__(self, cluster: FaultCluster) -> None:
        super().__init__(cluster, "rstream Consumer")
        self.rotation = itertools.cycle(cluster.ids)

    async def session(self) -> None:
        closed = asyncio.Event()

        async def on_close(info) -> None:
            closed.set()

        async def on_message(raw: bytes, context) -> None:
            self.got(context.offset, decode_record(raw).value)
        host, port = self.cluster.stream_address(next(self.rotation))
        consumer = Consumer(host, port, username=USER, password=self.cluster.password,
                            on_close_handler=on_close,
                            recovery_strategy=BackOffRecoveryStrategy(enable=False))
        try:
            await asyncio.wait_for(consumer.start(), 2)
            await asyncio.wait_for(consumer.subscribe(
                STREAM, on_message, offset_specification=ConsumerOffsetSpecification(
                    OffsetType.OFFSET, self.next_offset)), 5)
            await closed.wait()
        finally:
            await close_quietly(consumer.close())


def readers(cluster: FaultCluster) -> list[Reader]:
    return [*(SubscribeReader(cluster, s) for s in cluster.ids), RstreamReader(cluster)]
