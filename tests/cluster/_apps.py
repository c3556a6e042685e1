# Three real riverlog Apps in this process forming one cluster, for tests/cluster: each with
# its Raft member, its embedded nats-server routed to the others', every door and its
# Prometheus endpoint on free ports. `configs` makes their ServerConfigs, `until` polls the
# loop; the `cluster` fixture (tests/cluster/conftest.py) starts them.
from __future__ import annotations

import asyncio
import inspect

import grpc

from compat._servers import HOST, free_port
from riverlog.config import (ClusterConfig, GrpcConfig, MetricsConfig, NatsConfig,
                             RabbitStreamConfig, SecurityConfig, ServerConfig)
from riverlog.cluster.metadata import RaftBindError
from riverlog.protocol.liftbridge import api_pb2_grpc
from riverlog.server.app import App

IDS = ("a", "b", "c")
WAIT_S = 60


def configs(tmp_path, password: str = "pw",
            security: SecurityConfig | None = None) -> list[ServerConfig]:
    raft = {i: f"{HOST}:{free_port()}" for i in IDS}
    routes = {i: f"{HOST}:{free_port()}" for i in IDS}
    return [ServerConfig(
        data_dir=str(tmp_path / i), rabbitmq_stream=RabbitStreamConfig(port=0, tls_port=0),
        nats=NatsConfig(port=0, cluster_port=int(routes[i].rsplit(":", 1)[1]),
                        routes=tuple(r for j, r in routes.items() if j != i)),
        grpc=GrpcConfig(port=0), metrics=MetricsConfig(port=0),
        cluster=ClusterConfig(server_id=i, raft_address=raft[i], bootstrap_peers=IDS,
                              raft_peers=tuple((j, a) for j, a in raft.items() if j != i),
                              raft_password=password),
        security=security or SecurityConfig()) for i in IDS]


async def until(what: str, check):
    """Poll ``check`` (on the loop; its result awaited when it is awaitable) until it returns
    something true; return that."""
    for _ in range(WAIT_S * 20):
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        await asyncio.sleep(0.05)
    raise AssertionError(f"still not: {what}")


async def started(tmp_path, security: SecurityConfig | None = None) -> list[App]:
    """Three started Apps of one cluster (``security``: every member's), once every server
    is registered everywhere (stop them with ``stopped``). A Raft port picked free can be
    taken before pysyncobj binds it (an outgoing connection's ephemeral port: CI saw it once),
    so a RaftBindError starts the cluster again on new ports, in a new folder, twice at most."""
    for attempt in range(3):
        apps = [App(c) for c in configs(tmp_path / f"attempt{attempt}", security=security)]
        try:
            await asyncio.gather(*(a.start() for a in apps))
            await until("every server registered everywhere", lambda: all(
                a.broker.placement.servers() == IDS for a in apps))
        except RaftBindError:
            await stopped(apps)
            if attempt == 2:
                raise
            continue
        except BaseException:
            await stopped(apps)
            raise
        return apps
    raise AssertionError("unreachable")


async def stopped(apps: list[App]) -> None:
    await asyncio.gather(*(a.stop() for a in apps), return_exceptions=True)


def replica_bytes(app: App, stream: str) -> bytes:
    """The bytes of every segment of partition 0 of ``stream`` on ``app``, in order."""
    log = app.broker.streams[stream].partitions[0].log
    return b"".join(open(seg.path, "rb").read() for seg in log.segments)


def stub_of(app: App):
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}")
    return channel, api_pb2_grpc.APIStub(channel)
