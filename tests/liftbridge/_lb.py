# Helpers of the Liftbridge door tests (imported by the tests as `_lb`): the Server handle,
# the App configuration, and small client-side helpers on riverlog's own api_pb2 stub.
from __future__ import annotations

import asyncio
import dataclasses
import os

import grpc

from riverlog.config import (Durability, GrpcConfig, LogConfig, NatsConfig, RabbitStreamConfig,
                             ServerConfig)
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.server.app import App
@dataclasses.dataclass
class Server:
    """A running App and where to reach its doors."""

    app: App
    data_dir: str

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.app.grpc.port}"

    @property
    def nats_url(self) -> str:
        return self.app.nats.url

    @property
    def stream_port(self) -> int:
        return self.app.rabbitmq_stream.port

    @property
    def liftbridge(self):
        return self.app.liftbridge


def make_config(data_dir: str, durability: Durability = Durability.INTERVAL,
                **grpc_options) -> ServerConfig:
    """The test server's configuration. RIVERLOG_TEST_GRPC_TRANSPORT (grpcio or h2), when
    set, picks the gRPC transport of the tests that do not choose one themselves."""
    transport = os.environ.get("RIVERLOG_TEST_GRPC_TRANSPORT")
    if transport:
        grpc_options.setdefault("transport", transport)
    return ServerConfig(data_dir=data_dir, log=LogConfig(durability=durability),
                        rabbitmq_stream=RabbitStreamConfig(port=0),
                        nats=NatsConfig(port=0), grpc=GrpcConfig(port=0, **grpc_options))


async def create(stub, name: str, subject: str | None = None, **fields) -> None:
    await stub.CreateStream(pb.CreateStreamRequest(name=name, subject=subject or name, **fields),
                            timeout=10)


async def read_all(stub, stream: str, partition: int = 0, *, start=pb.StartPosition.EARLIEST,
                   timeout: float = 10, **fields) -> list[pb.Message]:
    """Every message from ``start`` to the newest one (STOP_LATEST), handshake dropped."""
    call = stub.Subscribe(pb.SubscribeRequest(
        stream=stream, partition=partition, startPosition=start,
        stopPosition=pb.StopPosition.STOP_LATEST, **fields), timeout=timeout)
    out = []
    try:
        async for msg in call:
            out.append(msg)
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
    if not out:  # STOP_LATEST on an empty partition ends before the handshake
        return []
    assert out[0] == pb.Message(), "the first message must be the empty handshake"
    return out[1:]


async def wait_for_offset(server: Server, stream: str, offset: int, partition: int = 0,
                          timeout: float = 10) -> None:
    """Wait until partition ``partition`` of ``stream`` has committed ``offset``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    part = server.app.broker.streams[stream].partitions[partition]
    while part.committed_offset < offset:
        if loop.time() > deadline:
            raise AssertionError(f"{stream}/{partition}: offset {offset} not committed after "
                                 f"{timeout}s (committed {part.committed_offset})")
        await asyncio.sleep(0.01)


class Clients:
    """``async with Clients(server) as (stub, nc)``: a raw gRPC stub and a nats-py connection
    for a server the test made itself (the ``stub``/``nc`` fixtures use the default one)."""

    def __init__(self, server: Server) -> None:
        self.server = server

    async def __aenter__(self):
        import nats
        from riverlog.protocol.liftbridge import api_pb2_grpc
        self.channel = grpc.aio.insecure_channel(self.server.grpc_addr)
        self.nc = await nats.connect(self.server.nats_url)
        return api_pb2_grpc.APIStub(self.channel), self.nc

    async def __aexit__(self, *exc) -> None:
        await self.nc.close()
        await self.channel.close()
