# Security on the RabbitMQ Stream door with the real rstream client: PLAIN against bcrypt
# hashes, per-stream authorization answered with access refused (0x10), the TLS listener, and
# SASL EXTERNAL with client certificates (identity = the certificate's CN).
from __future__ import annotations

import asyncio
import ssl

import pytest
from rstream import (AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer,
                     SlasMechanism, exceptions)

from _sec import PASSWORDS, running, security
from riverlog.protocol.rabbitmq_stream import encode
from riverlog.protocol.rabbitmq_stream import frames as f
from riverlog.security.tls import client_context


def producer(app, user, password=None, *, tls=None, **kw) -> Producer:
    port = app.rabbitmq_stream.tls_port if tls else app.rabbitmq_stream.port
    return Producer("127.0.0.1", port=port, username=user,
                    password=PASSWORDS.get(user, "") if password is None else password,
                    ssl_context=tls, **kw)


async def consume(app, user, stream, count, *, tls=None, **kw) -> list[bytes]:
    port = app.rabbitmq_stream.tls_port if tls else app.rabbitmq_stream.port
    got: list[bytes] = []
    done = asyncio.Event()
    consumer = Consumer("127.0.0.1", port=port, username=user,
                        password=PASSWORDS.get(user, ""), ssl_context=tls, **kw)

    async def on_message(msg, ctx):
        got.append(bytes(msg))
        if len(got) >= count:
            done.set()

    await consumer.start()
    try:
        await consumer.subscribe(stream, on_message, offset_specification=(
            ConsumerOffsetSpecification(OffsetType.FIRST)))
        await asyncio.wait_for(done.wait(), 10)
    finally:
        await consumer.close()
    return got


