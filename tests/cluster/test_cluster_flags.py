# Liftbridge's pause / resume and read-only flags in a 3-server cluster (three real Apps in
# this process, tests/cluster/_apps.py), driven by real clients: riverlog's generated gRPC
# stubs (gufo-liftbridge has no pause, read-only or consumer group calls) and rstream. A flag
# set through any server holds on every server (agreed through the Raft metadata, as
# Liftbridge's metadata.go), a publish through any server resumes a paused partition
# everywhere, and a read-only partition refuses publishes on every door and every server.
from __future__ import annotations

import asyncio

import grpc
import pytest
from rstream import AMQPMessage, Producer

from _apps import IDS, created, stub_of, until
from compat._servers import HOST
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.rabbitmq_stream.constants import ResponseCode

GUEST = {"username": "guest", "password": "guest"}


@pytest.fixture
async def stubs(cluster):
    """Server id -> an APIStub on that server's gRPC door."""
    channels = {app.config.cluster.server_id: stub_of(app) for app in cluster}
    yield {server_id: stub for server_id, (_, stub) in channels.items()}
    for channel, _ in channels.values():
        await channel.close()


def roles(placed) -> tuple[str, str, str]:
    """(leader, one follower, the other follower) of a partition placed on all three."""
    first, second = [s for s in IDS if s != placed.leader]
    return placed.leader, first, second


async def everywhere(stubs, stream: str, *flags: tuple[bool, bool]) -> bool:
    """Whether every server's FetchMetadata gives ``flags``, (paused, readonly) of each
    partition of ``stream`` in order."""
    for stub in stubs.values():
        meta = await stub.FetchMetadata(pb.FetchMetadataRequest(streams=[stream]), timeout=10)
        parts = meta.streamMetadata[0].partitions
        if tuple((parts[i].paused, parts[i].readonly) for i in sorted(parts)) != flags:
            return False
    return True


async def test_a_pause_through_one_server_holds_everywhere_until_a_publish_resumes_it(
        cluster, stubs):
    placed = await created(cluster, "quiet", subject="quiet", partitions=2,
                           replication_factor=3)
    leader, asker, publisher = roles(placed)
    await stubs[asker].PauseStream(pb.PauseStreamRequest(name="quiet", resumeAll=True),
                                   timeout=30)
    await until("paused on every server", lambda: everywhere(
        stubs, "quiet", (True, False), (True, False)))
    meta = await stubs[leader].FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(
        stream="quiet", partition=0), timeout=10)
    assert meta.metadata.paused and meta.metadata.pauseTimestamps.latestTimestamp > 0
    with pytest.raises(grpc.aio.AioRpcError) as refused:  # a paused partition is not read
        async for _ in stubs[leader].Subscribe(pb.SubscribeRequest(stream="quiet"), timeout=10):
            pass
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    # a publish through a server that does not lead the partition resumes it (and, paused
    # with resumeAll, partition 1 too) on every server, then reaches the leader
    ack = (await stubs[publisher].Publish(pb.PublishRequest(
        stream="quiet", value=b"wake", ackPolicy=pb.AckPolicy.ALL), timeout=30)).ack
    assert ack.offset == 0
    await until("resumed on every server", lambda: everywhere(
        stubs, "quiet", (False, False), (False, False)))


async def test_read_only_set_through_a_follower_refuses_publishes_on_every_door(
        cluster, stubs):
    placed = await created(cluster, "frozen", subject="frozen", replication_factor=3)
    leader, setter, other = roles(placed)
    ack = (await stubs[leader].Publish(pb.PublishRequest(
        stream="frozen", value=b"kept", ackPolicy=pb.AckPolicy.ALL), timeout=30)).ack
    assert ack.offset == 0
    await stubs[setter].SetStreamReadonly(pb.SetStreamReadonlyRequest(
        name="frozen", readonly=True), timeout=30)
    await until("read-only on every server", lambda: everywhere(stubs, "frozen",
                                                                (False, True)))

    for server_id in (leader, other):  # on the leader, and refused before it leaves another
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stubs[server_id].Publish(pb.PublishRequest(
                stream="frozen", value=b"no", ackPolicy=pb.AckPolicy.ALL), timeout=30)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.details() == "readonly partition: 0"

    async def one_request():
        yield pb.PublishRequest(stream="frozen", value=b"no", correlationId="x",
                                ackPolicy=pb.AckPolicy.ALL)
    (answer,) = [r async for r in stubs[other].PublishAsync(one_request(), timeout=30)]
    assert answer.asyncError.code == pb.PublishAsyncError.Code.READONLY

    leader_app = cluster[IDS.index(leader)]
    async with Producer(HOST, leader_app.rabbitmq_stream.port, **GUEST) as producer:
        status = asyncio.get_running_loop().create_future()  # (rstream's send_wait never
        await producer.send("frozen", AMQPMessage(body=b"no"),  # raises a PublishError)
                            on_publish_confirm=status.set_result)
        refused = await asyncio.wait_for(status, 30)
    # as a single server answers (docs/rabbitmq-stream.md)
    assert (refused.is_confirmed, refused.response_code) == (False, ResponseCode.ACCESS_REFUSED)
    subscription = stubs[leader].Subscribe(pb.SubscribeRequest(
        stream="frozen", startPosition=pb.StartPosition.EARLIEST), timeout=30)
    got = []
    with pytest.raises(grpc.aio.AioRpcError) as ended:  # subscribers end at its end
        async for message in subscription:
            got.append(message.value)
    assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert got == [b"", b"kept"]  # the empty message that starts every subscription
    assert leader_app.broker.streams["frozen"].partitions[0].next_offset == 1

    await stubs[other].SetStreamReadonly(pb.SetStreamReadonlyRequest(
        name="frozen", readonly=False), timeout=30)
    ack = (await stubs[other].Publish(pb.PublishRequest(
        stream="frozen", value=b"again", ackPolicy=pb.AckPolicy.ALL), timeout=30)).ack
    assert ack.offset == 1
