"""The management API routes `riverlog ctl` added for rabbitmq-streams' commands, over real
HTTP while rstream clients work: PUT /api/stream/super-streams/{vhost}/{name} (RabbitMQ's,
rabbitmq_stream_management's rabbit_stream_super_stream_mgmt), and riverlog's
DELETE /api/riverlog/stream/super-streams/{vhost}/{name} and
GET /api/riverlog/stream/consumer-groups[/{vhost}[/{stream}/{reference}]]: status codes,
RabbitMQ's error words, what each caller may do and see."""
from __future__ import annotations

import pytest
from rstream import (Consumer, OffsetSpecification, OffsetType,
                     Producer)

from riverlog.config import SecurityConfig
from riverlog.security.users import hash_password

from test_management import _app, app, basic, call  # noqa: F401  (the `app` fixture)

pytestmark = pytest.mark.timeout(120)

PUT = "/api/stream/super-streams/%2F/"
DELETE = "/api/riverlog/stream/super-streams/%2F/"
GROUPS = "/api/riverlog/stream/consumer-groups"


async def test_put_and_delete_super_stream(app):  # noqa: F811
    status, _ = await call(app, "PUT", PUT + "inv", json={
        "partitions": 3, "arguments": {"max-length-bytes": 1000000}})
    assert status == 201
    super_streams = app.rabbitmq_stream.super_streams
    assert super_streams.get("inv").partitions == ("inv-0", "inv-1", "inv-2")
    assert super_streams.get("inv").binding_keys == ("0", "1", "2")
    assert app.broker.streams["inv-0"].config.retention_max_bytes == 1000000
    status, _ = await call(app, "PUT", PUT + "keys", json={"binding-keys": "eu, us,,"})
    assert status == 201 and super_streams.get("keys").partitions == ("keys-eu", "keys-us")
    # exchange and bindings as the rest of the API shows a super stream
    status, bindings = await call(app, "GET", "/api/exchanges/%2F/keys/bindings/source")
    assert status == 200 and [b["routing_key"] for b in bindings] == ["eu", "us"]

    for body, reason in (({}, "Must specify partitions or binding keys"),
                         ({"partitions": 2, "binding-keys": "a"},
                          "Specify partitions or binding keys, not both"),
                         ({"partitions": 0}, "The partition number must be greater than 0"),
                         ({"partitions": "many"}, "The partitions must be a number"),
                         ({"partitions": 5000}, "The partition number must not exceed 4096"),
                         ({"binding-keys": " , "},
                          "The number of binding keys must be greater than 0"),
                         ({"partitions": 1, "arguments": {"max-age": "soon"}}, None),
                         ({"partitions": 1}, "already exists")):
        name = "inv" if reason == "already exists" else "bad"
        status, answer = await call(app, "PUT", PUT + name, json=body)
        assert status == 400 and answer["error"] == "bad_request", (body, answer)
        assert reason is None or reason in answer["reason"], (body, answer)
    assert super_streams.find("bad") is None and "bad-0" not in app.broker.streams
    status, _ = await call(app, "PUT", "/api/stream/super-streams/other/x",
                           json={"partitions": 1})
    assert status == 404

    status, _ = await call(app, "DELETE", DELETE + "inv")
    assert status == 204
    assert super_streams.find("inv") is None
    assert not {"inv-0", "inv-1", "inv-2"} & set(app.broker.streams)
    status, answer = await call(app, "DELETE", DELETE + "inv")
    assert status == 404 and answer["error"] == "Object Not Found"


async def _secured(tmp_path, *alice_rules: tuple[str, str]):
    """An App with authorization on: `ops` may do anything, `alice` what ``alice_rules``
    ((pattern, action) pairs) allow; each logs in with its name as password."""
    users = tuple((name, hash_password(name, rounds=4)) for name in ("alice", "ops"))
    rules = (*(("p", "alice", pattern, action) for pattern, action in alice_rules),
             ("p", "ops", "*", "*"))
    return await _app(tmp_path, security=SecurityConfig(users=users, loopback_users=(),
                                                        authz=True, authz_rules=rules))


async def test_super_stream_routes_follow_the_caller_rights(tmp_path):
    app = await _secured(tmp_path, ("a.*", "create"), ("a.*", "publish"), ("a.inv", "consume"))
    alice, ops = basic("alice", "alice"), basic("ops", "ops")
    try:
        status, answer = await call(app, "PUT", PUT + "b.inv", auth=alice,
                                    json={"partitions": 1})
        assert status == 401 and answer["error"] == "not_authorized"
        status, _ = await call(app, "PUT", PUT + "a.no", auth=alice, json={"partitions": 1})
        assert status == 401  # no consume on a.no: RabbitMQ's read on the exchange
        status, _ = await call(app, "PUT", PUT + "a.inv", auth=alice, json={"partitions": 2})
        assert status == 201
        assert app.broker.streams["a.inv-0"].config.owner == "alice"
        status, _ = await call(app, "DELETE", DELETE + "a.inv", auth=alice)
        assert status == 401  # alice may create, not delete
        assert app.rabbitmq_stream.super_streams.find("a.inv") is not None
        status, _ = await call(app, "DELETE", DELETE + "a.inv", auth=ops)
        assert status == 204
    finally:
        await app.stop()


async def _member(port: int, stream: str, group: str, user: str = "guest",
                  **extra: str) -> Consumer:
    consumer = Consumer("127.0.0.1", port, username=user, password=user)
    await consumer.start()

    async def on_update(active, ctx):
        return OffsetSpecification(OffsetType.FIRST, 0)
    await consumer.subscribe(stream, lambda msg, ctx: None, properties={
        "single-active-consumer": "true", "name": group, **extra},
        consumer_update_listener=on_update)
    return consumer


