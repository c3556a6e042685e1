# Every request's work is bounded by its size and by limits a user cannot raise (issue 24):
# gRPC FetchMetadata's and RabbitMQ Metadata's names. Real server in this process
# (_sec.running) with authorization on, real grpcio clients with Basic credentials.
from __future__ import annotations

import asyncio

import grpc
import pytest

from _sec import PASSWORDS, basic, running, security, status_of
from riverlog.client.async_client import AsyncClient
from riverlog.client.connection import ClientError
from riverlog.protocol.rabbitmq_stream.constants import MAX_METADATA_NAMES as RABBITMQ_MAX_NAMES
from riverlog.protocol.rabbitmq_stream import frames as f
from riverlog.protocol.rabbitmq_stream.constants import ResponseCode
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc
from riverlog.server.grpc_metadata import MAX_METADATA_NAMES, fetch_metadata


def stub_of(channel) -> api_pb2_grpc.APIStub:
    return api_pb2_grpc.APIStub(channel)


async def test_fetch_metadata_names_are_bounded(tmp_path, users):
    """200,000 names cost 0.54 s of the event loop per call before; now more than
    MAX_METADATA_NAMES are refused at once, and up to that many are answered."""
    async with running(tmp_path, security(users)) as app, \
            grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
        stub = stub_of(channel)
        alice = basic("alice")
        names = [f"n{i}" for i in range(MAX_METADATA_NAMES + 1)]
        assert await status_of(stub.FetchMetadata(pb.FetchMetadataRequest(streams=names),
                                                   metadata=alice, timeout=30)) == \
            grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await status_of(stub.FetchMetadata(pb.FetchMetadataRequest(
            streams=names[:10], groups=names[10:]), metadata=alice, timeout=30)) == \
            grpc.StatusCode.RESOURCE_EXHAUSTED
        resp = await stub.FetchMetadata(pb.FetchMetadataRequest(
            streams=names[:MAX_METADATA_NAMES]), metadata=alice, timeout=30)
        assert len(resp.streamMetadata) == MAX_METADATA_NAMES
        assert {m.error for m in resp.streamMetadata} == {pb.StreamMetadata.Error.UNKNOWN_STREAM}


async def test_fetch_metadata_names_are_counted_past_other_fields(tmp_path, users):
    """The count stopped at the first field that was not length-delimited: an unknown varint
    field first (b"\\x18\\x01") let every name through to the parser. Crafted bytes over a
    generic unary call: varint, fixed64 and fixed32 fields are stepped over, a group is
    refused."""
    names = pb.FetchMetadataRequest(
        streams=[f"n{i}" for i in range(MAX_METADATA_NAMES + 1)]).SerializeToString()
    async with running(tmp_path, security(users)) as app, \
            grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}") as channel:
        call = channel.unary_unary("/proto.API/FetchMetadata",
                                   request_serializer=lambda raw: raw,
                                   response_deserializer=pb.FetchMetadataResponse.FromString)
        alice = basic("alice")
        for prefix in (b"\x18\x01", b"\x18\xff\x01", b"\x19" + bytes(8),
                       b"\x1d" + bytes(4), b"\x18\x01\x19" + bytes(8) + b"\x1d" + bytes(4)):
            assert await status_of(call(prefix + names, metadata=alice, timeout=30)) == \
                grpc.StatusCode.RESOURCE_EXHAUSTED, prefix
        few = pb.FetchMetadataRequest(streams=["a", "b"]).SerializeToString()
        assert await status_of(call(b"\x1b\x1c" + few, metadata=alice, timeout=30)) == \
            grpc.StatusCode.INVALID_ARGUMENT
        resp = await call(b"\x18\x01" + few + b"\x1d" + bytes(4), metadata=alice,
                          timeout=30)
        assert [m.name for m in resp.streamMetadata] == ["a", "b"]


async def test_a_large_fetch_metadata_lets_the_event_loop_turn(tmp_path, users):
    """The answer is built in slices: other work runs between them (before: none did)."""
    async with running(tmp_path, security(users)) as app:
        turns = 0
        done = False

        async def ticker():
            nonlocal turns
            while not done:
                turns += 1
                await asyncio.sleep(0)

        task = asyncio.get_running_loop().create_task(ticker())
        await asyncio.sleep(0)
        request = pb.FetchMetadataRequest(streams=[f"n{i}" for i in range(MAX_METADATA_NAMES)])
        before = turns
        resp = await fetch_metadata(app.grpc.service, request)
        during = turns - before
        done = True
        await task
        assert len(resp.streamMetadata) == MAX_METADATA_NAMES
        assert during >= 10, during


async def test_rabbitmq_metadata_names_are_bounded(tmp_path, users):
    """A Metadata frame of 1 MiB names ~130,000 streams: before, every one was decoded and
    answered on the event loop (seconds); now more than RABBITMQ_MAX_NAMES close the
    connection with 0x0e (frame too large) before they are read, and a name asked twice is
    answered once, as RabbitMQ answers from a map."""
    async with running(tmp_path, security(users)) as app:
        port = app.rabbitmq_stream.port
        client = await AsyncClient.connect("127.0.0.1", port, "alice", PASSWORDS["alice"])
        try:
            names = [f"n{i}" for i in range(RABBITMQ_MAX_NAMES)]
            asked = tuple(names[10:] + names[10:20])  # 10 asked twice
            answer = await client._request(lambda corr: f.Metadata(corr, asked))
            assert [s.name for s in answer.streams] == names[10:]
            assert {s.response_code for s in answer.streams} == {
                ResponseCode.STREAM_DOES_NOT_EXIST}
            with pytest.raises(ClientError, match="0x0e FRAME_TOO_LARGE"):
                await asyncio.wait_for(client.metadata(*names, "one more"), 30)
        finally:
            await client.close()
