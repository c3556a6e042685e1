# Every request's work is bounded by its size and by limits a user cannot raise (issue 24):
# FetchMetadata's names, cursor ids and cursors per stream. Real server in this process
# (_sec.running) with authorization on, real grpcio clients with Basic credentials.
from __future__ import annotations

import asyncio

import grpc

from _sec import basic, running, security, status_of
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
