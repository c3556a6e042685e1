# The Liftbridge doors against a hostile client (issue 15, items 1-6 and 12), with the real
# nats-server, nats-py and grpcio: subjects and ack inboxes that would make nats-server close
# riverlog's own NATS connection are refused, and the link comes back by itself when the
# server closes it anyway; a stream never widens its creator's NATS rights; acks never land on
# a stream's subject; remote clients must log in on every door; only riverlog joins the queue
# groups of stream subjects; creating a stream asks the policy about that stream only.
from __future__ import annotations

import asyncio
import logging

import grpc
import nats
import pytest
from rstream import Producer, exceptions

from _sec import Client, basic, running, security, status_of, stored, wait_stored
from riverlog.broker import StreamConfig
from riverlog.config import SecurityConfig
from riverlog.ops import scrape, stats_tables
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.api_pb2_grpc import APIStub
from riverlog.protocol.liftbridge.envelope import decode_ack, decode_publish, encode_publish
from riverlog.security.authz import Authorizer
from riverlog.server.embedded_nats import EmbeddedNats
from riverlog.server.nats_link import settle

LEADER = pb.AckPolicy.LEADER
INVALID = grpc.StatusCode.INVALID_ARGUMENT
DENIED = grpc.StatusCode.PERMISSION_DENIED
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
LONG_INBOX = "_INBOX." + "x" * 5000  # past nats-server's 4096-byte control line


def stub_of(app, host: str = "127.0.0.1") -> tuple[grpc.aio.Channel, APIStub]:
    channel = grpc.aio.insecure_channel(f"{host}:{app.grpc.port}")
    return channel, APIStub(channel)


def enveloped(value: bytes, inbox: str) -> bytes:
    return encode_publish(pb.Message(value=value, ackInbox=inbox, ackPolicy=LEADER))


async def next_ack(sub) -> pb.Ack:
    return decode_ack((await sub.next_msg(timeout=5)).data)


async def test_long_ack_inboxes_and_subjects_are_refused_and_the_nats_door_lives(tmp_path):
    async with running(tmp_path, SecurityConfig()) as app:
        channel, stub = stub_of(app)
        async with channel:
            await stub.CreateStream(pb.CreateStreamRequest(name="s", subject="s"), timeout=10)
            assert await status_of(stub.Publish(pb.PublishRequest(
                stream="s", value=b"no", ackInbox=LONG_INBOX, ackPolicy=LEADER),
                timeout=10)) == INVALID
            assert await status_of(stub.PublishToSubject(pb.PublishToSubjectRequest(
                subject="s." + "y" * 5000, value=b"no"), timeout=10)) == INVALID
            assert await status_of(stub.PublishToSubject(pb.PublishToSubjectRequest(
                subject="s", value=b"no", ackInbox=LONG_INBOX, ackPolicy=LEADER),
                timeout=10)) == INVALID
            client = await Client().connect(app.nats.url, None)
            await client.publish("s", enveloped(b"no", LONG_INBOX))
            await client.publish("s", enveloped(b"no", "_INBOX.a b"))
            # the door still stores and acks; the refused messages took no offset
            sub = await client.nc.subscribe("_INBOX.good")
            await client.publish("s", enveloped(b"yes", "_INBOX.good"))
            assert (await next_ack(sub)).offset == 0
            resp = await stub.PublishToSubject(pb.PublishToSubjectRequest(
                subject="s", value=b"yes", ackPolicy=LEADER), timeout=10)
            assert resp.ack.offset == 1
            assert stored(app, "s") == 2 and app.nats.nc.is_connected
            await client.nc.close()


async def metric(app, name: str) -> float:
    samples = await asyncio.to_thread(scrape, app.metrics.url)
    return sum(value for _, value in samples.get(name, ()))


