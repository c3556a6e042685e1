# A real local cluster for tests: the `riverlog cluster up` process (`cluster_up` fixture,
# three `riverlog serve` processes on free ports in the test's tmp_path), the table it prints
# (`read_table`), and polls on it (`until`, `metadata`, `with_stream`, `raft_leader`). Waits
# are generous polls, never timed assertions.
from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest

from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc

WAIT_S = 120


def read_table(proc: subprocess.Popen) -> dict[str, dict[str, str]]:
    """The table `cluster up` prints once every server is registered: server id -> column
    -> value."""
    lines = []
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, f"cluster up ended: {proc.wait()}"
        if "servers up" in line:
            break
        lines.append(line.rstrip())
    head = [h for h in lines[0].split("  ") if h]
    rows = {}
    for line in lines[1:]:
        cells = line.split()
        rows[cells[0]] = dict(zip([h.strip() for h in head], cells))
    return rows


def raft_leader(rows) -> str | None:
    for server_id, row in rows.items():
        try:
            with urllib.request.urlopen(f"http://{row['metrics']}/metrics", timeout=5) as r:
                if "riverlog_raft_leader 1.0" in r.read().decode():
                    return server_id
        except OSError:
            continue
    return None


async def until(what: str, check):
    deadline = time.monotonic() + WAIT_S
    while True:
        result = await check()
        if result:
            return result
        assert time.monotonic() < deadline, f"still not: {what}"
        await asyncio.sleep(0.2)


async def metadata(address: str) -> pb.FetchMetadataResponse | None:
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            return await api_pb2_grpc.APIStub(channel).FetchMetadata(
                pb.FetchMetadataRequest(), timeout=5)
    except grpc.aio.AioRpcError:
        return None


def start_cluster_up(directory, *options: str) -> subprocess.Popen:
    """`riverlog cluster up -d DIRECTORY OPTIONS...` (3 servers unless OPTIONS say), its
    output readable as text; stop it with ``stop_cluster_up``."""
    return subprocess.Popen([sys.executable, "-m", "riverlog", "cluster", "up", "--servers",
                             "3", "-d", str(directory), *options], stdout=subprocess.PIPE,
                            text=True)


def stop_cluster_up(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


@pytest.fixture
def cluster_up(tmp_path):
    proc = start_cluster_up(tmp_path / "cluster")
    yield proc
    stop_cluster_up(proc)


async def with_stream(address: str, stream: str):
    """``address``'s FetchMetadata once it lists ``stream`` without error, else None."""
    meta = await metadata(address)
    if meta is None:
        return None
    names = {s.name for s in meta.streamMetadata if not s.error}
    return meta if stream in names else None


async def values(address: str, stream: str, last: int) -> list[bytes]:
    """The values of partition 0 of ``stream`` up to offset ``last``, read from ``address``
    (readISRReplica, so any replica serves them; a stored RabbitMQ offset takes an offset
    and is no message)."""
    got: list[bytes] = []
    async with grpc.aio.insecure_channel(address) as channel:
        call = api_pb2_grpc.APIStub(channel).Subscribe(pb.SubscribeRequest(
            stream=stream, startPosition=pb.StartPosition.EARLIEST, readISRReplica=True))
        first = True
        async for message in call:
            if first:  # the empty message that says the subscription started (Liftbridge's)
                first = False
                continue
            got.append(message.value)
            if message.offset >= last:
                call.cancel()
                break
    return got
