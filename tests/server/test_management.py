"""The management HTTP API of a running App, over real HTTP (aiohttp's client) while real
clients work: rstream on the RabbitMQ Stream door, riverlog's gRPC stub on the Liftbridge API.
Shapes and status codes are RabbitMQ 3.13's (deps/rabbitmq_management,
deps/rabbitmq_stream_management); each answer shows only what its caller may see."""
from __future__ import annotations

import asyncio
import base64
import logging
import socket
from urllib.parse import quote

import aiohttp
import grpc
import pytest
from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer

from compat._raw import RawPeer
from riverlog.config import (GrpcConfig, LogConfig, ManagementConfig, RabbitStreamConfig,
                             SecurityConfig, ServerConfig)
from riverlog.config_file import build
from riverlog.protocol.rabbitmq_stream import frames as f
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.api_pb2_grpc import APIStub
from riverlog.security.users import hash_password
from riverlog.server.app import App
from riverlog.server.management import ManagementServer

pytestmark = pytest.mark.timeout(120)


def basic(user: str, password: str) -> dict[str, str]:
    """The Authorization header of HTTP basic auth (RFC 7617)."""
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


GUEST = basic("guest", "guest")


async def _app(tmp_path, **kwargs) -> App:
    config = ServerConfig(data_dir=str(tmp_path / "data"), log=LogConfig(),
                          rabbitmq_stream=RabbitStreamConfig(port=0),
                          management=ManagementConfig(port=0), **kwargs)
    app = App(config)
    await app.start()
    return app


@pytest.fixture
async def app(tmp_path):
    app = await _app(tmp_path, grpc=GrpcConfig(port=0))
    yield app
    await app.stop()


async def call(app: App, method: str, path: str, auth=GUEST, **kwargs):
    """(status, JSON body or None) of one request to ``app``'s management port."""
    async with aiohttp.ClientSession(headers=auth) as session:
        async with session.request(method, f"http://127.0.0.1:{app.management.port}{path}",
                                   **kwargs) as resp:
            body = await resp.read()
            return resp.status, (await resp.json(content_type=None) if body else None)