async def test_the_nats_link_comes_back_after_the_server_closes_it(tmp_path, caplog):
    """A nats-server with a short control line closes riverlog's connection on an ack inbox
    riverlog accepts; riverlog connects again, subscribes again, and says so in its log,
    /metrics and `riverlog stats`."""
    caplog.set_level(logging.INFO, "riverlog.nats")
    external = EmbeddedNats("127.0.0.1", 0, settings={"max_control_line": 512})
    await external.start()
    try:
        async with running(tmp_path, SecurityConfig(), metrics=True,
                           servers=(external.url,)) as app:
            channel, stub = stub_of(app)
            async with channel:
                await stub.CreateStream(pb.CreateStreamRequest(name="s", subject="s"),
                                        timeout=10)
                # a process-wide counter: other tests of this process may have counted some
                before = await metric(app, "riverlog_nats_reconnects_total")
                await stub.Publish(pb.PublishRequest(
                    stream="s", value=b"1", ackInbox="_INBOX." + "x" * 600, ackPolicy=LEADER),
                    timeout=10)
                for _ in range(150):
                    if await metric(app, "riverlog_nats_reconnects_total") == before + 1:
                        break
                    await asyncio.sleep(0.1)
                assert await metric(app, "riverlog_nats_connected") == 1
                client = await Client().connect(external.url, None)
                await client.publish("s", b"2")
                await wait_stored(app, "s", 2)
                await client.nc.close()
                tables = {title: (header, rows) for title, header, rows in
                          stats_tables(await asyncio.to_thread(scrape, app.metrics.url))}
                assert tables["nats"] == (["connected", "reconnects"],
                                          [["yes", str(int(before) + 1)]])
        assert "maximum control line exceeded" in caplog.text.lower()
        assert "reconnected to NATS" in caplog.text
    finally:
        await external.stop()


async def test_stream_subjects_are_checked_and_a_stored_bad_one_stays_detached(tmp_path,
                                                                               caplog):
    async with running(tmp_path, SecurityConfig()) as app:
        channel, stub = stub_of(app)
        async with channel:
            for subject in ("t." + "x" * 5000, "a..b", "a.>.b", "a b", ".a", "a\x00"):
                assert await status_of(stub.CreateStream(pb.CreateStreamRequest(
                    name="bad", subject=subject), timeout=10)) == INVALID, subject
            assert await status_of(stub.CreateStream(pb.CreateStreamRequest(
                name="bad", subject="g", group="g g"), timeout=10)) == INVALID
            await stub.CreateStream(pb.CreateStreamRequest(name="wild", subject="w.*.>"),
                                    timeout=10)
        assert "bad" not in app.broker.streams
        # streams stored by a version that did not check subjects
        app.broker.create("stored", StreamConfig(subject="t." + "x" * 5000))
        app.broker.create("good", StreamConfig(subject="good"))
    caplog.clear()
    async with running(tmp_path, SecurityConfig()) as app:  # the same data folder
        assert "stream 'stored' is not attached to NATS" in caplog.text
        client = await Client().connect(app.nats.url, None)
        await client.publish("good", b"still served")
        await client.publish("w.a.b", b"wild")
        await wait_stored(app, "good", 1)
        await wait_stored(app, "wild", 1)
        assert app.nats.nc.is_connected
        await client.nc.close()


async def test_resuming_a_paused_stream_left_detached_keeps_it_detached(tmp_path, caplog):
    """A paused stream whose stored subject NATS refuses: a publish over gRPC resumes it and
    it is stored, but the NATS door never subscribes it (that would make nats-server drop
    riverlog's connection)."""
    async with running(tmp_path, SecurityConfig()) as app:
        app.broker.create("stored", StreamConfig(subject="t." + "x" * 5000))
        await app.liftbridge.pause("stored", [], False)
    caplog.set_level(logging.INFO, "riverlog.nats")
    caplog.clear()
    async with running(tmp_path, SecurityConfig()) as app:  # the same data folder
        assert "stream 'stored' is not attached to NATS" in caplog.text
        link = app.nats.nc
        channel, stub = stub_of(app)
        async with channel:
            await stub.CreateStream(pb.CreateStreamRequest(name="good", subject="good"),
                                    timeout=10)
            await stub.Publish(pb.PublishRequest(stream="stored", value=b"resumes"),
                               timeout=10)
        assert not app.broker.streams["stored"].partitions[0].paused
        await app.nats.sync()
        client = await Client().connect(app.nats.url, None)
        await client.publish("good", b"still served")
        await wait_stored(app, "good", 1)
        await wait_stored(app, "stored", 1)
        assert app.nats.nc is link and link.is_connected
        assert "closed riverlog's connection" not in caplog.text
        await client.nc.close()


