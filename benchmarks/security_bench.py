"""What security costs: riverlog with defaults against riverlog with TLS and authorization.

Starts two `riverlog serve` processes in one run: "open" (the defaults: plain TCP, guest,
no authorization) and "secured" (tls.cert/tls.key with a test CA made here, authorization on
with the casbin rules `p, guest, *, *` and `p, bench, *, *`, user `bench` with a bcrypt cost 12
hash, guest kept). Measures:

  password check        bcrypt (riverlog.security.users) in this process: the first check of
                        a user/password pair at cost 10 (guest) and 12, then a remembered one
  logins/s              sequential RabbitMQ Stream handshakes (PeerProperties .. Open, then
                        close) as guest, plain TCP and TLS
  RabbitMQ publish      the load generator of rabbitmq_stream_bench.py (--messages 100-byte
                        messages, batches of 100, 20,000 unconfirmed): open/TCP,
                        secured/TCP (authorization on), secured/TLS
  gRPC PublishAsync     liftbridge_bench.py's PublishAsync case (--grpc-messages 256-byte
                        messages): open plaintext, and secured: TLS with Basic credentials
                        attached to every call (grpc.metadata_call_credentials), checked with
                        authorization per message

Clients run in this process; the servers are separate processes. Compare ratios within a run.

    .venv/bin/python benchmarks/security_bench.py [--messages 1000000] [--grpc-messages 50000]
        [--logins 200]

With ``--attacks`` it measures instead what one logged-in user's attacks (issue 24) cost
another user (security_attacks.py): a secured server (authorization on, users ``attacker``
and ``canary``), a canary that publishes over gRPC (Publish, ack policy LEADER: publish to
ack), consumes the same stream (Subscribe) and asks FetchMetadata for one stream, while an
attacker process runs each attack for ``--seconds``. Per attack: canary publish p99, canary
FetchMetadata p99, messages the canary consumer missed, server RSS growth.

    .venv/bin/python benchmarks/security_bench.py --attacks [--seconds 10] [--attack NAME]
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import uuid

import grpc
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests", "security")]

import liftbridge_bench  # noqa: E402
import rabbitmq_stream_bench as rsb  # noqa: E402
from _certs import Authority  # noqa: E402  (test certificates made with `cryptography`)

from riverlog.protocol.liftbridge import api_pb2 as pb  # noqa: E402
from riverlog.protocol.liftbridge import api_pb2_grpc  # noqa: E402
from riverlog.protocol.rabbitmq_stream import frames as f  # noqa: E402
from riverlog.security.tls import client_context  # noqa: E402
from riverlog.security.users import GUEST_HASH, Users, hash_password  # noqa: E402

BANNER = re.compile(r"RabbitMQ Stream: \S+:(\d+)(?:\s+RabbitMQ Stream TLS: \S+:(\d+))?"
                    r".*Liftbridge gRPC: (\S+:\d+)")
BENCH_PASSWORD = "bench-password"


class Server:
    """A `riverlog serve` subprocess; ``stream_port``, ``tls_port``, ``grpc_addr``."""

    def __init__(self, work: str, name: str, config: str | None) -> None:
        cmd = [sys.executable, "-m", "riverlog", "serve", "-d", os.path.join(work, name),
               "--stream-port", "0", "--port", "0", "--nats-port", "0", "--metrics-port", "0",
               "--level", "warning"]
        if config:
            cmd += ["-c", config, "--stream-tls-port", "0"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        for line in self.proc.stdout:
            m = BANNER.search(line)
            if m:
                self.stream_port = int(m.group(1))
                self.tls_port = int(m.group(2)) if m.group(2) else None
                self.grpc_addr = m.group(3)
                break
        else:
            raise RuntimeError(f"riverlog ({name}) did not start")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)


def secured_config(work: str) -> tuple[str, str]:
    """The secured server's configuration file and the CA file clients trust."""
    ca = Authority(work)
    server = ca.issue("localhost", server=True)
    path = os.path.join(work, "secured.yaml")
    write_config(path, {"guest": GUEST_HASH, "bench": hash_password(BENCH_PASSWORD, 12)},
                 [["guest", "*", "*"], ["bench", "*", "*"]],
                 {"cert": server.cert, "key": server.key})
    return path, ca.pem


def write_config(path: str, users: dict[str, str], rules: list[list[str]],
                 tls: dict[str, str] | None = None) -> None:
    """A riverlog configuration file at ``path``: authorization on, ``users`` (name: bcrypt
    hash), casbin ``rules``, and ``tls`` keys (cert, key) when given."""
    with open(path, "w") as out:
        yaml.safe_dump({"tls": {**(tls or {}), "client.authz.enabled": True},
                        "riverlog": {"users": users, "authz.rules": rules}}, out)


