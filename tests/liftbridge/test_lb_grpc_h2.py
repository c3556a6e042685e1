# The Liftbridge gRPC door on riverlog's own HTTP/2 transport (GrpcConfig.transport "h2",
# server/grpc_h2_server.py + protocol/grpc_h2.py), driven by real clients: grpcio's generated
# stubs, gufo-liftbridge, and a raw HTTP/2 client made with the `h2` library over a real socket
# where a test needs what well-behaved clients never do (no client-side deadline, not reading,
# a broken frame). Covers unary calls, Subscribe, PublishAsync (batched), deadlines, status
# codes and messages in trailers, flow control bounds, TLS with ALPN h2 and client certificates,
# and the authorization checks shared with the grpc.aio transport.
from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.util
import os
import sys

import grpc
import h2.config
import h2.connection
import h2.events
import pytest
from gufo.liftbridge.client import LiftbridgeClient
from gufo.liftbridge.types import StartPosition

from _lb import Server, create, make_config, read_all
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc
from riverlog.server.app import App

Code = grpc.StatusCode
# the security tests' fixtures (users, test PKI), loaded from their conftest under another name
_SECURITY = os.path.join(os.path.dirname(__file__), "..", "security")
sys.path.insert(0, _SECURITY)
_spec = importlib.util.spec_from_file_location("security_conftest",
                                               os.path.join(_SECURITY, "conftest.py"))
_security_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_security_conftest)
users, pki = _security_conftest.users, _security_conftest.pki


@pytest.fixture
async def h2server(tmp_path):
    app = App(make_config(str(tmp_path / "data"), transport="h2"))
    await asyncio.wait_for(app.start(), 30)
    yield Server(app, str(tmp_path / "data"))
    await asyncio.wait_for(app.stop(), 30)


@pytest.fixture
async def stub(h2server):
    channel = grpc.aio.insecure_channel(h2server.grpc_addr)
    yield api_pb2_grpc.APIStub(channel)
    await channel.close()


def test_the_h2_transport_serves_the_door(h2server):
    from riverlog.server.grpc_h2_server import GrpcH2Server
    assert isinstance(h2server.app.grpc._server, GrpcH2Server)


async def expect(call, code: grpc.StatusCode, text: str = "") -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value
    assert text in info.value.details()


# -- unary calls, status codes -------------------------------------------------------------

async def test_unary_calls_and_publish_deadline_semantics(h2server, stub):
    await create(stub, "u", partitions=2)
    meta = await stub.FetchMetadata(pb.FetchMetadataRequest(streams=["u"]), timeout=5)
    assert len(meta.streamMetadata[0].partitions) == 2
    resp = await stub.Publish(pb.PublishRequest(stream="u", partition=1, value=b"v",
                                                correlationId="c1",
                                                ackPolicy=pb.AckPolicy.ALL), timeout=5)
    assert (resp.ack.offset, resp.ack.correlationId, resp.ack.msgSubject) == (0, "c1", "u.1")
    # without a deadline Publish does not wait for the ack: the response has none
    assert not (await stub.Publish(pb.PublishRequest(stream="u", value=b"w"))).HasField("ack")
    assert [m.value for m in await read_all(stub, "u", 1)] == [b"v"]


@pytest.mark.parametrize("request_, code, text", [
    (pb.PublishRequest(value=b"v"), Code.INVALID_ARGUMENT, "no stream provided"),
    (pb.PublishRequest(stream="missing", value=b"v"), Code.NOT_FOUND, "no such stream"),
])
async def test_errors_carry_code_and_message_in_trailers(stub, request_, code, text):
    await expect(stub.Publish(request_, timeout=5), code, text)


async def test_malformed_request_unknown_method_and_non_ascii_message(h2server, stub):
    channel = grpc.aio.insecure_channel(h2server.grpc_addr)
    try:
        bad = channel.unary_unary("/proto.API/CreateStream")
        await expect(bad(b"\xff\xff\xff"), Code.INVALID_ARGUMENT, "malformed CreateStreamRequest")
        nowhere = channel.unary_unary("/proto.API/NoSuchCall")
        await expect(nowhere(b""), Code.UNIMPLEMENTED, "NoSuchCall")
    finally:
        await channel.close()
    await create(stub, "dup")
    # a message with characters outside ASCII survives the grpc-message percent-encoding
    await expect(stub.CreateStream(pb.CreateStreamRequest(name="dup", subject="dup"), timeout=5),
                 Code.ALREADY_EXISTS)
    await expect(stub.FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(
        stream="é—missing", partition=0), timeout=5), Code.NOT_FOUND)


async def test_publish_to_subject_deadline(stub):
    await expect(stub.PublishToSubject(pb.PublishToSubjectRequest(
        subject="nobody.listens", value=b"v"), timeout=0.5), Code.DEADLINE_EXCEEDED)


