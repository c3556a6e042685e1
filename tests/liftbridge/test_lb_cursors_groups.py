"""Cursors (the compacted `__cursors` stream, -1 when unset, kept across restarts), consumer
groups (join, leave, assignments, epochs, consumer timeouts, coordinator reports) and the
activity stream."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from _lb import create, read_all

from riverlog.broker.cursors import decode_cursor_offset
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc

pytestmark = pytest.mark.timeout(60)
Code = grpc.StatusCode


async def expect_error(call, code, text=None):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value
    if text:
        assert text in info.value.details(), info.value.details()


async def test_cursors_set_fetch_and_survive_restart(server_factory):
    server = await server_factory()
    channel = grpc.aio.insecure_channel(server.grpc_addr)
    stub = api_pb2_grpc.APIStub(channel)
    fetch = pb.FetchCursorRequest(stream="orders", partition=1, cursorId="c1")
    assert (await stub.FetchCursor(fetch, timeout=5)).offset == -1
    await stub.SetCursor(pb.SetCursorRequest(stream="orders", partition=1, cursorId="c1",
                                             offset=41), timeout=5)
    await stub.SetCursor(pb.SetCursorRequest(stream="orders", partition=1, cursorId="c1",
                                             offset=42), timeout=5)
    assert (await stub.FetchCursor(fetch, timeout=5)).offset == 42
    other = pb.FetchCursorRequest(stream="orders", partition=0, cursorId="c1")
    assert (await stub.FetchCursor(other, timeout=5)).offset == -1
    # stored as Liftbridge stores them: key "<cursorId>,<stream>,<partition>", compacted stream
    cursors = server.app.broker.streams["__cursors"]
    assert cursors.config.compact is True and cursors.config.subject == "liftbridge-default.cursors"
    stored = await read_all(stub, "__cursors")
    assert [(m.key, decode_cursor_offset(m.value)) for m in stored] == [
        (b"c1,orders,1", 41), (b"c1,orders,1", 42)]
    for request in (pb.SetCursorRequest(cursorId="c"), pb.SetCursorRequest(stream="s")):
        await expect_error(stub.SetCursor(request, timeout=5), Code.INVALID_ARGUMENT, "provided")
    await expect_error(stub.FetchCursor(pb.FetchCursorRequest(stream="s"), timeout=5),
                       Code.INVALID_ARGUMENT, "No cursorId provided")
    await channel.close()
    await server_factory.stop(server.app)
    again = await server_factory(data_dir=server.data_dir)
    channel = grpc.aio.insecure_channel(again.grpc_addr)
    stub = api_pb2_grpc.APIStub(channel)
    assert (await stub.FetchCursor(fetch, timeout=5)).offset == 42
    await channel.close()


async def test_cursors_are_bounded(server_factory):
    """Issue 24: SetCursor took ids of any size (6 MB ones were stored) in any number."""
    server = await server_factory(cursors_max_per_stream=3)
    async with grpc.aio.insecure_channel(server.grpc_addr) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        await create(stub, "s", "s", partitions=2)
        for cursor_id in ("x" * 256, "é" * 128):  # 256 bytes
            await expect_error(stub.SetCursor(pb.SetCursorRequest(
                stream="s", cursorId=cursor_id, offset=1), timeout=5),
                Code.INVALID_ARGUMENT, "cursorId longer than 255 bytes")
            await expect_error(stub.FetchCursor(pb.FetchCursorRequest(
                stream="s", cursorId=cursor_id), timeout=5),
                Code.INVALID_ARGUMENT, "cursorId longer than 255 bytes")
        for cursor_id in ("x" * 255, "a", "b"):
            await stub.SetCursor(pb.SetCursorRequest(stream="s", cursorId=cursor_id, offset=1),
                                 timeout=5)
        full = pb.SetCursorRequest(stream="s", cursorId="c", offset=1)
        await expect_error(stub.SetCursor(full, timeout=5), Code.RESOURCE_EXHAUSTED,
                           "riverlog.cursors.max.per.stream")
        await expect_error(stub.SetCursor(pb.SetCursorRequest(
            stream="s", partition=1, cursorId="a", offset=1), timeout=5),
            Code.RESOURCE_EXHAUSTED)  # a cursor is an id and a partition
        await stub.SetCursor(pb.SetCursorRequest(stream="s", cursorId="a", offset=7), timeout=5)
        # streams that do not exist (Liftbridge takes cursors for any name) share one allowance
        for i in range(3):
            await stub.SetCursor(pb.SetCursorRequest(stream=f"none{i}", cursorId="c", offset=1),
                                 timeout=5)
        await expect_error(stub.SetCursor(pb.SetCursorRequest(
            stream="none9", cursorId="c", offset=1), timeout=5), Code.RESOURCE_EXHAUSTED,
            "streams that do not exist")
        config = server.app.broker.streams["__cursors"].config
        assert config.compact and config.segment_max_bytes == 16 * 1024 * 1024
    await server_factory.stop(server.app)
    again = await server_factory(data_dir=server.data_dir, cursors_max_per_stream=3)
    async with grpc.aio.insecure_channel(again.grpc_addr) as channel:  # counted on load
        stub = api_pb2_grpc.APIStub(channel)
        await expect_error(stub.SetCursor(full, timeout=5), Code.RESOURCE_EXHAUSTED)
        assert (await stub.FetchCursor(pb.FetchCursorRequest(stream="s", cursorId="a"),
                                       timeout=5)).offset == 7


async def test_cursors_off(server_factory):
    server = await server_factory(cursors_partitions=0)
    channel = grpc.aio.insecure_channel(server.grpc_addr)
    stub = api_pb2_grpc.APIStub(channel)
    await expect_error(stub.FetchCursor(pb.FetchCursorRequest(stream="s", cursorId="c"),
                                        timeout=5), Code.INTERNAL, "cursors")
    assert "__cursors" not in server.app.broker.streams
    await channel.close()


async def test_gufo_cursor_helpers(lb):
    await lb.wait_for_cursors()
    assert await lb.get_cursor("s", 0, "gufo") == -1
    await lb.set_cursor("s", 0, "gufo", 10)  # gufo stores offset + 1
    assert await lb.get_cursor("s", 0, "gufo") == 11


async def test_consumer_group_membership_and_assignments(server, stub):
    await create(stub, "a", partitions=3)
    await create(stub, "b", partitions=1)
    sid = server.liftbridge.server_id
    j1 = await stub.JoinConsumerGroup(pb.JoinConsumerGroupRequest(
        groupId="g", consumerId="c1", streams=["a", "b"]), timeout=5)
    assert (j1.coordinator, j1.epoch) == (sid, 0)
    assert j1.consumerTimeout == 15 * 10**9 and j1.coordinatorTimeout == 15 * 10**9

    async def assignments(consumer, epoch):
        resp = await stub.FetchConsumerGroupAssignments(pb.FetchConsumerGroupAssignmentsRequest(
            groupId="g", consumerId=consumer, epoch=epoch), timeout=5)
        return resp.epoch, {a.stream: list(a.partitions) for a in resp.assignments}

    assert await assignments("c1", 0) == (0, {"a": [0, 1, 2], "b": [0]})
    j2 = await stub.JoinConsumerGroup(pb.JoinConsumerGroupRequest(
        groupId="g", consumerId="c2", streams=["a"]), timeout=5)
    assert j2.epoch > 0
    e, c1 = await assignments("c1", j2.epoch)
    _, c2 = await assignments("c2", j2.epoch)
    assert e == j2.epoch
    assert sorted(c1.get("a", []) + c2["a"]) == [0, 1, 2] and c1["b"] == [0]
    assert len(c1.get("a", [])) + len(c1["b"]) == 2 and len(c2["a"]) == 2  # balanced
    await expect_error(stub.FetchConsumerGroupAssignments(pb.FetchConsumerGroupAssignmentsRequest(
        groupId="g", consumerId="c1", epoch=0), timeout=5), Code.FAILED_PRECONDITION, "epoch")
    await expect_error(stub.FetchConsumerGroupAssignments(pb.FetchConsumerGroupAssignmentsRequest(
        groupId="g", consumerId="zz", epoch=j2.epoch), timeout=5), Code.FAILED_PRECONDITION,
        "not a member")
    await expect_error(stub.FetchConsumerGroupAssignments(pb.FetchConsumerGroupAssignmentsRequest(
        groupId="nope", consumerId="c1"), timeout=5), Code.NOT_FOUND)
    await expect_error(stub.JoinConsumerGroup(pb.JoinConsumerGroupRequest(
        groupId="g", consumerId="c2", streams=["a"]), timeout=5), Code.FAILED_PRECONDITION,
        "already a member")
    await expect_error(stub.JoinConsumerGroup(pb.JoinConsumerGroupRequest(
        groupId="g", consumerId="c3", streams=["missing"]), timeout=5), Code.FAILED_PRECONDITION)
    meta = await stub.FetchMetadata(pb.FetchMetadataRequest(groups=["g"]), timeout=5)
    assert (meta.groupMetadata[0].coordinator, meta.groupMetadata[0].epoch) == (sid, j2.epoch)

    await stub.LeaveConsumerGroup(pb.LeaveConsumerGroupRequest(groupId="g", consumerId="c2"),
                                  timeout=5)
    epoch = (await stub.FetchMetadata(pb.FetchMetadataRequest(groups=["g"]),
                                      timeout=5)).groupMetadata[0].epoch
    assert epoch > j2.epoch and await assignments("c1", epoch) == (epoch, {"a": [0, 1, 2], "b": [0]})
    await expect_error(stub.LeaveConsumerGroup(pb.LeaveConsumerGroupRequest(
        groupId="g", consumerId="c2"), timeout=5), Code.FAILED_PRECONDITION)
    await stub.LeaveConsumerGroup(pb.LeaveConsumerGroupRequest(groupId="g", consumerId="c1"),
                                  timeout=5)
    await expect_error(stub.LeaveConsumerGroup(pb.LeaveConsumerGroupRequest(
        groupId="g", consumerId="c1"), timeout=5), Code.NOT_FOUND)
    for request in (pb.JoinConsumerGroupRequest(consumerId="c", streams=["a"]),
                    pb.JoinConsumerGroupRequest(groupId="g", streams=["a"]),
                    pb.JoinConsumerGroupRequest(groupId="g", consumerId="c")):
        await expect_error(stub.JoinConsumerGroup(request, timeout=5), Code.INVALID_ARGUMENT)


async def test_consumer_timeout_and_coordinator_reports(server_factory):
    server = await server_factory(consumer_timeout_ms=300)
    channel = grpc.aio.insecure_channel(server.grpc_addr)
    stub = api_pb2_grpc.APIStub(channel)
    try:
        await create(stub, "t", partitions=2)
        join = await stub.JoinConsumerGroup(pb.JoinConsumerGroupRequest(
            groupId="tg", consumerId="alive", streams=["t"]), timeout=5)
        await stub.JoinConsumerGroup(pb.JoinConsumerGroupRequest(
            groupId="tg", consumerId="silent", streams=["t"]), timeout=5)
        epoch = (await stub.FetchMetadata(pb.FetchMetadataRequest(groups=["tg"]),
                                          timeout=5)).groupMetadata[0].epoch
        for _ in range(8):  # "alive" heartbeats, "silent" never does
            try:
                resp = await stub.FetchConsumerGroupAssignments(
                    pb.FetchConsumerGroupAssignmentsRequest(groupId="tg", consumerId="alive",
                                                            epoch=epoch), timeout=5)
            except grpc.aio.AioRpcError:
                epoch = (await stub.FetchMetadata(pb.FetchMetadataRequest(groups=["tg"]),
                                                  timeout=5)).groupMetadata[0].epoch
                continue
            await asyncio.sleep(0.1)
        assert server.liftbridge.groups.is_member("tg", "alive")
        assert not server.liftbridge.groups.is_member("tg", "silent")
        assert [a.partitions for a in resp.assignments] == [[0, 1]]

        report = pb.ReportConsumerGroupCoordinatorRequest(
            groupId="tg", consumerId="alive", coordinator=join.coordinator, epoch=0)
        await expect_error(stub.ReportConsumerGroupCoordinator(report, timeout=5),
                           Code.FAILED_PRECONDITION, "mismatch")
        report.epoch = epoch
        await stub.ReportConsumerGroupCoordinator(report, timeout=5)  # majority: re-elected
        new_epoch = (await stub.FetchMetadata(pb.FetchMetadataRequest(groups=["tg"]),
                                              timeout=5)).groupMetadata[0].epoch
        assert new_epoch > epoch
        await expect_error(stub.ReportConsumerGroupCoordinator(
            pb.ReportConsumerGroupCoordinatorRequest(groupId="x", consumerId="c",
                                                     coordinator="y"), timeout=5),
            Code.FAILED_PRECONDITION, "No such consumer group")
        await expect_error(stub.ReportConsumerGroupCoordinator(
            pb.ReportConsumerGroupCoordinatorRequest(groupId="x", consumerId="c"), timeout=5),
            Code.INVALID_ARGUMENT, "No coordinator provided")
    finally:
        await channel.close()


async def test_groups_survive_restart_with_their_epoch(server_factory):
    server = await server_factory()
    channel = grpc.aio.insecure_channel(server.grpc_addr)
    stub = api_pb2_grpc.APIStub(channel)
    await create(stub, "r", partitions=2)
    for consumer in ("x", "y"):
        await stub.JoinConsumerGroup(pb.JoinConsumerGroupRequest(
            groupId="rg", consumerId=consumer, streams=["r"]), timeout=5)
    epoch = server.liftbridge.groups.coordinator_of("rg")[1]
    await channel.close()
    await server_factory.stop(server.app)
    again = await server_factory(data_dir=server.data_dir)
    assert again.liftbridge.groups.coordinator_of("rg")[1] == epoch
    assert again.liftbridge.groups.assignments("rg", "x", epoch)[0] == {"r": [0]}


async def test_activity_stream(server_factory):
    server = await server_factory(activity_enabled=True)
    channel = grpc.aio.insecure_channel(server.grpc_addr)
    stub = api_pb2_grpc.APIStub(channel)
    try:
        await create(stub, "act", partitions=2)
        await stub.PauseStream(pb.PauseStreamRequest(name="act", partitions=[1]), timeout=5)
        await stub.Publish(pb.PublishRequest(stream="act", partition=1, value=b"v"), timeout=5)
        await stub.SetStreamReadonly(pb.SetStreamReadonlyRequest(name="act", readonly=True),
                                     timeout=5)
        await stub.JoinConsumerGroup(pb.JoinConsumerGroupRequest(
            groupId="ag", consumerId="c", streams=["act"]), timeout=5)
        await stub.LeaveConsumerGroup(pb.LeaveConsumerGroupRequest(groupId="ag", consumerId="c"),
                                      timeout=5)
        await stub.DeleteStream(pb.DeleteStreamRequest(name="act"), timeout=5)
        await expect_error(stub.CreateStream(pb.CreateStreamRequest(
            name="__activity", subject="x"), timeout=5), Code.INVALID_ARGUMENT)
        Op = pb.ActivityStreamOp
        events = []
        for _ in range(50):
            events = [pb.ActivityStreamEvent.FromString(m.value)
                      for m in await read_all(stub, "__activity")]
            if len(events) >= 7:
                break
            await asyncio.sleep(0.05)
        assert [e.op for e in events] == [
            Op.CREATE_STREAM, Op.PAUSE_STREAM, Op.RESUME_STREAM, Op.SET_STREAM_READONLY,
            Op.JOIN_CONSUMER_GROUP, Op.LEAVE_CONSUMER_GROUP, Op.DELETE_STREAM]
        assert list(events[0].createStreamOp.partitions) == [0, 1]
        assert list(events[1].pauseStreamOp.partitions) == [1]
        assert list(events[2].resumeStreamOp.partitions) == [1]
        assert events[5].leaveConsumerGroupOp.consumerId == "c"
        assert events[6].deleteStreamOp.stream == "act"
        ids = [e.id for e in events]
        assert ids == sorted(ids) and len(set(ids)) == len(ids) and ids[0] > 0
    finally:
        await channel.close()


async def test_group_and_consumer_ids_are_bounded(stub):
    """A group id or consumer id longer than a stream name (255 bytes) is refused: each is
    kept by the server (in a cluster, in the Raft metadata every server holds and
    snapshots), so one client must not make them as large as a gRPC message."""
    await create(stub, "a")
    long_id = "g" * 256
    for request in (pb.JoinConsumerGroupRequest(groupId=long_id, consumerId="c", streams=["a"]),
                    pb.JoinConsumerGroupRequest(groupId="g", consumerId=long_id, streams=["a"])):
        await expect_error(stub.JoinConsumerGroup(request, timeout=5), Code.INVALID_ARGUMENT,
                           "255 bytes")
    joined = await stub.JoinConsumerGroup(pb.JoinConsumerGroupRequest(
        groupId="g" * 255, consumerId="c" * 255, streams=["a"]), timeout=5)
    assert joined.epoch == 0


async def test_a_coordinator_report_naming_a_long_coordinator_is_refused_as_any_other(stub):
    """Liftbridge's generation mismatch names the coordinator reported; a name too long for
    gRPC's status details (16 KiB of metadata) is shortened, so the client gets the refusal
    and not a RESOURCE_EXHAUSTED of its own."""
    await create(stub, "a")
    join = await stub.JoinConsumerGroup(pb.JoinConsumerGroupRequest(
        groupId="g", consumerId="c", streams=["a"]), timeout=5)
    await expect_error(stub.ReportConsumerGroupCoordinator(
        pb.ReportConsumerGroupCoordinatorRequest(groupId="g", consumerId="c",
                                                 coordinator="x" * 100_000, epoch=join.epoch),
        timeout=5), Code.FAILED_PRECONDITION,
        f"Coordinator generation mismatch, current coordinator: {join.coordinator} epoch: "
        f"{join.epoch}, got coordinator: xxx")
