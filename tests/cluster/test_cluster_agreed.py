# Liftbridge's pause / resume, read-only flags and consumer groups in a 3-server cluster
# (three real Apps in this process, tests/cluster/_apps.py), driven by real clients:
# riverlog's generated gRPC stubs (gufo-liftbridge has no pause, read-only or consumer group
# calls) and rstream. What any server is asked is agreed through the Raft metadata, as
# Liftbridge's metadata.go: a flag holds on every server, a publish through any server
# resumes a paused partition everywhere, a read-only partition refuses publishes on every
# door and every server, a group joined through different servers has one coordinator and
# one assignment, and all of it outlives the Raft leader (a server restarted from its files
# catches up with what changed meanwhile). What one client can cost the Raft metadata and the
# status requests is bounded: concurrent resumes share one Raft command, a flag change asks
# only its partitions' leaders, a status request waiting for Raft holds up no other, and
# joins and coordinator reports no server can accept are refused before Raft.
from __future__ import annotations

import asyncio

import grpc
import pytest
from rstream import AMQPMessage, Producer

from _apps import IDS, created, started, stopped, stub_of, until
from compat._servers import HOST
from riverlog.cluster.status import APPLIED_HEADER
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.envelope import MsgType, decode_internal, encode_message
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
    leader_app = cluster[IDS.index(leader)]
    async with Producer(HOST, leader_app.rabbitmq_stream.port, **GUEST) as producer:
        # the RabbitMQ Stream door ignores pause, as a single server's does (a confirm)
        await producer.send_wait("quiet-0", AMQPMessage(body=b"rabbit"))
    assert await everywhere(stubs, "quiet", (True, False), (True, False))

    # a publish through a server that does not lead the partition resumes it (and, paused
    # with resumeAll, partition 1 too) on every server, then reaches the leader
    ack = (await stubs[publisher].Publish(pb.PublishRequest(
        stream="quiet", value=b"wake", ackPolicy=pb.AckPolicy.ALL), timeout=30)).ack
    assert ack.offset == 1
    await until("resumed on every server", lambda: everywhere(
        stubs, "quiet", (False, False), (False, False)))

    # PublishAsync through that server: its request waits for the resume, then is stored
    await stubs[leader].PauseStream(pb.PauseStreamRequest(name="quiet", partitions=[0]),
                                    timeout=30)
    await until("partition 0 paused again everywhere", lambda: everywhere(
        stubs, "quiet", (True, False), (False, False)))

    async def one_request():
        yield pb.PublishRequest(stream="quiet", value=b"again", correlationId="y",
                                ackPolicy=pb.AckPolicy.ALL)
    (answer,) = [r async for r in stubs[publisher].PublishAsync(one_request(), timeout=30)]
    assert (answer.correlationId, answer.ack.offset) == ("y", 2)
    await until("resumed again on every server", lambda: everywhere(
        stubs, "quiet", (False, False), (False, False)))

    # __cursors is a stream of the metadata once the Raft leader made it (docs/clustering.md
    # "Consumer state"): paused through one server, it is paused on every server
    await until("__cursors in the metadata everywhere", lambda: all(
        app.broker.placement.of("__cursors", 0) is not None for app in cluster))
    await stubs[asker].PauseStream(pb.PauseStreamRequest(name="__cursors"), timeout=30)
    await until("__cursors paused everywhere", lambda: all(
        app.broker.streams["__cursors"].partitions[0].paused for app in cluster))


async def test_an_idle_partition_is_auto_paused_by_its_leader_for_every_server(cluster, stubs):
    """autoPauseTime: the leader, the only server receiving the partition's messages, pauses
    it through the metadata (Liftbridge's autoPauseLoop and requestPause), so the servers
    holding no replica say so too; a publish through one of them resumes it."""
    await stubs["a"].CreateStream(pb.CreateStreamRequest(
        name="idle", subject="idle", replicationFactor=1,
        autoPauseTime=pb.NullableInt64(value=1500)), timeout=30)
    await until("auto paused, on every server", lambda: everywhere(
        stubs, "idle", (True, False)))
    leader = cluster[0].broker.placement.of("idle", 0).leader
    outsider = next(s for s in IDS if s != leader)
    ack = (await stubs[outsider].Publish(pb.PublishRequest(
        stream="idle", value=b"wake", ackPolicy=pb.AckPolicy.LEADER), timeout=30)).ack
    assert ack.offset == 0


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