async def test_a_stream_never_widens_its_users_nats_rights(tmp_path, users):
    """bob may do anything on bob.*; he may not attach a stream to another subject, and a
    stream an admin attaches to `secret` gives him no NATS right on `secret`."""
    async with running(tmp_path, security(users)) as app:
        channel, stub = stub_of(app)
        bob, ops = basic("bob"), basic("ops")
        async with channel:
            for name, subject in (("bob.spy", "secret"), ("bob.all", ">"), ("bob.any", "*.x"),
                                  ("bob.orders", "orders.eu")):  # bob only reads orders.*
                assert await status_of(stub.CreateStream(pb.CreateStreamRequest(
                    name=name, subject=subject), metadata=bob, timeout=10)) == DENIED, name
            await stub.CreateStream(pb.CreateStreamRequest(name="bob.own", subject="bob.own"),
                                    metadata=bob, timeout=10)
            await stub.CreateStream(pb.CreateStreamRequest(name="bob.more", subject="bob.>"),
                                    metadata=bob, timeout=10)  # a wildcard he was granted
            await stub.CreateStream(pb.CreateStreamRequest(name="bob.mirror", subject="secret"),
                                    metadata=ops, timeout=10)
            assert await status_of(stub.PublishToSubject(pb.PublishToSubjectRequest(
                subject="secret", value=b"no"), metadata=bob, timeout=10)) == DENIED
        client = await Client().connect(app.nats.url, "bob")
        await client.publish("bob.own", b"mine")
        await wait_stored(app, "bob.own", 1)
        await wait_stored(app, "bob.more", 1)
        await client.publish("secret", b"hijack")
        await client.nc.subscribe("secret")
        await settle(client.nc)
        await client.nc.subscribe(">")
        await settle(client.nc)
        errors = await client.errors_reach(3)
        assert all("permissions violation" in e.lower() for e in errors), errors
        assert stored(app, "bob.mirror") == 0
        await client.nc.close()


async def test_acks_go_only_to_inboxes_never_to_stream_subjects(tmp_path, users):
    async with running(tmp_path, security(users)) as app:
        channel, stub = stub_of(app)
        alice, ops = basic("alice"), basic("ops")
        async with channel:
            for name in ("orders.eu", "secret"):
                await stub.CreateStream(pb.CreateStreamRequest(name=name, subject=name),
                                        metadata=ops, timeout=10)
            client = await Client().connect(app.nats.url, "alice")
            # a stream's subject, and a subject alice may not subscribe to, as ack inboxes
            for inbox in ("secret", "orders.eu", "alice.notify"):
                await client.publish("orders.eu", enveloped(b"no", inbox))
            sub = await client.nc.subscribe("_INBOX.alice.acks")
            await client.publish("orders.eu", enveloped(b"yes", "_INBOX.alice.acks"))
            assert (await next_ack(sub)).offset == 0
            for inbox in ("secret", "orders.eu", "alice.notify"):
                assert await status_of(stub.Publish(pb.PublishRequest(
                    stream="orders.eu", value=b"no", ackInbox=inbox, ackPolicy=LEADER),
                    metadata=alice, timeout=10)) == DENIED, inbox
                assert await status_of(stub.PublishToSubject(pb.PublishToSubjectRequest(
                    subject="orders.eu", value=b"no", ackInbox=inbox, ackPolicy=LEADER),
                    metadata=alice, timeout=10)) == DENIED, inbox
            resp = await stub.Publish(pb.PublishRequest(
                stream="orders.eu", value=b"yes", ackInbox="_INBOX.alice.acks", ackPolicy=LEADER),
                metadata=alice, timeout=10)
            assert resp.ack.offset == 1 and (await next_ack(sub)).offset == 1
            assert stored(app, "orders.eu") == 2 and stored(app, "secret") == 0
            assert client.errors == []
            await client.nc.close()