# -- streaming calls -----------------------------------------------------------------------

async def test_publish_async_acks_every_message(h2server, stub):
    await create(stub, "pa")
    n = 3000
    requests = [pb.PublishRequest(stream="pa", value=b"x" * 100, correlationId=str(i))
                for i in range(n)]

    async def gen():
        for request in requests:
            yield request
        yield pb.PublishRequest(stream="missing", correlationId="bad")

    got = []
    async for resp in stub.PublishAsync(gen(), timeout=30):
        got.append(resp)
        if len(got) == n + 1:
            break
    errors = [r for r in got if r.HasField("asyncError")]
    assert [(r.correlationId, r.asyncError.code) for r in errors] == [
        ("bad", pb.PublishAsyncError.Code.NOT_FOUND)]
    acked = [r for r in got if not r.HasField("asyncError")]
    assert sorted(int(r.correlationId) for r in acked) == list(range(n))
    assert sorted(r.ack.offset for r in acked) == list(range(n))


async def test_gufo_liftbridge_publish_and_subscribe(h2server):
    async with LiftbridgeClient([h2server.grpc_addr]) as client:
        await client.create_stream("g", subject="g.subject", partitions=1)
        for i in range(5):
            await client.publish(f"m{i}".encode(), stream="g", key=b"k")
        seen = []
        async for msg in client.subscribe("g", partition=0, start_position=StartPosition.EARLIEST):
            seen.append(msg.value)
            if len(seen) == 5:
                break
    assert seen == [b"m0", b"m1", b"m2", b"m3", b"m4"]


# -- a raw HTTP/2 client, for what real clients never do -----------------------------------

def responses(data: bytes) -> list[bytes]:
    """The whole length-prefixed gRPC messages at the start of ``data``."""
    out, pos = [], 0
    while len(data) - pos >= 5:
        size = int.from_bytes(data[pos + 1:pos + 5], "big")
        if len(data) - pos - 5 < size:
            break
        out.append(data[pos + 5:pos + 5 + size])
        pos += 5 + size
    return out


class RawClient:
    """An HTTP/2 gRPC client made with h2 over a real socket; no deadline of its own."""

    def __init__(self, reader, writer) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.events: list = []

    @classmethod
    async def open(cls, address: str) -> "RawClient":
        host, port = address.rsplit(":", 1)
        client = cls(*await asyncio.open_connection(host, int(port)))
        client.flush()
        return client

    def flush(self) -> None:
        self.writer.write(self.conn.data_to_send())

    def call(self, method: str, timeout: str | None = None) -> int:
        sid = self.conn.get_next_available_stream_id()
        headers = [(":method", "POST"), (":scheme", "http"), (":authority", "riverlog"),
                   (":path", f"/proto.API/{method}"), ("content-type", "application/grpc"),
                   ("te", "trailers")]
        if timeout:
            headers.append(("grpc-timeout", timeout))
        self.conn.send_headers(sid, headers)
        self.flush()
        return sid

    def send(self, sid: int, message: bytes, end: bool = False) -> None:
        self.conn.send_data(sid, b"\x00" + len(message).to_bytes(4, "big") + message,
                            end_stream=end)
        self.flush()

    async def read(self, timeout: float = 5.0) -> list:
        data = await asyncio.wait_for(self.reader.read(65536), timeout)
        if not data:
            raise ConnectionError("closed")
        events = self.conn.receive_data(data)
        self.flush()
        self.events += events
        return events

    async def trailers(self, sid: int, timeout: float = 5.0) -> dict:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for event in self.events:
                if isinstance(event, (h2.events.TrailersReceived, h2.events.ResponseReceived)) \
                        and event.stream_id == sid:
                    headers = {k.decode(): v.decode() for k, v in event.headers}
                    if "grpc-status" in headers:
                        return headers
            await self.read(max(deadline - loop.time(), 0.01))

    def close(self) -> None:
        self.writer.close()


async def test_server_enforces_grpc_timeout(h2server, stub):
    await create(stub, "wait")
    client = await RawClient.open(h2server.grpc_addr)
    try:
        sid = client.call("Subscribe", timeout="300m")
        client.send(sid, pb.SubscribeRequest(stream="wait").SerializeToString(), end=True)
        started = asyncio.get_running_loop().time()
        trailers = await client.trailers(sid)
        assert trailers["grpc-status"] == str(Code.DEADLINE_EXCEEDED.value[0])
        assert 0.25 < asyncio.get_running_loop().time() - started < 3
    finally:
        client.close()


