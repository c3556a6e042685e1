# The consumers: one gRPC Subscribe per server with readISRReplica (so a follower, the old
# leader and a cut-off server serve from their own replica), recording every (offset,
# payload) a server served. Rules: a consumer stays on its server for the whole run and, after
# an error (its server killed, stopped, cut off, restarting), subscribes there again from the
# offset after the last one it got; the records it served are handed to the checks with
# take() and must all be found in the final log (checks.check_served).
from __future__ import annotations

import asyncio

import grpc

from riverlog.protocol.liftbridge import api_pb2 as pb

from .servers import STREAM, FaultCluster

RETRY_S = 0.3


class Consumer:
    """Reads STREAM partition 0 from ``server``'s replica for ever; ``served`` holds
    (offset, payload) in the order served, until take()n."""

    def __init__(self, cluster: FaultCluster, server: str) -> None:
        self.cluster = cluster
        self.server = server
        self.next_offset = 0
        self.served: list[tuple[int, bytes]] = []
        self.total = 0
        self.errors = 0

    def take(self) -> list[tuple[int, bytes]]:
        served, self.served = self.served, []
        return served

    async def run(self) -> None:
        while True:
            call = self.cluster.stubs[self.server].Subscribe(pb.SubscribeRequest(
                stream=STREAM, startPosition=pb.StartPosition.OFFSET,
                startOffset=self.next_offset, readISRReplica=True),
                metadata=self.cluster.auth)
            try:
                first = True
                async for message in call:
                    if first and message == pb.Message():
                        continue  # Liftbridge's empty first message: the subscription is made
                    first = False
                    self.served.append((message.offset, message.value))
                    self.total += 1
                    self.next_offset = message.offset + 1
            except grpc.aio.AioRpcError:
                self.errors += 1
            finally:
                call.cancel()
            await asyncio.sleep(RETRY_S)