def password_checks() -> list[tuple[str, float]]:
    out = []
    for rounds in (10, 12):
        users = Users([("u", hash_password("pw", rounds))])
        t0 = time.perf_counter()
        assert users.check_password("u", "pw")
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(10_000):
            users.check_password("u", "pw")
        out.append((f"bcrypt cost {rounds}: first check (ms)", first * 1000))
        out.append((f"bcrypt cost {rounds}: remembered check (us)",
                    (time.perf_counter() - t0) / 10_000 * 1e6))
    return out


@contextlib.contextmanager
def rabbitmq_over(context: ssl.SSLContext | None):
    """rabbitmq_stream_bench's generator, connecting with TLS when ``context`` is given (its
    measure_* functions dial through the module's ``connect``)."""
    plain = rsb.connect

    async def connect_tls(port: int) -> rsb.Conn:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(rsb.Conn, rsb.HOST, port, ssl=context)
        await conn.handshake()
        return conn

    rsb.connect = connect_tls if context is not None else plain
    try:
        yield
    finally:
        rsb.connect = plain


async def logins(port: int, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        conn = await rsb.connect(port)
        conn.transport.close()
    return n / (time.perf_counter() - t0)


async def publish(port: int, messages: int) -> float:
    stream = f"sec-{uuid.uuid4().hex[:8]}"
    await rsb.with_admin(port, lambda conn: conn.request(f.Create(conn.next_corr(), stream, {})))
    rate, _ = await rsb.measure_publish(port, stream, rsb.publish_frames(messages, 100, 100),
                                        100, 20_000)
    return rate


async def grpc_publish(channel: grpc.aio.Channel, messages: int) -> float:
    stub = api_pb2_grpc.APIStub(channel)
    await stub.FetchMetadata(pb.FetchMetadataRequest(), wait_for_ready=True, timeout=30)
    return await liftbridge_bench.bench_publish_async(stub, messages, os.urandom(256))


def basic_credentials(ca: str) -> grpc.ChannelCredentials:
    token = base64.b64encode(f"bench:{BENCH_PASSWORD}".encode()).decode()

    def attach(context, callback):
        callback((("authorization", f"Basic {token}"),), None)

    with open(ca, "rb") as f_:
        return grpc.composite_channel_credentials(grpc.ssl_channel_credentials(f_.read()),
                                                  grpc.metadata_call_credentials(attach))


async def run(args, open_: Server, secured: Server, ca: str) -> list[tuple[str, float]]:
    tls = client_context(ca)
    results = password_checks()
    with rabbitmq_over(None):
        results.append(("RabbitMQ logins/s, open, TCP", await logins(open_.stream_port,
                                                                      args.logins)))
        results.append(("RabbitMQ logins/s, secured, TCP", await logins(secured.stream_port,
                                                                         args.logins)))
    with rabbitmq_over(tls):
        results.append(("RabbitMQ logins/s, secured, TLS", await logins(secured.tls_port,
                                                                         args.logins)))
    with rabbitmq_over(None):
        results.append(("RabbitMQ publish msgs/s, open, TCP",
                        await publish(open_.stream_port, args.messages)))
        results.append(("RabbitMQ publish msgs/s, secured (authz), TCP",
                        await publish(secured.stream_port, args.messages)))
    with rabbitmq_over(tls):
        results.append(("RabbitMQ publish msgs/s, secured (authz), TLS",
                        await publish(secured.tls_port, args.messages)))
    async with grpc.aio.insecure_channel(open_.grpc_addr) as channel:
        results.append(("gRPC PublishAsync msgs/s, open, plaintext",
                        await grpc_publish(channel, args.grpc_messages)))
    host_port = "localhost:" + secured.grpc_addr.rpartition(":")[2]
    async with grpc.aio.secure_channel(host_port, basic_credentials(ca)) as channel:
        results.append(("gRPC PublishAsync msgs/s, secured: TLS + Basic + authz",
                        await grpc_publish(channel, args.grpc_messages)))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--grpc-messages", type=int, default=50_000)
    parser.add_argument("--logins", type=int, default=200)
    parser.add_argument("--attacks", action="store_true",
                        help="measure issue 24's attacks against a canary user instead")
    parser.add_argument("--seconds", type=float, default=10.0, help="each attack's length")
    parser.add_argument("--attack", action="append",
                        help="with --attacks: only this one (repeatable)")
    args = parser.parse_args()
    if args.attacks:
        import security_attacks
        security_attacks.main(args.seconds, args.attack)
        return
    work = tempfile.mkdtemp(prefix="security-bench-")
    servers = []
    try:
        config, ca = secured_config(work)
        servers.append(Server(work, "open", None))
        servers.append(Server(work, "secured", config))
        results = asyncio.run(run(args, servers[0], servers[1], ca))
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    for name, value in results:
        print(f"{name:58s} {value:14,.1f}")


if __name__ == "__main__":
    main()
