"""Virtual hosts (issue 30 item 1), over real HTTP and rstream to a running App: RabbitMQ's
/api/vhosts routes, bodies and status codes (rabbit_mgmt_wm_vhost), administrators only for
changes, every change logged, kept in DATA/access.json across a restart; Open of an existing
virtual host, 0x0c for a missing one; the same stream name in two virtual hosts is two
streams; deleting a virtual host closes its connections and deletes its streams."""
from __future__ import annotations

import asyncio
import json
import logging
import os

import pytest
from rstream import (AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer,
                     amqp_decoder)
from rstream.exceptions import VirtualHostAccessFailure

from riverlog.server.runtime_access import ACCESS_FILE
from riverlog.vhost_names import internal
from server.test_management import _app, basic, call, eventually
from server.test_management_users import app  # noqa: F401 (a fixture: one App, no gRPC)

pytestmark = pytest.mark.timeout(120)


def _producer(app, vhost: str, **kwargs) -> Producer:
    return Producer("127.0.0.1", app.rabbitmq_stream.port, username="guest",
                    password="guest", vhost=vhost, **kwargs)


async def _read_all(app, vhost: str, stream: str, count: int) -> list[bytes]:
    """The first ``count`` message bodies of ``stream`` in ``vhost`` (rstream Consumer)."""
    got: list[bytes] = []
    consumer = Consumer("127.0.0.1", app.rabbitmq_stream.port, username="guest",
                        password="guest", vhost=vhost)
    await consumer.start()
    try:
        async def on_message(msg, ctx):
            got.append(bytes(msg.body) if hasattr(msg, "body") else bytes(msg))
        await consumer.subscribe(stream, on_message, decoder=amqp_decoder,
                                 offset_specification=ConsumerOffsetSpecification(
                                     OffsetType.FIRST))
        await eventually(lambda: asyncio.sleep(0, len(got) >= count))
        await asyncio.sleep(0.2)  # nothing more comes
    finally:
        await consumer.close()
    return got


async def test_vhost_routes_shapes_codes_and_log(app, caplog):
    caplog.set_level(logging.INFO, "riverlog.management")
    status, listed = await call(app, "GET", "/api/vhosts")
    assert status == 200 and [v["name"] for v in listed] == ["/"]
    assert listed[0]["description"] == "Default virtual host"
    assert (await call(app, "GET", "/api/vhosts/v1"))[0] == 404
    assert (await call(app, "PUT", "/api/vhosts/v1",
                       json={"description": "first", "tags": "a,b"}))[0] == 201
    assert (await call(app, "PUT", "/api/vhosts/v1", json={"description": "again"}))[0] == 204
    assert (await call(app, "PUT", "/api/vhosts/v2"))[0] == 201  # no body at all
    status, v1 = await call(app, "GET", "/api/vhosts/v1")
    assert status == 200
    assert {k: v1[k] for k in ("name", "description", "tags", "default_queue_type")} == {
        "name": "v1", "description": "again", "tags": [], "default_queue_type": "stream"}
    assert [v["name"] for v in (await call(app, "GET", "/api/vhosts"))[1]] == ["/", "v1", "v2"]
    # bad names and bodies: 400 with RabbitMQ's body
    for path, body in (("/api/vhosts/a%01b", {}), ("/api/vhosts/" + "n" * 256, {}),
                       ("/api/vhosts/x", {"tags": 5}), ("/api/vhosts/x", [1]),
                       ("/api/vhosts/x", {"description": 5})):
        status, answer = await call(app, "PUT", path, json=body)
        assert status == 400 and answer["error"] == "bad_request", (path, body, answer)
    assert (await call(app, "DELETE", "/api/vhosts/%2F"))[0] == 400
    assert (await call(app, "DELETE", "/api/vhosts/nowhere"))[0] == 404
    # only an administrator changes them; without credentials 401
    assert (await call(app, "PUT", "/api/users/mo", json={"password": "mo-pw",
                                                          "tags": "monitoring"}))[0] == 201
    mo = basic("mo", "mo-pw")
    assert (await call(app, "PUT", "/api/vhosts/v3", auth=mo))[0] == 403
    assert (await call(app, "DELETE", "/api/vhosts/v1", auth=mo))[0] == 403
    assert (await call(app, "PUT", "/api/vhosts/v3", auth={}))[0] == 401
    assert (await call(app, "DELETE", "/api/vhosts/v2"))[0] == 204
    assert [v["name"] for v in (await call(app, "GET", "/api/vhosts"))[1]] == ["/", "v1"]
    assert "virtual host 'v1' created by 'guest'" in caplog.text
    assert "virtual host 'v2' deleted by 'guest'" in caplog.text


