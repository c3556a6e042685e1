"""RabbitMQ policies in a cluster: a policy set through one server's management API is agreed
through Raft (the change_policy command), so every server lists it and applies it to its
replica of each stream it matches (retention truncates the stream); clearing it reaches all;
a server restarted from its files has it; and while a server of the cluster is at an older
version (a rolling upgrade, cluster.features POLICIES) a change is refused with 503 and never
sent."""
from __future__ import annotations

import dataclasses

from rstream import AMQPMessage, Producer

from _apps import started, stopped, until
from riverlog.cluster import features
from riverlog.server.app import App
from server.test_management import call

GB20 = 20_000_000_000
RETENTION = {"max-length-bytes": 100_000, "stream-max-segment-size-bytes": 50_000}


async def _announce(cluster, app, version: int) -> None:
    """Register ``app`` again announcing ``version``; wait until every server applied it."""
    me = app.cluster.placement.state.servers[app.config.cluster.server_id]
    await app.cluster.placement.submit("add_server",
                                       server=dataclasses.replace(me, version=version))
    await until(f"version {version} applied", lambda: all(
        x.cluster.placement.state.servers[me.id].version == version for x in cluster))


def _retention(app, name: str) -> int | None:
    stream = app.broker.streams.get(name)
    return None if stream is None else stream.partitions[0].config.retention_max_bytes


async def test_a_policy_is_agreed_applied_everywhere_and_gated_by_version(tmp_path):
    cluster = await started(tmp_path)
    again = None
    try:
        a, b, c = cluster
        body = {"pattern": "^ret", "definition": RETENTION, "priority": 1,
                "apply-to": "queues"}
        assert (await call(a, "PUT", "/api/policies/%2F/p", json=body))[0] == 201
        assert (await call(b, "PUT", "/api/policies/%2F/p", json=body))[0] == 204  # agreed
        await until("the policy listed on every server", lambda: all(
            [p.name for p in x.policies.every()] == ["p"] for x in cluster))
        assert (await call(c, "GET", "/api/policies/%2F/p"))[1]["definition"] == RETENTION
        assert (await call(c, "PUT", "/api/queues/%2F/ret-s", json={
            "durable": True, "arguments": {"x-queue-type": "stream",
                                           "x-max-length-bytes": GB20}}))[0] == 201
        await until("every replica under the policy", lambda: all(
            _retention(x, "ret-s") == 100_000 for x in cluster))
        async with Producer("127.0.0.1", c.rabbitmq_stream.port, username="guest",
                            password="guest") as producer:
            for i in range(10):
                for _ in range(99):
                    await producer.send("ret-s", AMQPMessage(body=b"x" * 1000))
                await producer.send_wait("ret-s", AMQPMessage(body=b"x" * 1000))

        async def truncated():
            status, queue = await call(a, "GET", "/api/queues/%2F/ret-s")
            return status == 200 and queue.get("first_offset", 0) > 0
        await until("retention truncated the stream", truncated)
        assert (await call(b, "GET", "/api/queues/%2F/ret-s"))[1]["policy"] == "p"

        # c restarts from its files and has the policy, on its replica too
        await c.stop()
        cluster.remove(c)
        again = App(c.config)
        await again.start()
        cluster.append(again)
        await until("the restarted server follows the policy", lambda: (
            [p.name for p in again.policies.every()] == ["p"]
            and _retention(again, "ret-s") == 100_000))

        # cleared through b: every replica has its own 20 GB again
        assert (await call(b, "DELETE", "/api/policies/%2F/p"))[0] == 204
        assert (await call(a, "DELETE", "/api/policies/%2F/p"))[0] == 404  # agreed: gone
        await until("the stream's own retention everywhere", lambda: all(
            _retention(x, "ret-s") == GB20 for x in cluster))

        # a server at the version before policies: refused, nothing sent
        await _announce(cluster, b, features.FEATURES[features.POLICIES] - 1)
        status, answer = await call(a, "PUT", "/api/policies/%2F/p", json=body)
        assert status == 503 and answer["error"] == "service_unavailable"
        assert "finish the upgrade" in answer["reason"]
        assert a.cluster.placement.state.policies == ()
        await _announce(cluster, b, features.VERSION)
        assert (await call(a, "PUT", "/api/policies/%2F/p", json=body))[0] == 201
    finally:
        await stopped(cluster)
