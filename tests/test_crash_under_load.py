# Crash under load, the short version of benchmarks/crash_bench.py (which holds the harness:
# server process, the three publishers, the read-back checks): `riverlog serve` is SIGKILLed
# and restarted 20 times under durability `always` while rstream, nats-py (enveloped, acks
# LEADER/ALL) and gufo-liftbridge (PublishAsync) publish into one stream with confirms. Every
# confirmed or acked message must be there exactly once, in order per publisher, after every
# restart and at the end. RIVERLOG_CRASH_SEED replays a run.
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import crash_bench  # noqa: E402  benchmarks/crash_bench.py


# a hang guard, not a target: ~70 s on an idle machine, 110-480 s with other suites running
# beside it (each of the 20 restarts starts a Python server); run side by side in one load, in
# pytest and as a plain script, the restarts took the same (2-4.5 s each)
@pytest.mark.timeout(600)
async def test_twenty_kills_under_load_lose_nothing_confirmed(tmp_path):
    seed = os.environ.get("RIVERLOG_CRASH_SEED")
    lines: list[str] = []
    report = await crash_bench.run_crash_test(
        kills=20, policy="always", workdir=str(tmp_path), seed=int(seed) if seed else None,
        min_run=0.15, max_run=0.5, rate=3000, log=lines.append)
    detail = "\n".join(lines[-30:] + report.problems[:20])
    assert report.kills == 20
    assert all(report.confirmed[name] > 0 for name in crash_bench.PUBLISHERS), detail
    assert report.lost == 0, detail
    assert report.duplicates == 0, detail
    assert report.out_of_order == 0, detail
    assert report.offset_gaps == 0, detail
    assert report.problems == [], detail
    assert report.stored >= report.total_confirmed


@pytest.mark.timeout(60)
def test_sigkill_leaves_no_embedded_nats_server_behind(tmp_path):
    """The embedded nats-server is riverlog's child: a SIGKILLed riverlog must not orphan it
    (embedded_nats.py sets PR_SET_PDEATHSIG), so a restart gets the same NATS port again."""
    import signal
    import subprocess
    import time

    from _proc import free_port, wait_listening  # benchmarks/_proc.py

    nats_port, stream_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "riverlog", "serve", "-d", str(tmp_path / "data"),
           "--stream-port", str(stream_port), "-p", "0", "--nats-port", str(nats_port),
           "--metrics-port", "0", "--management-port", "0",
           "--level", "warning"]
    for _ in range(3):
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        wait_listening(stream_port, proc)
        wait_listening(nats_port, proc)
        children = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "nats-server"],
                                  capture_output=True, text=True).stdout.split()
        assert len(children) == 1, children
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{children[0]}") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not os.path.exists(f"/proc/{children[0]}"), "nats-server outlived riverlog"
