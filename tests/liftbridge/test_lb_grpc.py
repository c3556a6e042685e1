"""The gRPC API RPC by RPC with riverlog's own stub (and raw bytes for malformed requests):
CreateStream with every override, DeleteStream, PauseStream, SetStreamReadonly,
FetchMetadata, FetchPartitionMetadata, Publish (deadline semantics, error codes),
PublishAsync, PublishToSubject, and the exact status codes of the reference."""
from __future__ import annotations


import grpc
import pytest
from _lb import create, read_all, wait_for_offset

from riverlog.protocol.liftbridge import api_pb2 as pb

pytestmark = pytest.mark.timeout(60)
Code = grpc.StatusCode


async def expect_error(call, code, text: str | None = None):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value
    if text is not None:
        assert text in info.value.details(), info.value.details()
    return info.value


async def test_create_stream_keeps_every_override(server, stub):
    N64, N32, NB = pb.NullableInt64, pb.NullableInt32, pb.NullableBool
    await stub.CreateStream(pb.CreateStreamRequest(
        name="full", subject="full.subj", group="workers", replicationFactor=-1, partitions=2,
        retentionMaxBytes=N64(value=10_000_000), retentionMaxMessages=N64(value=1000),
        retentionMaxAge=N64(value=3_600_000), cleanerInterval=N64(value=60_000),
        segmentMaxBytes=N64(value=1_048_576), segmentMaxAge=N64(value=600_000),
        compactMaxGoroutines=N32(value=4), compactEnabled=NB(value=True),
        autoPauseTime=N64(value=0), autoPauseDisableIfSubscribers=NB(value=True),
        minIsr=N32(value=1), optimisticConcurrencyControl=NB(value=True),
        encryption=NB(value=False)), timeout=5)
    stream = server.app.broker.streams["full"]
    c = stream.config
    assert (c.subject, c.group, c.partitions, c.replication_factor) == ("full.subj", "workers", 2, 1)
    assert (c.retention_max_bytes, c.retention_max_messages, c.retention_max_age_ms) == (
        10_000_000, 1000, 3_600_000)
    assert (c.cleaner_interval_ms, c.segment_max_bytes, c.segment_max_age_ms) == (
        60_000, 1_048_576, 600_000)
    assert (c.compact, c.compact_max_goroutines, c.min_isr) == (True, 4, 1)
    assert (c.optimistic_concurrency, c.auto_pause_disable_if_subscribers) == (True, True)
    log = stream.partitions[1].log.config
    assert (log.retention_max_bytes, log.segment_max_bytes, log.compact) == (10_000_000, 1_048_576, True)
    meta = await stub.FetchMetadata(pb.FetchMetadataRequest(streams=["full"]), timeout=5)
    (sm,) = meta.streamMetadata
    assert sm.subject == "full.subj" and sorted(sm.partitions) == [0, 1]
    assert sm.creationTimestamp == stream.created_ns


@pytest.mark.parametrize("request_, code, text", [
    (pb.CreateStreamRequest(subject="s"), Code.INVALID_ARGUMENT, "Name cannot be empty"),
    (pb.CreateStreamRequest(name="n"), Code.INVALID_ARGUMENT, "Subject is invalid"),
    (pb.CreateStreamRequest(name="n", subject="a b"), Code.INVALID_ARGUMENT, "Subject is invalid"),
    (pb.CreateStreamRequest(name="n", subject="a..b"), Code.INVALID_ARGUMENT, "Subject is invalid"),
    (pb.CreateStreamRequest(name="__cursors", subject="c"), Code.INVALID_ARGUMENT, "reserved"),
    (pb.CreateStreamRequest(name="__activity", subject="c"), Code.INVALID_ARGUMENT, "reserved"),
    (pb.CreateStreamRequest(name="n", subject="s", replicationFactor=3), Code.INVALID_ARGUMENT,
     "Invalid replicationFactor 3"),
    (pb.CreateStreamRequest(name="n", subject="s", partitions=-2), Code.INVALID_ARGUMENT,
     "partitions"),
    (pb.CreateStreamRequest(name="n", subject="s", segmentMaxBytes=pb.NullableInt64(value=10)),
     Code.INVALID_ARGUMENT, "segment_max_bytes"),
    (pb.CreateStreamRequest(name="n", subject="s", encryption=pb.NullableBool(value=True)),
     Code.FAILED_PRECONDITION, "encryption"),
])
async def test_create_stream_refusals(stub, request_, code, text):
    await expect_error(stub.CreateStream(request_, timeout=5), code, text)


