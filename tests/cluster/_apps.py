# Three real riverlog Apps in this process forming one cluster, for tests/cluster: each with
# its Raft member, its embedded nats-server routed to the others', every door, its
# Prometheus endpoint and its management API on free ports. `configs` makes their
# ServerConfigs, `until` polls the loop; the `cluster` fixture (tests/cluster/conftest.py)
# starts them.
from __future__ import annotations

import asyncio
import inspect

import grpc

from compat._servers import HOST, free_port
from riverlog.broker import StreamConfig
from riverlog.config import (ClusterConfig, GrpcConfig, ManagementConfig, MetricsConfig,
                             NatsConfig, RabbitStreamConfig, SecurityConfig, ServerConfig,
                             TableConfig)
from riverlog.protocol.liftbridge import api_pb2_grpc
from riverlog.server.app import App

IDS = ("a", "b", "c")
WAIT_S = 60


def configs(tmp_path, password: str = "pw", security: SecurityConfig | None = None,
            tables: TableConfig | None = None, replica_timings_ms: tuple = (),
            **grpc) -> list[ServerConfig]:
    """Every member's ServerConfig; ``tables``: every member's TableConfig (streams as
    tables); ``replica_timings_ms``: ClusterConfig's; ``grpc``: GrpcConfig settings of every
    member."""
    raft = {i: f"{HOST}:{free_port()}" for i in IDS}
    routes = {i: f"{HOST}:{free_port()}" for i in IDS}
    return [ServerConfig(
        data_dir=str(tmp_path / i),
        rabbitmq_stream=RabbitStreamConfig(port=0, tls_port=0, silent_close_delay_ms=0),
        nats=NatsConfig(port=0, cluster_port=int(routes[i].rsplit(":", 1)[1]),
                        routes=tuple(r for j, r in routes.items() if j != i)),
        grpc=GrpcConfig(port=0, **grpc), metrics=MetricsConfig(port=0),
        management=ManagementConfig(port=0),
        cluster=ClusterConfig(server_id=i, raft_address=raft[i], bootstrap_peers=IDS,
                              raft_peers=tuple((j, a) for j, a in raft.items() if j != i),
                              raft_password=password,
                              replica_timings_ms=replica_timings_ms),
        security=security or SecurityConfig(), tables=tables or TableConfig()) for i in IDS]


def joiner_config(tmp_path, apps, server_id: str = "d", password: str = "pw") -> ServerConfig:
    """The ServerConfig of a server that joins the running cluster of ``apps`` (neither
    bootstrap seed nor peers): its nats-server routed to the first app's (no routes without
    apps), its own Raft address, the cluster's Raft password."""
    routes = (f"{HOST}:{apps[0].config.nats.cluster_port}",) if apps else ()
    return ServerConfig(
        data_dir=str(tmp_path / server_id),
        rabbitmq_stream=RabbitStreamConfig(port=0, silent_close_delay_ms=0, tls_port=0),
        nats=NatsConfig(port=0, cluster_port=free_port(), routes=routes),
        grpc=GrpcConfig(port=0), metrics=MetricsConfig(port=0),
        cluster=ClusterConfig(server_id=server_id, raft_address=f"{HOST}:{free_port()}",
                              raft_password=password))


async def until(what: str, check):
    """Poll ``check`` (on the loop; a coroutine function is awaited) until it returns
    something true; return that."""
    for _ in range(WAIT_S * 20):
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        await asyncio.sleep(0.05)
    raise AssertionError(f"still not: {what}")


async def started(tmp_path, security: SecurityConfig | None = None,
                  tables: TableConfig | None = None, replica_timings_ms: tuple = (),
                  **grpc) -> list[App]:
    """Three started Apps of one cluster (``security``, ``tables``, ``replica_timings_ms``,
    ``grpc``: as ``configs``), once every server is registered everywhere, each caught up with Raft and
    its Raft member connected to every other (stop them with ``stopped``). A Raft or NATS
    route port picked free can be taken before its server binds it (an outgoing
    connection's ephemeral port, or another member's door on port 0: CI saw the first, a
    local run the second; the nats-server then exits and the NATS link gives up), so an
    OSError at start (RaftBindError is one) starts the cluster again on new ports, in a new
    folder, twice at most."""
    for attempt in range(3):
        apps = [App(c) for c in configs(tmp_path / f"attempt{attempt}", security=security,
                                        tables=tables, replica_timings_ms=replica_timings_ms,
                                        **grpc)]
        try:
            await asyncio.gather(*(a.start() for a in apps))
            await until("every server registered everywhere, caught up, in touch with all",
                        lambda: all(a.broker.placement.servers() == IDS
                                    and a.broker.placement.caught_up
                                    and all(map(a.broker.placement.reachable, IDS))
                                    for a in apps))
        except OSError:  # RaftBindError too
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


async def created(cluster: list[App], name: str, **config):
    """Create stream ``name`` (StreamConfig ``config``) through the first member; return its
    partition 0's placement once every member applied it."""
    await cluster[0].broker.placement.create_stream(name, StreamConfig(**config))
    await until(f"{name} applied everywhere", lambda: all(
        x.broker.placement.of(name, 0) is not None for x in cluster))
    return cluster[0].broker.placement.of(name, 0)


def replica_bytes(app: App, stream: str) -> bytes:
    """The bytes of every segment of partition 0 of ``stream`` on ``app``, in order."""
    log = app.broker.streams[stream].partitions[0].log
    return b"".join(open(seg.path, "rb").read() for seg in log.segments)


def stub_of(app: App):
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}")
    return channel, api_pb2_grpc.APIStub(channel)
