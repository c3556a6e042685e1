"""Graceful shutdown of `riverlog serve` (a subprocess): SIGTERM while rstream publishers
have messages in flight. The server must exit 0 within a bound, close its RabbitMQ Stream
clients' sockets with no Close frame (as RabbitMQ does, so clients recover), stop its
embedded nats-server, and every message it confirmed must be there after a restart on the
same data folder."""
from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from compat._raw import Closed, RawPeer
from compat._servers import free_port
from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer
from rstream.recovery import BackOffRecoveryStrategy

from riverlog.protocol.rabbitmq_stream import frames as f

pytestmark = pytest.mark.timeout(120)
GUEST = {"username": "guest", "password": "guest"}
EXIT_BOUND_S = 10


class Serve:
    """`riverlog serve` on a data folder, every port free, logs to a file."""

    def __init__(self, data_dir: str, log_path: str, durability: str) -> None:
        self.data_dir, self.log_path, self.durability = data_dir, log_path, durability
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "riverlog", "serve", "-d", self.data_dir,
               "--stream-port", str(self.port), "--port", "0", "--nats-port", "0",
               "--metrics-port", "0", "--management-port", "0",
               "--durability", self.durability, "--level", "info"]
        runs = self.log().count("riverlog serving")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while self.log().count("riverlog serving") == runs:
            assert self.proc.poll() is None, f"riverlog exited early:\n{self.log()}"
            assert time.monotonic() < deadline, f"riverlog did not start:\n{self.log()}"
            time.sleep(0.05)

    def log(self) -> str:
        if not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, errors="replace") as f_:
            return f_.read()

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"


async def _publisher(port: int, stream: str, worker: int, confirmed: list[bytes],
                     stop: asyncio.Event) -> None:
    """send_wait one message after the other until the server goes away; a message counts
    as confirmed only once send_wait returned. rstream's recovery is off: its recovery task
    outlives the producer's close and retries with back-off up to 50 s a step, which held
    the test's event loop teardown past the time limit once in a full run."""
    try:
        async with Producer("127.0.0.1", port, **GUEST,
                            recovery_strategy=BackOffRecoveryStrategy(False)) as producer:
            i = 0
            while not stop.is_set():
                body = b"w%02d-%06d" % (worker, i)
                await producer.send_wait(stream, body)
                confirmed.append(body)
                i += 1
    except Exception:  # the server closed the connection: that is the point
        return


@pytest.mark.parametrize("durability", ["interval", "always"])
async def test_sigterm_while_publishing_keeps_every_confirmed_message(tmp_path, durability):
    server = Serve(str(tmp_path / "data"), str(tmp_path / "server.log"), durability)
    server.start()
    try:
        stream = "shutdown"
        async with Producer("127.0.0.1", server.port, **GUEST) as admin:
            await admin.create_stream(stream)
        watcher = await RawPeer.open("127.0.0.1", server.port)  # an idle client
        nats_pid = int(re.search(r"embedded NATS server \(pid (\d+)\)", server.log()).group(1))

        confirmed: list[bytes] = []
        stop = asyncio.Event()
        workers = [asyncio.create_task(_publisher(server.port, stream, w, confirmed, stop))
                   for w in range(16)]
        deadline = time.monotonic() + 30
        while len(confirmed) < 2000:
            assert time.monotonic() < deadline, f"only {len(confirmed)} confirms"
            await asyncio.sleep(0.01)
        server.proc.send_signal(signal.SIGTERM)
        sent_at = time.monotonic()
        rc = await asyncio.to_thread(server.proc.wait, EXIT_BOUND_S + 5)
        took = time.monotonic() - sent_at
        stop.set()
        await asyncio.wait_for(asyncio.gather(*workers), 30)
        assert rc == 0, server.log()[-4000:]
        assert took < EXIT_BOUND_S, f"exit took {took:.1f}s"

        frames = []
        with pytest.raises(Closed):
            while True:
                frames.append(await watcher.recv(5))
        # the socket is closed with no Close frame, as RabbitMQ's reader does when its node
        # stops: a server Close would tell clients not to recover (the Java client's
        # SERVER_CLOSE, tests/compat/test_java.py's restart test)
        assert not [fr for fr in frames if isinstance(fr, f.Close)], frames
        assert not _alive(nats_pid), "the embedded nats-server outlived riverlog"
        assert "stopped" in server.log()

        server.start()  # same data folder, same port
        stored: set[bytes] = set()
        async with Consumer("127.0.0.1", server.port, **GUEST) as consumer:
            async def on_message(msg, ctx):
                stored.add(bytes(msg))
            await consumer.subscribe(stream, on_message, offset_specification=(
                ConsumerOffsetSpecification(OffsetType.FIRST, None)))
            deadline = time.monotonic() + 30
            while not stored.issuperset(confirmed) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        missing = set(confirmed) - stored
        assert not missing, f"{len(missing)} of {len(confirmed)} confirmed messages lost"
        assert len(confirmed) >= 2000
    finally:
        server.terminate()
