# `riverlog serve`'s default `--workers auto` (issue 31 item 0; docs/operations.md "Workers"):
# one worker per core on a new data folder, the saved count on a folder of workers, and one
# process where workers cannot run (a cluster member's settings, an external NATS, an
# advertised port) or where the folder holds one process's data (it is not moved into
# workers); the reason is logged. RIVERLOG_WORKERS sets it from the environment (the test
# session sets 1: tests/conftest.py); a member of `cluster up` or of workers runs one process.
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys

import pytest

from _cluster import WAIT_S
from compat._servers import free_port
from riverlog.cluster.local import WORKERS_ENV, Member, serve_command
from riverlog.cluster.workers import auto_count, check, cores, worker_count
from riverlog.config_file import build, load


def config(data: str, env: dict[str, str] | None = None, **flags):
    return build(load(None, env or {}), {"data_dir": data, **flags})[0]


def test_auto_is_one_per_core_on_a_new_folder(tmp_path):
    assert auto_count(config(str(tmp_path / "new"))) == (cores(), None)
    assert cores() == len(os.sched_getaffinity(0))


def test_auto_keeps_the_saved_count_of_a_folder_of_workers(tmp_path):
    (tmp_path / "workers").mkdir()
    (tmp_path / "workers" / "cluster.json").write_text(
        json.dumps({"servers": [{"id": f"s{i}"} for i in range(3)]}))
    assert auto_count(config(str(tmp_path))) == (3, None)


@pytest.mark.parametrize("made", ["layout", "streams"])
def test_auto_is_one_process_on_a_folder_of_one_process(tmp_path, made):
    if made == "layout":
        (tmp_path / "layout").write_text("riverlog data layout 1\n")
    else:
        (tmp_path / "streams").mkdir()
    (tmp_path / "workers").mkdir()  # workers beside it do not change that
    (tmp_path / "workers" / "cluster.json").write_text(json.dumps({"servers": [{}, {}]}))
    count, why = auto_count(config(str(tmp_path)))
    assert count == 1
    assert "holds the data of one process" in why and made in why


@pytest.mark.parametrize("env, flags, why", [
    ({"LIFTBRIDGE_RIVERLOG_RAFT_ADDRESS": "127.0.0.1:7001",
      "LIFTBRIDGE_RIVERLOG_RAFT_PASSWORD": "pw"},
     {"raft_bootstrap_seed": True, "server_id": "a"}, "cluster member"),
    ({}, {"nats_servers": ["nats://127.0.0.1:4222"]}, "external NATS"),
    ({}, {"advertised_port": 5553}, "advertises a port"),
])
def test_auto_is_one_process_for_settings_workers_cannot_run_with(tmp_path, env, flags, why):
    settings = config(str(tmp_path), env, **flags)
    count, reason = auto_count(settings)
    assert count == 1 and why in reason
    with pytest.raises(ValueError, match="run one worker"):  # asked for: refused
        check(settings)


def test_worker_count_logs_why_auto_is_one_and_refuses_bad_values(tmp_path, caplog):
    (tmp_path / "streams").mkdir()
    with caplog.at_level(logging.INFO, logger="riverlog.workers"):
        assert worker_count("auto", config(str(tmp_path))) == 1
    assert "--workers auto: one process" in caplog.text
    assert worker_count("3", config(str(tmp_path))) == 3
    for bad in ("0", "-1", "many"):
        with pytest.raises(ValueError, match="--workers"):
            worker_count(bad, config(str(tmp_path)))


def test_a_cluster_member_runs_one_process():
    member = Member("s0", {p: 1000 + i for i, p in enumerate(
        ("stream", "grpc", "nats", "nats_cluster", "raft", "metrics", "management"))},
        "127.0.0.1")
    _command, env = serve_command(member, [member], "/nonexistent-riverlog-test")
    assert env[WORKERS_ENV] == "1"


def serve(data: str, env: dict[str, str]) -> tuple[subprocess.Popen, list[str]]:
    """`riverlog serve` on ``data`` with free ports and no --workers; its stdout lines up to
    and including the "riverlog serving" one."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "riverlog", "serve", "-d", data, "--level", "info",
         "--stream-port", str(free_port()), "--port", str(free_port()),
         "--nats-port", str(free_port()), "--metrics-port", str(free_port()),
         "--management-port", str(free_port())],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    lines = []
    while True:
        line = proc.stdout.readline()
        if not line:
            proc.wait(WAIT_S)
            pytest.fail(f"serve ended: {proc.returncode} {proc.stderr.read()[-2000:]}")
        lines.append(line)
        if line.startswith("riverlog serving"):
            return proc, lines


def stop(proc: subprocess.Popen) -> str:
    """SIGTERM ``proc``, wait for exit 0; its stderr."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(WAIT_S) == 0
    return proc.stderr.read()


def test_serve_without_workers_flag_runs_auto(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != WORKERS_ENV}
    # a new folder: one worker per core (a table row each), and again on restart
    for _ in range(2):
        proc, lines = serve(str(tmp_path / "new"), env)
        try:
            if cores() > 1:
                assert f"({cores()} workers;" in lines[-1]
                assert [li.split()[0] for li in lines[1:-1]] == [
                    f"s{i}" for i in range(cores())]
            else:
                assert "workers" not in lines[-1]
        finally:
            stop(proc)
    # a folder one process wrote: one process, and the log says why
    proc, lines = serve(str(tmp_path / "old"), {**env, WORKERS_ENV: "1"})
    stop(proc)
    proc, lines = serve(str(tmp_path / "old"), env)
    err = stop(proc)
    assert len(lines) == 1 and "workers" not in lines[0]
    assert "--workers auto: one process" in err and "holds the data of one process" in err
