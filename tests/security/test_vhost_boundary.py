# Virtual hosts as a security boundary (issue 30 item 1), with authorization on: a stream of
# virtual host v1 is kept under a hidden broker name (riverlog.vhost_names), and no client of
# any door reaches it by spelling that name: not on the stream door from `/` or from another
# virtual host (raw frames), not on the gRPC Liftbridge door (its own stub), not through
# NATS subjects (nats-py against the embedded nats-server), not through the management API's
# queue routes. Open of a virtual host the user has no permission on is refused 0x0c, as
# RabbitMQ's check_vhost_access refuses it.
from __future__ import annotations

from urllib.parse import quote

import grpc
import pytest

from _raw_stream import Raw
from _sec import Client, basic, status_of
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc
from riverlog.protocol.rabbitmq_stream import ResponseCode, encode
from riverlog.protocol.rabbitmq_stream import frames as f
from riverlog.protocol.rabbitmq_stream.constants import OffsetType
from riverlog.vhost_names import internal
from server.test_management import basic as http_basic
from server.test_management import call
from test_runtime_users import app as runtime_app  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(120)

OPS = http_basic("ops", "ops-pw")  # role admin, an administrator
EVERYTHING = {"configure": ".*", "write": ".*", "read": ".*"}
SECRET = internal("v1", "secret")  # what a client would have to spell
DOES_NOT_EXIST = ResponseCode.STREAM_DOES_NOT_EXIST


@pytest.fixture
async def app(runtime_app):
    """test_runtime_users' App (every door, the management API, authorization on), with
    virtual hosts v1 and v2 on which ops has every permission."""
    app = runtime_app
    for path, body in (("/api/vhosts/v1", {}), ("/api/vhosts/v2", {}),
                       ("/api/permissions/v1/ops", EVERYTHING),
                       ("/api/permissions/v2/ops", EVERYTHING)):
        assert (await call(app, "PUT", path, auth=OPS, json=body))[0] == 201
    return app


async def opened(app, user: str, vhost: str) -> tuple[Raw, int]:
    """A raw stream connection of ``user`` and the code Open of ``vhost`` got."""
    raw = await Raw.connect(app.rabbitmq_stream.port)
    await raw.login(user)
    assert type(await raw.next_frame()) is f.Tune
    raw.writer.write(encode(f.TuneResponse(1048576, 0)))
    return raw, (await raw.request(f.Open(4, vhost))).response_code


async def spelled(raw: Raw, name: str) -> dict[str, int]:
    """The codes of every stream command naming ``name``."""
    codes = {
        "metadata": (await raw.request(f.Metadata(20, (name,)))).streams[0].response_code,
        "subscribe": (await raw.request(f.Subscribe(21, 1, name, OffsetType.FIRST, None,
                                                    1))).response_code,
        "declare": (await raw.request(f.DeclarePublisher(22, 1, "ref", name))).response_code,
        "query offset": (await raw.request(f.QueryOffset(23, "ref", name))).response_code,
        "sequence": (await raw.request(f.QueryPublisherSequence(24, "ref",
                                                                name))).response_code,
        "stats": (await raw.request(f.StreamStats(25, name))).response_code,
        "delete": (await raw.request(f.Delete(26, name))).response_code,
        "create": (await raw.request(f.Create(27, name, {}))).response_code,
    }
    return codes


async def test_no_stream_door_client_reaches_another_vhosts_stream(app):
    owner, code = await opened(app, "ops", "v1")
    assert code == ResponseCode.OK
    assert (await owner.request(f.Create(10, "secret", {}))).response_code == ResponseCode.OK
    assert SECRET in app.broker.streams and "secret" not in app.broker.streams
    refused = {**{k: DOES_NOT_EXIST for k in ("metadata", "subscribe", "declare",
                                               "query offset", "sequence", "stats", "delete")},
               "create": ResponseCode.PRECONDITION_FAILED}
    for vhost in ("/", "v2"):
        other, code = await opened(app, "ops", vhost)
        assert code == ResponseCode.OK
        assert await spelled(other, SECRET) == refused, vhost
        # Metadata answers each name as asked (RabbitMQ answers from a map of the names):
        # two spellings of hidden names, two answers, neither found
        answer = await other.request(f.Metadata(12, (SECRET, internal("v2", "x"))))
        assert [(s.name, s.response_code) for s in answer.streams] == [
            (SECRET, DOES_NOT_EXIST), (internal("v2", "x"), DOES_NOT_EXIST)], vhost
    assert sorted(app.broker.streams) == sorted(["__cursors", SECRET])  # none made or gone
    # the owner's own connection reaches it by its name in v1
    assert (await owner.request(f.StreamStats(11, "secret"))).response_code == ResponseCode.OK