async def test_permissions_on_any_existing_vhost(app):
    assert (await call(app, "PUT", "/api/users/al", json={"password": "p"}))[0] == 201
    body = {"configure": ".*", "write": ".*", "read": ".*"}
    assert (await call(app, "PUT", "/api/permissions/v1/al", json=body))[0] == 400  # no vhost
    assert (await call(app, "PUT", "/api/vhosts/v1"))[0] == 201
    assert (await call(app, "PUT", "/api/permissions/v1/al", json=body))[0] == 201
    expected = {"user": "al", "vhost": "v1", **body}
    assert (await call(app, "GET", "/api/permissions/v1/al")) == (200, expected)
    assert (await call(app, "GET", "/api/permissions/%2F/al"))[0] == 404
    assert (await call(app, "GET", "/api/vhosts/v1/permissions"))[1] == [expected]
    assert (await call(app, "GET", "/api/users/al/permissions"))[1] == [expected]
    # deleting the vhost takes its permissions along
    assert (await call(app, "DELETE", "/api/vhosts/v1"))[0] == 204
    assert (await call(app, "GET", "/api/permissions"))[1] == []


async def test_vhosts_survive_a_restart(tmp_path):
    app = await _app(tmp_path)
    try:
        assert (await call(app, "PUT", "/api/vhosts/kept",
                           json={"description": "d"}))[0] == 201
    finally:
        await app.stop()
    with open(os.path.join(str(tmp_path / "data"), ACCESS_FILE)) as f:
        assert [v["name"] for v in json.load(f)["vhosts"]] == ["kept"]
    app = await _app(tmp_path)
    try:
        status, kept = await call(app, "GET", "/api/vhosts/kept")
        assert status == 200 and kept["description"] == "d"
    finally:
        await app.stop()


async def test_open_missing_vhost_is_refused(app):
    with pytest.raises(VirtualHostAccessFailure):  # rstream's for code 0x0c
        async with _producer(app, "nowhere") as producer:
            await producer.create_stream("s")


async def test_same_name_in_two_vhosts_is_two_streams(app):
    assert (await call(app, "PUT", "/api/vhosts/v1"))[0] == 201
    async with _producer(app, "/") as root, _producer(app, "v1") as v1:
        await root.create_stream("s")
        await v1.create_stream("s")
        await v1.create_stream("only-v1")
        await root.send_wait("s", AMQPMessage(body=b"in-root"))
        await v1.send_wait("s", AMQPMessage(body=b"in-v1"))
        await v1.send_wait("s", AMQPMessage(body=b"in-v1-again"))
        assert (await root.stream_exists("only-v1")) is False
        assert (await v1.stream_exists("only-v1")) is True
        # stored offsets are per stream, so per virtual host too
        await v1.delete_stream("only-v1")
    assert await _read_all(app, "/", "s", 1) == [b"in-root"]
    assert await _read_all(app, "v1", "s", 2) == [b"in-v1", b"in-v1-again"]
    # the queue listings name the virtual host
    status, queues = await call(app, "GET", "/api/queues")
    assert status == 200
    assert sorted((q["vhost"], q["name"]) for q in queues) == [("/", "s"), ("v1", "s")]
    assert [q["vhost"] for q in (await call(app, "GET", "/api/queues/v1"))[1]] == ["v1"]
    status, one = await call(app, "GET", "/api/queues/v1/s")
    assert status == 200 and one["vhost"] == "v1" and one["messages"] == 2
    assert (await call(app, "GET", "/api/queues/nowhere"))[0] == 404


async def test_deleting_a_vhost_closes_connections_and_deletes_streams(app):
    assert (await call(app, "PUT", "/api/vhosts/doomed"))[0] == 201
    closed = asyncio.Event()
    async with _producer(app, "/") as root:
        await root.create_stream("s")
        async with _producer(app, "doomed", on_close_handler=lambda *a: closed.set()) as gone:
            await gone.create_stream("s")
            await gone.send_wait("s", AMQPMessage(body=b"x"))
            assert sorted(app.broker.streams) == sorted(["s", internal("doomed", "s")])
            status, conns = await call(app, "GET", "/api/connections")
            assert "doomed" in [c["vhost"] for c in conns]
            status, conns = await call(app, "GET", "/api/vhosts/doomed/connections")
            assert conns and {c["vhost"] for c in conns} == {"doomed"}
            assert (await call(app, "GET", "/api/vhosts/nowhere/connections"))[0] == 404
            assert (await call(app, "DELETE", "/api/vhosts/doomed"))[0] == 204
            await asyncio.wait_for(closed.wait(), 30)
        assert await root.stream_exists("s")
    assert sorted(app.broker.streams) == ["s"]
    assert (await call(app, "GET", "/api/vhosts/doomed"))[0] == 404
    status, conns = await call(app, "GET", "/api/connections")
    assert [c["vhost"] for c in conns] == []


