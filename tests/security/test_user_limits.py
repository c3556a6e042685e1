# Per-user stream limits (SecurityConfig.max_streams_per_user, RabbitMQ's per-user
# max-queues as the model) on both doors that create streams, with real clients: rstream on
# the RabbitMQ Stream door (refused: 0x11 precondition failed, as RabbitMQ refuses a queue
# over max-queues) and grpcio with the Liftbridge stub (RESOURCE_EXHAUSTED). The count is
# per owner across doors, each super stream partition counts, it survives a restart, and a
# deletion frees room. Consumer groups per user (gRPC JoinConsumerGroup creating a group:
# RESOURCE_EXHAUSTED past the limit; joining an existing group is never refused).
from __future__ import annotations

import dataclasses

import grpc
import pytest
from gufo.liftbridge.api_pb2_grpc import APIStub
from rstream import Producer, exceptions

from _raw_stream import Raw
from _sec import PASSWORDS, basic, security, server_config, status_of
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.rabbitmq_stream import ResponseCode
from riverlog.protocol.rabbitmq_stream import frames as f
from riverlog.server.app import App

LIMIT = 3
GROUPS = 2


def producer(app, user: str) -> Producer:
    return Producer("127.0.0.1", port=app.rabbitmq_stream.port, username=user,
                    password=PASSWORDS[user])


def limited(tmp_path, users) -> App:
    sec = dataclasses.replace(security(users), max_streams_per_user=LIMIT,
                              max_groups_per_user=GROUPS)
    return App(server_config(tmp_path, sec))


async def test_streams_per_user_are_limited_on_both_doors(tmp_path, users):
    app = limited(tmp_path, users)
    await app.start()
    try:
        async with producer(app, "bob") as bob:
            for i in range(LIMIT):
                await bob.create_stream(f"bob.{i}")
            with pytest.raises(exceptions.PreconditionFailed):
                await bob.create_stream("bob.over")
            async with producer(app, "ops") as ops:  # another user is not held back
                await ops.create_stream("ops.1")
            await bob.delete_stream("bob.0")  # room for one more
            await bob.create_stream("bob.again")
            with pytest.raises(exceptions.PreconditionFailed):
                await bob.create_stream("bob.over")
        assert "bob.over" not in app.broker.streams
        assert app.broker.owned("bob") == LIMIT
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
            stub = APIStub(channel)
            request = pb.CreateStreamRequest(name="bob.grpc", subject="bob.grpc")
            status = await status_of(stub.CreateStream(request, metadata=basic("bob"),
                                                       timeout=10))
            assert status == grpc.StatusCode.RESOURCE_EXHAUSTED
            await stub.CreateStream(pb.CreateStreamRequest(name="ops.grpc", subject="ops.grpc"),
                                    metadata=basic("ops"), timeout=10)
    finally:
        await app.stop()
    assert "bob.grpc" not in app.broker.streams


async def test_the_count_survives_a_restart_and_super_streams_count_each_partition(
        tmp_path, users):
    app = limited(tmp_path, users)
    await app.start()
    try:
        async with producer(app, "bob") as bob:
            await bob.create_stream("bob.a")
            await bob.create_stream("bob.b")
    finally:
        await app.stop()
    app = limited(tmp_path, users)
    await app.start()
    try:
        assert app.broker.owned("bob") == 2
        bob = await Raw.connect(app.rabbitmq_stream.port)
        await bob.opened("bob")
        # two partitions would make 4 of 3: refused whole, nothing made
        answer = await bob.request(f.CreateSuperStream(
            5, "bob.super", ("bob.super-0", "bob.super-1"), ("0", "1"), {}))
        assert answer.response_code == ResponseCode.PRECONDITION_FAILED
        assert not any(name.startswith("bob.super") for name in app.broker.streams)
        answer = await bob.request(f.CreateSuperStream(6, "bob.super", ("bob.super-0",),
                                                       ("0",), {}))
        assert answer.response_code == ResponseCode.OK
        assert app.broker.owned("bob") == LIMIT
        bob.writer.close()
    finally:
        await app.stop()


async def test_consumer_groups_a_user_creates_are_limited(tmp_path, users):
    app = limited(tmp_path, users)
    await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
            stub = APIStub(channel)
            bob, ops = basic("bob"), basic("ops")
            await stub.CreateStream(pb.CreateStreamRequest(name="bob.s", subject="bob.s"),
                                    metadata=bob, timeout=10)

            def join(group: str, consumer: str, metadata):
                return stub.JoinConsumerGroup(pb.JoinConsumerGroupRequest(
                    groupId=group, consumerId=consumer, streams=["bob.s"]),
                    metadata=metadata, timeout=10)

            for group in ("g1", "g2"):
                await join(group, "c1", bob)
            assert await status_of(join("g3", "c1", bob)) == \
                grpc.StatusCode.RESOURCE_EXHAUSTED
            await join("g1", "c2", bob)  # an existing group: nothing created
            await join("g4", "c1", ops)  # another user is not held back
            for consumer in ("c1", "c2"):  # g1's last member leaves: g1 is gone
                await stub.LeaveConsumerGroup(pb.LeaveConsumerGroupRequest(
                    groupId="g1", consumerId=consumer), metadata=bob, timeout=10)
            await join("g3", "c1", bob)
            assert await status_of(join("g5", "c1", bob)) == \
                grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await app.stop()


async def test_each_partition_of_a_grpc_stream_counts_and_after_a_restart_too(tmp_path, users):
    # CreateStream checks the partitions it makes against the count, so the count must be of
    # partitions: counted per stream, 2 streams of 2 partitions passed a limit of 3
    def create(stub, name: str, partitions: int):
        return stub.CreateStream(pb.CreateStreamRequest(name=name, subject=name,
                                                        partitions=partitions),
                                 metadata=basic("bob"), timeout=10)

    app = limited(tmp_path, users)
    await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
            stub = APIStub(channel)
            await create(stub, "bob.two", 2)
            assert await status_of(create(stub, "bob.over", 2)) == \
                grpc.StatusCode.RESOURCE_EXHAUSTED
            assert app.broker.owned("bob") == 2
            await create(stub, "bob.one", 1)
    finally:
        await app.stop()
    assert "bob.over" not in app.broker.streams
    app = limited(tmp_path, users)
    await app.start()
    try:
        assert app.broker.owned("bob") == LIMIT
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
            stub = APIStub(channel)
            assert await status_of(create(stub, "bob.after", 1)) == \
                grpc.StatusCode.RESOURCE_EXHAUSTED
            await stub.DeleteStream(pb.DeleteStreamRequest(name="bob.two"),
                                    metadata=basic("bob"), timeout=10)
            assert app.broker.owned("bob") == 1  # both partitions freed
            await create(stub, "bob.after", 2)
    finally:
        await app.stop()
