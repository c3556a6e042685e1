"""The `riverlog` command: serve starts, recovers stored partitions and stops cleanly on
SIGTERM; `log verify` reports damage without changing files."""
import os
import signal
import subprocess
import sys
import time

from riverlog.log import CommitLog

RIVERLOG = [sys.executable, "-m", "riverlog"]


def test_help_lists_commands():
    out = subprocess.run(RIVERLOG + ["--help"], capture_output=True, text=True, check=True)
    assert "serve" in out.stdout and "log" in out.stdout


def test_serve_recovers_partitions_and_stops_on_sigterm(tmp_path):
    part = tmp_path / "streams" / "orders" / "0"
    with CommitLog(part) as clog:
        clog.append([b"a", b"b"])
    with open(clog.segments[-1].path, "ab") as f:
        f.write(b"torn")
    proc = subprocess.Popen(RIVERLOG + ["serve", "-d", str(tmp_path)], stderr=subprocess.PIPE,
                            text=True)
    lines = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        if "press Ctrl-C" in line or not line:
            break
    assert any("truncated 4 bytes" in l for l in lines), lines
    assert any("offsets 0..1" in l for l in lines), lines
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "stopped" in rest
    assert os.path.getsize(clog.segments[-1].path) == CommitLog(part).size_bytes


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
