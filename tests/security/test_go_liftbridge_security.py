"""Logins and permissions as Liftbridge's Go client sees them (tests/compat/go_liftbridge,
built by the `go_liftbridge` fixture): go-liftbridge v2.3.0 logs in only with a TLS client
certificate (its ClientOptions have TLSConfig and no call credentials; Liftbridge's
authorization names the client by the certificate), so the password paths go through
Liftbridge's generated API stub with Basic metadata, and nats.go logs in to the NATS door.

Liftbridge answers a call its policy refuses with a plain Go error, which gRPC sends as
UNKNOWN ("The client is not authorized to call Publish on resource X"); riverlog answers
PERMISSION_DENIED (docs/compatibility.md): go-liftbridge reports both as an error."""
from __future__ import annotations

import pytest

from _sec import basic, running, security, wait_stored
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.api_pb2_grpc import APIStub
from test_grpc_security import channel

pytestmark = pytest.mark.timeout(120)


async def test_go_liftbridge_with_a_client_certificate(tmp_path, users, pki, go_liftbridge):
    async with running(tmp_path, security(users, pki, client_auth=True)) as app:
        address = f"127.0.0.1:{app.grpc.port}"
        async with channel(app, pki, pki.alice) as ch:
            await APIStub(ch).CreateStream(pb.CreateStreamRequest(
                name="orders.go", subject="orders.go"), metadata=basic("ops"), timeout=10)
        # alice may publish to orders.* and nothing else
        out = await go_liftbridge.run("login", address, stream="orders.go", ca=pki.ca,
                                      cert=pki.alice.cert, key=pki.alice.key)
        assert out["connect"] is None
        assert out["create"]["code"] == "PermissionDenied"
        assert out["publish"]["error"] is None and out["publish"]["ack"]["offset"] == 0
        assert out["subscribe"]["code"] == "PermissionDenied"
        assert out["pause"]["code"] == "PermissionDenied"
        # a certificate the server's CA did not sign: no TLS session, no connection
        out = await go_liftbridge.run("login", address, stream="orders.go", ca=pki.ca,
                                      cert=pki.stranger.cert, key=pki.stranger.key)
        assert out["connect"]["code"] in ("DeadlineExceeded", "Unavailable"), out
        assert app.broker.streams["orders.go"].partitions[0].next_offset == 1


async def test_passwords_on_the_grpc_and_nats_doors(tmp_path, users, go_liftbridge):
    async with running(tmp_path, security(users)) as app:
        address = f"127.0.0.1:{app.grpc.port}"
        async with channel(app) as ch:
            await APIStub(ch).CreateStream(pb.CreateStreamRequest(
                name="orders.pw", subject="orders.pw"), metadata=basic("ops"), timeout=10)
        for user, password in (("alice", "wrong"), ("nobody", "x"), ("", "")):
            out = await go_liftbridge.run("login", address, stream="orders.pw", user=user,
                                          password=password)
            assert {k: v["code"] for k, v in out.items()} == {
                "metadata": "Unauthenticated", "publish": "Unauthenticated",
                "subscribe": "Unauthenticated"}, user
        out = await go_liftbridge.run("login", address, stream="orders.pw", user="alice",
                                      password="alice-pw")
        assert out["metadata"] is None and out["publish"] is None
        assert out["subscribe"]["code"] == "PermissionDenied"
        assert app.broker.streams["orders.pw"].partitions[0].next_offset == 1

        nats = app.nats.url
        out = await go_liftbridge.run("nats_login", address, nats, user="alice",
                                      password="wrong")
        assert out["connect"]["error"] == "nats: Authorization Violation"
        out = await go_liftbridge.run("nats_login", address, nats, user="alice",
                                      password="alice-pw", subject="orders.pw")
        assert out == {"connect": None, "publish": None}
        await wait_stored(app, "orders.pw", 2)
        out = await go_liftbridge.run("nats_login", address, nats, user="alice",
                                      password="alice-pw", subject="secret")
        assert out["publish"]["error"] == (
            'nats: Permissions Violation for Publish to "secret"')