async def test_a_forged_ack_never_reaches_another_users_inbox(tmp_path, users):
    """bob names alice's ack inbox in an envelope he publishes on his own stream, over NATS
    (even with a made-up sender header) and over gRPC: riverlog knows he published it and
    refuses it, as it refuses reading her inboxes. alice's own acks arrive, plain publishes
    are stored, and NATS subscribers of a stream's subject see every message once, riverlog's
    own publishes (PublishToSubject) included."""
    async with running(tmp_path, security(users)) as app:
        channel, stub = stub_of(app)
        ops = basic("ops")
        async with channel:
            for name in ("orders.eu", "bob.own"):
                await stub.CreateStream(pb.CreateStreamRequest(name=name, subject=name),
                                        metadata=ops, timeout=10)
            alice = await Client().connect(app.nats.url, "alice", inbox_prefix="_INBOX.alice")
            bob = await Client().connect(app.nats.url, "bob")
            acks = await alice.nc.subscribe(alice.nc.new_inbox())
            seen = await bob.nc.subscribe("orders.eu")  # bob reads orders.*
            await bob.nc.subscribe("_INBOX.alice.>")
            await bob.nc.subscribe("_INBOX.>")
            await settle(bob.nc)
            assert all("permissions violation for subscription" in e.lower()
                       for e in await bob.errors_reach(2))
            forged = encode_publish(pb.Message(value=b"forged", ackInbox=acks.subject,
                                               correlationId="alice-1", ackPolicy=LEADER))
            await bob.publish("bob.own", forged)
            await bob.nc.publish("bob.own", forged, headers={
                "Nats-Request-Info": '{"acc":"USERS","user":"alice"}'})
            assert await status_of(stub.Publish(pb.PublishRequest(
                stream="bob.own", value=b"forged", ackInbox=acks.subject,
                correlationId="alice-1", ackPolicy=LEADER), metadata=basic("bob"),
                timeout=10)) == DENIED
            assert await status_of(stub.PublishToSubject(pb.PublishToSubjectRequest(
                subject="bob.own", value=b"forged", ackInbox=acks.subject,
                correlationId="alice-1", ackPolicy=LEADER), metadata=basic("bob"),
                timeout=10)) == DENIED
            own = await bob.nc.subscribe("_INBOX.bob.acks")
            await bob.publish("bob.own", enveloped(b"bob's", "_INBOX.bob.acks"))
            assert (await next_ack(own)).offset == 0  # bob's own inbox: acked

            await alice.publish("orders.eu", b"plain")
            await alice.publish("orders.eu", encode_publish(pb.Message(
                value=b"enveloped", ackInbox=acks.subject, correlationId="alice-1",
                ackPolicy=LEADER)))
            ack = await next_ack(acks)  # the first ack alice gets is her own
            assert (ack.stream, ack.offset, ack.correlationId) == ("orders.eu", 1, "alice-1")
            await stub.PublishToSubject(pb.PublishToSubjectRequest(
                subject="orders.eu", value=b"from riverlog"), metadata=ops, timeout=10)
            await alice.publish("orders.eu", b"last")
            await wait_stored(app, "orders.eu", 4)
            assert stored(app, "bob.own") == 1
            got = [(await seen.next_msg(timeout=5)).data for _ in range(4)]
            assert got[0] == b"plain" and got[3] == b"last"
            assert [decode_publish(data).value for data in got[1:3]] == [b"enveloped",
                                                                         b"from riverlog"]
            assert acks.pending_msgs == 0 and alice.errors == [] and len(bob.errors) == 2
            for client in (alice, bob):
                await client.nc.close()


async def test_publish_to_subject_without_an_ack_inbox_is_acked_with_authorization(tmp_path,
                                                                                    users):
    """PublishToSubject names riverlog's own ack inbox when the caller gives none; with
    authorization on the NATS door refused it (it is no user's inbox), so nothing was stored
    and the call ran into its deadline."""
    async with running(tmp_path, security(users)) as app:
        channel, stub = stub_of(app)
        async with channel:
            await stub.CreateStream(pb.CreateStreamRequest(name="orders.eu", subject="orders.eu"),
                                    metadata=basic("ops"), timeout=10)
            resp = await stub.PublishToSubject(pb.PublishToSubjectRequest(
                subject="orders.eu", value=b"acked", ackPolicy=LEADER), metadata=basic("alice"),
                timeout=10)
        assert resp.ack.offset == 0 and stored(app, "orders.eu") == 1


