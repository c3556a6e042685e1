# A separate process of gRPC subscribers for the memory tests (its memory is not the
# server's): `python _subscribers.py ADDRESS STREAM COUNT CONNECTIONS` opens COUNT Subscribe
# calls from the earliest offset over CONNECTIONS connections with grpcio, reads the first
# message of each, prints "ready", then reads nothing more until a line on stdin, cancels
# every call, prints "cancelled" and exits at the next line (or end) of stdin.
from __future__ import annotations

import asyncio
import sys

import grpc

from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc


async def main(address: str, stream: str, count: int, connections: int) -> None:
    options = [("grpc.max_receive_message_length", -1), ("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(address, options) for _ in range(connections)]
    stubs = [api_pb2_grpc.APIStub(channel) for channel in channels]
    calls = [stubs[i % connections].Subscribe(pb.SubscribeRequest(
        stream=stream, startPosition=pb.StartPosition.EARLIEST)) for i in range(count)]
    for call in calls:
        await call.read()  # the empty "subscription created"
        await call.read()  # the first message
    loop = asyncio.get_running_loop()
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    for call in calls:
        call.cancel()
    print("cancelled", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    for channel in channels:
        await channel.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
