"""RabbitMQ policies (issue 30: the Java suite's RetentionClientTest "retention defined in
policy should take precedence"), over real HTTP and rstream to a running App: RabbitMQ's
/api/policies routes, bodies, status codes and validation reasons (rabbit_mgmt_wm_policy,
rabbit_policy.erl), administrators and policymakers only; a policy's max-length-bytes and
stream-max-segment-size-bytes win over a stream's own arguments at once (the first offset
moves as retention truncates), clearing it gives the stream its own back; the highest
priority wins, per virtual host, the pattern searched unanchored; kept in DATA/policies.json
across a restart."""
from __future__ import annotations

import json
import os

import pytest
from rstream import AMQPMessage, Producer

from riverlog.server.runtime_policies import POLICIES_FILE
from server.test_management import _app, basic, call, eventually
from server.test_management_users import app  # noqa: F401 (a fixture: one App, no gRPC)

pytestmark = pytest.mark.timeout(120)

GB20 = 20_000_000_000
RETENTION = {"max-length-bytes": 100_000, "stream-max-segment-size-bytes": 50_000}


async def _stream(app, name: str, vhost: str = "%2F") -> None:
    """A stream with the Java test's 20 GB max-length-bytes, created through the API."""
    status, _ = await call(app, "PUT", f"/api/queues/{vhost}/{name}",
                           json={"durable": True,
                                 "arguments": {"x-queue-type": "stream",
                                               "x-max-length-bytes": GB20}})
    assert status in (201, 204)


