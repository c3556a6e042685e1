"""Subscribe: the empty handshake message, every start and stop position, committed messages
only, resume of a paused partition, read-only ends, group members taking partitions over,
and the exact status codes (NotFound, InvalidArgument, ResourceExhausted,
FailedPrecondition)."""
from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from _lb import create

from riverlog.protocol.liftbridge import api_pb2 as pb

pytestmark = pytest.mark.timeout(60)
SP, STOP, Code = pb.StartPosition, pb.StopPosition, grpc.StatusCode


async def publish_n(stub, stream, n, start=0, partition=0):
    for i in range(start, start + n):
        await stub.Publish(pb.PublishRequest(stream=stream, partition=partition,
                                             value=b"m%d" % i), timeout=5)


async def collect(call, n=None, timeout=5.0):
    """Messages of a Subscribe call (handshake checked and dropped) until ``n`` arrived or the
    call ends; returns (messages, final status code or None)."""
    out: list[pb.Message] = []
    code = None

    async def run():
        nonlocal code
        try:
            async for msg in call:
                out.append(msg)
                if n is not None and len(out) == n + 1:
                    return
        except grpc.aio.AioRpcError as exc:
            code = exc.code()

    await asyncio.wait_for(run(), timeout)
    if out:
        assert out[0] == pb.Message()
    return out[1:], code


def sub(stub, stream, partition=0, **fields):
    return stub.Subscribe(pb.SubscribeRequest(stream=stream, partition=partition, **fields),
                          timeout=15)


async def test_handshake_then_new_messages(stub):
    await create(stub, "hs")
    await publish_n(stub, "hs", 2)
    call = sub(stub, "hs")  # NEW_ONLY
    first = await asyncio.wait_for(call.read(), 5)
    assert first == pb.Message()
    await publish_n(stub, "hs", 2, start=2)
    msgs = [await asyncio.wait_for(call.read(), 5) for _ in range(2)]
    assert [(m.offset, m.value, m.stream, m.partition) for m in msgs] == [
        (2, b"m2", "hs", 0), (3, b"m3", "hs", 0)]
    call.cancel()


@pytest.mark.parametrize("fields, expected", [
    (dict(startPosition=SP.EARLIEST), [0, 1, 2, 3, 4]),
    (dict(startPosition=SP.LATEST), [4]),
    (dict(startPosition=SP.OFFSET, startOffset=2), [2, 3, 4]),
    (dict(startPosition=SP.OFFSET, startOffset=-7), [0, 1, 2, 3, 4]),
    (dict(startPosition=SP.EARLIEST, stopPosition=STOP.STOP_OFFSET, stopOffset=1), [0, 1]),
    (dict(startPosition=SP.OFFSET, startOffset=3, stopPosition=STOP.STOP_OFFSET, stopOffset=3),
     [3]),
])
async def test_start_and_stop_positions(stub, fields, expected):
    await create(stub, "pos")
    await publish_n(stub, "pos", 5)
    fields.setdefault("stopPosition", STOP.STOP_LATEST)
    msgs, code = await collect(sub(stub, "pos", **fields))
    assert [m.offset for m in msgs] == expected
    assert code == Code.RESOURCE_EXHAUSTED


async def test_timestamp_positions(stub):
    await create(stub, "ts")
    await publish_n(stub, "ts", 3)
    await asyncio.sleep(0.05)
    middle = time.time_ns()
    await asyncio.sleep(0.05)
    await publish_n(stub, "ts", 3, start=3)
    msgs, _ = await collect(sub(stub, "ts", startPosition=SP.TIMESTAMP, startTimestamp=middle,
                                stopPosition=STOP.STOP_LATEST))
    assert [m.offset for m in msgs] == [3, 4, 5]
    assert all(m.timestamp >= middle for m in msgs)
    msgs, code = await collect(sub(stub, "ts", startPosition=SP.EARLIEST,
                                   stopPosition=STOP.STOP_TIMESTAMP, stopTimestamp=middle))
    assert [m.offset for m in msgs] == [0, 1, 2] and code == Code.RESOURCE_EXHAUSTED


async def test_refusals(stub):
    await create(stub, "ref", partitions=2)
    await publish_n(stub, "ref", 3)
    for call, code in (
            (sub(stub, "ref", partition=2), Code.NOT_FOUND),
            (sub(stub, "nope"), Code.NOT_FOUND),
            (sub(stub, "ref", partition=1, stopPosition=STOP.STOP_LATEST), Code.RESOURCE_EXHAUSTED),
            (sub(stub, "ref", startPosition=SP.OFFSET, startOffset=2,
                 stopPosition=STOP.STOP_OFFSET, stopOffset=1), Code.INVALID_ARGUMENT),
            (sub(stub, "ref", startPosition=9), Code.INVALID_ARGUMENT),
            (sub(stub, "ref", consumer=pb.Consumer(groupId="g")), Code.INVALID_ARGUMENT)):
        msgs, got = await collect(call)
        assert (msgs, got) == ([], code)


