"""Many idle streams and a SIGKILL (issue 31 item 1) against a real `riverlog serve`: rstream
publishes with confirms to a few of a few hundred streams while the server is SIGKILLed; the
restart checks only the partitions written since their clean close, every confirmed
message is there, and an idle stream never holds a file descriptor, not even once listed."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest
from rstream import Producer
from test_storage_faults import read_all  # tests/log

from riverlog.broker import Broker
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.api_pb2_grpc import APIStub

pytestmark = pytest.mark.timeout(300)
GUEST = {"username": "guest", "password": "guest"}
IDLE, WRITTEN = 300, 4

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from _proc import free_port  # noqa: E402  benchmarks/_proc.py


class Server:
    """`riverlog serve --durability always` on ``data_dir``; its log in ``log_path``."""

    def __init__(self, data_dir: str, log_path: str) -> None:
        self.data_dir, self.log_path = data_dir, log_path
        self.port, self.grpc_port, self.http_port = free_port(), free_port(), free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "riverlog", "serve", "-d", self.data_dir,
                 "--durability", "always", "--stream-port", str(self.port), "-p",
                 str(self.grpc_port), "--nats-port", str(free_port()), "--metrics-port",
                 str(free_port()), "--management-port", str(self.http_port), "--level",
                 "info"], stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 120
        while " serving " not in self.text():
            assert self.proc.poll() is None, f"riverlog exited:\n{self.text()[-4000:]}"
            assert time.monotonic() < deadline, "riverlog did not serve in 120 s"
            time.sleep(0.1)

    def list_everything(self) -> None:
        """What operators and clients list: FetchMetadata of every stream (`riverlog stream
        list`), the management API's first page of queues."""
        with grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}") as channel:
            answer = APIStub(channel).FetchMetadata(pb.FetchMetadataRequest(), timeout=60)
        assert len(answer.streamMetadata) >= IDLE
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}/api/queues?page=1&page_size=100",
            headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
        with urllib.request.urlopen(request, timeout=60) as page:
            assert json.load(page)["total_count"] >= IDLE

    def log_files(self) -> int:
        """Open descriptors of the server on segment or index files."""
        fd_dir = f"/proc/{self.proc.pid}/fd"
        count = 0
        for fd in os.listdir(fd_dir):
            try:
                count += os.readlink(os.path.join(fd_dir, fd)).endswith((".segment", ".index"))
            except OSError:
                pass
        return count

    def stop(self, sig: int = signal.SIGTERM) -> int:
        proc, self.proc = self.proc, None
        os.killpg(proc.pid, sig)
        return proc.wait(60)

    def text(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()


async def _publish_until_killed(server: Server, streams: list[str],
                                confirmed: dict[str, set[bytes]]) -> None:
    async with Producer("127.0.0.1", server.port, **GUEST) as producer:
        def on_confirm_for(stream):
            def on_confirm(status):
                if status.is_confirmed:
                    confirmed[stream].add(bodies[stream][status.message_id])
            return on_confirm

        bodies: dict[str, dict[int, bytes]] = {s: {} for s in streams}
        for i in range(40):
            for stream in streams:
                batch = [b"%s-%d-%d" % (stream.encode(), i, j) for j in range(10)]
                ids = await producer.send_batch(stream, batch,
                                                on_publish_confirm=on_confirm_for(stream))
                bodies[stream].update(zip(ids, batch))
            await asyncio.sleep(0.02)
            if i == 20:
                server.stop(signal.SIGKILL)
                return


async def test_sigkill_with_many_idle_streams_checks_only_the_written_ones(tmp_path):
    data = str(tmp_path / "data")
    broker = Broker(data)
    broker.open()
    for i in range(IDLE):
        broker.create(f"idle-{i}").partitions[0].write_records([b"idle"])
    await broker.close()
    server = Server(data, str(tmp_path / "server.log"))
    server.start()
    assert "checked" not in server.text()  # a clean stop: nothing checked
    server.list_everything()  # answered without opening a partition
    assert server.log_files() < 10  # not one per idle stream

    written = [f"idle-{i}" for i in range(0, IDLE, IDLE // WRITTEN)]
    confirmed: dict[str, set[bytes]] = {s: set() for s in written}
    await _publish_until_killed(server, written, confirmed)
    assert all(confirmed.values())

    server.start()
    found = re.search(r"(\d+) partition\(s\) written since their clean close checked",
                      server.text())
    assert found, server.text()[-3000:]
    # the written ones and the server's own streams it opened, never the idle ones
    assert WRITTEN <= int(found.group(1)) <= WRITTEN + 2
    for stream in written:
        got = await read_all(server.port, stream, len(confirmed[stream]) + 1)
        assert got[0] == b"idle"
        assert confirmed[stream] <= set(got), f"{stream}: confirmed messages lost"
        assert len(got) == len(set(got))
    assert server.stop() == 0
