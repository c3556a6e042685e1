# The servers behind the `stream_server` fixtures (tests/conftest.py): a `riverlog serve`
# subprocess on a free port with its own data dir, or an already-running RabbitMQ peer.
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

HOST = "127.0.0.1"


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free on HOST now that this process never handed out before. bind(0) alone
    can give the same port to two calls in a row once the first socket is closed (137
    repeats in 2,000 calls here), and two servers of one test then got one Raft port (CI:
    "Raft peers list this server's own address")."""
    while True:
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def _read(path: str | None, start: int = 0) -> str:
    if not path or not os.path.exists(path):
        return ""
    with open(path, "rb") as f:
        f.seek(start)
        return f.read().decode(errors="replace")


class RiverlogServer:
    """`riverlog serve` in a subprocess; restart() keeps the data dir and the port."""

    kind = "riverlog"
    host = HOST
    can_restart = True

    def __init__(self, data_dir: str, log_path: str) -> None:
        self.data_dir, self.log_path = data_dir, log_path
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.problems: list[str] = []

    def start(self, timeout: float = 30) -> None:
        cmd = [sys.executable, "-m", "riverlog", "serve", "-d", self.data_dir,
               "--stream-port", str(self.port), "--port", "0", "--nats-port", "0",
               "--metrics-port", "0", "--management-port", "0",
               # the suites refuse many logins: answered at once, not after RabbitMQ 4's 3 s
               "--silent-close-delay", "0",
               "--level", "warning"]  # free ports: suites side by side
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"riverlog exited with {self.proc.returncode} before listening "
                                   f"on {HOST}:{self.port}:\n{self.log()[-8000:]}")
            try:
                socket.create_connection((HOST, self.port), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.proc.kill()
                    raise RuntimeError(f"riverlog did not listen on {HOST}:{self.port} within "
                                       f"{timeout}s:\n{self.log()[-8000:]}") from None
                time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; anything but a prompt exit 0 is a problem."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is not None:
            self.problems.append(f"riverlog had already exited with {proc.returncode}")
            return
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            self.problems.append(f"riverlog ignored SIGTERM for {timeout}s and was killed")
            return
        if rc != 0:
            self.problems.append(f"riverlog exited with {rc} after SIGTERM")

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_size(self) -> int:
        return os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0

    def log(self, since: int = 0) -> str:
        return _read(self.log_path, since)


class PeerServer:
    """An already-running RabbitMQ (RIVERLOG_TEST_PEER=rabbitmq:PORT). restart() runs the
    loopback tool named by RIVERLOG_TEST_PEER_RESTART (stop, then start on the same port)."""

    kind = "rabbitmq"
    host = HOST

    def __init__(self, port: int) -> None:
        self.port = port
        self.tool = os.environ.get("RIVERLOG_TEST_PEER_RESTART")
        self.can_restart = bool(self.tool)
        self.problems: list[str] = []

    def alive(self) -> bool:
        try:
            socket.create_connection((HOST, self.port), timeout=2).close()
            return True
        except OSError:
            return False

    def restart(self) -> None:
        if not self.tool:
            pytest.skip("the RabbitMQ peer is not restarted (set RIVERLOG_TEST_PEER_RESTART)")
        env = {**os.environ, "STREAM_PORT": str(self.port)}
        subprocess.run(["bash", self.tool, "stop"], env=env, check=True, timeout=120)
        subprocess.run(["bash", self.tool, "start"], env=env, check=True, timeout=180,
                       stdout=subprocess.DEVNULL)

    def stop(self) -> None:
        pass

    def log_size(self) -> int:
        return 0

    def log(self, since: int = 0) -> str:
        return ""