async def test_create_existing_and_delete(server, stub):
    await create(stub, "dup")
    await expect_error(stub.CreateStream(pb.CreateStreamRequest(name="dup", subject="x"),
                                         timeout=5), Code.ALREADY_EXISTS)
    await stub.DeleteStream(pb.DeleteStreamRequest(name="dup"), timeout=5)
    assert "dup" not in server.app.broker.streams
    await expect_error(stub.DeleteStream(pb.DeleteStreamRequest(name="dup"), timeout=5),
                       Code.NOT_FOUND)
    await expect_error(stub.DeleteStream(pb.DeleteStreamRequest(name="__cursors"), timeout=5),
                       Code.INVALID_ARGUMENT, "reserved")


async def test_fetch_metadata(server, stub):
    await create(stub, "m1", partitions=2)
    resp = await stub.FetchMetadata(pb.FetchMetadataRequest(streams=["m1", "nope"],
                                                            groups=["g?"]), timeout=5)
    (broker,) = resp.brokers
    sid = server.liftbridge.server_id
    assert (broker.id, broker.host, broker.port) == (sid, "127.0.0.1", server.app.grpc.port)
    assert broker.partitionCount == broker.leaderCount >= 2
    m1, nope = resp.streamMetadata
    assert m1.error == pb.StreamMetadata.Error.OK and nope.error == pb.StreamMetadata.Error.UNKNOWN_STREAM
    p0 = m1.partitions[0]
    assert (p0.leader, list(p0.replicas), list(p0.isr)) == (sid, [sid], [sid])
    assert (p0.highWatermark, p0.newestOffset) == (-1, -1)
    (group,) = resp.groupMetadata
    assert group.groupId == "g?" and group.error == pb.ConsumerGroupMetadata.Error.UNKNOWN_GROUP
    everything = await stub.FetchMetadata(pb.FetchMetadataRequest(), timeout=5)
    assert {"m1", "__cursors"} <= {s.name for s in everything.streamMetadata}


async def test_fetch_partition_metadata(server, stub):
    await create(stub, "pm")
    for i in range(3):
        await stub.Publish(pb.PublishRequest(stream="pm", value=b"%d" % i), timeout=5)
    meta = (await stub.FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(
        stream="pm", partition=0), timeout=5)).metadata
    assert (meta.id, meta.highWatermark, meta.newestOffset, meta.paused) == (0, 2, 2, False)
    assert meta.messagesReceivedTimestamps.firstTimestamp > 0
    await expect_error(stub.FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(
        stream="pm", partition=1), timeout=5), Code.NOT_FOUND)


async def test_publish_without_deadline_returns_at_once(server, stub):
    await create(stub, "nodl")
    resp = await stub.Publish(pb.PublishRequest(stream="nodl", value=b"v", key=b"k",
                                                headers={"a": b"1"}, correlationId="c"))
    assert resp == pb.PublishResponse()
    await wait_for_offset(server, "nodl", 0)
    (m,) = await read_all(stub, "nodl")
    assert (m.key, m.value, dict(m.headers)) == (b"k", b"v", {"a": b"1", "subject": b"nodl",
                                                             "reply": b""})


