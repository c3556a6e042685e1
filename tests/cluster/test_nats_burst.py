# go-liftbridge's example lift-bench against a three-server cluster (issue 29), at a size CI
# affords: a burst of enveloped ALL-ack publishes over plain NATS, every one sent before the
# first ack is awaited (no flow control), to a real `riverlog cluster up` (three processes,
# each with its embedded nats-server, routed), through a server that does not lead the
# partition. Every publish is acked once and stored once, and the partition keeps its leader:
# a leader whose NATS connection is full of publishes still answers its followers' fetches
# in time (they travel on the servers' own cluster connection), so they never report it
# silent and no tail of acked-to-be publishes is truncated and lost. (Before: the followers
# reported the leader silent within ~2 s, a new leader truncated the old one's uncommitted
# tail, and 0 to ~5,000 of the 400,000 publishes were ever acked.) Followers that fall
# behind during the burst may leave the ISR for a while; they come back with the same records.
from __future__ import annotations

import asyncio
import re
import urllib.request

import grpc
import nats
import pytest

from _cluster import cluster_up, read_table, until, values, with_stream
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc
from riverlog.protocol.liftbridge.envelope import decode_ack, encode_publish
from riverlog.server.nats_link import settle

__all__ = ["cluster_up"]  # the fixture, used by name
pytestmark = pytest.mark.timeout(240)
MESSAGES = 400_000
KEYS = (b"foo", b"bar", b"baz", b"qux")  # lift-bench's
ACKS_WAIT_S = 60


async def _partition(address: str, stream: str) -> pb.PartitionMetadata | None:
    """Partition 0 of ``stream`` in ``address``'s FetchMetadata (None: not listed)."""
    meta = await with_stream(address, stream)
    if meta is None:
        return None
    return [s for s in meta.streamMetadata if s.name == stream][0].partitions.get(0)


def _epoch(row: dict[str, str], stream: str) -> int:
    """The leader epoch of partition 0 of ``stream`` in the /metrics of the server of
    ``row``."""
    with urllib.request.urlopen(f"http://{row['metrics']}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.search(r'riverlog_partition_leader_epoch\{partition="0",stream="%s",'
                      r'vhost="/"\} (\S+)' % stream, text)
    return int(float(found.group(1)))