async def eventually(check, timeout: float = 30.0):
    """Poll ``check`` (async, returns a truthy value when done) until it holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = await check()
        if result:
            return result
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.05)


def _port(app: App) -> int:
    return app.rabbitmq_stream.port


async def test_connections_publishers_consumers(app):
    port = _port(app)
    async with Producer("127.0.0.1", port, username="guest", password="guest",
                        connection_name="orders-producer") as producer:
        await producer.create_stream("orders", arguments={"max-age": "1h"})
        for i in range(7):
            await producer.send_wait("orders", b"m%d" % i)
        consumer = Consumer("127.0.0.1", port, username="guest", password="guest",
                            connection_name="orders-consumer")
        await consumer.start()
        got = []

        async def on_message(msg, ctx):
            got.append(ctx.offset)
        await consumer.subscribe("orders", on_message, properties={"identifier": "c-1"},
                                 offset_specification=ConsumerOffsetSpecification(
                                     OffsetType.OFFSET, 2))
        await eventually(lambda: asyncio.sleep(0, len(got) == 5))
        try:
            status, conns = await call(app, "GET", "/api/stream/connections")
            assert status == 200
            by_name = {c["client_properties"].get("connection_name"): c for c in conns}
            producer_conn = by_name["orders-producer"]
            assert producer_conn["user_provided_name"] == "orders-producer"
            assert producer_conn["protocol"] == "stream" and producer_conn["user"] == "guest"
            assert producer_conn["vhost"] == "/" and producer_conn["port"] == port
            assert producer_conn["name"] == (f"127.0.0.1:{producer_conn['peer_port']} -> "
                                             f"127.0.0.1:{port}")
            assert (await call(app, "GET", "/api/connections"))[1] == conns

            status, pubs = await call(app, "GET", "/api/stream/publishers/%2F/orders")
            assert status == 200 and len(pubs) == 1
            pub = pubs[0]
            assert pub["queue"] == {"name": "orders", "vhost": "/"}
            assert pub["messages_published"] == pub["messages_confirmed"] == 7
            assert pub["messages_errored"] == 0
            assert pub["connection_details"]["name"] == producer_conn["name"]

            status, subs = await call(app, "GET", "/api/stream/consumers/%2F/")
            assert status == 200 and len(subs) == 1
            sub = subs[0]
            assert sub["properties"]["identifier"] == "c-1"
            assert sub["messages_consumed"] == 5 and sub["offset"] == 7
            assert sub["offset_lag"] == 0 and sub["active"] is True
            assert sub["connection_details"]["name"] == by_name["orders-consumer"]["name"]
            assert (await call(app, "GET", "/api/stream/consumers/%2F/orders"))[1] == subs
            assert (await call(app, "GET", "/api/stream/consumers/%2F/other"))[1] == []

            path = f"/api/stream/connections/%2F/{quote(producer_conn['name'])}"
            status, one = await call(app, "GET", path)
            assert status == 200 and one["name"] == producer_conn["name"]
            assert (await call(app, "GET", path + "/publishers"))[1] == pubs
            assert (await call(app, "GET", path + "/consumers"))[1] == []
            assert (await call(app, "GET", "/api/connections/nope"))[0] == 404

            status, queue = await call(app, "GET", "/api/queues/%2F/orders")
            assert status == 200
            assert queue["type"] == "stream" and queue["messages"] == 7
            assert queue["consumers"] == 1 and queue["segments"] == 1
            assert queue["arguments"] == {"x-queue-type": "stream", "x-max-age": "1h"}
            assert queue["leader"] == queue["node"] and queue["members"] == [queue["node"]]
        finally:
            await consumer.close()


async def test_close_connection_with_reason(app, caplog):
    closed = asyncio.Event()
    async with Producer("127.0.0.1", _port(app), username="guest", password="guest",
                        connection_name="doomed", on_close_handler=lambda *a: closed.set()
                        ) as producer:
        await producer.create_stream("s")
        await producer.send_wait("s", b"x")  # rstream connects its producer on first use
        status, conns = await call(app, "GET", "/api/connections")
        name = next(c["name"] for c in conns
                    if c["client_properties"].get("connection_name") == "doomed")
        with caplog.at_level(logging.INFO, "riverlog.management"):
            status, _ = await call(app, "DELETE", f"/api/connections/{quote(name)}",
                                   headers={"X-Reason": "maintenance"})
        assert status == 204
        assert f"{name} closing: maintenance" in caplog.text

        async def gone():
            _, conns = await call(app, "GET", "/api/connections")
            return name not in [c["name"] for c in conns]
        await eventually(gone)
        await asyncio.wait_for(closed.wait(), 30)
        assert (await call(app, "DELETE", f"/api/connections/{quote(name)}"))[0] == 404


async def test_a_connection_in_its_close_exchange_is_not_listed(app):
    """After a client's Close the door lingers (up to 1 s) for the client to hang up; it is
    gone for RabbitMQ once its reader stops, so it is not listed (the Node suite's
    closeAllConnections got 404s closing such connections)."""
    peer = await RawPeer.open("127.0.0.1", _port(app))
    try:
        status, conns = await call(app, "GET", "/api/connections")
        assert len(conns) == 1
        response = await peer.request(f.Close(peer.next_corr(), 0, "bye"))
        assert isinstance(response, f.CloseResponse)
        assert len(app.rabbitmq_stream.connections) == 1  # the socket is still open
        assert (await call(app, "GET", "/api/connections"))[1] == []
        assert (await call(app, "DELETE", f"/api/connections/{quote(conns[0]['name'])}")
                )[0] == 404
    finally:
        peer.close()


async def test_queues_created_and_deleted_over_http_and_liftbridge_streams(app):
    body = {"durable": True, "arguments": {"x-queue-type": "stream", "x-max-age": "2h",
                                           "x-max-length-bytes": 1000000}}
    assert (await call(app, "PUT", "/api/queues/%2F/q1", json=body))[0] == 201
    assert (await call(app, "PUT", "/api/queues/%2F/q1", json=body))[0] == 204
    status, error = await call(app, "PUT", "/api/queues/%2F/q2",
                               json={"arguments": {"x-queue-type": "classic"}})
    assert status == 400 and error["error"] == "bad_request"
    status, queue = await call(app, "GET", "/api/queues/%2F/q1")
    assert queue["arguments"] == {"x-queue-type": "stream", "x-max-age": "2h",
                                  "x-max-length-bytes": 1000000}
    assert queue["messages"] == 0
    assert "q1" in app.broker.streams

    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
        await APIStub(channel).CreateStream(pb.CreateStreamRequest(
            name="lb", subject="lb.subject", partitions=2), timeout=10)
    status, queues = await call(app, "GET", "/api/queues")
    by_name = {q["name"]: q for q in queues}
    assert set(by_name) == {"q1", "lb-0", "lb-1"}
    assert by_name["lb-1"]["subject"] == "lb.subject" and by_name["lb-1"]["partition"] == 1
    assert by_name["lb-0"]["arguments"] == {"x-queue-type": "stream"}
    status, exchange = await call(app, "GET", "/api/exchanges/%2F/lb")
    assert status == 200 and exchange["type"] == "direct"
    status, bindings = await call(app, "GET", "/api/exchanges/%2F/lb/bindings/source")
    assert [(b["destination"], b["routing_key"]) for b in bindings] == [("lb-0", "0"),
                                                                        ("lb-1", "1")]
    assert (await call(app, "GET", "/api/exchanges/%2F/q1"))[0] == 404
    for name, listed in by_name.items():  # one queue: what the listing says, found alone
        assert await call(app, "GET", f"/api/queues/%2F/{name}") == (200, listed)
    for name in ("lb", "lb-2", "q1-0", "__cursors", "nope"):
        assert (await call(app, "GET", f"/api/queues/%2F/{name}"))[0] == 404, name

    assert (await call(app, "DELETE", "/api/queues/%2F/q1"))[0] == 204
    assert "q1" not in app.broker.streams
    assert (await call(app, "DELETE", "/api/queues/%2F/q1"))[0] == 404
    assert (await call(app, "GET", "/api/queues/%2F/q1"))[0] == 404
    assert (await call(app, "GET", "/api/queues/other/lb-0"))[0] == 404


async def test_super_stream_declared_as_exchange_and_bindings(app):
    """As the Node client's test helper builds one: a direct exchange, stream queues, one
    binding per partition with x-stream-partition-order; then the door routes by key."""
    assert (await call(app, "PUT", "/api/exchanges/%2F/sup", json={
        "type": "direct", "durable": True,
        "arguments": {"x-super-stream-enabled": "true"}}))[0] == 201
    assert (await call(app, "PUT", "/api/exchanges/%2F/sup", json={}))[0] == 204
    for i in (2, 1, 0):  # the Node helper binds in parallel: any order may arrive
        assert (await call(app, "PUT", f"/api/queues/%2F/sup-{i}", json={
            "durable": True, "arguments": {"x-queue-type": "stream"}}))[0] == 201
        status, _ = await call(app, "POST", f"/api/bindings/%2F/e/sup/q/sup-{i}", json={
            "routing_key": f"k{i}", "arguments": {"x-stream-partition-order": i}})
        assert status == 201
    assert (await call(app, "POST", "/api/bindings/%2F/e/sup/q/nope",
                       json={"routing_key": "x"}))[0] == 404
    assert (await call(app, "POST", "/api/bindings/%2F/e/sup/q/sup-0",
                       json={"routing_key": "k0"}))[0] == 400
    status, bindings = await call(app, "GET", "/api/exchanges/%2F/sup/bindings/source")
    assert [(b["destination"], b["routing_key"], b["arguments"]) for b in bindings] == [
        ("sup-0", "k0", {"x-stream-partition-order": 0}),
        ("sup-1", "k1", {"x-stream-partition-order": 1}),
        ("sup-2", "k2", {"x-stream-partition-order": 2})]
    async with Producer("127.0.0.1", _port(app), username="guest", password="guest") as p:
        await p.send_wait("sup-1", b"x")
    super_stream = app.rabbitmq_stream.super_streams.get("sup")
    assert super_stream.route("k1") == ["sup-1"]
    assert super_stream.partitions == ("sup-0", "sup-1", "sup-2")
    assert (await call(app, "DELETE", "/api/exchanges/%2F/sup"))[0] == 204
    assert (await call(app, "GET", "/api/exchanges/%2F/sup"))[0] == 404
    assert (await call(app, "DELETE", "/api/exchanges/%2F/sup"))[0] == 404
    assert {"sup-0", "sup-1", "sup-2"} <= set(app.broker.streams)  # the queues stay, as in RabbitMQ


async def test_overview_whoami_vhosts_nodes(app):
    status, me = await call(app, "GET", "/api/whoami")
    assert status == 200 and me["name"] == "guest" and me["tags"] == ["administrator"]
    status, vhosts = await call(app, "GET", "/api/vhosts")
    assert [v["name"] for v in vhosts] == ["/"]
    status, nodes = await call(app, "GET", "/api/nodes")
    assert len(nodes) == 1 and nodes[0]["running"] is True and nodes[0]["alarms"] == []
    # RabbitMQ's node names carry the host clients reach the node at; the Node client's
    # address resolver tests compare the part after "@" with the host they connected to
    assert nodes[0]["name"] == f"rabbit@{app.rabbitmq_stream.advertised[0]}"
    status, overview = await call(app, "GET", "/api/overview")
    assert overview["node"] == nodes[0]["name"] and overview["alarms"] == []
    assert {"protocol": "stream", "port": _port(app)}.items() <= \
        overview["listeners"][0].items()
    status, error = await call(app, "GET", "/api/overview",
                               auth=basic("guest", "wrong"))
    assert status == 401 and error["error"] == "not_authorized"
    async with aiohttp.ClientSession() as session:  # no credentials: a Basic challenge
        async with session.get(f"http://127.0.0.1:{app.management.port}/api/whoami") as resp:
            assert resp.status == 401 and resp.headers["WWW-Authenticate"].startswith("Basic")


async def test_each_caller_sees_only_what_it_may(tmp_path):
    users = tuple((name, hash_password(name, rounds=4)) for name in ("alice", "ops"))
    rules = (("p", "alice", "a.*", "publish"), ("p", "alice", "a.*", "create"),
             ("p", "ops", "*", "*"))
    app = await _app(tmp_path, security=SecurityConfig(users=users, loopback_users=(),
                                                       authz=True, authz_rules=rules))
    alice, ops = basic("alice", "alice"), basic("ops", "ops")
    try:
        async with Producer("127.0.0.1", _port(app), username="ops", password="ops") as op, \
                Producer("127.0.0.1", _port(app), username="alice",
                         password="alice") as al:
            await op.create_stream("secret")
            await al.create_stream("a.mine")
            await op.send_wait("secret", b"x")
            await al.send_wait("a.mine", b"y")
            status, mine = await call(app, "GET", "/api/connections", auth=alice)
            assert status == 200 and {c["user"] for c in mine} == {"alice"}
            status, every = await call(app, "GET", "/api/connections", auth=ops)
            assert {c["user"] for c in every} == {"alice", "ops"}
            assert [p["queue"]["name"] for p in
                    (await call(app, "GET", "/api/stream/publishers", auth=alice))[1]] == \
                ["a.mine"]
            assert [q["name"] for q in (await call(app, "GET", "/api/queues", auth=alice))[1]] \
                == ["a.mine"]
            assert (await call(app, "GET", "/api/queues/%2F/secret", auth=alice))[0] == 404
            assert (await call(app, "DELETE", "/api/queues/%2F/a.mine", auth=alice))[0] == 401
            assert (await call(app, "PUT", "/api/queues/%2F/secret2", auth=alice,
                               json={"arguments": {}}))[0] == 401
            assert (await call(app, "GET", "/api/whoami", auth=alice))[1]["tags"] == []
            ops_conn = next(c["name"] for c in every if c["user"] == "ops")
            assert (await call(app, "DELETE", f"/api/connections/{quote(ops_conn)}",
                               auth=alice))[0] == 404
            assert "secret" in app.broker.streams and "secret2" not in app.broker.streams
    finally:
        await app.stop()


async def test_a_taken_port(tmp_path):
    """A taken --management-port is a clear error; the default port, when taken, is replaced
    by a free one with a warning."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        app = await _app(tmp_path)
        try:
            with pytest.raises(OSError, match=f"management API on 127.0.0.1:{port}.*"
                                              "--management-port"):
                await ManagementServer(app, ManagementConfig(port=port)).start()
            own = app.management
            app.management = ManagementServer(app, ManagementConfig(port=port,
                                                                     port_fallback=True))
            await app.management.start()
            try:
                assert app.management.port not in (0, port)
                assert (await call(app, "GET", "/api/whoami"))[0] == 200
            finally:
                await app.management.stop()
                app.management = own
        finally:
            await app.stop()


