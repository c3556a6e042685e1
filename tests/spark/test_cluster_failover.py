# The Spark source against a real 3-server cluster (`riverlog cluster up`,
# tests/cluster/_cluster.py), the leader of the RF=3 stream it reads SIGKILLed: a task reading
# from the leader moves to a replica and reads its range on, once each record; a running
# streaming query, while a gRPC publisher (ALL acks, seeded at a server that stays up) keeps
# writing, ends with every offset in its memory sink once, in order, each acknowledged one with
# its value. Waits are generous polls, never timed assertions.
from __future__ import annotations

import itertools
import os
import signal
import sys
import threading
import time

import grpc
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "cluster"))

from _cluster import WAIT_S, cluster_up, read_table  # noqa: E402
from _members import wait_for as _until  # noqa: E402
from riverlog.protocol.liftbridge import api_pb2 as pb  # noqa: E402
from riverlog.protocol.liftbridge import api_pb2_grpc  # noqa: E402
from riverlog.record import Record, encode_record  # noqa: E402

__all__ = ["cluster_up"]  # the fixture, used by name


def _created(rows, stream: str) -> str:
    """Create ``stream`` (RF=3, minIsr 2) through s0; its leader's server id."""
    address = rows["s0"]["Liftbridge gRPC"]
    with grpc.insecure_channel(address) as channel:
        api_pb2_grpc.APIStub(channel).CreateStream(pb.CreateStreamRequest(
            name=stream, subject=stream, replicationFactor=3,
            minIsr=pb.NullableInt32(value=2)), timeout=WAIT_S)
    return _until("a leader", lambda: _leader(address, stream))


def _servers(rows, first: str) -> str:
    """The RabbitMQ Stream addresses of every server, ``first``'s first."""
    return ",".join(rows[s]["RabbitMQ Stream"] for s in sorted(rows, key=lambda s: s != first))


def _leader(address: str, stream: str) -> str | None:
    """The leader of partition 0 of ``stream`` in ``address``'s FetchMetadata (None when
    the server does not answer or names none)."""
    try:
        with grpc.insecure_channel(address) as channel:
            meta = api_pb2_grpc.APIStub(channel).FetchMetadata(pb.FetchMetadataRequest(),
                                                               timeout=5)
    except grpc.RpcError:
        return None
    for s in meta.streamMetadata:
        if s.name == stream and not s.error:
            return s.partitions[0].leader or None
    return None


class Publisher(threading.Thread):
    """Publishes ``p<n>`` with ALL acks through ``address`` until stopped; ``acked`` maps
    each acknowledged offset to its value (a failed publish is retried as a new value)."""

    def __init__(self, address: str, stream: str) -> None:
        super().__init__(daemon=True)
        self.address, self.stream = address, stream
        self.acked: dict[int, bytes] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        with grpc.insecure_channel(self.address) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            for n in itertools.count():
                if self.stop.is_set():
                    return
                value = b"p%d" % n
                try:
                    ack = stub.Publish(pb.PublishRequest(
                        stream=self.stream, value=value,
                        ackPolicy=pb.AckPolicy.ALL), timeout=10).ack
                except grpc.RpcError:
                    time.sleep(0.1)
                    continue
                self.acked[ack.offset] = value


def test_a_task_reading_from_a_killed_leader_reads_on_from_a_replica(cluster_up):
    """read_partition (one Spark task) connected to the leader: SIGKILLed after the first
    batch, the task reconnects where the stream lives and reads on from the offset after
    the last one it handed out (before: ClientError, the task and the query failed)."""
    pytest.importorskip("pyarrow")
    pytest.importorskip("pyspark")
    from riverlog.spark.options import connection
    from riverlog.spark.reader import RangePartition, read_partition
    rows = read_table(cluster_up)
    leader = _created(rows, "read-on")
    conn = connection({"servers": _servers(rows, leader), "timeout": "10"})
    with conn.connect_for("read-on", write=True) as client, client.publisher("read-on") as pub:
        for i in range(0, 2000, 10):  # 200 chunks: more than a subscription's credit
            pub.publish([encode_record(Record(value=b"r%d" % j)) for j in range(i, i + 10)])
            pub.flush()
    batches = read_partition(RangePartition("read-on", 0, 0, 2000, conn, batch_rows=10))
    first = next(batches)
    os.kill(int(rows[leader]["pid"]), signal.SIGKILL)
    got = [(o, v) for batch in [first, *batches]
           for o, v in zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist())]
    assert got == [(j, b"r%d" % j) for j in range(2000)]


def test_a_streaming_query_reads_through_a_leader_failover(spark, cluster_up, tmp_path):
    rows = read_table(cluster_up)
    grpc_of = {s: row["Liftbridge gRPC"] for s, row in rows.items()}
    leader = _created(rows, "failover")
    survivor = next(s for s in rows if s != leader)
    publisher = Publisher(grpc_of[survivor], "failover")
    publisher.start()
    # the leader first: the query's connections start there and must move on
    query = (spark.readStream.format("riverlog").option("servers", _servers(rows, leader))
             .option("stream", "failover").option("startingOffsets", "earliest")
             .option("timeout", "10").load()
             .select("offset", "value").writeStream.format("memory").queryName("failover_out")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="200 milliseconds").start())

    def output() -> list[tuple[int, bytes]]:
        assert query.exception() is None, query.exception()
        return [(r.offset, bytes(r.value)) for r in spark.table("failover_out").collect()]

    try:
        _until("records through the query before the kill", lambda: len(output()) >= 100)
        os.kill(int(rows[leader]["pid"]), signal.SIGKILL)
        before = len(publisher.acked)
        _until("a new leader", lambda: _leader(grpc_of[survivor], "failover")
               not in (None, leader))
        _until("acks after the kill", lambda: len(publisher.acked) >= before + 200)
        publisher.stop.set()
        publisher.join(WAIT_S)
        newest = max(publisher.acked)
        _until("every acknowledged record through the query",
               lambda: output() and output()[-1][0] >= newest)
        got = output()
    finally:
        publisher.stop.set()
        query.stop()
    offsets = [offset for offset, _ in got]
    assert offsets == list(range(len(offsets)))  # each offset once, in order, no gap
    values = dict(got)
    assert {offset: values[offset] for offset in publisher.acked} == publisher.acked