async def test_open_needs_a_permission_on_the_vhost(app):
    for user in ("alice", "bob"):  # configuration-file users, no permission on v1
        raw, code = await opened(app, user, "v1")
        assert code == ResponseCode.VIRTUAL_HOST_ACCESS_FAILURE
        assert await raw.closed_by_server()
    raw, code = await opened(app, "alice", "/")  # `/` stays the policy lines'
    assert code == ResponseCode.OK
    raw, code = await opened(app, "ops", "missing")
    assert code == ResponseCode.VIRTUAL_HOST_ACCESS_FAILURE
    # a permission on v1 opens it, and v1's expressions decide there (on v1's names)
    assert (await call(app, "PUT", "/api/permissions/v1/alice", auth=OPS, json={
        "configure": "^mine$", "write": "", "read": ""}))[0] == 201
    raw, code = await opened(app, "alice", "v1")
    assert code == ResponseCode.OK
    assert (await raw.request(f.Create(10, "mine", {}))).response_code == ResponseCode.OK
    assert (await raw.request(f.Create(11, "other", {}))).response_code == \
        ResponseCode.ACCESS_REFUSED


async def test_no_liftbridge_client_reaches_another_vhosts_stream(app):
    owner, _ = await opened(app, "ops", "v1")
    assert (await owner.request(f.Create(10, "secret", {}))).response_code == ResponseCode.OK
    ops = basic("ops")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
        stub = api_pb2_grpc.APIStub(channel)
        listed = await stub.FetchMetadata(pb.FetchMetadataRequest(), metadata=ops, timeout=10)
        assert SECRET not in [m.name for m in listed.streamMetadata]
        named = await stub.FetchMetadata(pb.FetchMetadataRequest(streams=[SECRET]),
                                         metadata=ops, timeout=10)
        assert named.streamMetadata[0].error == pb.StreamMetadata.Error.UNKNOWN_STREAM
        not_found = grpc.StatusCode.NOT_FOUND
        for call_ in (
                stub.Publish(pb.PublishRequest(stream=SECRET, value=b"x"), metadata=ops,
                             timeout=10),
                stub.FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(stream=SECRET),
                                            metadata=ops, timeout=10),
                stub.DeleteStream(pb.DeleteStreamRequest(name=SECRET), metadata=ops,
                                  timeout=10),
                stub.SetCursor(pb.SetCursorRequest(stream=SECRET, cursorId="c", offset=1),
                               metadata=ops, timeout=10)):
            assert await status_of(call_) == not_found
        # pausing needs `admin`, never granted on another vhost's stream: refused before
        assert await status_of(stub.PauseStream(pb.PauseStreamRequest(name=SECRET),
                                                metadata=ops, timeout=10)) == \
            grpc.StatusCode.PERMISSION_DENIED
        subscribe = stub.Subscribe(pb.SubscribeRequest(stream=SECRET), metadata=ops,
                                   timeout=10)
        assert await status_of(subscribe.read()) == not_found
        assert await status_of(stub.CreateStream(pb.CreateStreamRequest(
            name=internal("v2", "made"), subject="made"), metadata=ops, timeout=10)) == \
            grpc.StatusCode.INVALID_ARGUMENT
    # a NATS publish on any subject near the name never lands in it (it has no subject)
    client = await Client().connect(app.nats.url, "ops")
    for subject in ("secret", "v1.secret", "v1"):
        await client.publish(subject, b"x")
    assert app.broker.streams[SECRET].partitions[0].next_offset == 0
    assert sorted(app.broker.streams) == sorted(["__cursors", SECRET])


async def test_no_management_route_reaches_another_vhosts_stream(app):
    owner, _ = await opened(app, "ops", "v1")
    assert (await owner.request(f.Create(10, "secret", {}))).response_code == ResponseCode.OK
    spelled_name = quote(SECRET, safe="")
    for vhost in ("%2F", "v2"):
        assert (await call(app, "GET", f"/api/queues/{vhost}/{spelled_name}",
                           auth=OPS))[0] == 404
        assert (await call(app, "DELETE", f"/api/queues/{vhost}/{spelled_name}",
                           auth=OPS))[0] == 404
        assert (await call(app, "PUT", f"/api/queues/{vhost}/{spelled_name}",
                           auth=OPS))[0] == 400
    assert [q["name"] for q in (await call(app, "GET", "/api/queues/%2F", auth=OPS))[1]] == []
    assert sorted(app.broker.streams) == sorted(["__cursors", SECRET])