def test_command_line_settings():
    config, _ = build({}, {})
    assert (config.management.host, config.management.port) == ("127.0.0.1", 15672)
    assert config.management.port_fallback
    config, _ = build({}, {"management_port": 0, "management_host": "0.0.0.0"})
    assert (config.management.host, config.management.port) == ("0.0.0.0", 0)
    assert not config.management.port_fallback
    assert build({}, {"no_management": True})[0].management is None
    assert build({"riverlog.management.enabled": False}, {})[0].management is None


async def test_resource_alarms_show_in_nodes_and_overview(app):
    """An alarm in force is listed as RabbitMQ lists it ({"node", "resource"}) and flags the
    node (mem_alarm); it is gone from both once it clears."""
    from riverlog.config import AlarmConfig, Threshold
    alarms = app.broker.alarms
    alarms.config = AlarmConfig(memory_high_watermark=Threshold(1))  # 1 byte: always over
    alarms.check()
    assert alarms.raised == {"memory"}
    status, nodes = await call(app, "GET", "/api/nodes")
    assert status == 200 and nodes[0]["mem_alarm"] is True and not nodes[0]["disk_free_alarm"]
    assert nodes[0]["alarms"] == [{"node": nodes[0]["name"], "resource": "memory"}]
    status, overview = await call(app, "GET", "/api/overview")
    assert overview["alarms"] == nodes[0]["alarms"]
    alarms.config = AlarmConfig()
    alarms.check()
    status, nodes = await call(app, "GET", "/api/nodes")
    assert nodes[0]["mem_alarm"] is False and nodes[0]["alarms"] == []


