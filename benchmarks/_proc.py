# Process helpers shared by the benchmarks that run `riverlog serve` (or nats-server) as a
# subprocess: a free loopback port, waiting until a port accepts connections, and a process's
# resident memory and CPU time from /proc, and a private network namespace for a run. Linux only.
# Importing it sets RIVERLOG_WORKERS=1 unless it is set: a benchmark measures one `riverlog
# serve` process (the default `--workers auto` would start one per core) unless it asks for
# workers itself (workers_scaling.py). An environment variable, not the flag, so that a
# benchmark's baseline tree older than `--workers` runs too.
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

HOST = "127.0.0.1"
os.environ.setdefault("RIVERLOG_WORKERS", "1")


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` used so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_NETNS_MARK = "RIVERLOG_BENCH_PRIVATE_NETWORK"


def private_network() -> None:
    """Run the calling script (sys.argv) in a network namespace of its own, loopback up, so
    that fixed ports (lift-bench's 9292/4222, RabbitMQ's Erlang distribution and epmd) are
    its own and other work on the machine is neither reached nor in the way. Re-executes
    through `unshare --net` (root; SystemExit otherwise); returns in the new namespace."""
    if os.environ.get(_NETNS_MARK):
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        return
    if os.geteuid() != 0:
        raise SystemExit("needs root for a private network namespace (unshare --net)")
    os.execvpe("unshare", ["unshare", "--net", "--", sys.executable, *sys.argv],
               {**os.environ, _NETNS_MARK: "1"})


def end_private_network() -> None:
    """SIGKILL what is left in this script's private network namespace (daemons its servers
    started, e.g. RabbitMQ's epmd): every process there was started by this script."""
    if not os.environ.get(_NETNS_MARK):
        return
    mine = os.readlink("/proc/self/ns/net")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(pid) != os.getpid() and os.readlink(f"/proc/{pid}/ns/net") == mine:
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
