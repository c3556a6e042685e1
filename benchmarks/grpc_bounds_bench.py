"""What slow gRPC subscribers cost the Liftbridge gRPC door's memory (issue 15, item 13).

Starts `riverlog serve` (defaults, `--grpc-transport` as given) as a subprocess and measures
its resident set (VmRSS, /proc/<pid>/status):

  subscribers   --messages messages of --size bytes published (PublishAsync), then
                --subscribers gRPC Subscribe calls from the earliest offset over --channels
                channels (connections; the server takes 100 calls per connection), each
                reading one message and then nothing: the server pushes what flow control
                lets it. RSS before, once every call has its first message and
                the server has settled, after every call is cancelled, and after the
                connections are closed.

    .venv/bin/python benchmarks/grpc_bounds_bench.py [--subscribers 400] [--size 100000]
        [--messages 20] [--channels 40] [--grpc-transport h2|grpcio]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests", "security")]

from _proc import rss_kib  # noqa: E402
from security_bench import Server  # noqa: E402

from riverlog.protocol.liftbridge import api_pb2 as pb  # noqa: E402
from riverlog.protocol.liftbridge import api_pb2_grpc  # noqa: E402

STREAM = "wide"


async def settle(pid: int, seconds: float = 3.0) -> int:
    """The server's RSS (KiB) once it has stopped growing for a while."""
    last = rss_kib(pid)
    while True:
        await asyncio.sleep(seconds)
        now = rss_kib(pid)
        if now <= last:
            return now
        last = now


async def subscribers(server: Server, args) -> None:
    options = [("grpc.max_receive_message_length", -1),
               ("grpc.use_local_subchannel_pool", 1)]  # one connection per channel
    channels = [grpc.aio.insecure_channel(server.grpc_addr, options)
                for _ in range(args.channels)]
    stubs = [api_pb2_grpc.APIStub(c) for c in channels]
    await stubs[0].CreateStream(pb.CreateStreamRequest(name=STREAM, subject=STREAM))
    call = stubs[0].PublishAsync()
    value = os.urandom(args.size)
    for i in range(args.messages):
        await call.write(pb.PublishRequest(stream=STREAM, value=value, correlationId=str(i),
                                           ackPolicy=pb.AckPolicy.LEADER))
    for _ in range(args.messages):
        await call.read()
    await call.done_writing()
    pid = server.proc.pid
    before = await settle(pid, 1.0)
    calls = []
    for i in range(args.subscribers):
        sub = stubs[i % len(stubs)].Subscribe(pb.SubscribeRequest(
            stream=STREAM, startPosition=pb.StartPosition.EARLIEST))
        calls.append(sub)
    for sub in calls:
        await sub.read()  # "subscription created"
        await sub.read()  # the first message
    during = await settle(pid)
    for sub in calls:
        sub.cancel()
    after = await settle(pid)
    for channel in channels:
        await channel.close()
    closed = await settle(pid)
    print(f"{args.subscribers} subscribers x {args.messages} messages of {args.size} bytes "
          f"over {args.channels} connections ({args.grpc_transport}): server RSS "
          f"{before / 1024:.0f} MiB before, {during / 1024:.0f} MiB subscribed, "
          f"{after / 1024:.0f} MiB after cancelling, {closed / 1024:.0f} MiB after closing "
          f"the connections")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=400)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--channels", type=int, default=40)
    parser.add_argument("--grpc-transport", choices=("h2", "grpcio"), default="h2")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        config = os.path.join(work, "riverlog.yaml")
        with open(config, "w") as f:
            f.write(f"riverlog.grpc.transport: {args.grpc_transport}\n")
        server = Server(work, "server", config)
        try:
            asyncio.run(subscribers(server, args))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
