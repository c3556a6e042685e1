"""`riverlog serve` as a Liftbridge drop-in, in a subprocess: Liftbridge's flags and YAML keys
with LIFTBRIDGE_* overrides, the printed NATS address that nats-py can use, the embedded
nats-server dying with riverlog even on SIGKILL, taken ports reported clearly, and
gufo-liftbridge's README examples run unchanged."""
from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
from email.parser import Parser
from importlib import metadata

import nats
import pytest

from riverlog.protocol.liftbridge import api_pb2 as pb

pytestmark = pytest.mark.timeout(90)
RIVERLOG = [sys.executable, "-m", "riverlog", "serve"]
BANNER = re.compile(r"riverlog serving .*Liftbridge gRPC: (\S+):(\d+)\s+NATS: (\S+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFTBRIDGE_")}
    env.update(extra)
    return env


class Serve:
    """A `riverlog serve` subprocess; ``grpc`` and ``nats`` from the banner it prints."""

    def __init__(self, args, env=None, timeout=30):
        self.proc = subprocess.Popen(RIVERLOG + args, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     env=env or clean_env(), stdin=subprocess.DEVNULL)
        self.lines: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError("serve exited before its banner:\n" + "".join(self.lines))
            self.lines.append(line)
            m = BANNER.search(line)
            if m:
                self.grpc = f"{m.group(1)}:{m.group(2)}"
                self.nats = m.group(3)
                return
            if time.monotonic() > deadline:
                raise AssertionError("no banner:\n" + "".join(self.lines))

    def nats_pid(self) -> int:
        out = subprocess.run(["ps", "-o", "pid=,ppid=,comm=", "--ppid", str(self.proc.pid)],
                             capture_output=True, text=True).stdout
        pids = [int(l.split()[0]) for l in out.splitlines() if "nats-server" in l]
        assert len(pids) == 1, out
        return pids[0]

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rest, _ = self.proc.communicate(timeout=30)
        return "".join(self.lines) + (rest or "")


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_liftbridge_command_line_config_file_and_env(tmp_path):
    grpc_port, nats_port = free_port(), free_port()
    cfg = tmp_path / "liftbridge.yaml"
    cfg.write_text(f"""
listen: 127.0.0.1:{grpc_port + 0}
data.dir: {tmp_path / 'ignored'}
logging.level: debug
clustering:
  server.id: from-file
  raft.bootstrap.seed: true
cursors:
  stream.partitions: 2
streams:
  retention.max.age: 1h
  segment.max.bytes: 1048576
nats.servers:
  - nats://127.0.0.1:1
""")
    env = clean_env(LIFTBRIDGE_CLUSTERING_SERVER_ID="from-env",
                    LIFTBRIDGE_RIVERLOG_STREAM_PORT="0")
    serve = Serve(["-c", str(cfg), "-d", str(tmp_path / "data"), "--embedded-nats",
                   "--raft-bootstrap-seed", "--port", str(grpc_port), "--nats-port",
                   str(nats_port), "--level", "info"], env=env)
    try:
        assert serve.grpc == f"127.0.0.1:{grpc_port}" and serve.nats == f"nats://127.0.0.1:{nats_port}"

        async def check():
            import grpc
            from riverlog.protocol.liftbridge import api_pb2_grpc
            async with grpc.aio.insecure_channel(serve.grpc) as channel:
                stub = api_pb2_grpc.APIStub(channel)
                meta = await stub.FetchMetadata(pb.FetchMetadataRequest(streams=["__cursors"]),
                                                timeout=5)
                assert meta.brokers[0].id == "from-env"  # env beats the file
                assert len(meta.streamMetadata[0].partitions) == 2
            nc = await nats.connect(serve.nats)  # the printed address works
            await nc.close()

        asyncio.run(check())
        assert (tmp_path / "data" / "streams").is_dir()  # -d beats data.dir
    finally:
        out = serve.stop()
    assert serve.proc.returncode == 0, out
    assert "has no effect on a single riverlog server" in out


