# Runtime users and permissions (issue 30 item 2) on the doors, with authorization on: a user
# made through the management API logs in on the RabbitMQ Stream door (raw frames), the gRPC
# Liftbridge door and the NATS door (nats-py against the embedded nats-server); its
# configure/write/read expressions decide there as RabbitMQ applies them; a changed password
# or permission holds from the next connection; a deleted user's stream connections are closed,
# its gRPC subscription ended and its NATS connection dropped when nats-server reloads
# without it.
from __future__ import annotations

import asyncio
import dataclasses

import grpc
import nats
import pytest

from _raw_stream import Raw
from _sec import Client, basic, security, server_config, stored, wait_stored
from riverlog.config import ManagementConfig
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc
from riverlog.protocol.rabbitmq_stream import ResponseCode, encode
from riverlog.protocol.rabbitmq_stream import frames as f
from riverlog.protocol.rabbitmq_stream.constants import OffsetType
from riverlog.server.app import App
from server.test_management import basic as http_basic
from server.test_management import call

pytestmark = pytest.mark.timeout(120)
OPS = http_basic("ops", "ops-pw")  # role admin: `*` on every stream, an administrator


@pytest.fixture(params=["h2", "grpcio"])  # both gRPC transports end a deleted user's calls
async def app(tmp_path, users, request):
    config = dataclasses.replace(server_config(tmp_path, security(users)),
                                 management=ManagementConfig(port=0))
    config = dataclasses.replace(config, grpc=dataclasses.replace(config.grpc,
                                                                  transport=request.param))
    app = App(config)
    await app.start()
    yield app
    await app.stop()


async def stream_login(port: int, user: str, password: str) -> tuple[Raw, int]:
    """A raw stream connection: (it, the SaslAuthenticate response code); opened on OK."""
    raw = await Raw.connect(port)
    await raw.request(f.PeerProperties(1, {}))
    await raw.request(f.SaslHandshake(2))
    answer = await raw.request(f.SaslAuthenticate(3, "PLAIN",
                                                  f"\0{user}\0{password}".encode()))
    if answer.response_code == ResponseCode.OK:
        assert type(await raw.next_frame()) is f.Tune
        raw.writer.write(encode(f.TuneResponse(1048576, 0)))
        assert (await raw.request(f.Open(4, "/"))).response_code == ResponseCode.OK
    return raw, answer.response_code


async def codes(raw: Raw) -> dict[str, int]:
    """The answers to create, declare-publisher, subscribe and delete of `carol.s`, and to
    create of `orders.x`."""
    return {
        "create": (await raw.request(f.Create(10, "carol.s", {}))).response_code,
        "create orders.x": (await raw.request(f.Create(11, "orders.x", {}))).response_code,
        "publish": (await raw.request(f.DeclarePublisher(12, 1, None, "carol.s"))).response_code,
        "consume": (await raw.request(f.Subscribe(13, 1, "carol.s", OffsetType.FIRST, None,
                                                  1))).response_code,
    }


async def test_runtime_user_on_the_stream_door(app):
    port = app.rabbitmq_stream.port
    assert (await call(app, "PUT", "/api/users/carol", auth=OPS,
                       json={"password": "c-pw", "tags": ""}))[0] == 201
    carol, code = await stream_login(port, "carol", "c-pw")
    assert code == ResponseCode.OK
    # a runtime user without a permission may do nothing
    assert (await carol.request(f.Create(10, "carol.s", {}))).response_code == \
        ResponseCode.ACCESS_REFUSED
    assert (await call(app, "PUT", "/api/permissions/%2F/carol", auth=OPS, json={
        "configure": "^carol\\.", "write": "^carol\\.", "read": "^nothing$"}))[0] == 201
    again, _ = await stream_login(port, "carol", "c-pw")
    assert await codes(again) == {"create": ResponseCode.OK,
                                  "create orders.x": ResponseCode.ACCESS_REFUSED,
                                  "publish": ResponseCode.OK,
                                  "consume": ResponseCode.ACCESS_REFUSED}
    assert (await call(app, "PUT", "/api/permissions/%2F/carol", auth=OPS, json={
        "configure": "", "write": "", "read": "carol"}))[0] == 204
    third, _ = await stream_login(port, "carol", "c-pw")
    assert (await third.request(f.Subscribe(13, 1, "carol.s", OffsetType.FIRST, None,
                                            1))).response_code == ResponseCode.OK
    assert (await third.request(f.Delete(14, "carol.s"))).response_code == \
        ResponseCode.ACCESS_REFUSED

    # a new password holds from the next login; open connections stay
    assert (await call(app, "PUT", "/api/users/carol", auth=OPS,
                       json={"password": "c-pw2"}))[0] == 204
    assert (await stream_login(port, "carol", "c-pw"))[1] == ResponseCode.AUTHENTICATION_FAILURE
    fourth, code = await stream_login(port, "carol", "c-pw2")
    assert code == ResponseCode.OK
    # deleted: every connection of hers is closed, a connection of another user is not
    bob, code = await stream_login(port, "bob", "bob-pw")
    assert code == ResponseCode.OK
    assert (await call(app, "DELETE", "/api/users/carol", auth=OPS))[0] == 204
    for conn in (carol, again, third, fourth):
        assert await conn.closed_by_server()
    assert (await bob.request(f.Create(20, "bob.s", {}))).response_code == ResponseCode.OK
    assert (await stream_login(port, "carol", "c-pw2"))[1] == \
        ResponseCode.AUTHENTICATION_FAILURE