async def test_only_committed_messages_are_sent(server, stub):
    await create(stub, "hw")
    part = server.app.broker.streams["hw"].partitions[0]
    await publish_n(stub, "hw", 2)
    # write a record without committing it: a reader must not see it
    part.log.auto_commit = False
    part.write_records([b"uncommitted"])
    call = sub(stub, "hw", startPosition=SP.EARLIEST)
    msgs = [await asyncio.wait_for(call.read(), 5) for _ in range(3)]
    assert msgs[0] == pb.Message() and [m.offset for m in msgs[1:]] == [0, 1]
    nxt = asyncio.ensure_future(call.read())
    await asyncio.sleep(0.2)
    assert not nxt.done()
    part.log.commit(2)
    m = await asyncio.wait_for(nxt, 5)
    assert m.offset == 2 and m.value == b"uncommitted"
    part.log.auto_commit = True
    call.cancel()


async def test_paused_partition_needs_resume(server, stub):
    await create(stub, "pr")
    await publish_n(stub, "pr", 1)
    await stub.PauseStream(pb.PauseStreamRequest(name="pr"), timeout=5)
    msgs, code = await collect(sub(stub, "pr", startPosition=SP.EARLIEST))
    assert code == Code.FAILED_PRECONDITION
    msgs, code = await collect(sub(stub, "pr", startPosition=SP.EARLIEST, resume=True,
                                   stopPosition=STOP.STOP_LATEST))
    assert [m.value for m in msgs] == [b"m0"]
    assert not server.app.broker.streams["pr"].partitions[0].paused


async def test_readonly_partition_ends_the_subscription(stub):
    await create(stub, "rdo")
    await publish_n(stub, "rdo", 2)
    live = sub(stub, "rdo", startPosition=SP.EARLIEST)
    assert await asyncio.wait_for(live.read(), 5) == pb.Message()
    assert (await asyncio.wait_for(live.read(), 5)).offset == 0
    assert (await asyncio.wait_for(live.read(), 5)).offset == 1
    await stub.SetStreamReadonly(pb.SetStreamReadonlyRequest(name="rdo", readonly=True), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(live.read(), 5)
    assert info.value.code() == Code.RESOURCE_EXHAUSTED
    assert "End of readonly partition" in info.value.details()
    msgs, code = await collect(sub(stub, "rdo", startPosition=SP.EARLIEST))
    assert [m.offset for m in msgs] == [0, 1] and code == Code.RESOURCE_EXHAUSTED


async def test_deleting_the_stream_ends_subscriptions(stub):
    await create(stub, "gone")
    call = sub(stub, "gone")
    assert await asyncio.wait_for(call.read(), 5) == pb.Message()
    await stub.DeleteStream(pb.DeleteStreamRequest(name="gone"), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(call.read(), 5)
    assert info.value.code() == Code.NOT_FOUND


async def test_newer_group_member_takes_the_partition_over(stub):
    await create(stub, "grp")
    old = sub(stub, "grp", consumer=pb.Consumer(groupId="g", consumerId="a", groupEpoch=1))
    assert await asyncio.wait_for(old.read(), 5) == pb.Message()
    stale = sub(stub, "grp", consumer=pb.Consumer(groupId="g", consumerId="b", groupEpoch=0))
    _, code = await collect(stale)
    assert code == Code.FAILED_PRECONDITION
    new = sub(stub, "grp", consumer=pb.Consumer(groupId="g", consumerId="c", groupEpoch=2))
    assert await asyncio.wait_for(new.read(), 5) == pb.Message()
    # the older member's stream ends (cleanly) once the newer one took over
    assert await asyncio.wait_for(old.read(), 5) is grpc.aio.EOF
    await publish_n(stub, "grp", 1)
    assert (await asyncio.wait_for(new.read(), 5)).value == b"m0"
    new.cancel()


async def test_gufo_liftbridge_subscribe_and_publish(server, lb):
    from gufo.liftbridge.types import StartPosition
    await lb.create_stream("gufo", partitions=2, wait_for_stream=True)
    await lb.publish(b"hello", stream="gufo", partition=1, key=b"k", headers={"x": b"y"})
    acks = [a async for a in lb.publish_bulk(
        [lb.get_publish_request(b"bulk%d" % i, stream="gufo", partition=1) for i in range(3)])]
    assert len(acks) == 3
    got = []
    async for msg in lb.subscribe("gufo", partition=1, start_position=StartPosition.EARLIEST):
        got.append(msg)
        if len(got) == 4:
            break
    assert [m.value for m in got] == [b"hello", b"bulk0", b"bulk1", b"bulk2"]
    assert got[0].key == b"k" and got[0].headers["x"] == b"y" and got[0].subject == "gufo.1"
    meta = await lb.get_partition_metadata("gufo", 1)
    assert (meta.high_watermark, meta.newest_offset) == (3, 3)
    await lb.delete_stream("gufo")
