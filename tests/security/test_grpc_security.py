# Security on the Liftbridge gRPC door: credentials in the `authorization` metadata (Basic) or
# a verified client certificate, UNAUTHENTICATED without or with wrong ones, PERMISSION_DENIED
# for a stream the user may not touch, and TLS (grpc.ssl_server_credentials). Clients:
# gufo-liftbridge (plaintext only, no metadata: it cannot log in, so it is refused) and
# grpcio channels with the generated Liftbridge stub (the one gufo-liftbridge ships too).
from __future__ import annotations

import grpc
import pytest
from gufo.liftbridge.api_pb2_grpc import APIStub
from gufo.liftbridge.client import LiftbridgeClient

from _sec import basic, running, security, status_of
from riverlog.protocol.liftbridge import api_pb2 as pb

DENIED = grpc.StatusCode.PERMISSION_DENIED
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


def channel(app, pki=None, cert=None) -> grpc.aio.Channel:
    address = f"127.0.0.1:{app.grpc.port}"
    if pki is None:
        return grpc.aio.insecure_channel(address)
    with open(pki.ca, "rb") as f:
        root = f.read()
    key = chain = None
    if cert is not None:
        with open(cert.key, "rb") as f:
            key = f.read()
        with open(cert.cert, "rb") as f:
            chain = f.read()
    return grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(root, key, chain))


async def subscribe_status(stub, stream: str, metadata) -> grpc.StatusCode:
    call = stub.Subscribe(pb.SubscribeRequest(stream=stream), metadata=metadata, timeout=10)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    return info.value.code()


async def test_clients_without_or_with_wrong_credentials_are_refused(tmp_path, users):
    async with running(tmp_path, security(users)) as app:
        async with LiftbridgeClient([f"127.0.0.1:{app.grpc.port}"]) as gufo:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await gufo.get_metadata()
            assert info.value.code() == UNAUTHENTICATED
        async with channel(app) as ch:
            stub = APIStub(ch)
            request = pb.FetchMetadataRequest()
            assert await status_of(stub.FetchMetadata(request, timeout=10)) == UNAUTHENTICATED
            for metadata in (basic("alice", "wrong"), basic("nobody", "x"), basic("dave", ""),
                             (("authorization", "Bearer abc"),)):
                assert await status_of(stub.FetchMetadata(
                    request, metadata=metadata, timeout=10)) == UNAUTHENTICATED
            assert await subscribe_status(stub, "s", None) == UNAUTHENTICATED
            await stub.FetchMetadata(request, metadata=basic("alice"), timeout=10)


async def test_each_rpc_checks_the_stream_permission(tmp_path, users):
    async with running(tmp_path, security(users)) as app, channel(app) as ch:
        stub = APIStub(ch)
        ops, alice, bob = basic("ops"), basic("alice"), basic("bob")
        await stub.CreateStream(pb.CreateStreamRequest(name="orders.eu", subject="orders.eu"),
                                metadata=ops, timeout=10)
        await stub.CreateStream(pb.CreateStreamRequest(name="logs", subject="logs"),
                                metadata=ops, timeout=10)
        assert await status_of(stub.CreateStream(pb.CreateStreamRequest(
            name="orders.us", subject="orders.us"), metadata=alice, timeout=10)) == DENIED
        assert await status_of(stub.DeleteStream(pb.DeleteStreamRequest(
            name="orders.eu"), metadata=alice, timeout=10)) == DENIED
        assert await status_of(stub.PauseStream(pb.PauseStreamRequest(
            name="orders.eu"), metadata=alice, timeout=10)) == DENIED
        publish = pb.PublishRequest(stream="orders.eu", value=b"o1", ackPolicy=pb.AckPolicy.LEADER)
        ack = (await stub.Publish(publish, metadata=alice, timeout=10)).ack
        assert ack.offset == 0 and ack.stream == "orders.eu"
        assert await status_of(stub.Publish(publish, metadata=bob, timeout=10)) == DENIED
        assert await status_of(stub.Publish(pb.PublishRequest(stream="logs", value=b"x"),
                                            metadata=alice, timeout=10)) == DENIED
        assert await status_of(stub.PublishToSubject(pb.PublishToSubjectRequest(
            subject="logs", value=b"x"), metadata=alice, timeout=10)) == DENIED
        assert await subscribe_status(stub, "orders.eu", alice) == DENIED
        assert await status_of(stub.SetCursor(pb.SetCursorRequest(
            stream="orders.eu", cursorId="c", offset=0), metadata=alice, timeout=10)) == DENIED
        # bob reads what alice wrote
        call = stub.Subscribe(pb.SubscribeRequest(
            stream="orders.eu", startPosition=pb.StartPosition.EARLIEST,
            stopPosition=pb.StopPosition.STOP_LATEST), metadata=bob, timeout=10)
        values = []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for msg in call:
                values.append(msg.value)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # the stop offset
        assert values == [b"", b"o1"]  # the empty handshake message, then alice's

        # PublishAsync: answers for the allowed messages, then PERMISSION_DENIED
        async def requests():
            yield pb.PublishRequest(stream="orders.eu", value=b"o2", correlationId="1",
                                    ackPolicy=pb.AckPolicy.LEADER)
            yield pb.PublishRequest(stream="logs", value=b"no", correlationId="2",
                                    ackPolicy=pb.AckPolicy.LEADER)
            yield pb.PublishRequest(stream="orders.eu", value=b"never read", correlationId="3",
                                    ackPolicy=pb.AckPolicy.LEADER)
        call = stub.PublishAsync(requests(), metadata=alice, timeout=10)
        answers = []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for response in call:
                answers.append(response.correlationId)
        assert info.value.code() == DENIED and answers == ["1"]
        partition = app.broker.streams["orders.eu"].partitions[0]
        assert partition.next_offset == 2
        assert app.broker.streams["logs"].partitions[0].next_offset == 0