async def test_runtime_user_on_the_grpc_and_nats_doors(app):
    assert (await call(app, "PUT", "/api/users/nina", auth=OPS,
                       json={"password": "n-pw"}))[0] == 201
    assert (await call(app, "PUT", "/api/permissions/%2F/nina", auth=OPS, json={
        "configure": "^nina$", "write": "^nina$", "read": "^nina$"}))[0] == 201
    nina = basic("nina", "n-pw")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
        stub = api_pb2_grpc.APIStub(channel)
        await stub.CreateStream(pb.CreateStreamRequest(name="nina", subject="nina"),
                                metadata=nina, timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.CreateStream(pb.CreateStreamRequest(name="other", subject="other"),
                                    metadata=nina, timeout=10)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        await app.nats.sync()

        client = await Client().connect(app.nats.url, "nina", "n-pw")
        await client.publish("nina", b"one")
        await wait_stored(app, "nina", 1)
        assert client.errors == []

        # write taken away: refused by nats-server on her next connection
        assert (await call(app, "PUT", "/api/permissions/%2F/nina", auth=OPS, json={
            "configure": "^nina$", "write": "", "read": "^nina$"}))[0] == 204
        later = await Client().connect(app.nats.url, "nina", "n-pw")
        await later.publish("nina", b"refused")
        assert "permissions violation for publish" in (await later.errors_reach(1))[0].lower()
        assert stored(app, "nina") == 1

        # deleted: her NATS connections are dropped, her gRPC subscription ends, she logs in
        # nowhere
        subscription = stub.Subscribe(pb.SubscribeRequest(
            stream="nina", startPosition=pb.StartPosition.EARLIEST), metadata=nina)
        got = [await subscription.read() for _ in range(2)]  # the start, then "one"
        assert got[1].value == b"one"
        assert (await call(app, "DELETE", "/api/users/nina", auth=OPS))[0] == 204
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await asyncio.wait_for(subscription.read(), 30)
        assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "was deleted" in ended.value.details()
        for conn in (client, later):
            for _ in range(500):
                if conn.nc.is_closed:
                    break
                await asyncio.sleep(0.01)
            assert conn.nc.is_closed
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await Client().connect(app.nats.url, "nina", "n-pw")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.FetchMetadata(pb.FetchMetadataRequest(), metadata=nina, timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED



@pytest.fixture
async def stream_app(tmp_path, users):
    config = dataclasses.replace(server_config(tmp_path, security(users)),
                                 management=ManagementConfig(port=0))
    app = App(config)
    await app.start()
    yield app
    await app.stop()


async def test_a_secret_update_ends_what_is_no_longer_allowed(stream_app):
    """A secret update (SaslAuthenticate after Open) rechecks the connection's publishers
    (write) and subscriptions (read) against the user's permissions of that moment: those on
    `lost` end, with one MetadataUpdate (0x06) for the stream, and answer
    PUBLISHER_DOES_NOT_EXIST and SUBSCRIPTION_ID_DOES_NOT_EXIST after; those on `kept` go on,
    as rabbit_stream_reader's evaluate_state_after_secret_update (the Java suite's
    AuthorisationTest.shouldReceiveMetadataUpdateAfterUpdateSecret; before, both went on and
    no MetadataUpdate came)."""
    from riverlog.protocol.rabbitmq_stream.codec import simple_entry
    app = stream_app
    assert (await call(app, "PUT", "/api/users/dora", auth=OPS,
                       json={"password": "d-pw", "tags": ""}))[0] == 201
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    assert (await call(app, "PUT", "/api/permissions/%2F/dora", auth=OPS,
                       json=everything))[0] == 201
    dora, code = await stream_login(app.rabbitmq_stream.port, "dora", "d-pw")
    assert code == ResponseCode.OK
    for corr, name in ((10, "lost"), (11, "kept")):
        assert (await dora.request(f.Create(corr, name, {}))).response_code == ResponseCode.OK
    for pid, name in ((1, "lost"), (2, "kept")):
        assert (await dora.request(f.DeclarePublisher(20 + pid, pid, None, name))
                ).response_code == ResponseCode.OK
        assert (await dora.request(f.Subscribe(30 + pid, pid, name, OffsetType.FIRST, None, 1))
                ).response_code == ResponseCode.OK
    kept_only = {"configure": "^kept$", "write": "^kept$", "read": "^kept$"}
    assert (await call(app, "PUT", "/api/permissions/%2F/dora", auth=OPS,
                       json=kept_only))[0] == 204
    answer = await dora.request(f.SaslAuthenticate(40, "PLAIN", b"\0dora\0d-pw"))
    assert (type(answer), answer.response_code) == (f.SaslAuthenticateResponse,
                                                    ResponseCode.OK)
    assert await dora.next_frame() == f.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE,
                                                       "lost")
    message = ((7, simple_entry(b"m")),)
    assert await dora.request(f.Publish(1, message)) == f.PublishError(
        1, ((7, ResponseCode.PUBLISHER_DOES_NOT_EXIST),))
    assert await dora.request(f.Credit(1, 1)) == f.CreditResponse(
        ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST, 1)
    assert await dora.request(f.Publish(2, message)) == f.PublishConfirm(2, (7,))
    deliver = await dora.next_frame()  # subscription 2 on `kept` still delivers
    assert deliver.subscription_id == 2
    # nothing else came between (a second MetadataUpdate, a Deliver on `lost`)
    assert type(await dora.request(f.Metadata(50, ("none",)))) is f.MetadataResponse
