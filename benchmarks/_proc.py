# Process helpers shared by the benchmarks that run `riverlog serve` (or nats-server) as a
# subprocess: a free loopback port, waiting until a port accepts connections, and a process's
# resident memory from /proc. Linux only (/proc/<pid>/status).
from __future__ import annotations

import socket
import subprocess
import time

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    """Return once 127.0.0.1:``port`` accepts a connection; RuntimeError if ``proc`` exits
    first or ``timeout`` s pass."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((HOST, port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on {HOST}:{port} after {timeout} s") from None
            time.sleep(0.05)


def rss_kib(pid: int) -> int:
    """Resident set size of process ``pid`` in KiB (VmRSS of /proc/<pid>/status), 0 if gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