def test_bad_configuration_is_one_clear_line(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("streams:\n  retention.max.agee: 1h\n")
    out = subprocess.run(RIVERLOG + ["-c", str(cfg)], capture_output=True, text=True,
                         env=clean_env(), timeout=30)
    assert out.returncode != 0 and "Unknown configuration setting 'streams.retention.max.agee'" \
        in out.stderr and "Traceback" not in out.stderr
    cfg.write_text("tls:\n  cert: x.pem\n")
    out = subprocess.run(RIVERLOG + ["-c", str(cfg)], capture_output=True, text=True,
                         env=clean_env(), timeout=30)
    assert out.returncode != 0 and "tls.cert and tls.key: give both" in out.stderr


def test_embedded_nats_dies_with_riverlog_on_sigkill(tmp_path):
    serve = Serve(["-d", str(tmp_path), "--port", "0", "--nats-port", "0", "--stream-port", "0"])
    nats_pid = serve.nats_pid()
    assert pid_alive(nats_pid)
    serve.proc.send_signal(signal.SIGKILL)
    serve.proc.wait(10)
    deadline = time.monotonic() + 10
    while pid_alive(nats_pid):
        assert time.monotonic() < deadline, "nats-server outlived a SIGKILLed riverlog"
        time.sleep(0.05)


def test_taken_ports_are_reported(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for flag, what in (("--nats-port", "is already in use"), ("--port", "gRPC")):
            args = ["-d", str(tmp_path), "--stream-port", "0", "--port", "0", "--nats-port", "0"]
            args[args.index(flag) + 1] = str(port)
            out = subprocess.run(RIVERLOG + args, capture_output=True, text=True,
                                 env=clean_env(), timeout=60)
            assert out.returncode == 1, out.stderr
            assert f"127.0.0.1:{port}" in out.stderr and what in out.stderr
            assert "Traceback" not in out.stderr


async def test_a_taken_default_port_is_named_and_replaced(caplog):
    """Ports nobody asked for (the defaults): a warning names the taken one, a free one is used."""
    from riverlog.server.embedded_nats import EmbeddedNats
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = EmbeddedNats(port=port, port_fallback=True)
        await server.start()
        try:
            assert server.port != port
            assert f"NATS port 127.0.0.1:{port} is taken" in caplog.text
            nc = await nats.connect(server.url)
            await nc.close()
        finally:
            await server.stop()


def test_nats_servers_flag_uses_a_running_server(tmp_path):
    from riverlog.server.embedded_nats import find_nats_server
    port = free_port()
    external = subprocess.Popen([find_nats_server(), "-a", "127.0.0.1", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        serve = Serve(["-d", str(tmp_path), "--stream-port", "0", "--port", "0",
                       "--nats-servers", f"nats://127.0.0.1:{port}"])
        assert serve.nats == f"nats://127.0.0.1:{port}"
        serve.stop()
        assert serve.proc.returncode == 0
        assert external.poll() is None  # riverlog leaves a server it did not start alone
    finally:
        external.terminate()
        external.wait(10)


def readme_examples() -> str:
    """The Python code blocks of gufo-liftbridge's README (its PyPI description), verbatim."""
    text = Parser().parsestr(metadata.distribution("gufo_liftbridge").read_text("METADATA")
                             or "").get_payload()
    blocks = re.findall(r"``` python\n(.*?)```", text, re.S)
    assert len(blocks) == 2 and "async def publish" in blocks[0]
    assert "async def subscribe" in blocks[1]
    return "\n".join(blocks)


def test_gufo_liftbridge_readme_examples_run_unchanged(tmp_path):
    code = readme_examples()
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", 9292))
            port_free = True
        except OSError:
            port_free = False
    if not port_free:  # someone else holds Liftbridge's port: the same code on another port
        port = free_port()
        code = code.replace("127.0.0.1:9292", f"127.0.0.1:{port}")
    else:
        port = 9292
    serve = Serve(["-d", str(tmp_path), "--port", str(port), "--nats-port", "0",
                   "--stream-port", "0"])
    try:
        namespace: dict = {}
        exec(compile(code, "gufo_liftbridge README", "exec"), namespace)

        async def run():
            from gufo.liftbridge.client import LiftbridgeClient
            async with LiftbridgeClient([f"127.0.0.1:{port}"]) as client:
                await client.create_stream("test", partitions=1, wait_for_stream=True)
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                subscriber = asyncio.create_task(namespace["subscribe"]())
                for _ in range(100):  # NEW_ONLY: publish until the subscriber is there
                    await namespace["publish"]()
                    await asyncio.sleep(0.1)
                    if printed.getvalue():
                        break
                subscriber.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await subscriber
            return printed.getvalue()

        out = asyncio.run(asyncio.wait_for(run(), 60))
        assert re.match(r"\d+: b'mybinarydata'", out), out
    finally:
        serve.stop()
