"""Storage faults in a cluster (issue 21 item 4): when the disk under a partition's leader
fails (every fsync of that partition's files on that server gets EIO, injected by the
LD_PRELOAD shim of tests/iofault into the `riverlog cluster up` servers), the leader's log
stops taking writes and refuses its followers' fetches, the followers report it, and one of
them takes the leadership over: writes go on through the new leader, and every message
acked before, during and after the change is on it."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import grpc
import iofault
import pytest
from _cluster import metadata, read_table, stop_cluster_up, until, values, with_stream

from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc

pytestmark = pytest.mark.timeout(240)
STREAM = "orders"


async def leader_of(address: str) -> str | None:
    meta = await with_stream(address, STREAM)
    if meta is None:
        return None
    part = [s for s in meta.streamMetadata if s.name == STREAM][0].partitions[0]
    return part.leader or None


async def publish(address: str, value: bytes) -> bool:
    """A Publish with AckPolicy ALL to ``address``; True when acked."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            await api_pb2_grpc.APIStub(channel).Publish(pb.PublishRequest(
                stream=STREAM, value=value, ackPolicy=pb.ALL), timeout=10)
            return True
        except grpc.aio.AioRpcError:
            return False


async def test_a_leader_whose_disk_fails_hands_the_partition_over(tmp_path):
    shim = iofault.build(str(tmp_path))
    faults = tmp_path / "faults"
    faults.mkdir()
    directory = tmp_path / "cluster"
    proc = subprocess.Popen(
        [sys.executable, "-m", "riverlog", "cluster", "up", "--servers", "3", "-d",
         str(directory)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "LD_PRELOAD": shim, "RIVERLOG_FAULT_DIR": str(faults)})
    try:
        rows = read_table(proc)
        grpc_of = {s: row["Liftbridge gRPC"] for s, row in rows.items()}
        first = next(iter(grpc_of.values()))
        async with grpc.aio.insecure_channel(first) as channel:
            await api_pb2_grpc.APIStub(channel).CreateStream(pb.CreateStreamRequest(
                name=STREAM, subject=STREAM, replicationFactor=3), timeout=60)
        old = await until("a leader", lambda: leader_of(first))
        acked = [b"before-%d" % i for i in range(5)]
        for value in acked:
            assert await publish(grpc_of[old], value)

        iofault.arm(str(faults), "fsync", f"{directory}/{old}/streams/{STREAM}/")
        others = [s for s in grpc_of if s != old]
        refused = moved = 0
        i, deadline = 0, time.monotonic() + 60
        while time.monotonic() < deadline:  # until the leader's interval fsync failed
            value = b"during-%d" % i
            i += 1
            if await publish(grpc_of[old], value):
                acked.append(value)  # acked by the ISR before the fsync failed
            else:
                refused += 1
                break
            # a failover that ends within one publish leaves no refusal to see: the failed
            # server's door forwards later publishes to the new leader, which acks them
            moved = await leader_of(grpc_of[others[0]]) in others
            if moved:
                break
            await asyncio.sleep(0.05)  # the interval fsync's turn (200 ms) comes between
        assert refused or moved, f"the failing leader kept acking ({i} publishes)"


        async def new_leader():
            found = await leader_of(grpc_of[others[0]])
            return found if found in others else None
        new = await until("another leader", new_leader)
        for i in range(5):
            # ALL waits for every ISR member: the first may wait until the new leader drops the
            # failed server from the ISR (its lag time), past one call's 10 s under load
            value = b"after-%d" % i
            await until(f"{value!r} acked", lambda: publish(grpc_of[new], value))
            acked.append(value)

        async def committed():
            meta = await metadata(grpc_of[new])
            part = [s for s in meta.streamMetadata if s.name == STREAM][0].partitions[0]
            return part.highWatermark >= 0 and part.highWatermark == part.newestOffset and part
        part = await until("everything committed", committed)
        stored = await values(grpc_of[new], STREAM, part.highWatermark)
        assert [v for v in acked if v not in stored] == []  # nothing acked is lost
        log = (directory / old / "riverlog.log").read_text(errors="replace")
        assert "stopped taking writes" in log
    finally:
        stop_cluster_up(proc)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