async def assert_handshake_refused(port: int, context: ssl.SSLContext) -> None:
    """Connect with ``context`` and send PeerProperties: the server must refuse the TLS
    handshake (with TLS 1.3 the client learns it on its first read: an alert or the end of
    the stream) and never answer. rstream reports this only as a timeout, so the refusal is
    checked on the socket."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        writer.write(encode(f.PeerProperties(1, {})))
        await writer.drain()
        data = await asyncio.wait_for(reader.read(65536), 5)
    except (ssl.SSLError, ConnectionResetError):
        return
    assert data == b"", f"the TLS handshake was accepted; the server sent {data!r}"


async def publish_refused(client: Producer, stream: str) -> None:
    """Publishing is refused with access refused (0x10) on DeclarePublisher. rstream then
    deletes the publisher it failed to declare and raises that answer (publisher does not
    exist, as RabbitMQ gives too), chained to the refusal."""
    with pytest.raises(exceptions.ServerError) as info:
        await client.send_wait(stream, b"not allowed")
    error = info.value
    assert isinstance(error, exceptions.AccessRefused) or isinstance(
        error.__context__, exceptions.AccessRefused), repr(error)


async def test_wrong_password_and_unknown_user_are_refused(tmp_path, users):
    async with running(tmp_path, security(users), liftbridge=False) as app:
        for user, password in (("alice", "wrong"), ("nobody", "x"), ("dave", "")):
            with pytest.raises(exceptions.AuthenticationFailure):
                await producer(app, user, password).start()
        async with producer(app, "alice"):  # the right password works
            pass


async def test_guest_works_only_with_the_default_users(tmp_path, users):
    async with running(tmp_path, security(users), liftbridge=False) as app:
        with pytest.raises(exceptions.AuthenticationFailure):
            await producer(app, "guest", "guest").start()


async def test_streams_are_refused_without_permission(tmp_path, users):
    async with running(tmp_path, security(users), liftbridge=False) as app:
        async with producer(app, "ops") as ops:
            await ops.create_stream("orders.eu")
            await ops.create_stream("logs.app")
        async with producer(app, "alice") as alice:
            with pytest.raises(exceptions.AccessRefused):
                await alice.create_stream("orders.us")
            with pytest.raises(exceptions.AccessRefused):
                await alice.delete_stream("orders.eu")
            await alice.send_wait("orders.eu", b"order 1")
            await publish_refused(alice, "logs.app")
        with pytest.raises(exceptions.AccessRefused):
            await consume(app, "alice", "orders.eu", 1)
        assert await consume(app, "bob", "orders.eu", 1) == [b"order 1"]
        with pytest.raises(exceptions.AccessRefused):
            await consume(app, "bob", "logs.app", 1)
        async with producer(app, "bob") as bob:
            await publish_refused(bob, "orders.eu")
        async with producer(app, "ops") as ops:
            await ops.delete_stream("logs.app")
        assert "logs.app" not in app.broker.streams
        assert app.broker.streams["orders.eu"].partitions[0].next_offset == 1


async def test_tls_listener_with_plain_login(tmp_path, users, pki):
    async with running(tmp_path, security(users, pki), liftbridge=False) as app:
        assert app.rabbitmq_stream.tls_port != app.rabbitmq_stream.port
        tls = client_context(pki.ca)
        async with producer(app, "ops", tls=tls) as ops:
            await ops.create_stream("orders.tls")
        async with producer(app, "alice", tls=tls) as alice:
            await alice.send_wait("orders.tls", AMQPMessage(body=b"over TLS"))
        got = await consume(app, "bob", "orders.tls", 1, tls=tls)
        assert len(got) == 1 and b"over TLS" in got[0]
        with pytest.raises(exceptions.AuthenticationFailure):
            await producer(app, "alice", "wrong", tls=tls).start()
        with pytest.raises(ssl.SSLCertVerificationError):  # the client checks the server
            await producer(app, "alice", tls=client_context()).start()


async def test_sasl_external_takes_the_user_from_the_client_certificate(tmp_path, users, pki):
    async with running(tmp_path, security(users, pki), liftbridge=False) as app:
        async with producer(app, "ops") as ops:
            await ops.create_stream("orders.ext")
        external = {"sasl_configuration_mechanism": SlasMechanism.MechanismExternal}
        alice_tls = client_context(pki.ca, pki.alice.cert, pki.alice.key)
        async with producer(app, "ignored", "ignored", tls=alice_tls, **external) as alice:
            await alice.send_wait("orders.ext", b"signed by alice")
            with pytest.raises(exceptions.AccessRefused):  # alice's permissions apply
                await alice.create_stream("orders.new")
        # a certificate-only user logs in with its certificate, never with a password
        dave_tls = client_context(pki.ca, pki.dave.cert, pki.dave.key)
        async with producer(app, "dave", "", tls=dave_tls, **external):
            pass
        # a valid certificate whose CN names no user
        carol_tls = client_context(pki.ca, pki.carol.cert, pki.carol.key)
        with pytest.raises(exceptions.AuthenticationFailure):
            await producer(app, "carol", "", tls=carol_tls, **external).start()
        # no client certificate: EXTERNAL is not offered (rstream checks the handshake list)
        with pytest.raises(AssertionError):
            await producer(app, "alice", tls=client_context(pki.ca), **external).start()
        # alice's name on a certificate from a CA the server does not trust
        stranger = client_context(pki.ca, pki.stranger.cert, pki.stranger.key)
        await assert_handshake_refused(app.rabbitmq_stream.tls_port, stranger)
        assert app.broker.streams["orders.ext"].partitions[0].next_offset == 1


async def test_client_certificates_can_be_required(tmp_path, users, pki):
    async with running(tmp_path, security(users, pki, client_auth=True),
                       liftbridge=False) as app:
        await assert_handshake_refused(app.rabbitmq_stream.tls_port, client_context(pki.ca))
        alice_tls = client_context(pki.ca, pki.alice.cert, pki.alice.key)
        async with producer(app, "alice", tls=alice_tls):  # PLAIN still works with a cert
            pass


async def test_a_secret_update_keeps_its_user_and_mechanism(tmp_path, users):
    """A SaslAuthenticate after Open updates the secret: the same user's is answered OK with
    no Tune, and the connection goes on; another user's is refused with
    SASL_CANNOT_CHANGE_USERNAME (0x15), another mechanism's with
    SASL_CANNOT_CHANGE_MECHANISM (0x14), and the connection is closed, as
    rabbit_stream_reader does (before, bob could take over alice's open connection)."""
    from _raw_stream import Raw
    from riverlog.protocol.rabbitmq_stream import ResponseCode
    async with running(tmp_path, security(users)) as app:
        port = app.rabbitmq_stream.port
        alice = await (await Raw.connect(port)).opened("alice")
        same = f"\0alice\0{PASSWORDS['alice']}".encode()
        answer = await alice.request(f.SaslAuthenticate(5, "PLAIN", same))
        assert (type(answer), answer.response_code) == (f.SaslAuthenticateResponse,
                                                        ResponseCode.OK)
        answer = await alice.request(f.Metadata(6, ("none",)))  # no Tune came between
        assert type(answer) is f.MetadataResponse
        for frame, code in (
                (f.SaslAuthenticate(7, "PLAIN", f"\0bob\0{PASSWORDS['bob']}".encode()),
                 ResponseCode.SASL_CANNOT_CHANGE_USERNAME),
                (f.SaslAuthenticate(7, "EXTERNAL", b""),
                 ResponseCode.SASL_CANNOT_CHANGE_MECHANISM),
                (f.SaslAuthenticate(7, None, b""), ResponseCode.SASL_CANNOT_CHANGE_MECHANISM)):
            raw = await (await Raw.connect(port)).opened("alice")
            answer = await raw.request(frame)
            assert (type(answer), answer.response_code) == (f.SaslAuthenticateResponse, code)
            assert await raw.closed_by_server()
        alice.writer.close()


async def opened_as(port: int, user: str, password: str):
    """A raw stream connection opened on "/" as ``user`` (one not in _sec.PASSWORDS)."""
    from _raw_stream import Raw
    from riverlog.protocol.rabbitmq_stream import ResponseCode
    raw = await Raw.connect(port)
    await raw.request(f.PeerProperties(1, {}))
    await raw.request(f.SaslHandshake(2))
    assert (await raw.request(f.SaslAuthenticate(3, "PLAIN", f"\0{user}\0{password}".encode()))
            ).response_code == ResponseCode.OK
    assert type(await raw.next_frame()) is f.Tune
    raw.writer.write(encode(f.TuneResponse(1048576, 0)))
    assert (await raw.request(f.Open(4, "/"))).response_code == ResponseCode.OK
    return raw


async def test_creating_a_super_stream_needs_rabbitmqs_four_rights(tmp_path, users):
    """CreateSuperStream asks what RabbitMQ asks (check_super_stream_management_permitted):
    create (configure) on the super stream and on every partition, consume (read) on the
    super stream, publish (write) on every partition; one missing: ACCESS_REFUSED (0x10) and
    nothing made. Before, create alone was asked (the Java client's
    SuperStreamManagementTest found it)."""
    import dataclasses
    from _sec import RULES
    from riverlog.protocol.rabbitmq_stream import ResponseCode
    from riverlog.security.users import hash_password
    carol = [("p", "carol", "c.*", "create"), ("p", "carol", "c.*", "consume"),
             ("p", "carol", "c.ok-*", "publish"), ("p", "carol", "c.half-0", "publish")]
    sec = dataclasses.replace(security(users), users=security(users).users + (
        ("carol", hash_password("carol-pw", rounds=4)),), authz_rules=RULES + tuple(carol))
    async with running(tmp_path, sec) as app:
        raw = await opened_as(app.rabbitmq_stream.port, "carol", "carol-pw")
        for corr, (name, code) in enumerate((("c.half", ResponseCode.ACCESS_REFUSED),
                                             ("c.ok", ResponseCode.OK)), start=5):
            answer = await raw.request(f.CreateSuperStream(
                corr, name, (f"{name}-0", f"{name}-1"), ("0", "1"), {}))
            assert answer.response_code == code, name
        assert "c.ok-1" in app.broker.streams and not any(
            s.startswith("c.half") for s in app.broker.streams)
        raw.writer.close()


async def test_deleting_a_super_stream_needs_rabbitmqs_four_rights(tmp_path, users):
    """DeleteSuperStream asks what CreateSuperStream asks (RabbitMQ checks both with
    rabbit_stream_utils:check_super_stream_management_permitted): delete (configure) on the
    super stream and every partition, consume (read) on the super stream, publish (write)
    on every partition; one missing: ACCESS_REFUSED (0x10) and nothing deleted. Before,
    delete alone was asked."""
    import dataclasses
    from _sec import RULES
    from riverlog.broker import StreamConfig
    from riverlog.protocol.rabbitmq_stream import ResponseCode
    from riverlog.security.users import hash_password
    dave = [("p", "dave", "d.*", "delete"), ("p", "dave", "d.*", "consume"),
            ("p", "dave", "d.ok-*", "publish"), ("p", "dave", "d.half-0", "publish")]
    sec = dataclasses.replace(security(users), users=security(users).users + (
        ("dave", hash_password("dave-pw", rounds=4)),), authz_rules=RULES + tuple(dave))
    async with running(tmp_path, sec) as app:
        for name in ("d.half", "d.ok"):
            app.rabbitmq_stream.super_streams.create(
                name, (f"{name}-0", f"{name}-1"), ("0", "1"), StreamConfig())
        raw = await opened_as(app.rabbitmq_stream.port, "dave", "dave-pw")
        for corr, (name, code) in enumerate((("d.half", ResponseCode.ACCESS_REFUSED),
                                             ("d.ok", ResponseCode.OK)), start=5):
            answer = await raw.request(f.DeleteSuperStream(corr, name))
            assert answer.response_code == code, name
        super_streams = app.rabbitmq_stream.super_streams
        assert super_streams.find("d.half") is not None and super_streams.find("d.ok") is None
        assert {"d.half-0", "d.half-1"} <= set(app.broker.streams)
        assert not any(s.startswith("d.ok") for s in app.broker.streams)
        raw.writer.close()



async def test_tls_connections_keep_the_copying_path_with_sendfile_on(tmp_path, users, pki):
    """With RabbitStreamConfig.sendfile a plain TCP consumer gets large chunks' data by
    os.sendfile; a TLS one cannot (the bytes must go through the TLS layer) and is served
    by the copying path, the same messages."""
    async with running(tmp_path, security(users, pki), liftbridge=False,
                       stream={"sendfile": True}) as app:
        tls = client_context(pki.ca)
        bodies = [f"{i:05d}".encode() * 40 for i in range(2000)]  # 200 B each: 400 kB
        async with producer(app, "ops") as ops:
            await ops.create_stream("orders.big")
        async with producer(app, "alice") as alice:
            for i in range(0, len(bodies), 500):  # chunks of 100 kB or more
                await alice.send_batch("orders.big", bodies[i:i + 500])
        counted = {}
        for name, context in (("tls", tls), ("plain", None)):
            before = app.rabbitmq_stream.sendfile_bytes
            got = await consume(app, "bob", "orders.big", len(bodies), tls=context)
            assert [g[-200:] for g in got] == bodies, name
            counted[name] = app.rabbitmq_stream.sendfile_bytes - before
        assert counted["tls"] == 0 and counted["plain"] > 300_000
