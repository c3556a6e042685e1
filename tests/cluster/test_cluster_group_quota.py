# The consumer groups a user may create (riverlog.limits.groups.per.user, server/group_quota.py)
# in a real three-server cluster: a JoinConsumerGroup waits on Raft before its group exists,
# so joins in flight must count. Before, each concurrent join's check forgot the others'
# (not yet existing) groups and every one passed the limit.
from __future__ import annotations

import asyncio
import base64

import grpc

from _apps import created, started, stopped, stub_of, until
from riverlog.config import SecurityConfig
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.security.users import hash_password

LIMIT = 2
BOB = (("authorization", "Basic " + base64.b64encode(b"bob:bob-pw").decode()),)


async def test_concurrent_joins_in_a_cluster_create_no_more_groups_than_the_limit(tmp_path):
    security = SecurityConfig(users=(("bob", hash_password("bob-pw", rounds=4)),),
                              authz=True, authz_rules=(("p", "bob", "*", "*"),),
                              max_groups_per_user=LIMIT)
    apps = await started(tmp_path, security)
    try:
        await created(apps, "s")
        channel, stub = stub_of(apps[0])
        async with channel:
            def join(group: str, streams=("s",)):
                return stub.JoinConsumerGroup(pb.JoinConsumerGroupRequest(
                    groupId=group, consumerId="c1", streams=list(streams)),
                    metadata=BOB, timeout=30)

            # a join that fails (no such stream) leaves nothing counted behind
            try:
                await join("failed", ("nope",))
                raise AssertionError("a join to a stream that does not exist was accepted")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            groups = [f"g{i}" for i in range(6)]
            results = await asyncio.gather(*(join(g) for g in groups), return_exceptions=True)
            made = [g for g, r in zip(groups, results) if not isinstance(r, BaseException)]
            refused = [r.code() for r in results if isinstance(r, grpc.aio.AioRpcError)]
            assert len(made) == LIMIT, results
            assert refused == [grpc.StatusCode.RESOURCE_EXHAUSTED] * (len(groups) - LIMIT)
            await until("the groups made exist on every server", lambda: all(
                a.liftbridge.groups.coordinator_of(g) is not None for a in apps for g in made))
            try:
                await join("later")
                raise AssertionError("a join past the limit was accepted")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
    finally:
        await stopped(apps)