async def test_tls_and_client_certificate_identity(tmp_path, users, pki):
    async with running(tmp_path, security(users, pki, client_auth=True)) as app:
        async with channel(app, pki, pki.alice) as ch:  # the certificate says alice
            stub = APIStub(ch)
            await stub.FetchMetadata(pb.FetchMetadataRequest(), timeout=10)
            assert await status_of(stub.CreateStream(pb.CreateStreamRequest(
                name="orders.tls", subject="orders.tls"), timeout=10)) == DENIED
        async with channel(app, pki, pki.carol) as ch:  # valid, but carol is no user
            stub = APIStub(ch)
            assert await status_of(stub.FetchMetadata(
                pb.FetchMetadataRequest(), timeout=10)) == UNAUTHENTICATED
            # metadata credentials work on a TLS connection too
            await stub.CreateStream(pb.CreateStreamRequest(name="orders.tls",
                                                           subject="orders.tls"),
                                    metadata=basic("ops"), timeout=10)
        async with channel(app, pki) as ch:  # no client certificate: no TLS session
            assert await status_of(APIStub(ch).FetchMetadata(
                pb.FetchMetadataRequest(), timeout=10)) == grpc.StatusCode.UNAVAILABLE
        async with channel(app) as ch:  # plaintext to a TLS port
            assert await status_of(APIStub(ch).FetchMetadata(
                pb.FetchMetadataRequest(), timeout=10)) == grpc.StatusCode.UNAVAILABLE
        assert "orders.tls" in app.broker.streams


async def test_tls_without_authorization_needs_no_credentials(tmp_path, users, pki):
    async with running(tmp_path, security(users, pki, authz=False)) as app:
        async with channel(app, pki) as ch:
            stub = APIStub(ch)
            await stub.CreateStream(pb.CreateStreamRequest(name="open", subject="open"),
                                    timeout=10)
            ack = (await stub.Publish(pb.PublishRequest(
                stream="open", value=b"v", ackPolicy=pb.AckPolicy.LEADER), timeout=10)).ack
            assert ack.offset == 0


async def test_a_first_login_runs_bcrypt_once(tmp_path, users, monkeypatch):
    """On the h2 transport a call's credentials are checked when its headers arrive and again
    by the handler's wrapper: the two checks of a pair not seen before share one bcrypt run
    (bcrypt.checkpw is counted, and still does the work)."""
    import bcrypt
    runs = []
    checkpw = bcrypt.checkpw

    def counted(password, hashed):
        runs.append(password)
        return checkpw(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counted)
    async with running(tmp_path, security(users)) as app:
        async with channel(app) as ch:
            stub = APIStub(ch)
            await stub.FetchMetadata(pb.FetchMetadataRequest(), metadata=basic("alice"),
                                     timeout=10)
            assert len(runs) == 1
            await stub.FetchMetadata(pb.FetchMetadataRequest(), metadata=basic("alice"),
                                     timeout=10)  # remembered
            assert await status_of(stub.FetchMetadata(
                pb.FetchMetadataRequest(), metadata=basic("bob", "wrong"),
                timeout=10)) == UNAUTHENTICATED
        assert runs == [b"alice-pw", b"wrong"]


async def test_consumer_group_calls_need_consume_and_the_members_own_user(tmp_path, users):
    """Issue 24: a user could read another user's group assignment, and LeaveConsumerGroup on
    her behalf kicked her out."""
    async with running(tmp_path, security(users)) as app, channel(app) as ch:
        stub = APIStub(ch)
        ops, alice, bob = basic("ops"), basic("alice"), basic("bob")
        await stub.CreateStream(pb.CreateStreamRequest(name="orders.eu", subject="orders.eu"),
                                metadata=ops, timeout=10)
        joined = await stub.JoinConsumerGroup(pb.JoinConsumerGroupRequest(
            groupId="g", consumerId="c1", streams=["orders.eu"]), metadata=bob, timeout=10)
        fetch = pb.FetchConsumerGroupAssignmentsRequest(groupId="g", consumerId="c1",
                                                        epoch=joined.epoch)
        leave = pb.LeaveConsumerGroupRequest(groupId="g", consumerId="c1")
        report = pb.ReportConsumerGroupCoordinatorRequest(
            groupId="g", consumerId="c1", coordinator=joined.coordinator, epoch=joined.epoch)
        for metadata in (alice, ops):  # alice may not consume orders.eu; ops did not join c1
            assert await status_of(stub.FetchConsumerGroupAssignments(
                fetch, metadata=metadata, timeout=10)) == DENIED
            assert await status_of(stub.ReportConsumerGroupCoordinator(
                report, metadata=metadata, timeout=10)) == DENIED
            assert await status_of(stub.LeaveConsumerGroup(
                leave, metadata=metadata, timeout=10)) == DENIED
        got = await stub.FetchConsumerGroupAssignments(fetch, metadata=bob, timeout=10)
        assert [(a.stream, list(a.partitions)) for a in got.assignments] == [("orders.eu", [0])]
        await stub.LeaveConsumerGroup(leave, metadata=bob, timeout=10)
        # once c1 left, the id is free: another user with the right may join as c1
        await stub.JoinConsumerGroup(pb.JoinConsumerGroupRequest(
            groupId="g", consumerId="c1", streams=["orders.eu"]), metadata=ops, timeout=10)
        await stub.LeaveConsumerGroup(leave, metadata=ops, timeout=10)