@pytest.mark.parametrize("transport", ["h2", "grpcio"])
async def test_remote_clients_must_log_in_on_every_door(tmp_path, users, remote_host, caplog,
                                                        transport):
    """Users configured, authorization off, every door on 0.0.0.0: loopback clients need no
    credentials on gRPC, remote ones must log in on gRPC and NATS."""
    async with running(tmp_path, security(users, authz=False), host="0.0.0.0",
                       transport=transport) as app:
        channel, stub = stub_of(app, remote_host)
        async with channel:
            assert await status_of(stub.FetchMetadata(pb.FetchMetadataRequest(),
                                                      timeout=10)) == UNAUTHENTICATED
            assert await status_of(stub.CreateStream(pb.CreateStreamRequest(
                name="r", subject="r"), timeout=10)) == UNAUTHENTICATED
            assert await status_of(stub.FetchMetadata(
                pb.FetchMetadataRequest(), metadata=basic("alice", "wrong"),
                timeout=10)) == UNAUTHENTICATED
            await stub.CreateStream(pb.CreateStreamRequest(name="r", subject="r"),
                                    metadata=basic("alice"), timeout=10)
        channel, stub = stub_of(app)
        async with channel:
            await stub.FetchMetadata(pb.FetchMetadataRequest(), timeout=10)
        remote = f"nats://{remote_host}:{app.nats.embedded.port}"
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await Client().connect(remote, None)
        client = await Client().connect(remote, "alice")
        await client.publish("r", b"from afar")
        await wait_stored(app, "r", 1)
        await client.nc.close()
    caplog.clear()
    # the default users: guest, from loopback only
    async with running(tmp_path, SecurityConfig(), host="0.0.0.0", transport=transport) as app:
        channel, stub = stub_of(app, remote_host)
        async with channel:
            assert await status_of(stub.FetchMetadata(
                pb.FetchMetadataRequest(), metadata=basic("guest", "guest"),
                timeout=10)) == UNAUTHENTICATED
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await Client().connect(f"nats://{remote_host}:{app.nats.embedded.port}", "guest",
                                   "guest")
        producer = Producer(remote_host, port=app.rabbitmq_stream.port, username="guest",
                            password="guest")  # the RabbitMQ door's rule, as in RabbitMQ
        with pytest.raises(exceptions.SASLAuthenticationFailureLoopback):
            await producer.start()
        await producer.close()
        for door in ("RabbitMQ Stream", "Liftbridge gRPC", "NATS"):
            assert f"{door} listens on 0.0.0.0 beyond loopback" in caplog.text, door


async def test_only_the_server_joins_the_queue_groups_of_stream_subjects(tmp_path, users):
    async with running(tmp_path, security(users)) as app:
        channel, stub = stub_of(app)
        async with channel:
            await stub.CreateStream(pb.CreateStreamRequest(
                name="orders.eu", subject="orders.eu", group="riverlog", partitions=2),
                metadata=basic("ops"), timeout=10)
        bob = await Client().connect(app.nats.url, "bob")  # bob reads orders.*
        await bob.nc.subscribe("orders.eu", queue="riverlog")
        await settle(bob.nc)
        await bob.nc.subscribe("orders.eu.1", queue="mine")
        await settle(bob.nc)
        errors = await bob.errors_reach(2)
        assert all("permissions violation for subscription" in e.lower() for e in errors)
        copy = await bob.nc.subscribe("orders.eu")  # reading what goes by is allowed
        await settle(bob.nc)
        alice = await Client().connect(app.nats.url, "alice")
        for i in range(200):
            await alice.nc.publish("orders.eu", b"%d" % i)
        await alice.nc.flush()
        await wait_stored(app, "orders.eu", 200)
        for _ in range(200):
            await copy.next_msg(timeout=5)
        assert alice.errors == [] and len(bob.errors) == 2
        for client in (alice, bob):
            await client.nc.close()


def policy_questions() -> int:
    """How many times the authorizer was asked so far (answered from its cache or not)."""
    info = Authorizer.allowed.cache_info()
    return info.hits + info.misses


async def test_a_create_asks_the_policy_about_the_new_stream_only(tmp_path, users):
    """NATS permissions are kept per stream: a create asks a few questions per NATS user
    (may it publish, consume: on the stream and its subject), however many streams there are.
    Rebuilding them all asked users x streams and, past ~700 streams, blocked the event loop
    0.5-0.7 s per create."""
    async with running(tmp_path, security(users)) as app:
        for i in range(40):
            await app.liftbridge.create_stream(f"orders.{i}", f"orders.{i}",
                                               StreamConfig(subject=f"orders.{i}"))
        await app.nats.sync()
        channel, stub = stub_of(app)
        async with channel:
            before = policy_questions()
            await stub.CreateStream(pb.CreateStreamRequest(name="orders.new", subject="orders.new"),
                                    metadata=basic("ops"), timeout=10)
            asked = policy_questions() - before
        assert asked <= 3 * 2 * 2 + 3, asked  # alice, bob, ops; the gRPC door's own check
        client = await Client().connect(app.nats.url, "alice")  # the new right is in effect
        await client.publish("orders.new", b"new")
        await wait_stored(app, "orders.new", 1)
        assert client.errors == []
        await client.nc.close()
