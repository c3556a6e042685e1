"""The operations commands, run as `python -m riverlog ...` subprocesses against a real
`riverlog serve` (started with --log-format json): stream list|create|delete|describe,
publish (arguments and stdin), tail (every start position, --follow, --format json), stats
(scraped from /metrics), the errors when no server listens, and --help on each command."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from compat._servers import free_port

pytestmark = pytest.mark.timeout(120)


@contextlib.contextmanager
def serving(tmp, *flags: str):
    """A `riverlog serve` subprocess on ``tmp/data`` with ``flags``; yields the environment
    that points the CLI at it."""
    out, err = open(tmp / "stdout", "wb"), open(tmp / "stderr", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "riverlog", "serve", "-d", str(tmp / "data"),
         "--stream-port", str(free_port()), "--port", "0", "--nats-port", "0",
         "--metrics-port", "0", "--management-port", "0", "--log-format", "json", *flags],
        stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while "riverlog serving" not in (tmp / "stdout").read_text():
        assert proc.poll() is None, (tmp / "stderr").read_text()
        assert time.monotonic() < deadline, "riverlog did not start"
        time.sleep(0.05)
    line = (tmp / "stdout").read_text()
    env = {**os.environ,
           "RIVERLOG_SERVER": re.search(r"RabbitMQ Stream: (\S+)", line).group(1),
           "RIVERLOG_GRPC": re.search(r"Liftbridge gRPC: (\S+)", line).group(1),
           "RIVERLOG_METRICS_URL": re.search(r"metrics: (\S+)", line).group(1)}
    try:
        yield env
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        out.close()
        err.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A `riverlog serve` subprocess; yields the environment that points the CLI at it."""
    tmp = tmp_path_factory.mktemp("ops")
    with serving(tmp) as env:
        yield env, tmp


def cli(env, *args, stdin: bytes | None = None, check: bool = True):
    done = subprocess.run([sys.executable, "-m", "riverlog", *args], env=env, input=stdin,
                          capture_output=True, timeout=60)
    if check:
        assert done.returncode == 0, done.stderr.decode()
    return done


def out(done) -> str:
    return done.stdout.decode()


def test_stream_create_list_describe_delete(server):
    env, _ = server
    assert out(cli(env, "stream", "create", "orders", "--max-age", "7D")) == \
        "created stream orders\n"
    again = cli(env, "stream", "create", "orders", "--max-age", "7D", check=False)
    assert again.returncode == 1
    assert again.stderr.decode() == \
        "Error: create 'orders': cannot create stream 'orders' (0x05 STREAM_ALREADY_EXISTS)\n"
    assert out(cli(env, "stream", "create", "orders", "--max-age", "7D", "--exists-ok")) == \
        "stream orders already exists\n"
    # other arguments than the stream's: precondition failed, as RabbitMQ answers
    other = cli(env, "stream", "create", "orders", "--exists-ok", check=False)
    assert other.returncode == 1 and "0x11 PRECONDITION_FAILED" in other.stderr.decode()
    listing = out(cli(env, "stream", "list")).splitlines()
    assert listing[0].split() == ["stream", "partitions", "subject"]
    assert ["orders", "1"] in [row.split() for row in listing[1:]]
    assert not any(row.startswith("__") for row in listing)
    everything = out(cli(env, "stream", "list", "-a")).splitlines()
    assert any(row.startswith("__cursors") for row in everything)

    cli(env, "publish", "orders", "a", "b", "c")
    described = dict(re.split(r"\s{2,}", row, 1) for row in
                     out(cli(env, "stream", "describe", "orders", "-c", "nobody")).splitlines())
    assert described["stream"] == "orders"
    assert (described["first offset"], described["end offset"], described["messages"]) == \
        ("0", "3", "3")
    assert described["consumer nobody"] == "no stored offset"
    assert described["table"] == "off"

    assert out(cli(env, "stream", "delete", "orders")) == "deleted stream orders\n"
    gone = cli(env, "stream", "describe", "orders", check=False)
    assert gone.returncode == 1 and "does not exist" in gone.stderr.decode()
    assert cli(env, "stream", "delete", "orders", check=False).returncode == 1
    assert out(cli(env, "stream", "delete", "orders", "--missing-ok")) == \
        "stream orders does not exist\n"


def test_stream_with_a_table(server):
    """`stream create --table` turns the stream's table on (Iceberg, the default); describe
    shows the offsets it holds and its lag once the writer caught up (streams.table.lag:
    5 s)."""
    env, _ = server
    cli(env, "stream", "create", "tabled", "--table")
    cli(env, "publish", "tabled", "a", "b", "c")
    deadline = time.monotonic() + 60
    while True:
        described = dict(re.split(r"\s{2,}", row, 1) for row in
                         out(cli(env, "stream", "describe", "tabled")).splitlines())
        if "lag 0 " in described["table"]:
            break
        assert time.monotonic() < deadline, described["table"]
        time.sleep(0.5)
    assert re.fullmatch(r"on, offsets 0\.\.2, 1 file, \d+ bytes, lag 0 messages \(0\.0s\)",
                        described["table"]), described["table"]