async def _pong(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read until the server's PONG, answering its own PINGs (keep-alive); an INFO update
    (nats-server sends one when the cluster's routes change) is fine, anything else (-ERR)
    fails the test."""
    while (line := await asyncio.wait_for(reader.readline(), 60)) != b"PONG\r\n":
        if line == b"PING\r\n":
            writer.write(b"PONG\r\n")
        else:
            assert line.startswith(b"INFO "), line


async def _burst(address: str, subject: str, payloads: list[bytes]) -> None:
    """Publish ``payloads`` on ``subject`` to the NATS server at ``address`` ("host:port") as
    fast as a Go client does: the NATS client protocol's PUB commands written at once on a
    connection of their own (nats-py's publish takes some µs each in Python, so its burst is
    slower than lift-bench's), then a PING answered once the server has taken them all."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        info = await reader.readline()
        assert info.startswith(b"INFO "), info
        writer.write(b'CONNECT {"verbose":false,"pedantic":false,"name":"burst"}\r\nPING\r\n')
        await _pong(reader, writer)
        head = subject.encode()
        writer.write(b"".join(b"PUB %b %d\r\n%b\r\n" % (head, len(p), p) for p in payloads))
        writer.write(b"PING\r\n")
        await writer.drain()
        await _pong(reader, writer)
    finally:
        writer.close()


async def test_an_unflowcontrolled_burst_of_all_acks_is_acked_and_stored_once(cluster_up):
    rows = read_table(cluster_up)
    grpc_of = {s: row["Liftbridge gRPC"] for s, row in rows.items()}
    async with grpc.aio.insecure_channel(grpc_of["s0"]) as channel:
        await api_pb2_grpc.APIStub(channel).CreateStream(pb.CreateStreamRequest(
            subject="burst", name="burst", replicationFactor=-1), timeout=30)  # lift-bench's

    async def in_sync():
        p = await _partition(grpc_of["s0"], "burst")
        return p if p is not None and p.leader and len(p.isr) == 3 else None
    before = await until("burst led, ISR of 3", in_sync)
    via = next(s for s in rows if s != before.leader)  # the publisher's server: not the leader
    epoch = _epoch(rows[via], "burst")

    nc = await nats.connect(f"nats://{rows[via]['NATS']}", pending_size=256 * 1024 * 1024)
    try:
        inbox = nc.new_inbox()
        acked: dict[str, int] = {}
        offsets: list[int] = []
        done = asyncio.get_running_loop().create_future()

        async def on_ack(msg):
            ack = decode_ack(msg.data)
            acked[ack.correlationId] = acked.get(ack.correlationId, 0) + 1
            offsets.append(ack.offset)
            if len(acked) == MESSAGES and not done.done():
                done.set_result(None)
        await nc.subscribe(inbox, cb=on_ack, pending_msgs_limit=0, pending_bytes_limit=0)
        await settle(nc)
        value = bytes(10)
        await _burst(rows[via]["NATS"], "burst", [encode_publish(pb.Message(
            key=KEYS[i % 4], value=value, ackInbox=inbox, correlationId=str(i),
            ackPolicy=pb.AckPolicy.ALL)) for i in range(MESSAGES)])
        try:
            await asyncio.wait_for(done, ACKS_WAIT_S)
        except asyncio.TimeoutError:
            pass
        await asyncio.sleep(0.5)  # an ack sent twice would come now
    finally:
        await nc.close()
    after = await until("the leader's metadata",  # a busy leader's answer can take > 5 s
                        lambda: _partition(grpc_of[before.leader], "burst"))
    # every publish acked once, at an offset of its own; nothing else stored; one leader
    assert (len(acked), after.leader, _epoch(rows[via], "burst")) == (
        MESSAGES, before.leader, epoch)
    assert set(acked.values()) == {1}
    assert sorted(offsets) == list(range(MESSAGES))
    assert after.newestOffset + 1 == MESSAGES
    # followers that fell behind during the burst left the ISR (the leader committed without
    # them, as Liftbridge does); they catch up and come back, holding the same records
    async def caught_up():
        p = await _partition(grpc_of[before.leader], "burst")
        return p is not None and len(p.isr) == 3 and p.highWatermark + 1 == MESSAGES
    await until("the followers back in the ISR", caught_up)
    stored = await values(grpc_of[via], "burst", MESSAGES - 1)  # a follower's copy
    assert stored == [value] * MESSAGES


async def test_a_leader_with_followers_stores_a_burst_in_smaller_turns(cluster):
    """A partition with followers stores TURN_MESSAGES_REPLICATED of a read's NATS messages
    per loop turn (one without, TURN_MESSAGES: test_lb_envelope_batch.py): the followers'
    fetches are answered between turns, so they keep up with the burst (with 4,096 per turn
    a three-server lift-bench left them out of the ISR)."""
    from _apps import created
    from riverlog.server.nats_bridge import TURN_MESSAGES, TURN_MESSAGES_REPLICATED
    placed = await created(cluster, "turns", subject="turns", replication_factor=3)
    app = next(a for a in cluster if a.config.cluster.server_id == placed.leader)
    stream = app.broker.streams["turns"]
    partition = stream.partitions[0]
    burst = TURN_MESSAGES + 100
    app.nats._handler(stream, partition)([(1, "turns", "", None, b"m%d" % i)
                                          for i in range(burst)])
    await asyncio.sleep(0)  # one loop turn: the first TURN_MESSAGES_REPLICATED go to the log
    partition.readonly = True  # the rest are dropped from here on
    await asyncio.sleep(0.2)
    assert partition.next_offset == TURN_MESSAGES_REPLICATED < TURN_MESSAGES
