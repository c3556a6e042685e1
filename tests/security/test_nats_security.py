# Security on the NATS door with the real nats-server and nats-py: the embedded server runs
# with TLS and with users and permissions derived from riverlog's users and authorization
# policy, so plain and enveloped publishes are refused by nats-server itself ("Permissions
# Violation", "Authorization Violation"); permissions follow streams as they are created and
# deleted. Streams are managed over gRPC as ops.
from __future__ import annotations

import grpc
import nats
import pytest

from _sec import Client, basic, running, security, stored, wait_stored
from riverlog.broker import StreamConfig
from riverlog.config import GrpcConfig, NatsConfig, RabbitStreamConfig, ServerConfig
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc
from riverlog.protocol.liftbridge.envelope import decode_ack, encode_publish
from riverlog.security.tls import client_context
from riverlog.security.users import hash_password
from riverlog.server.app import App
from riverlog.server.embedded_nats import EmbeddedNats
from riverlog.server.nats_link import settle

OPS = basic("ops")


async def create(stub, name: str) -> None:
    await stub.CreateStream(pb.CreateStreamRequest(name=name, subject=name), metadata=OPS,
                            timeout=10)


async def test_nats_users_and_permissions_follow_the_policy(tmp_path, users, pki):
    async with running(tmp_path, security(users, pki)) as app, \
            grpc.aio.secure_channel(f"127.0.0.1:{app.grpc.port}", grpc.ssl_channel_credentials(
                open(pki.ca, "rb").read())) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        await create(stub, "orders.eu")
        await create(stub, "logs")
        url, tls = app.nats.url, client_context(pki.ca)

        for user, password in ((None, None), ("alice", "wrong"), ("dave", "")):
            with pytest.raises(nats.errors.Error, match="Authorization Violation"):
                await Client().connect(url, user, password, tls)
        with pytest.raises(Exception):  # nats-server requires TLS
            await Client().connect(url, "alice")

        alice = await Client().connect(url, "alice", tls=tls)
        await alice.publish("orders.eu", b"plain")
        inbox = "_INBOX.alice.acks"  # her own inboxes: _INBOX.alice.>
        sub = await alice.nc.subscribe(inbox)
        await alice.publish("orders.eu", encode_publish(pb.Message(
            value=b"enveloped", ackInbox=inbox, ackPolicy=pb.AckPolicy.LEADER)))
        ack = decode_ack((await sub.next_msg(timeout=5)).data)
        assert ack.stream == "orders.eu" and ack.offset == 1
        assert alice.errors == []
        await alice.publish("logs", b"plain")
        await alice.publish("logs", encode_publish(pb.Message(value=b"enveloped")))
        assert all("permissions violation for publish" in e.lower()
                   for e in await alice.errors_reach(2))
        await wait_stored(app, "orders.eu", 2)
        assert stored(app, "logs") == 0

        bob = await Client().connect(url, "bob", tls=tls)
        await bob.publish("orders.eu", b"bob may only read")
        assert "permissions violation" in (await bob.errors_reach(1))[0].lower()
        seen = await bob.nc.subscribe("orders.eu")  # consume: the raw subject is readable
        await settle(bob.nc)  # the subscription is in place before alice publishes
        await alice.publish("orders.eu", b"third")
        assert (await seen.next_msg(timeout=5)).data == b"third"
        await bob.nc.subscribe("logs")
        await settle(bob.nc)
        assert "permissions violation for subscription" in (await bob.errors_reach(2))[-1].lower()
        await wait_stored(app, "orders.eu", 3)

        # a new stream alice may publish to: the permission follows its creation
        await create(stub, "orders.us")
        await alice.publish("orders.us", b"new")
        await wait_stored(app, "orders.us", 1)
        # and is gone with the stream
        await stub.DeleteStream(pb.DeleteStreamRequest(name="orders.us"), metadata=OPS,
                                timeout=10)
        await alice.publish("orders.us", b"gone")
        assert 'publish to "orders.us"' in (await alice.errors_reach(3))[-1]
        for client in (alice, bob):
            await client.nc.close()


async def test_tls_without_authorization(tmp_path, users, pki):
    async with running(tmp_path, security(users, pki, authz=False)) as app:
        await app.liftbridge.create_stream("open", "open", StreamConfig(subject="open"))
        await app.nats.sync()
        client = await Client().connect(app.nats.url, None, tls=client_context(pki.ca))
        await client.publish("open", b"no users without authorization")
        await wait_stored(app, "open", 1)
        assert client.errors == []
        await client.nc.close()


async def test_bridge_logs_in_to_external_nats_over_tls(tmp_path, users, pki):
    """--nats-servers: a nats-server of its own (TLS, one user) that riverlog reaches with
    nats.user/nats.password and nats.tls.ca."""
    external = EmbeddedNats("127.0.0.1", 0, settings={
        "tls": {"cert_file": pki.server.cert, "key_file": pki.server.key},
        "authorization": {"users": [
            {"user": "riverlog", "password": hash_password("nats-pw", rounds=4)}]}})
    await external.start()
    try:
        url = f"tls://localhost:{external.port}"
        wrong = ServerConfig(data_dir=str(tmp_path / "wrong"),
                             rabbitmq_stream=RabbitStreamConfig(port=0),
                             nats=NatsConfig(servers=(url,), user="riverlog", password="nope",
                                             tls_ca=pki.ca), grpc=GrpcConfig(port=0))
        with pytest.raises(OSError, match="cannot connect to NATS"):  # not a hang
            await App(wrong).start()
        config = ServerConfig(data_dir=str(tmp_path / "data"),
                              rabbitmq_stream=RabbitStreamConfig(port=0),
                              nats=NatsConfig(servers=(url,), user="riverlog",
                                              password="nats-pw", tls_ca=pki.ca),
                              grpc=GrpcConfig(port=0))
        app = App(config)
        await app.start()
        try:
            await app.liftbridge.create_stream("ext", "ext", StreamConfig(subject="ext"))
            await app.nats.sync()
            with pytest.raises(nats.errors.Error, match="Authorization Violation"):
                await Client().connect(url, None, tls=client_context(pki.ca))
            # a client with the server's user publishes a plain message: riverlog stores it
            client = await Client().connect(url, "riverlog", "nats-pw", client_context(pki.ca))
            await client.publish("ext", b"through the external server")
            await wait_stored(app, "ext", 1)
            await client.nc.close()
        finally:
            await app.stop()
    finally:
        await external.stop()


async def test_no_nats_user_reaches_riverlogs_own_subjects(tmp_path, users):
    """``<namespace>.>`` (replication, notifications, riverlog's own ack inboxes) is
    riverlog's: even a user allowed everything may neither publish nor subscribe there, and
    riverlog sends no ack there (an ack inbox under the namespace but ``<ns>.ack.`` is
    refused), while the bridge's own connection still uses it."""
    async with running(tmp_path, security(users)) as app:
        url, own = app.nats.url, f"{app.liftbridge.namespace}.notify.a"
        ops = await Client().connect(url, "ops")
        await ops.nc.subscribe(own)
        await settle(ops.nc)
        await ops.publish(own, b"forged")
        errors = await ops.errors_reach(2)
        assert "permissions violation for subscription" in errors[0].lower()
        assert "permissions violation for publish" in errors[1].lower()
        seen = await app.nats.nc.subscribe(own)
        await app.nats.nc.publish(own, b"riverlog's own")
        assert (await seen.next_msg(timeout=5)).data == b"riverlog's own"
        assert "riverlog's own" in app.nats.ack_inbox_error(own).message
