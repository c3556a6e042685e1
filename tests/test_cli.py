"""The `riverlog` command: serve starts, recovers stored streams, reports a taken port and
stops cleanly on SIGTERM; `log verify` reports damage without changing files."""
import os
import signal
import socket
import subprocess
import sys
import time

from riverlog.broker import Broker
from riverlog.log import CommitLog

RIVERLOG = [sys.executable, "-m", "riverlog"]
# the doors besides the one a test is about, on free ports (suites may run side by side)
FREE_PORTS = ["--port", "0", "--nats-port", "0", "--metrics-port", "0", "--management-port", "0"]


def test_help_lists_commands():
    out = subprocess.run(RIVERLOG + ["--help"], capture_output=True, text=True, check=True)
    assert "serve" in out.stdout and "log" in out.stdout


def test_serve_recovers_streams_and_stops_on_sigterm(tmp_path):
    broker = Broker(str(tmp_path))
    broker.open()
    partition = broker.create("orders").partitions[0]
    partition.log.append([b"a", b"b"])
    partition.log.close()
    with open(partition.log.segments[-1].path, "ab") as f:
        f.write(b"torn")
    proc = subprocess.Popen(RIVERLOG + ["serve", "-d", str(tmp_path), "--stream-port", "0"]
                            + FREE_PORTS,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        if "press Ctrl-C" in line or not line:
            break
    assert any("truncated 4 bytes" in l for l in lines), lines
    assert any("(1 streams" in l for l in lines), lines
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "stopped" in rest
    reopened = CommitLog(partition.log.directory)
    assert reopened.report.clean and reopened.next_offset == 2


def test_serve_reports_a_taken_port(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(RIVERLOG + ["serve", "-d", str(tmp_path), "--stream-port",
                                         str(port)] + FREE_PORTS,
                             capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert f"127.0.0.1:{port}" in out.stderr and "Traceback" not in out.stderr


def test_log_verify_is_read_only(tmp_path):
    with CommitLog(tmp_path) as clog:
        clog.append([b"x" * 100])
    path = clog.segments[-1].path
    ok = subprocess.run(RIVERLOG + ["log", "verify", str(tmp_path)], capture_output=True,
                        text=True)
    assert ok.returncode == 0 and "every chunk checks" in ok.stdout
    with open(path, "r+b") as f:
        f.seek(60)
        f.write(b"Y")
    size = os.path.getsize(path)
    bad = subprocess.run(RIVERLOG + ["log", "verify", str(tmp_path)], capture_output=True,
                         text=True)
    assert bad.returncode == 1 and "CRC-32 mismatch" in bad.stdout
    assert os.path.getsize(path) == size