async def test_publish_with_deadline_waits_for_the_ack(stub):
    await create(stub, "dl", partitions=2)
    resp = await stub.Publish(pb.PublishRequest(stream="dl", partition=1, value=b"v",
                                                correlationId="c9", ackPolicy=pb.AckPolicy.ALL),
                              timeout=5)
    ack = resp.ack
    assert (ack.stream, ack.msgSubject, ack.offset, ack.correlationId) == ("dl", "dl.1", 0, "c9")
    assert ack.ackPolicy == pb.AckPolicy.ALL and ack.commitTimestamp >= ack.receptionTimestamp > 0
    assert ack.ackInbox.startswith("liftbridge-default.ack.")
    none = await stub.Publish(pb.PublishRequest(stream="dl", value=b"v",
                                                ackPolicy=pb.AckPolicy.NONE), timeout=5)
    assert not none.HasField("ack")


@pytest.mark.parametrize("request_, code, text", [
    (pb.PublishRequest(value=b"v"), Code.INVALID_ARGUMENT, "no stream provided"),
    (pb.PublishRequest(stream="missing", value=b"v"), Code.NOT_FOUND, "no such stream"),
    (pb.PublishRequest(stream="pe", partition=5, value=b"v"), Code.NOT_FOUND, "no such partition"),
])
async def test_publish_refusals(stub, request_, code, text):
    await create(stub, "pe")
    await expect_error(stub.Publish(request_, timeout=5), code, text)


async def test_publish_ack_errors_map_to_status_codes(server_factory):
    from riverlog.protocol.liftbridge import api_pb2_grpc
    server = await server_factory(replication_max_bytes=500)
    channel = grpc.aio.insecure_channel(server.grpc_addr)
    stub = api_pb2_grpc.APIStub(channel)
    try:
        await create(stub, "occ", optimisticConcurrencyControl=pb.NullableBool(value=True))
        await stub.Publish(pb.PublishRequest(stream="occ", value=b"a", expectedOffset=0), timeout=5)
        await expect_error(stub.Publish(pb.PublishRequest(stream="occ", value=b"b",
                                                          expectedOffset=0), timeout=5),
                           Code.UNKNOWN, "incorrect expected offset")
        await expect_error(stub.Publish(pb.PublishRequest(stream="occ", value=b"c" * 1000,
                                                          expectedOffset=1), timeout=5),
                           Code.INVALID_ARGUMENT, "exceeds max replication size")
        await expect_error(stub.Publish(pb.PublishRequest(stream="occ", value=b"d",
                                                          ackPolicy=pb.AckPolicy.NONE), timeout=5),
                           Code.INVALID_ARGUMENT, "concurrency control")
        await stub.SetStreamReadonly(pb.SetStreamReadonlyRequest(name="occ", readonly=True),
                                     timeout=5)
        await expect_error(stub.Publish(pb.PublishRequest(stream="occ", value=b"e"), timeout=5),
                           Code.FAILED_PRECONDITION, "readonly")
    finally:
        await channel.close()


async def test_publish_async(server, stub):
    await create(stub, "pa", partitions=2)

    async def requests():
        for i in range(10):
            yield pb.PublishRequest(stream="pa", partition=i % 2, value=b"%d" % i,
                                    correlationId=str(i))
        yield pb.PublishRequest(stream="pa", value=b"quiet", ackPolicy=pb.AckPolicy.NONE,
                                correlationId="none")
        yield pb.PublishRequest(stream="nope", value=b"x", correlationId="bad")
        yield pb.PublishRequest(stream="pa", partition=9, value=b"x", correlationId="badp")

    responses = [r async for r in stub.PublishAsync(requests(), timeout=10)]
    by_corr = {r.correlationId: r for r in responses}
    assert set(by_corr) == {str(i) for i in range(10)} | {"bad", "badp"}
    assert not any(r.HasField("asyncError") for c, r in by_corr.items() if c.isdigit())
    assert sorted(by_corr[str(i)].ack.offset for i in range(0, 10, 2)) == [0, 1, 2, 3, 4]
    assert by_corr["bad"].asyncError.code == pb.PublishAsyncError.Code.NOT_FOUND
    assert by_corr["bad"].ack == pb.Ack()
    assert by_corr["badp"].asyncError.code == pb.PublishAsyncError.Code.NOT_FOUND
    await wait_for_offset(server, "pa", 5)
    assert len(await read_all(stub, "pa", 0)) == 6  # 5 acked + the NONE one