async def test_a_failed_start_leaves_no_alarm_task(tmp_path):
    """App.start with a taken explicit --management-port raises, and the resource alarms'
    periodic check started just before the management API is stopped with the rest."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        app = App(ServerConfig(data_dir=str(tmp_path / "data"), log=LogConfig(),
                               rabbitmq_stream=RabbitStreamConfig(port=0),
                               management=ManagementConfig(port=port)))
        with pytest.raises(OSError, match=f"management API on 127.0.0.1:{port}"):
            await app.start()
    alarms = app.broker.alarms
    left = [t for t in asyncio.all_tasks() if not t.done()
            and getattr(t.get_coro(), "cr_frame", None) is not None
            and t.get_coro().cr_frame.f_locals.get("self") is alarms]
    assert left == []


async def test_queues_declared_over_http_count_against_the_callers_stream_limit(tmp_path):
    """The per-user stream limit holds on PUT /api/queues as on the doors: the stream is
    owned by the caller and one past the limit is refused with 400 and the reason."""
    users = (("alice", hash_password("alice", rounds=4)),)
    app = await _app(tmp_path, security=SecurityConfig(
        users=users, loopback_users=(), max_streams_per_user=2))
    alice = basic("alice", "alice")
    try:
        for name in ("a1", "a2"):
            assert (await call(app, "PUT", f"/api/queues/%2F/{name}", auth=alice,
                               json={"arguments": {}}))[0] == 201
        assert app.broker.owned("alice") == 2
        assert app.broker.streams["a1"].config.owner == "alice"
        status, error = await call(app, "PUT", "/api/queues/%2F/a3", auth=alice,
                                   json={"arguments": {}})
        assert status == 400 and error["error"] == "bad_request"
        assert "limit of 2 per user" in error["reason"]
        assert "a3" not in app.broker.streams
        assert (await call(app, "DELETE", "/api/queues/%2F/a1", auth=alice))[0] == 204
        assert (await call(app, "PUT", "/api/queues/%2F/a3", auth=alice,
                           json={"arguments": {}}))[0] == 201
    finally:
        await app.stop()


async def test_reserved_streams_cannot_be_declared_or_deleted_over_http(tmp_path):
    """__cursors and __activity are the server's own: PUT and DELETE are refused with 400
    naming the reserved stream, and the cursors stream stays."""
    app = await _app(tmp_path, grpc=GrpcConfig(port=0))
    try:
        for name in ("__cursors", "__activity"):
            status, error = await call(app, "PUT", f"/api/queues/%2F/{name}",
                                       json={"arguments": {}})
            assert status == 400 and "reserved" in error["reason"], (name, error)
            status, error = await call(app, "DELETE", f"/api/queues/%2F/{name}")
            assert status == 400 and "reserved" in error["reason"], (name, error)
    finally:
        await app.stop()


async def test_listings_log_no_denial_for_the_streams_left_out(tmp_path, caplog):
    """A non-administrator's /api/queues and /api/overview over many streams it cannot see
    answer its own streams only and log no "denied" line per stream left out (each was ~5
    casbin checks, each denial logged at INFO); an administrator sees them all."""
    users = tuple((name, hash_password(name, rounds=4)) for name in ("alice", "ops"))
    rules = (("p", "alice", "a.*", "publish"), ("p", "ops", "*", "*"))
    app = await _app(tmp_path, security=SecurityConfig(users=users, loopback_users=(),
                                                       authz=True, authz_rules=rules))
    others = [f"other-{i:03d}" for i in range(300)]  # more than queues.YIELD_EVERY
    try:
        for name in others + ["a.mine"]:
            app.broker.create(name)
        with caplog.at_level(logging.INFO, "riverlog.security"):
            status, listed = await call(app, "GET", "/api/queues", auth=basic("alice", "alice"))
            assert status == 200 and [q["name"] for q in listed] == ["a.mine"]
            status, overview = await call(app, "GET", "/api/overview",
                                          auth=basic("alice", "alice"))
            assert status == 200 and overview["object_totals"]["queues"] == 1
            status, listed = await call(app, "GET", "/api/queues", auth=basic("ops", "ops"))
            assert status == 200 and len(listed) == len(others) + 1
        assert [r.getMessage() for r in caplog.records if "denied" in r.getMessage()] == []
    finally:
        await app.stop()


async def test_binding_needs_a_right_on_the_bound_stream(tmp_path):
    """POST bindings wants, besides `create` on the super stream, `publish` (or `create`) on
    the stream bound, as RabbitMQ wants write on the destination queue: a stream the caller
    cannot see is 404, one it sees but may not write is 401; nothing is bound."""
    users = tuple((name, hash_password(name, rounds=4)) for name in ("alice", "ops"))
    rules = (("p", "alice", "sup", "create"), ("p", "alice", "mine", "publish"),
             ("p", "alice", "readable", "consume"), ("p", "ops", "*", "*"))
    app = await _app(tmp_path, security=SecurityConfig(users=users, loopback_users=(),
                                                       authz=True, authz_rules=rules))
    alice = basic("alice", "alice")
    try:
        for name in ("secret", "readable", "mine"):
            app.broker.create(name)
        assert (await call(app, "PUT", "/api/exchanges/%2F/sup", auth=alice, json={}))[0] == 201
        status, error = await call(app, "POST", "/api/bindings/%2F/e/sup/q/secret", auth=alice,
                                   json={"routing_key": "s"})
        assert status == 404 and error["error"] == "Object Not Found"
        status, error = await call(app, "POST", "/api/bindings/%2F/e/sup/q/readable",
                                   auth=alice, json={"routing_key": "r"})
        assert status == 401 and error["error"] == "not_authorized"
        assert (await call(app, "POST", "/api/bindings/%2F/e/sup/q/mine", auth=alice,
                           json={"routing_key": "m"}))[0] == 201
        assert app.rabbitmq_stream.super_streams.get("sup").partitions == ("mine",)
    finally:
        await app.stop()


async def test_numbers_json_allows_but_no_integer_holds_are_400(app):
    """JSON as Python reads it takes Infinity and NaN; a binding order or a queue argument
    that is one is 400 bad_request, not a 500 with a traceback."""
    assert (await call(app, "PUT", "/api/exchanges/%2F/sup", json={}))[0] == 201
    assert (await call(app, "PUT", "/api/queues/%2F/sup-0", json={"arguments": {}}))[0] == 201
    for number in ("Infinity", "-Infinity", "NaN", "1e999"):
        status, error = await call(
            app, "POST", "/api/bindings/%2F/e/sup/q/sup-0",
            data='{"routing_key": "k", "arguments": {"x-stream-partition-order": %s}}' % number,
            headers={"Content-Type": "application/json"})
        assert status == 400 and error["error"] == "bad_request", (number, status, error)
        status, error = await call(
            app, "PUT", "/api/queues/%2F/q", data='{"arguments": {"x-max-length-bytes": %s}}'
            % number, headers={"Content-Type": "application/json"})
        assert status == 400 and error["error"] == "bad_request", (number, status, error)
    assert app.rabbitmq_stream.super_streams.get("sup").partitions == ()