async def test_consumer_groups_name_their_vhost(app):
    """A single active consumer group on v1's stream `s` is listed as v1's, under `s`, and
    found through /api/riverlog/stream/consumer-groups/v1/s/g only."""
    assert (await call(app, "PUT", "/api/vhosts/v1"))[0] == 201
    async with _producer(app, "v1") as producer:
        await producer.create_stream("s")
    consumer = Consumer("127.0.0.1", app.rabbitmq_stream.port, username="guest",
                        password="guest", vhost="v1")
    await consumer.start()
    try:
        async def on_update(active, ctx):
            return ConsumerOffsetSpecification(OffsetType.FIRST)
        await consumer.subscribe("s", lambda msg, ctx: None, properties={
            "single-active-consumer": "true", "name": "g"}, consumer_update_listener=on_update)
        groups = "/api/riverlog/stream/consumer-groups"
        expected = [{"vhost": "v1", "stream": "s", "reference": "g", "partition_index": -1,
                     "consumers": 1}]
        assert (await call(app, "GET", groups))[1] == expected
        assert (await call(app, "GET", groups + "/v1"))[1] == expected
        assert (await call(app, "GET", groups + "/%2F"))[1] == []
        status, one = await call(app, "GET", groups + "/v1/s/g")
        assert status == 200 and one["vhost"] == "v1" and len(one["consumers"]) == 1
        assert (await call(app, "GET", groups + "/%2F/s/g"))[0] == 404
        status, consumers = await call(app, "GET", "/api/stream/consumers/v1/s")
        assert status == 200 and [c["queue"] for c in consumers] == [
            {"name": "s", "vhost": "v1"}]
        assert (await call(app, "GET", "/api/stream/consumers/%2F/s"))[1] == []
    finally:
        await consumer.close()


async def test_super_streams_and_exchanges_of_a_vhost(app):
    assert (await call(app, "PUT", "/api/vhosts/v1"))[0] == 201
    path = "/api/stream/super-streams/v1/ss"
    assert (await call(app, "PUT", path, json={"partitions": 2}))[0] == 201
    assert sorted(app.broker.streams) == [internal("v1", "ss-0"), internal("v1", "ss-1")]
    status, exchange = await call(app, "GET", "/api/exchanges/v1/ss")
    assert status == 200 and (exchange["name"], exchange["vhost"]) == ("ss", "v1")
    assert (await call(app, "GET", "/api/exchanges/%2F/ss"))[0] == 404
    status, bindings = await call(app, "GET", "/api/exchanges/v1/ss/bindings/source")
    assert [(b["vhost"], b["source"], b["destination"]) for b in bindings] == [
        ("v1", "ss", "ss-0"), ("v1", "ss", "ss-1")]
    # the same name on / is another super stream
    assert (await call(app, "PUT", "/api/stream/super-streams/%2F/ss",
                       json={"partitions": 1}))[0] == 201
    assert (await call(app, "DELETE", "/api/riverlog/stream/super-streams/v1/ss"))[0] == 204
    assert sorted(app.broker.streams) == ["ss-0"]
    assert (await call(app, "GET", "/api/exchanges/v1/ss"))[0] == 404
    # exchanges and bindings declared one by one, in the vhost
    assert (await call(app, "PUT", "/api/queues/v1/p0"))[0] == 201
    assert (await call(app, "PUT", "/api/exchanges/v1/e"))[0] == 201
    status, _ = await call(app, "POST", "/api/bindings/v1/e/e/q/p0", json={
        "routing_key": "k", "arguments": {"x-stream-partition-order": 0}})
    assert status == 201
    status, bindings = await call(app, "GET", "/api/exchanges/v1/e/bindings/source")
    assert [(b["destination"], b["routing_key"]) for b in bindings] == [("p0", "k")]
    assert (await call(app, "POST", "/api/bindings/%2F/e/e/q/p0", json={}))[0] == 404