async def test_publish_to_subject(server, stub, nc):
    await create(stub, "pts", "pts.subject", partitions=2)
    resp = await stub.PublishToSubject(pb.PublishToSubjectRequest(
        subject="pts.subject.1", value=b"via nats", key=b"k", correlationId="x"), timeout=5)
    assert (resp.ack.stream, resp.ack.offset, resp.ack.correlationId) == ("pts", 0, "x")
    (m,) = await read_all(stub, "pts", 1)
    assert (m.key, m.value, m.subject) == (b"k", b"via nats", "pts.subject.1")
    await expect_error(stub.PublishToSubject(pb.PublishToSubjectRequest(
        subject="nobody.listens", value=b"v"), timeout=0.5), Code.DEADLINE_EXCEEDED)


async def test_publish_to_subject_of_a_read_only_partition_is_refused(server, stub, nc):
    """Issue 24: it timed out before (the NATS message was not stored, no ack came)."""
    await create(stub, "ptsro", "ptsro.subject", partitions=2)
    await stub.SetStreamReadonly(pb.SetStreamReadonlyRequest(name="ptsro", partitions=[1],
                                                             readonly=True), timeout=5)
    await expect_error(stub.PublishToSubject(pb.PublishToSubjectRequest(
        subject="ptsro.subject.1", value=b"v"), timeout=10), Code.FAILED_PRECONDITION,
        "readonly partition: 1")
    resp = await stub.PublishToSubject(pb.PublishToSubjectRequest(
        subject="ptsro.subject", value=b"v"), timeout=10)
    assert (resp.ack.stream, resp.ack.partitionSubject) == ("ptsro", "ptsro.subject")


async def test_pause_and_resume(server, stub):
    await create(stub, "pause", partitions=3)
    await stub.PauseStream(pb.PauseStreamRequest(name="pause", partitions=[1, 2],
                                                 resumeAll=True), timeout=5)
    meta = await stub.FetchMetadata(pb.FetchMetadataRequest(streams=["pause"]), timeout=5)
    parts = meta.streamMetadata[0].partitions
    assert [parts[i].paused for i in range(3)] == [False, True, True]
    assert parts[1].pauseTimestamps.firstTimestamp > 0
    await stub.Publish(pb.PublishRequest(stream="pause", partition=1, value=b"v"), timeout=5)
    meta = await stub.FetchMetadata(pb.FetchMetadataRequest(streams=["pause"]), timeout=5)
    parts = meta.streamMetadata[0].partitions
    assert [parts[i].paused for i in range(3)] == [False, False, False]  # resumeAll
    await expect_error(stub.PauseStream(pb.PauseStreamRequest(name="nope"), timeout=5),
                       Code.NOT_FOUND)
    await expect_error(stub.PauseStream(pb.PauseStreamRequest(name="pause", partitions=[7]),
                                        timeout=5), Code.NOT_FOUND)


async def test_readonly_flags(server, stub):
    await create(stub, "ro", partitions=2)
    await stub.SetStreamReadonly(pb.SetStreamReadonlyRequest(name="ro", partitions=[1],
                                                             readonly=True), timeout=5)
    meta = await stub.FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(
        stream="ro", partition=1), timeout=5)
    assert meta.metadata.readonly and meta.metadata.readonlyTimestamps.latestTimestamp > 0
    await stub.Publish(pb.PublishRequest(stream="ro", partition=0, value=b"ok"), timeout=5)
    await stub.SetStreamReadonly(pb.SetStreamReadonlyRequest(name="ro", readonly=False), timeout=5)
    await stub.Publish(pb.PublishRequest(stream="ro", partition=1, value=b"ok"), timeout=5)
    await expect_error(stub.SetStreamReadonly(pb.SetStreamReadonlyRequest(name="x", readonly=True),
                                              timeout=5), Code.NOT_FOUND)


