"""Storage faults (issue 21 item 4, docs/operations.md "Storage faults") against a real
`riverlog serve` with real clients (rstream, riverlog's gRPC stub).

Faults are injected at the libc boundary by an LD_PRELOAD shim (tests/iofault, built with
the system's cc): an EIO from fsync or from a segment write, on one stream's files only; a
segment file removed under the running server; and a real full filesystem (a tmpfs, as
root). device-mapper error targets would be more real still, but the test machines' kernels
have no device-mapper driver.

What must hold: after a failed fsync or an EIO on write the partition takes no more writes
(every door gets an error, nothing unconfirmed is confirmed, not even once the fault is
gone: the page cache cannot be trusted), other streams go on, and a restart brings the
partition back with everything that was confirmed; a full disk fails the writes that do not
fit and the partition comes back by itself once space returns."""
from __future__ import annotations

import asyncio
import glob
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import grpc
import iofault
import pytest
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer
from rstream.exceptions import StreamAlreadyExists

from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.api_pb2_grpc import APIStub

pytestmark = pytest.mark.timeout(120)
GUEST = {"username": "guest", "password": "guest"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> str:
    return iofault.build(str(tmp_path_factory.mktemp("shim")))


class Server:
    """`riverlog serve --durability always` in a subprocess, under the shim."""

    def __init__(self, data_dir: str, shim: str, faults: str) -> None:
        self.data_dir, self.shim, self.faults = data_dir, shim, faults
        self.port, self.grpc_port = free_port(), free_port()
        self.log = os.path.join(faults, "server.log")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "LD_PRELOAD": self.shim,
               "RIVERLOG_FAULT_DIR": self.faults}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "riverlog", "serve", "-d", self.data_dir,
                 "--durability", "always", "--stream-port", str(self.port), "--port",
                 str(self.grpc_port), "--nats-port", "0", "--no-metrics",
                 "--disk-free-limit", "0"], stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, f"riverlog exited:\n{self.text()[-4000:]}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                assert time.monotonic() < deadline, "riverlog did not listen in 60 s"
                time.sleep(0.05)

    def stop(self) -> int:
        proc, self.proc = self.proc, None
        proc.send_signal(signal.SIGTERM)
        return proc.wait(30)

    def text(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()


@pytest.fixture
def server(tmp_path, shim):
    faults = tmp_path / "faults"
    faults.mkdir()
    srv = Server(str(tmp_path / "data"), shim, str(faults))
    srv.start()
    yield srv
    if srv.proc is not None:
        srv.proc.kill()
        srv.proc.wait()


def arm(server: Server, what: str, match: str) -> None:
    iofault.arm(server.faults, what, match)


def disarm(server: Server, what: str) -> None:
    iofault.disarm(server.faults, what)


async def publish(producer: Producer, stream: str, bodies: list[bytes]) -> tuple[list, list]:
    """Publish ``bodies``; return (confirmed ids, failed ids) once each has an answer."""
    confirmed, failed = [], []
    done = asyncio.Event()

    def on_confirm(status):
        (confirmed if status.is_confirmed else failed).append(status.message_id)
        if len(confirmed) + len(failed) == len(bodies):
            done.set()

    await producer.send_batch(stream, bodies, on_publish_confirm=on_confirm)
    await asyncio.wait_for(done.wait(), 30)
    return confirmed, failed


async def read_all(port: int, stream: str, at_least: int,
                   deadline_s: float = 30) -> list[bytes]:
    """Every message of ``stream``: read until ``at_least`` came and 1 s passed without
    more (generous deadline: the machine is shared)."""
    got: list[bytes] = []

    async def on_message(msg, ctx):
        got.append(bytes(msg.body) if isinstance(msg, AMQPMessage) else bytes(msg))

    async with Consumer("127.0.0.1", port, **GUEST) as consumer:
        await consumer.start()
        await consumer.subscribe(stream, on_message, offset_specification=
                                 ConsumerOffsetSpecification(OffsetType.FIRST))
        deadline = time.monotonic() + deadline_s
        seen = -1
        while len(got) < at_least or seen != len(got):
            assert time.monotonic() < deadline, f"read {len(got)} of at least {at_least}"
            seen = len(got)
            await asyncio.sleep(1.0)
    return got


@pytest.mark.parametrize("fault", ["fsync", "write"])
async def test_an_io_error_stops_the_partition_and_a_restart_brings_it_back(server, fault):
    bad, good = f"bad-{uuid.uuid4().hex[:8]}", f"good-{uuid.uuid4().hex[:8]}"
    async with Producer("127.0.0.1", server.port, **GUEST) as producer:
        await producer.create_stream(bad)
        await producer.create_stream(good)
        before = [b"before-%d" % i for i in range(10)]
        for stream in (bad, good):
            assert len((await publish(producer, stream, before))[0]) == 10

        arm(server, fault, f"/{bad}/")
        confirmed, failed = await publish(producer, bad, [b"lost-0", b"lost-1"])
        assert (confirmed, len(failed)) == ([], 2)  # nothing unconfirmed is confirmed
        assert len((await publish(producer, good, [b"good-after"]))[0]) == 1  # others go on
        disarm(server, fault)
        # fenced: the fault is gone, but what the page cache holds cannot be trusted
        confirmed, failed = await publish(producer, bad, [b"refused"])
        assert (confirmed, len(failed)) == ([], 1)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await APIStub(channel).Publish(pb.PublishRequest(
                stream=bad, value=b"grpc", ackPolicy=pb.AckPolicy.LEADER), timeout=20)
        assert "stopped taking writes" in refused.value.details()
    assert "stopped taking writes" in server.text()

    assert server.stop() == 0  # a clean shutdown despite the failed log
    server.start()  # the one documented command: restart; no crash loop
    async with Producer("127.0.0.1", server.port, **GUEST) as producer:
        assert len((await publish(producer, bad, [b"after-restart"]))[0]) == 1
    got = await read_all(server.port, bad, 11)
    assert got[:10] == before  # nothing confirmed is lost
    assert got[-1] == b"after-restart"
    assert b"refused" not in got
    assert set(got[10:-1]) <= {b"lost-0", b"lost-1"}  # unconfirmed: may or may not be there


async def test_a_segment_file_removed_under_the_server_stops_its_partition(server):
    bad, good = f"bad-{uuid.uuid4().hex[:8]}", f"good-{uuid.uuid4().hex[:8]}"
    async with Producer("127.0.0.1", server.port, **GUEST) as producer:
        await producer.create_stream(bad)
        await producer.create_stream(good)
        assert len((await publish(producer, bad, [b"first"]))[0]) == 1
        segments = glob.glob(os.path.join(server.data_dir, "streams", bad, "*", "*.segment"))
        assert segments
        for path in segments:
            os.unlink(path)
        confirmed, failed = await publish(producer, bad, [b"into-the-void"])
        assert (confirmed, len(failed)) == ([], 1)  # never confirmed: it would be gone
        assert len((await publish(producer, good, [b"fine"]))[0]) == 1
    assert "segment file was removed" in server.text()


@pytest.fixture
def full_disk_server(tmp_path, shim):
    """A server whose data folder is on a real 16 MiB tmpfs (root only)."""
    if os.geteuid() != 0:
        pytest.fail("the full-disk test mounts a tmpfs: run it as root")
    mount = tmp_path / "fs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], check=True)
    faults = tmp_path / "faults"
    faults.mkdir()
    srv = Server(str(mount / "data"), shim, str(faults))
    try:
        srv.start()
        yield srv, mount
    finally:
        if srv.proc is not None:
            srv.proc.kill()
            srv.proc.wait()
        subprocess.run(["umount", "-l", str(mount)], check=True)


async def test_a_full_disk_fails_writes_until_space_returns(full_disk_server):
    server, mount = full_disk_server
    stream = f"full-{uuid.uuid4().hex[:8]}"
    async with Producer("127.0.0.1", server.port, **GUEST) as producer:
        await producer.create_stream(stream)
        assert len((await publish(producer, stream, [b"before"]))[0]) == 1
        filler = mount / "filler"
        with open(filler, "wb") as out:  # every byte the filesystem has left
            try:
                while True:
                    out.write(b"\0" * 65536)
                    out.flush()
            except OSError:
                pass
        big = [os.urandom(60_000) for _ in range(4)]  # cannot fit
        confirmed, failed = await publish(producer, stream, big)
        assert (confirmed, len(failed)) == ([], 4)
        filler.unlink()  # space returns: the partition takes writes again, by itself
        assert len((await publish(producer, stream, [b"after"]))[0]) == 1
    assert "no space left on device" in server.text().lower()
    got = await read_all(server.port, stream, 2)
    assert got == [b"before", b"after"]  # the failed write left nothing behind


async def two_streams(server: Server) -> tuple[str, str]:
    """Two new streams ("bad", "good"), each holding the confirmed message b"kept"."""
    bad, good = f"bad-{uuid.uuid4().hex[:8]}", f"good-{uuid.uuid4().hex[:8]}"
    async with Producer("127.0.0.1", server.port, **GUEST) as producer:
        for stream in (bad, good):
            await producer.create_stream(stream)
            assert len((await publish(producer, stream, [b"kept"]))[0]) == 1
    return bad, good


async def test_an_io_error_on_read_fails_the_read_not_the_server(server):
    bad, good = await two_streams(server)
    arm(server, "read", f"/{bad}/")
    with pytest.raises(AssertionError, match="read 0 of at least 1"):
        await read_all(server.port, bad, 1, deadline_s=5)
    assert await read_all(server.port, good, 1) == [b"kept"]  # the server is fine
    disarm(server, "read")
    assert await read_all(server.port, bad, 1) == [b"kept"]  # and the data too
    async with Producer("127.0.0.1", server.port, **GUEST) as producer:
        assert len((await publish(producer, bad, [b"more"]))[0]) == 1  # reads never fence


async def test_a_stream_that_cannot_be_read_at_start_fails_its_reads_not_the_start(server):
    # No crash loop: partitions open on first use (broker/partition.py), so the server starts
    # with the stream whose files fail with EIO and serves the others; reading that stream
    # fails while the disk does, a Create of the same name cannot replace its data, and once
    # the disk is fixed the stream opens, with its data, without a restart.
    bad, good = await two_streams(server)
    assert server.stop() == 0
    arm(server, "read", f"/{bad}/")
    server.start()
    assert await read_all(server.port, good, 1) == [b"kept"]
    with pytest.raises(AssertionError, match="read 0 of at least 1"):
        await read_all(server.port, bad, 1, deadline_s=5)
    async with Producer("127.0.0.1", server.port, **GUEST) as producer:
        with pytest.raises(StreamAlreadyExists):
            await producer.create_stream(bad)
    disarm(server, "read")
    assert await read_all(server.port, bad, 1) == [b"kept"]