def test_describe_names_the_iceberg_catalog(tmp_path):
    """With Iceberg tables, describe says where readers find a stream's table: the catalog
    (the embedded SQLite one in the table folder) and the table's name in it."""
    with serving(tmp_path, "--tables", "--table-format", "iceberg") as env:
        cli(env, "stream", "create", "iced")
        described = dict(re.split(r"\s{2,}", row, 1) for row in
                         out(cli(env, "stream", "describe", "iced")).splitlines())
    catalog = f"sqlite:///{tmp_path / 'data' / 'tables' / 'catalog.db'}"
    assert described["table catalog"] == f"iceberg table riverlog.iced in {catalog}"


def test_publish_and_tail(server):
    env, _ = server
    cli(env, "stream", "create", "events")
    done = cli(env, "publish", "events", "one", "two", "--key", "k")
    assert done.stderr.decode() == "published 2 message(s) to events\n"
    cli(env, "publish", "events", stdin=b"three\nfour\r\nfive\n")
    assert out(cli(env, "tail", "events")) == "one\ntwo\nthree\nfour\nfive\n"
    assert out(cli(env, "tail", "events", "--from", "latest")) == "five\n"
    assert out(cli(env, "tail", "events", "--from", "3")) == "four\nfive\n"
    assert out(cli(env, "tail", "events", "-n", "2")) == "one\ntwo\n"
    assert out(cli(env, "tail", "events", "--from", "new")) == ""
    rows = [json.loads(line) for line in out(cli(env, "tail", "events", "--format", "json",
                                                  "-n", "3")).splitlines()]
    assert [(r["offset"], r["key"], r["value"]) for r in rows] == \
        [(0, "k", "one"), (1, "k", "two"), (2, None, "three")]
    assert all(r["timestamp_ns"] > 1_600_000_000 * 10**9 for r in rows)
    bad = cli(env, "tail", "events", "--from", "middle", check=False)
    assert bad.returncode == 1 and "--from: expected earliest, latest, new or an offset" in \
        bad.stderr.decode()


def test_tail_follow_sees_new_messages(server):
    env, _ = server
    cli(env, "stream", "create", "live")
    follower = subprocess.Popen([sys.executable, "-m", "riverlog", "tail", "live", "--from",
                                 "new", "--follow", "-n", "2"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(2)  # it subscribes at the end, then waits
    assert follower.poll() is None
    cli(env, "publish", "live", "later-1", "later-2")
    stdout, stderr = follower.communicate(timeout=30)
    assert follower.returncode == 0, stderr.decode()
    assert stdout.decode() == "later-1\nlater-2\n"


def test_stats_prints_tables_from_metrics(server):
    env, _ = server
    cli(env, "stream", "create", "counted")
    cli(env, "publish", "counted", "x" * 100, "y" * 100)
    text = out(cli(env, "stats"))
    sections = {}
    for block in text.strip().split("\n\n"):
        title, *lines = block.splitlines()
        sections[title] = lines
    assert list(sections) == ["streams:", "doors:", "consumers:", "errors:", "nats:",
                              "alarms:"]
    alarms = {row.split()[0]: row.split() for row in sections["alarms:"][1:]}
    assert alarms["disk"][1] == alarms["memory"][1] == "no"  # resource, alarm, measure...
    assert sections["streams:"][0].split()[:2] == ["vhost", "stream"]
    streams = {row.split()[1]: row.split() for row in sections["streams:"][1:]}
    # vhost, stream, partitions, disk (2 words), messages, published, bytes in (2 words), ...
    assert streams["counted"][:3] == ["/", "counted", "1"]
    assert streams["counted"][5:7] == ["2", "2"]
    doors = {row.split()[0]: row.split() for row in sections["doors:"][1:]}
    assert int(doors["rabbitmq_stream"][3]) >= 1  # confirms
    assert sections["nats:"][1].split() == ["yes", "0"]  # connected, no reconnects


def test_no_server_is_one_clear_line(server):
    env = {**server[0], "RIVERLOG_SERVER": f"127.0.0.1:{free_port()}",
           "RIVERLOG_GRPC": f"127.0.0.1:{free_port()}",
           "RIVERLOG_METRICS_URL": f"http://127.0.0.1:{free_port()}/metrics"}
    for args in (["stream", "create", "x"], ["publish", "x", "m"], ["tail", "x"],
                 ["stream", "list", "--timeout", "2"], ["stats"]):
        done = cli(env, *args, check=False)
        err = done.stderr.decode()
        assert done.returncode == 1, (args, err)
        assert err.startswith("Error: ") and err.count("\n") == 1, (args, err)
        assert "Traceback" not in err


@pytest.mark.parametrize("command", [["stream"], ["stream", "list"], ["stream", "create"],
                                     ["stream", "delete"], ["stream", "describe"], ["publish"],
                                     ["tail"], ["stats"]])
def test_every_command_has_help(command):
    done = subprocess.run([sys.executable, "-m", "riverlog", *command, "--help"],
                          capture_output=True, timeout=60)
    assert done.returncode == 0
    assert done.stdout.decode().startswith("Usage: python -m riverlog " + " ".join(command))


def test_server_logs_are_json(server):
    _, tmp = server
    lines = [json.loads(line) for line in (tmp / "stderr").read_text().splitlines()]
    assert lines, "the server logged nothing"
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    assert any(r["logger"] == "riverlog.grpc" and "listening" in r["message"] for r in lines)