async def _publish(app, name: str, count: int = 1000, size: int = 1000,
                   vhost: str = "/") -> None:
    """``count`` messages of ``size`` bytes, each batch of 100 confirmed before the next."""
    async with Producer("127.0.0.1", app.rabbitmq_stream.port, username="guest",
                        password="guest", vhost=vhost) as producer:
        for _ in range(count // 100):
            for _ in range(99):
                await producer.send(name, AMQPMessage(body=b"x" * size))
            await producer.send_wait(name, AMQPMessage(body=b"x" * size))


async def _queue(app, name: str, vhost: str = "%2F") -> dict:
    status, queue = await call(app, "GET", f"/api/queues/{vhost}/{name}")
    assert status == 200
    return queue


async def _set(app, name: str, pattern: str, definition: dict, priority: int = 0,
               apply_to: str = "queues", vhost: str = "%2F", auth=None) -> int:
    kwargs = {} if auth is None else {"auth": auth}
    return (await call(app, "PUT", f"/api/policies/{vhost}/{name}",
                       json={"pattern": pattern, "definition": definition,
                             "priority": priority, "apply-to": apply_to}, **kwargs))[0]


async def test_a_policy_truncates_an_existing_stream_and_clearing_it_stops(app):
    await _stream(app, "retention-s")
    await _stream(app, "other")
    assert (await _set(app, "stream-retention-test", "retention-s", RETENTION, 1)) == 201
    queue = await _queue(app, "retention-s")
    assert queue["policy"] == "stream-retention-test"
    assert queue["effective_policy_definition"] == RETENTION
    assert (await _queue(app, "other"))["policy"] == ""
    await _publish(app, "retention-s")
    await _publish(app, "other")

    async def truncated():
        return (await _queue(app, "retention-s"))["first_offset"] > 0
    await eventually(truncated)
    queue = await _queue(app, "retention-s")
    assert queue["disk_bytes"] < 400_000  # of about 1 MB published
    assert (await _queue(app, "other"))["first_offset"] == 0  # its own 20 GB

    assert (await call(app, "DELETE", "/api/policies/%2F/stream-retention-test"))[0] == 204
    assert (await call(app, "DELETE", "/api/policies/%2F/stream-retention-test"))[0] == 404
    queue = await _queue(app, "retention-s")
    assert queue["policy"] == "" and queue["effective_policy_definition"] == {}
    first = queue["first_offset"]
    await _publish(app, "retention-s")
    app.broker.streams["retention-s"].partitions[0].housekeeping()
    queue = await _queue(app, "retention-s")
    assert queue["first_offset"] == first  # its own 20 GB again
    assert queue["messages"] > 1000


async def test_a_stream_created_later_takes_the_policy(app):
    assert (await _set(app, "p", "^later", RETENTION)) == 201
    await _stream(app, "later-s")
    await _stream(app, "not-later")  # the pattern anchors: no match
    assert (await _queue(app, "later-s"))["policy"] == "p"
    assert (await _queue(app, "not-later"))["policy"] == ""
    await _publish(app, "later-s")

    async def truncated():
        return (await _queue(app, "later-s"))["first_offset"] > 0
    await eventually(truncated)


async def test_priority_vhosts_and_unanchored_patterns(app):
    assert (await call(app, "PUT", "/api/vhosts/v1"))[0] == 201
    await _stream(app, "orders.eu")
    await _stream(app, "orders.eu", vhost="v1")
    # unanchored: "eu" is found inside "orders.eu"
    assert (await _set(app, "low", "eu", {"max-length-bytes": 1000}, priority=1)) == 201
    assert (await _set(app, "high", "^orders", {"max-age": "1D"}, priority=5)) == 201
    assert (await _set(app, "exchanges-only", ".*", {"max-length-bytes": 5}, priority=9,
                       apply_to="exchanges")) == 201
    queue = await _queue(app, "orders.eu")
    assert queue["policy"] == "high" and queue["effective_policy_definition"] == {
        "max-age": "1D"}
    config = app.broker.streams["orders.eu"].partitions[0].config
    assert config.retention_max_age_ms == 86_400_000 and config.retention_max_bytes == GB20
    assert (await _queue(app, "orders.eu", "v1"))["policy"] == ""  # another vhost's policies
    assert (await _set(app, "v1-only", ".*", {"max-length-bytes": 777}, vhost="v1",
                       apply_to="streams")) == 201
    assert (await _queue(app, "orders.eu", "v1"))["policy"] == "v1-only"
    assert (await _queue(app, "orders.eu"))["policy"] == "high"
    assert (await call(app, "DELETE", "/api/policies/%2F/high"))[0] == 204
    assert (await _queue(app, "orders.eu"))["policy"] == "low"
    # the listings
    status, every = await call(app, "GET", "/api/policies")
    assert status == 200 and [(p["vhost"], p["name"]) for p in every] == [
        ("/", "exchanges-only"), ("/", "low"), ("v1", "v1-only")]
    status, v1 = await call(app, "GET", "/api/policies/v1")
    assert status == 200 and v1 == [{"vhost": "v1", "name": "v1-only", "pattern": ".*",
                                     "apply-to": "streams",
                                     "definition": {"max-length-bytes": 777}, "priority": 0}]
    status, low = await call(app, "GET", "/api/policies/%2F/low")
    assert status == 200 and low["priority"] == 1 and low["apply-to"] == "queues"
    assert (await call(app, "GET", "/api/policies/%2F/nope"))[0] == 404
    assert (await call(app, "GET", "/api/policies/nowhere"))[0] == 404
    # replacing one answers 204 and applies at once
    assert (await _set(app, "low", "eu", {"max-length-bytes": 2000}, priority=1)) == 204
    config = app.broker.streams["orders.eu"].partitions[0].config
    assert config.retention_max_bytes == 2000 and not config.retention_max_age_ms
    # deleting the vhost deletes its policies
    assert (await call(app, "DELETE", "/api/vhosts/v1"))[0] == 204
    assert [p["vhost"] for p in (await call(app, "GET", "/api/policies"))[1]] == ["/", "/"]


async def test_bad_input_is_400_with_rabbitmqs_reason(app):
    cases = [
        ({"pattern": "(", "definition": {"max-age": "1D"}}, "should be regular expression"),
        ({"pattern": ".*", "definition": {"foo": "bar"}},
         '[{<<"foo">>,<<"bar">>}] are not recognised policy settings'),
        ({"pattern": ".*", "definition": {}}, "no policy provided"),
        ({"pattern": ".*", "definition": {"max-length-bytes": "big"}},
         '<<"big">> is not a valid maximum length in bytes'),
        ({"pattern": ".*", "definition": {"max-length-bytes": -1}}, "-1 is not a valid"),
        ({"pattern": ".*", "definition": {"max-age": "7 weeks"}}, "is not a valid max age"),
        ({"pattern": ".*", "definition": {"stream-max-segment-size-bytes": 4_000_000_000}},
         "is not a valid segment size"),
        ({"pattern": ".*", "definition": {"max-age": "1D"}, "apply-to": "topics"},
         "apply-to 'topics' unrecognised"),
        ({"pattern": ".*", "definition": {"max-age": "1D"}, "priority": "high"},
         "priority should be a number"),
        ({"pattern": ".*", "definition": [1]}, "definition must be a dictionary"),
        ({"definition": {"max-age": "1D"}}, 'Key "pattern" not found'),
        ({"pattern": ".*"}, 'Key "definition" not found'),
    ]
    for body, reason in cases:
        status, answer = await call(app, "PUT", "/api/policies/%2F/bad", json=body)
        assert status == 400 and answer["error"] == "bad_request", (body, answer)
        assert reason in answer["reason"], (body, answer)
        assert answer["reason"].startswith("Validation failed\n\n"), answer
    assert (await call(app, "PUT", "/api/policies/%2F/bad", data=b"{"))[0] == 400
    assert (await call(app, "PUT", "/api/policies/nowhere/p",
                       json={"pattern": ".*", "definition": {"max-age": "1D"}}))[0] == 404
    assert (await call(app, "GET", "/api/policies"))[1] == []


async def test_only_administrators_and_policymakers(app):
    for user, tags in (("mo", "monitoring"), ("pm", "policymaker")):
        assert (await call(app, "PUT", f"/api/users/{user}",
                           json={"password": f"{user}-pw", "tags": tags}))[0] == 201
    mo, pm = basic("mo", "mo-pw"), basic("pm", "pm-pw")
    assert (await _set(app, "p", ".*", RETENTION, auth=mo)) == 403
    assert (await call(app, "GET", "/api/policies", auth=mo))[0] == 403
    assert (await call(app, "DELETE", "/api/policies/%2F/p", auth=mo))[0] == 403
    assert (await _set(app, "p", ".*", RETENTION, auth={})) == 401
    assert (await call(app, "GET", "/api/policies", auth=basic("mo", "wrong")))[0] == 401
    assert (await call(app, "GET", "/api/policies"))[1] == []
    assert (await _set(app, "p", ".*", RETENTION, auth=pm)) == 201
    assert [p["name"] for p in (await call(app, "GET", "/api/policies", auth=pm))[1]] == ["p"]
    assert (await call(app, "DELETE", "/api/policies/%2F/p", auth=pm))[0] == 204


async def test_policies_survive_a_restart(tmp_path):
    app = await _app(tmp_path)
    try:
        await _stream(app, "kept")
        assert (await _set(app, "keep", "^kept$", RETENTION, priority=3)) == 201
    finally:
        await app.stop()
    path = os.path.join(app.config.data_dir, POLICIES_FILE)
    assert json.load(open(path))["policies"][0]["name"] == "keep"
    assert not os.path.exists(path + ".tmp")
    app = await _app(tmp_path)
    try:
        status, kept = await call(app, "GET", "/api/policies/%2F/keep")
        assert status == 200 and kept["priority"] == 3 and kept["definition"] == RETENTION
        assert (await _queue(app, "kept"))["policy"] == "keep"
        config = app.broker.streams["kept"].partitions[0].config
        assert config.retention_max_bytes == 100_000 and config.segment_max_bytes == 50_000
        await _publish(app, "kept")

        async def truncated():
            return (await _queue(app, "kept"))["first_offset"] > 0
        await eventually(truncated)
    finally:
        await app.stop()
