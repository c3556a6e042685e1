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

--case files (issue 24's open-file target) instead: one `riverlog serve` (defaults) started
under RLIMIT_NOFILE 1024 (soft and hard, so it cannot raise it); the start with an empty data
folder is timed; then --streams (5000) Creates, one after the other on one connection,
each answered OK or refused (counted by code); a message published with confirm to every
stream that exists; the server stopped and started again (timed: the restart's extra time
over the first start), and one more message to every stream. Prints counts, times and the
descriptors the server holds (/proc/PID/fd).

    .venv/bin/python benchmarks/security_bench.py --case files [--streams 5000]

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
import resource
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
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

    def __init__(self, work: str, name: str, config: str | None, nofile: int = 0) -> None:
        """``nofile``: RLIMIT_NOFILE (soft and hard) of the server process (0: inherited)."""
        cmd = [sys.executable, "-m", "riverlog", "serve", "-d", os.path.join(work, name),
               "--stream-port", "0", "--port", "0", "--nats-port", "0", "--metrics-port", "0",
               "--level", "warning", "--workers", "1"]
        if config:
            cmd += ["-c", config, "--stream-tls-port", "0"]
        limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) \
            if nofile else None
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, preexec_fn=limit)
        for line in self.proc.stdout:
            m = BANNER.search(line)
            if m:
                self.stream_port = int(m.group(1))
                self.tls_port = int(m.group(2)) if m.group(2) else None
                self.grpc_addr = m.group(3)
                self.start_seconds = time.perf_counter() - self.started
                break
        else:
            raise RuntimeError(f"riverlog ({name}) did not start")
        # keep reading its output: a full pipe would block the server's logging
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

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


async def publish_one(conn: rsb.Conn, stream: str) -> int:
    """One message with confirm to ``stream`` (publisher 1, declared and deleted): the
    response code (DeclarePublisher's when it fails, PublishError's, or 1 confirmed)."""
    r = await conn.request(f.DeclarePublisher(conn.next_corr(), 1, "", stream))
    if r.response_code != 1:
        return r.response_code
    conn.transport.write(rsb.encode(f.Publish(1, ((1, rsb.message_entry(100)),))))
    while True:
        got = await asyncio.wait_for(conn.frames.get(), 30)
        if isinstance(got, f.PublishConfirm):
            code = 1
            break
        if isinstance(got, f.PublishError):
            code = got.errors[0][1]
            break
    await conn.request(f.DeletePublisher(conn.next_corr(), 1))
    return code


async def publish_to_all(port: int, streams: list[str]) -> dict[int, int]:
    conn = await rsb.connect(port)
    codes: dict[int, int] = {}
    for stream in streams:
        code = await publish_one(conn, stream)
        codes[code] = codes.get(code, 0) + 1
    conn.transport.close()
    return codes


async def create_many(port: int, n: int) -> tuple[list[str], dict[int, int], float]:
    conn = await rsb.connect(port)
    made, codes = [], {}
    t0 = time.perf_counter()
    for i in range(n):
        name = f"many-{i}"
        r = await conn.request(f.Create(conn.next_corr(), name, {}))
        codes[r.response_code] = codes.get(r.response_code, 0) + 1
        if r.response_code == 1:
            made.append(name)
    elapsed = time.perf_counter() - t0
    conn.transport.close()
    return made, codes, elapsed


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def files_case(args) -> list[tuple[str, float]]:
    """Issue 24's target: stream creates under RLIMIT_NOFILE 1024, publishing to every
    stream after, and the restart time."""
    work = tempfile.mkdtemp(prefix="security-bench-files-")
    results: list[tuple[str, float]] = []
    server = Server(work, "files", None, nofile=1024)
    try:
        results.append(("start, empty data folder (s)", server.start_seconds))
        made, codes, elapsed = asyncio.run(create_many(server.stream_port, args.streams))
        for code, count in sorted(codes.items()):
            results.append((f"Creates answered 0x{code:02x}", count))
        results.append(("Creates/s", args.streams / elapsed))
        results.append(("descriptors held after the creates", open_fds(server.proc.pid)))
        published = asyncio.run(publish_to_all(server.stream_port, made))
        for code, count in sorted(published.items()):
            results.append((f"publishes to existing streams answered 0x{code:02x}", count))
        server.stop()
        server = Server(work, "files", None, nofile=1024)
        results.append((f"restart with {len(made)} streams (s)", server.start_seconds))
        published = asyncio.run(publish_to_all(server.stream_port, made))
        for code, count in sorted(published.items()):
            results.append((f"after the restart, publishes answered 0x{code:02x}", count))
        results.append(("descriptors held after the restart and publishes",
                        open_fds(server.proc.pid)))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--grpc-messages", type=int, default=50_000)
    parser.add_argument("--logins", type=int, default=200)
    parser.add_argument("--case", choices=["costs", "files"], default="costs",
                        help="costs: what TLS and authorization cost; files: the open-file "
                             "target of issue 24")
    parser.add_argument("--streams", type=int, default=5000, help="--case files: Creates")
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
    if args.case == "files":
        for name, value in files_case(args):
            print(f"{name:58s} {value:14,.2f}")
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