async def test_consumer_groups(app):  # noqa: F811
    port = app.rabbitmq_stream.port
    status, answer = await call(app, "GET", GROUPS)
    assert status == 200 and answer == []
    async with Producer("127.0.0.1", port, username="guest", password="guest") as producer:
        await producer.create_stream("s1")
    assert (await call(app, "PUT", PUT + "ss", json={"partitions": 2}))[0] == 201
    members = [await _member(port, "s1", "g"), await _member(port, "s1", "g"),
               await _member(port, "ss-1", "g", **{"super-stream": "ss"})]
    try:
        status, groups = await call(app, "GET", GROUPS + "/%2F")
        assert status == 200 and groups == [
            {"vhost": "/", "stream": "s1", "reference": "g", "partition_index": -1,
             "consumers": 2},
            {"vhost": "/", "stream": "ss-1", "reference": "g", "partition_index": 1,
             "consumers": 1}]
        assert (await call(app, "GET", GROUPS))[1] == groups
        status, group = await call(app, "GET", GROUPS + "/%2F/s1/g")
        assert status == 200
        assert [c["state"] for c in group["consumers"]] == ["active", "inactive"]
        status, conns = await call(app, "GET", "/api/stream/consumers/%2F/s1")
        by_id = {c["connection_details"]["name"] for c in conns}
        assert {c["connection_name"] for c in group["consumers"]} == by_id
        assert len(by_id) == 2
        assert (await call(app, "GET", GROUPS + "/%2F/s1/nope"))[0] == 404
        assert (await call(app, "GET", GROUPS + "/other"))[0] == 404
        # paged as every listing
        status, page = await call(app, "GET", GROUPS + "?page=1&page_size=1")
        assert status == 200 and page["total_count"] == 2 and len(page["items"]) == 1
    finally:
        for consumer in members:
            await consumer.close()
    status, answer = await call(app, "GET", GROUPS)
    assert answer == []


async def test_consumer_groups_show_what_the_caller_may_see(tmp_path):
    app = await _secured(tmp_path, ("a.*", "*"))
    port = app.rabbitmq_stream.port
    try:
        async with Producer("127.0.0.1", port, username="ops", password="ops") as producer:
            await producer.create_stream("a.s")
            await producer.create_stream("secret")
        members = [await _member(port, "a.s", "g", "ops"), await _member(port, "a.s", "g",
                                                                         "alice"),
                   await _member(port, "secret", "g", "ops")]
        try:
            status, groups = await call(app, "GET", GROUPS, auth=basic("alice", "alice"))
            assert status == 200 and [g["stream"] for g in groups] == ["a.s"]
            status, group = await call(app, "GET", GROUPS + "/%2F/a.s/g",
                                       auth=basic("alice", "alice"))
            # ops' connection is not alice's to see: its name is left out
            assert [bool(c["connection_name"]) for c in group["consumers"]] == [False, True]
            assert (await call(app, "GET", GROUPS + "/%2F/secret/g",
                               auth=basic("alice", "alice")))[0] == 404
            status, groups = await call(app, "GET", GROUPS, auth=basic("ops", "ops"))
            assert [g["stream"] for g in groups] == ["a.s", "secret"]
        finally:
            for consumer in members:
                await consumer.close()
    finally:
        await app.stop()


async def test_restart_is_for_administrators(tmp_path):
    """POST /api/riverlog/stream/queues/{vhost}/{name}/restart (riverlog ctl restart_stream):
    an administrator gets 200 and the node, the stream's subscriber a MetadataUpdate (0x06);
    another user, even one allowed everything on the stream, 403 and nothing happens; a
    stream or virtual host that does not exist 404."""
    from compat._raw import RawPeer
    from riverlog.protocol.rabbitmq_stream import ResponseCode
    from riverlog.protocol.rabbitmq_stream import frames as f
    from riverlog.protocol.rabbitmq_stream.constants import OffsetType as Offset
    app = await _secured(tmp_path, ("a.*", "*"))
    restart = "/api/riverlog/stream/queues/%2F/a.s/restart"
    peer = await RawPeer.open("127.0.0.1", app.rabbitmq_stream.port, "alice", "alice")
    try:
        for frame in (f.Create(peer.next_corr(), "a.s", {}),
                      f.Subscribe(peer.next_corr(), 1, "a.s", Offset.FIRST, None, 1)):
            assert (await peer.request(frame)).response_code == ResponseCode.OK
        status, answer = await call(app, "POST", restart, auth=basic("alice", "alice"))
        assert status == 403 and answer["error"] == "not_authorized"
        assert [len(c.subscriptions) for c in app.rabbitmq_stream.connections] == [1]
        status, answer = await call(app, "POST", restart, auth=basic("ops", "ops"))
        assert status == 200 and answer["leader"].startswith("rabbit@")
        assert await peer.recv_until(f.MetadataUpdate) == f.MetadataUpdate(
            ResponseCode.STREAM_NOT_AVAILABLE, "a.s")
        assert [len(c.subscriptions) for c in app.rabbitmq_stream.connections] == [0]
        for path in ("/api/riverlog/stream/queues/%2F/none/restart",
                     "/api/riverlog/stream/queues/other/a.s/restart"):
            assert (await call(app, "POST", path, auth=basic("ops", "ops")))[0] == 404
    finally:
        peer.writer.close()
        await app.stop()