async def test_publish_async_requests_of_one_read_become_one_chunk_and_one_write(
        h2server, stub):
    await create(stub, "batch")
    client = await RawClient.open(h2server.grpc_addr)
    try:
        await client.read()  # the server's SETTINGS and connection window
        sid = client.call("PublishAsync")
        n = 300
        for i in range(n):  # queued in the client, written to the socket at once
            message = pb.PublishRequest(stream="batch", value=b"v" * 64,
                                        correlationId=str(i)).SerializeToString()
            client.conn.send_data(sid, b"\x00" + len(message).to_bytes(4, "big") + message)
        client.flush()
        data_frames = []
        while len(responses(b"".join(e.data for e in data_frames))) < n:
            data_frames += [e for e in await client.read() if isinstance(e, h2.events.DataReceived)]
        acks = [pb.PublishResponse.FromString(r).ack
                for r in responses(b"".join(e.data for e in data_frames))]
        assert [a.offset for a in acks] == list(range(n))
        chunks = h2server.liftbridge.partition("batch", 0).read_chunks(0, 1 << 30)
        assert sum(c.header.num_records for c in chunks) == n
        assert len(chunks) <= 3, [c.header.num_records for c in chunks]
        # the responses of one batch leave together: a few DATA frames, not one per message
        assert len(data_frames) <= 3 * (sum(len(e.data) for e in data_frames) // 16384 + 1)
    finally:
        client.close()


async def test_a_client_that_does_not_read_cannot_grow_server_memory(h2server, stub):
    await create(stub, "slow")
    client = await RawClient.open(h2server.grpc_addr)
    try:
        sid = client.call("PublishAsync")
        request = pb.PublishRequest(stream="slow", value=b"v" * 200,
                                    correlationId="c" * 30).SerializeToString()
        sent = 0
        history = []
        # send while the server gives window; never read (so never open the server's window)
        while len(history) < 10 or history[-1] != history[-10]:
            assert len(history) < 150, f"the server kept taking requests: {history[-5:]}"
            history.append(sent)
            while client.conn.local_flow_control_window(sid) >= len(request) + 5 and \
                    sent < 200_000:
                client.conn.send_data(sid, b"\x00" + len(request).to_bytes(4, "big") + request)
                sent += 1
            client.flush()
            await client.writer.drain()
            await asyncio.sleep(0.01)
            # take in the server's frames (WINDOW_UPDATE) without acknowledging its DATA
            try:
                data = await asyncio.wait_for(client.reader.read(1 << 20), 0.05)
            except asyncio.TimeoutError:
                continue
            for event in client.conn.receive_data(data):
                assert not isinstance(event, h2.events.StreamReset)
        stored = h2server.liftbridge.partition("slow", 0).next_offset
        # responses are ~100 bytes: the client's 64 KiB window takes ~650, the server holds
        # at most OUT_LIMIT (256 KiB) of them and one stream window (1 MiB) of requests
        assert 0 < stored < 20_000, stored
        assert sent < 20_000, sent
        conn = next(iter(h2server.app.grpc._server.connections)).conn
        assert conn.queued(sid) <= 512 * 1024
    finally:
        client.close()


@pytest.mark.parametrize("frame, error_code", [
    # DATA on stream 0 (RFC 9113 6.1): PROTOCOL_ERROR
    (b"\x00\x00\x05\x00\x00\x00\x00\x00\x00" + b"\x00" * 5, 1),
    # a HEADERS frame longer than SETTINGS_MAX_FRAME_SIZE (4.2), refused from its header on
    (b"\xff\xff\xff\x01\x04\x00\x00\x00\x01" + b"\x00" * 100, 6),
])
async def test_a_malformed_frame_closes_only_its_connection(h2server, stub, frame, error_code):
    client = await RawClient.open(h2server.grpc_addr)
    try:
        await client.read()  # the server's SETTINGS
        client.writer.write(frame)
        events = []
        with pytest.raises(ConnectionError):
            for _ in range(10):
                events += await client.read()
        assert any(isinstance(e, h2.events.ConnectionTerminated) and e.error_code == error_code
                   for e in events), events
    finally:
        client.close()
    await create(stub, "still-fine")


# -- TLS and authorization (the checks of security/grpc_auth.py) ---------------------------

def _basic(user: str, password: str) -> tuple:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return (("authorization", f"Basic {token}"),)


async def test_tls_alpn_h2_basic_and_certificate_identity(tmp_path, users, pki):
    from _sec import PASSWORDS, security
    from riverlog.config import GrpcConfig, NatsConfig, RabbitStreamConfig, ServerConfig
    config = ServerConfig(data_dir=str(tmp_path / "data"),
                          rabbitmq_stream=RabbitStreamConfig(port=0, tls_port=0),
                          nats=NatsConfig(port=0), grpc=GrpcConfig(port=0, transport="h2"),
                          security=security(users, pki, client_auth=True))
    app = App(config)
    await app.start()
    try:
        with open(pki.ca, "rb") as f:
            root = f.read()

        def channel(cert):
            with open(cert.key, "rb") as f:
                key = f.read()
            with open(cert.cert, "rb") as f:
                chain = f.read()
            return grpc.aio.secure_channel(f"localhost:{app.grpc.port}",
                                           grpc.ssl_channel_credentials(root, key, chain))

        async with channel(pki.alice) as ch:  # alice by certificate: publishes orders.*
            stub = api_pb2_grpc.APIStub(ch)
            await expect(stub.CreateStream(pb.CreateStreamRequest(
                name="orders.eu", subject="orders.eu"), timeout=5), Code.PERMISSION_DENIED)
            # ops by Basic credentials over the same TLS channel may create it
            await stub.CreateStream(pb.CreateStreamRequest(name="orders.eu", subject="orders.eu"),
                                    metadata=_basic("ops", PASSWORDS["ops"]), timeout=5)
            resp = await stub.Publish(pb.PublishRequest(stream="orders.eu", value=b"v",
                                                        ackPolicy=pb.AckPolicy.LEADER),
                                      timeout=5)
            assert resp.ack.offset == 0
            await expect(stub.Publish(pb.PublishRequest(stream="orders.eu", value=b"v"),
                                      metadata=_basic("alice", "wrong"), timeout=5),
                         Code.UNAUTHENTICATED)

            async def gen():
                yield pb.PublishRequest(stream="orders.eu", value=b"a", correlationId="1")
                yield pb.PublishRequest(stream="other", value=b"b", correlationId="2")

            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for resp in stub.PublishAsync(gen(), timeout=5):
                    assert resp.correlationId == "1"
            assert info.value.code() == Code.PERMISSION_DENIED
        async with channel(pki.carol) as ch:  # a valid certificate of no user
            await expect(api_pb2_grpc.APIStub(ch).FetchMetadata(pb.FetchMetadataRequest(),
                                                                timeout=5),
                         Code.UNAUTHENTICATED)
    finally:
        await app.stop()


# -- choosing the transport ----------------------------------------------------------------

def test_transport_from_flag_key_and_environment():
    from riverlog.config_file import build, load
    assert build({}, {})[0].grpc.transport == "h2"
    assert build({"riverlog.grpc.transport": "grpcio"}, {})[0].grpc.transport == "grpcio"
    assert build({"riverlog.grpc.transport": "grpcio"},
                 {"grpc_transport": "h2"})[0].grpc.transport == "h2"
    env = load(None, {"LIFTBRIDGE_RIVERLOG_GRPC_TRANSPORT": "GRPCIO"})
    assert build(env, {})[0].grpc.transport == "grpcio"
    with pytest.raises(ValueError, match="riverlog.grpc.transport"):
        build({"riverlog.grpc.transport": "quic"}, {})


async def test_cancelled_calls_and_lost_connections_end_their_handlers(h2server, stub):
    await create(stub, "sub")
    service = h2server.liftbridge
    partition = service.partition("sub", 0)

    async def subscribers_become(n: int) -> None:
        for _ in range(200):
            if service.subscribers.get(id(partition), 0) == n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{service.subscribers.get(id(partition), 0)} subscribers, not {n}")

    call = stub.Subscribe(pb.SubscribeRequest(stream="sub"))
    assert await call.read() == pb.Message()  # the handshake
    await subscribers_become(1)
    call.cancel()  # RST_STREAM CANCEL
    await subscribers_become(0)
    client = await RawClient.open(h2server.grpc_addr)
    sid = client.call("Subscribe")
    client.send(sid, pb.SubscribeRequest(stream="sub").SerializeToString(), end=True)
    await subscribers_become(1)
    client.close()  # the connection goes away
    await subscribers_become(0)


async def test_bytes_of_cancelled_calls_go_back_to_the_connection_window(h2server):
    client = await RawClient.open(h2server.grpc_addr)
    try:
        await client.read()  # SETTINGS (1 MiB per call) and the 8 MiB connection window
        chunk = b"\x00" * 16000
        for _ in range(12):  # 12 calls x ~1 MiB never consumed: more than the connection window
            sid = client.call("CreateStream")
            while client.conn.local_flow_control_window(sid) >= len(chunk):
                client.conn.send_data(sid, chunk)
            client.conn.reset_stream(sid)
            client.flush()
            await client.writer.drain()
            with contextlib.suppress(asyncio.TimeoutError):
                while True:
                    await client.read(0.05)  # the server's WINDOW_UPDATEs
            assert client.conn.outbound_flow_control_window > 4 * 1024 * 1024
        sid = client.call("CreateStream")
        client.send(sid, pb.CreateStreamRequest(name="after", subject="after")
                    .SerializeToString(), end=True)
        assert (await client.trailers(sid))["grpc-status"] == "0"
    finally:
        client.close()