async def test_pause_and_readonly_survive_restart(server_factory):
    from riverlog.protocol.liftbridge import api_pb2_grpc
    first = await server_factory()
    channel = grpc.aio.insecure_channel(first.grpc_addr)
    stub = api_pb2_grpc.APIStub(channel)
    await create(stub, "flags", partitions=2)
    await stub.PauseStream(pb.PauseStreamRequest(name="flags", partitions=[0]), timeout=5)
    await stub.SetStreamReadonly(pb.SetStreamReadonlyRequest(name="flags", partitions=[1],
                                                             readonly=True), timeout=5)
    await channel.close()
    server_id = first.liftbridge.server_id
    await server_factory.stop(first.app)
    second = await server_factory(data_dir=first.data_dir)
    parts = second.app.broker.streams["flags"].partitions
    assert (parts[0].paused, parts[0].readonly, parts[1].paused, parts[1].readonly) == (
        True, False, False, True)
    assert second.liftbridge.server_id == server_id


@pytest.mark.parametrize("method", [
    "CreateStream", "DeleteStream", "PauseStream", "SetStreamReadonly", "FetchMetadata",
    "FetchPartitionMetadata", "Publish", "PublishToSubject", "SetCursor", "FetchCursor",
    "JoinConsumerGroup", "LeaveConsumerGroup", "FetchConsumerGroupAssignments",
    "ReportConsumerGroupCoordinator"])
async def test_malformed_requests_get_invalid_argument(server, method):
    channel = grpc.aio.insecure_channel(server.grpc_addr)
    try:
        call = channel.unary_unary(f"/proto.API/{method}")  # raw bytes in and out
        err = await expect_error(call(b"\x0a\xff\xff\xff\x0f", timeout=5), Code.INVALID_ARGUMENT)
        assert "malformed" in err.details() and "Request" in err.details()
    finally:
        await channel.close()


async def test_malformed_stream_requests_get_invalid_argument(server):
    channel = grpc.aio.insecure_channel(server.grpc_addr)
    try:
        sub = channel.unary_stream("/proto.API/Subscribe")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in sub(b"\x0a\xff\xff", timeout=5):
                pass
        assert info.value.code() == Code.INVALID_ARGUMENT
        pub = channel.stream_stream("/proto.API/PublishAsync")

        async def requests():
            yield b"\x12\xff\xff"

        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in pub(requests(), timeout=5):
                pass
        assert info.value.code() == Code.INVALID_ARGUMENT
        assert "malformed PublishRequest" in info.value.details()
    finally:
        await channel.close()


async def test_messages_survive_restart(server_factory):
    from _lb import Clients
    first = await server_factory()
    async with Clients(first) as (stub, nc):
        await create(stub, "keep", "keep.subject", partitions=2)
        await nc.publish("keep.subject.1", b"over nats")
        await nc.flush()
        await wait_for_offset(first, "keep", 0, partition=1)  # NATS first, then gRPC
        await stub.Publish(pb.PublishRequest(stream="keep", partition=1, key=b"k",
                                             value=b"over grpc", ackPolicy=pb.AckPolicy.ALL),
                           timeout=5)
    await server_factory.stop(first.app)
    second = await server_factory(data_dir=first.data_dir)
    async with Clients(second) as (stub, nc):
        msgs = await read_all(stub, "keep", 1)
        assert [(m.offset, m.key, m.value) for m in msgs] == [
            (0, b"", b"over nats"), (1, b"k", b"over grpc")]
        await nc.publish("keep.subject.1", b"after restart")  # subscriptions are back
        await wait_for_offset(second, "keep", 2, partition=1)