async def group_everywhere(stubs, group: str) -> set[tuple[str, int]]:
    """(coordinator, epoch) of ``group`` as each server's FetchMetadata tells it."""
    seen = set()
    for stub in stubs.values():
        meta = await stub.FetchMetadata(pb.FetchMetadataRequest(groups=[group]), timeout=10)
        seen.add((meta.groupMetadata[0].coordinator, meta.groupMetadata[0].epoch))
    return seen


async def assigned(stub, group: str, consumer: str, epoch: int) -> dict[str, list[int]] | None:
    """The consumer's assignments from ``stub``'s server; None while it refuses (it has not
    applied the latest join yet)."""
    try:
        resp = await stub.FetchConsumerGroupAssignments(pb.FetchConsumerGroupAssignmentsRequest(
            groupId=group, consumerId=consumer, epoch=epoch), timeout=10)
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or "epoch" not in exc.details():
            raise
        return None
    return {a.stream: list(a.partitions) for a in resp.assignments}


async def test_a_group_joined_through_every_server_has_one_coordinator_and_one_assignment(
        cluster, stubs):
    await created(cluster, "work", subject="work", partitions=3, replication_factor=2)
    joins = {}
    for consumer, server_id in zip(("c1", "c2", "c3"), IDS):
        joins[consumer] = await stubs[server_id].JoinConsumerGroup(pb.JoinConsumerGroupRequest(
            groupId="g", consumerId=consumer, streams=["work"]), timeout=30)
    (coordinator,) = {join.coordinator for join in joins.values()}
    epoch = joins["c3"].epoch
    assert joins["c1"].epoch == 0 < joins["c2"].epoch < epoch  # a new epoch per change
    await until("one coordinator and epoch on every server", lambda: _equal(
        group_everywhere(stubs, "g"), {(coordinator, epoch)}))

    partitions = []
    for consumer in joins:  # on the coordinator, each partition goes to one member
        got = await until(f"{consumer}'s assignments", lambda c=consumer: assigned(
            stubs[coordinator], "g", c, epoch))
        assert list(got) == ["work"] and len(got["work"]) == 1
        partitions += got["work"]
    assert sorted(partitions) == [0, 1, 2]
    other = next(s for s in IDS if s != coordinator)
    with pytest.raises(grpc.aio.AioRpcError) as refused:  # Liftbridge's GetAssignments
        await stubs[other].FetchConsumerGroupAssignments(pb.FetchConsumerGroupAssignmentsRequest(
            groupId="g", consumerId="c1", epoch=epoch), timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == "broker is not the consumer group coordinator"
    with pytest.raises(grpc.aio.AioRpcError) as refused:  # through any server
        await stubs[other].JoinConsumerGroup(pb.JoinConsumerGroupRequest(
            groupId="g", consumerId="c2", streams=["work"]), timeout=30)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == "consumer is already a member of the consumer group"

    # two of three members report the coordinator: the group moves to another server
    for consumer in ("c1", "c2"):
        await stubs[other].ReportConsumerGroupCoordinator(
            pb.ReportConsumerGroupCoordinatorRequest(groupId="g", consumerId=consumer,
                                                     coordinator=coordinator, epoch=epoch),
            timeout=30)
    moved = await until("a new coordinator on every server", lambda: _one(
        group_everywhere(stubs, "g")))
    assert moved[0] != coordinator and moved[1] > epoch
    got = await until("c1's assignments from the new coordinator", lambda: assigned(
        stubs[moved[0]], "g", "c1", moved[1]))
    assert got == {"work": partitions[:1]}  # the assignments stay


async def _equal(seen, expected) -> bool:
    return await seen == expected


async def _at_epoch(seen, epoch: int):
    """The one (coordinator, epoch) of awaited set ``seen`` when its epoch is ``epoch``."""
    found = await _one(seen)
    return found if found is not None and found[1] == epoch else None


async def _one(seen):
    """The one element of awaited set ``seen``; None when the servers disagree."""
    found = await seen
    return next(iter(found)) if len(found) == 1 else None


async def test_flags_and_groups_outlive_the_raft_leader(cluster, stubs):
    from riverlog.server.app import App
    await created(cluster, "kept", subject="kept", partitions=2, replication_factor=3)
    await stubs["a"].PauseStream(pb.PauseStreamRequest(name="kept", partitions=[0]),
                                 timeout=30)
    await stubs["b"].SetStreamReadonly(pb.SetStreamReadonlyRequest(
        name="kept", partitions=[1], readonly=True), timeout=30)
    for consumer, server_id in (("c1", "c"), ("c2", "a")):
        await stubs[server_id].JoinConsumerGroup(pb.JoinConsumerGroupRequest(
            groupId="kg", consumerId=consumer, streams=["kept"]), timeout=30)
    lost = await until("a Raft leader", lambda: next(
        (app for app in cluster if app.cluster.metadata.is_leader), None))
    lost_id = lost.config.cluster.server_id
    await lost.stop()
    left = {s: stub for s, stub in stubs.items() if s != lost_id}
    await until("the flags on both servers left", lambda: everywhere(
        left, "kept", (True, False), (False, True)))
    # two joins: epochs 0 and 1 (the second join, applied by the server asked, reaches the
    # others with the next Raft leader's commit index when the lost server was the leader)
    group = await until("one group at epoch 1 on both", lambda: _at_epoch(
        group_everywhere(left, "kg"), 1))

    # changes through the servers left, once they elected another Raft leader
    survivors = [app for app in cluster if app is not lost]
    await until("another Raft leader both know", lambda: any(
        app.cluster.metadata.is_leader for app in survivors) and len(
        {app.cluster.metadata.leader for app in survivors} - {None}) == 1)
    await left[min(left)].LeaveConsumerGroup(pb.LeaveConsumerGroupRequest(
        groupId="kg", consumerId="c1"), timeout=60)
    await left[max(left)].SetStreamReadonly(pb.SetStreamReadonlyRequest(
        name="kept", readonly=False), timeout=60)
    await left[min(left)].PauseStream(pb.PauseStreamRequest(name="kept", partitions=[1]),
                                      timeout=60)
    await until("the changes on both servers left", lambda: everywhere(
        left, "kept", (True, False), (True, False)))
    after = await until("one group epoch on both", lambda: _one(group_everywhere(left, "kg")))
    assert after[1] > group[1]

    # the lost server, started again from its files, catches up with what it missed
    again = App(lost.config)
    try:
        await again.start()
        channel, stub = stub_of(again)
        try:
            await until("the restarted server caught up", lambda: everywhere(
                {lost_id: stub}, "kept", (True, False), (True, False)))
            parts = again.broker.streams["kept"].partitions
            assert [(p.paused, p.readonly) for p in parts] == [(True, False), (True, False)]
            assert await until("its group", lambda: _equal(
                group_everywhere({lost_id: stub}, "kg"), {after}))
        finally:
            await channel.close()
    finally:
        await stopped([again])


async def test_the_coordinator_removes_a_silent_member_through_raft(tmp_path):
    """groups.consumer.timeout on the coordinator: a member that fetches its assignments
    stays, a silent one is removed for every server (a new epoch), and the activity stream
    of the coordinator says it expired."""
    cluster = await started(tmp_path, consumer_timeout_ms=1500, activity_enabled=True)
    channels = {app.config.cluster.server_id: stub_of(app) for app in cluster}
    stubs = {server_id: stub for server_id, (_, stub) in channels.items()}
    try:
        await created(cluster, "beat", subject="beat", partitions=2, replication_factor=2)
        for consumer, server_id in (("alive", "b"), ("silent", "c")):
            join = await stubs[server_id].JoinConsumerGroup(pb.JoinConsumerGroupRequest(
                groupId="tg", consumerId=consumer, streams=["beat"]), timeout=30)
        coordinator = join.coordinator

        async def only_alive_left():
            found = await _one(group_everywhere(stubs, "tg"))
            if found is None:
                return False
            got = await assigned(stubs[found[0]], "tg", "alive", found[1])  # its heartbeat
            return got == {"beat": [0, 1]}
        await until("the silent member removed everywhere", only_alive_left)
        for app in cluster:
            assert app.liftbridge.groups.is_member("tg", "alive")
            assert not app.liftbridge.groups.is_member("tg", "silent")
        meta = await stubs[coordinator].FetchMetadata(pb.FetchMetadataRequest(
            groups=["tg"]), timeout=10)
        assert meta.groupMetadata[0].epoch > join.epoch
        async for message in stubs[coordinator].Subscribe(pb.SubscribeRequest(
                stream="__activity", startPosition=pb.StartPosition.EARLIEST), timeout=30):
            event = pb.ActivityStreamEvent.FromString(message.value)
            if event.op == pb.ActivityStreamOp.LEAVE_CONSUMER_GROUP:
                left = event.leaveConsumerGroupOp
                assert (left.groupId, left.consumerId, left.expired) == ("tg", "silent", True)
                break
    finally:
        for channel, _ in channels.values():
            await channel.close()
        await stopped(cluster)


async def test_a_status_request_waiting_for_raft_holds_up_no_other(cluster):
    """A partition status request names the Raft index its asker applied; the server asked
    waits until it applied it too (up to its timeout). Another request meanwhile, e.g. a
    new stream's leader check from a third server, is answered without waiting for it."""
    asker, asked = cluster[0].cluster, cluster[1].cluster
    subject = f"{asker.link.config.namespace}.raft.metadata.status.{asked.server_id}"
    request = encode_message(pb.PartitionStatusRequest(stream="none", partition=0))
    answered = []

    async def ask(name, headers):
        await asker.link.nc.request(subject, request, timeout=10, headers=headers)
        answered.append(name)
    await asyncio.gather(ask("ahead", {APPLIED_HEADER: str(10**9)}),
                         ask("plain", {APPLIED_HEADER: "0"}))
    assert answered == ["plain", "ahead"]



def flag_changes(raft) -> int:
    """set_partition_flags commands ``raft`` applied (others, e.g. an ISR change on the loaded
    machine, may come meanwhile: CI saw one)."""
    return raft.applied_commands().get("set_partition_flags", 0)


def group_commands(raft) -> int:
    """Consumer-group commands ``raft`` applied."""
    counts = raft.applied_commands()
    return sum(counts.get(name, 0)
               for name in ("join_group", "leave_group", "report_group_coordinator"))


async def test_a_flood_of_publishes_to_a_paused_partition_resumes_it_through_raft_once(
        cluster, stubs):
    """Each publish to a paused partition resumes it, a Raft command; publishes arriving
    while that resume is under way wait for it instead of adding a command each."""
    placed = await created(cluster, "flood", subject="flood", replication_factor=3)
    _, asker, publisher = roles(placed)
    await stubs[asker].PauseStream(pb.PauseStreamRequest(name="flood"), timeout=30)
    await until("paused on every server", lambda: everywhere(stubs, "flood", (True, False)))
    raft = cluster[IDS.index(publisher)].cluster.metadata
    before = flag_changes(raft)
    acks = await asyncio.gather(*(stubs[publisher].Publish(pb.PublishRequest(
        stream="flood", value=b"%d" % i, ackPolicy=pb.AckPolicy.LEADER), timeout=30)
        for i in range(20)))
    assert sorted(a.ack.offset for a in acks) == list(range(20))
    assert flag_changes(raft) - before == 1

    # so do subscribes asking to resume it (Liftbridge's SubscribeRequest.resume)
    leader = cluster[IDS.index(placed.leader)]
    await stubs[asker].PauseStream(pb.PauseStreamRequest(name="flood"), timeout=30)
    await until("paused again on every server", lambda: everywhere(stubs, "flood",
                                                                   (True, False)))
    raft = leader.cluster.metadata
    before = flag_changes(raft)

    async def first_message():
        call = stubs[placed.leader].Subscribe(pb.SubscribeRequest(
            stream="flood", resume=True), timeout=30)
        async for message in call:
            call.cancel()
            return message
    assert await asyncio.gather(*(first_message() for _ in range(20))) == [pb.Message()] * 20
    assert flag_changes(raft) - before == 1


async def test_a_join_naming_a_stream_no_server_can_have_is_refused_before_raft(cluster,
                                                                               stubs):
    """A stream name over 255 bytes cannot exist: such a join is refused as Liftbridge
    refuses any unknown stream, without a Raft command carrying the names to every
    server's journal (a gRPC message may be 64 MiB)."""
    await created(cluster, "known", subject="known")
    raft = cluster[1].cluster.metadata
    before = group_commands(raft)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stubs["b"].JoinConsumerGroup(pb.JoinConsumerGroupRequest(
            groupId="g", consumerId="c", streams=["known"] * 1000 + ["s" * 256]), timeout=30)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == "stream does not exist"
    assert group_commands(raft) == before


async def test_a_report_naming_no_server_as_coordinator_is_refused_before_raft(cluster,
                                                                              stubs):
    """ReportConsumerGroupCoordinator names the coordinator a member was told, a server of
    the cluster; any other name is Liftbridge's generation mismatch, refused without a Raft
    command carrying it to every server's journal."""
    await created(cluster, "known", subject="known")
    join = await stubs["a"].JoinConsumerGroup(pb.JoinConsumerGroupRequest(
        groupId="g", consumerId="c", streams=["known"]), timeout=30)
    await until("the group on b", lambda: cluster[1].liftbridge.groups.is_member("g", "c"))
    raft = cluster[1].cluster.metadata
    before = group_commands(raft)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stubs["b"].ReportConsumerGroupCoordinator(pb.ReportConsumerGroupCoordinatorRequest(
            groupId="g", consumerId="c", coordinator="x" * 1000, epoch=join.epoch),
            timeout=30)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details().startswith(
        f"Coordinator generation mismatch, current coordinator: {join.coordinator} epoch: "
        f"{join.epoch}, got coordinator: xxx")
    assert group_commands(raft) == before


async def test_a_flag_change_waits_for_the_leaders_of_its_partitions_only(cluster, stubs):
    """A pause or resume returns once the leaders of the partitions it changed applied it:
    it asks no other partition's leader (one that does not answer held up every resume of
    its stream's other partitions, 5 tries of 2 s)."""
    await stubs["a"].CreateStream(pb.CreateStreamRequest(
        name="two", subject="two", partitions=2, replicationFactor=1), timeout=30)
    placement = cluster[0].broker.placement
    other_leader = placement.of("two", 1).leader
    asker = next(s for s in IDS if s not in (other_leader, placement.of("two", 0).leader))
    spy = cluster[IDS.index(other_leader)].cluster
    asked = []

    async def count(msg):
        asked.append(decode_internal(msg.data, MsgType.PartitionStatusRequest).partition)
    subscription = await spy.link.nc.subscribe(
        f"{spy.link.config.namespace}.raft.metadata.status.{other_leader}", cb=count)
    try:
        await stubs[asker].PauseStream(pb.PauseStreamRequest(name="two", partitions=[0]),
                                       timeout=30)
        await spy.link.nc.flush()
    finally:
        await subscription.unsubscribe()
    assert 1 not in asked
