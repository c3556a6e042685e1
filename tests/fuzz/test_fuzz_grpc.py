# Fuzzing the Liftbridge gRPC handlers (riverlog.server.grpc_api / grpc_streams) through a real
# grpc channel into a real App (broker, embedded nats-server, gRPC door on each server transport:
# riverlog's own HTTP/2 one and grpcio's) running on its own event loop in a thread: every RPC of /proto.API gets request bytes made from its protobuf class
# (any field values, truncated or random bytes, names that hit an existing stream). The contract
# (grpc_api.py): a malformed or refused request gets a gRPC status naming the problem; a handler
# never fails with an unexpected exception (grpc's UNKNOWN "Unexpected <class ...>") and the
# server keeps serving.
from __future__ import annotations

import asyncio
import threading

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverlog.config import (GRPC_TRANSPORTS, GrpcConfig, NatsConfig, RabbitStreamConfig,
                             ServerConfig)
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.server.app import App

from ._budget import budget
from ._proto import wire

UNARY = {
    "CreateStream": pb.CreateStreamRequest, "DeleteStream": pb.DeleteStreamRequest,
    "PauseStream": pb.PauseStreamRequest, "SetStreamReadonly": pb.SetStreamReadonlyRequest,
    "FetchMetadata": pb.FetchMetadataRequest,
    "FetchPartitionMetadata": pb.FetchPartitionMetadataRequest,
    "Publish": pb.PublishRequest, "PublishToSubject": pb.PublishToSubjectRequest,
    "SetCursor": pb.SetCursorRequest, "FetchCursor": pb.FetchCursorRequest,
    "JoinConsumerGroup": pb.JoinConsumerGroupRequest,
    "LeaveConsumerGroup": pb.LeaveConsumerGroupRequest,
    "FetchConsumerGroupAssignments": pb.FetchConsumerGroupAssignmentsRequest,
    "ReportConsumerGroupCoordinator": pb.ReportConsumerGroupCoordinatorRequest,
}
TIMEOUT_S = 2.0
STREAMING_TIMEOUT_S = 0.2  # Subscribe to a live partition only ends at its deadline


class _Server:
    """An App on a private event loop in a daemon thread."""

    def __init__(self, data_dir: str, transport: str) -> None:
        config = ServerConfig(data_dir=data_dir, rabbitmq_stream=RabbitStreamConfig(port=0),
                              nats=NatsConfig(port=0),
                              grpc=GrpcConfig(port=0, transport=transport))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.app = App(config)
        self.call(self.app.start(), 30)

    def call(self, coro, timeout: float):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.call(self.app.stop(), 30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module", params=GRPC_TRANSPORTS)
def channel(request, tmp_path_factory):
    server = _Server(str(tmp_path_factory.mktemp("fuzz-grpc") / "data"), request.param)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.app.grpc.port}")
    create = channel.unary_unary("/proto.API/CreateStream")
    create(pb.CreateStreamRequest(name="fz", subject="fz", partitions=2).SerializeToString(),
           timeout=10)
    publish = channel.unary_unary("/proto.API/Publish")
    for i in range(5):
        publish(pb.PublishRequest(stream="fz", value=b"m%d" % i,
                                  ackPolicy=pb.AckPolicy.LEADER).SerializeToString(), timeout=10)
    yield channel
    channel.close()
    server.close()


def _expect_handled(call) -> None:
    try:
        call()
    except grpc.RpcError as exc:
        assert exc.code() != grpc.StatusCode.UNKNOWN, exc.details()


def _still_serving(channel) -> None:
    channel.unary_unary("/proto.API/FetchMetadata")(
        pb.FetchMetadataRequest().SerializeToString(), timeout=10)


@pytest.mark.parametrize("method", sorted(UNARY))
def test_unary_rpcs(channel, method):
    rpc = channel.unary_unary(f"/proto.API/{method}")

    @budget(20, share=0.1)
    @given(wire(UNARY[method]))
    def run(request: bytes):
        _expect_handled(lambda: rpc(request, timeout=TIMEOUT_S))

    run()
    _still_serving(channel)


def test_subscribe(channel):
    rpc = channel.unary_stream("/proto.API/Subscribe")

    @budget(15, share=0.02)
    @given(wire(pb.SubscribeRequest))
    def run(request: bytes):
        def consume():
            for _ in rpc(request, timeout=STREAMING_TIMEOUT_S):
                pass
        try:
            consume()
        except grpc.RpcError as exc:
            assert exc.code() != grpc.StatusCode.UNKNOWN, exc.details()

    run()
    _still_serving(channel)


def test_publish_async(channel):
    rpc = channel.stream_stream("/proto.API/PublishAsync")

    @budget(25, share=0.05)
    @given(st.lists(wire(pb.PublishRequest), max_size=4))
    def run(requests: list[bytes]):
        _expect_handled(lambda: list(rpc(iter(requests), timeout=TIMEOUT_S)))

    run()
    _still_serving(channel)


def test_a_huge_partition_count_is_refused_at_once(channel):
    """Found by the fuzz: CreateStream(partitions=2**31-1) made one folder per partition on the
    event loop, for hours. Now InvalidArgument (MAX_PARTITIONS)."""
    create = channel.unary_unary("/proto.API/CreateStream")
    with pytest.raises(grpc.RpcError) as err:
        create(pb.CreateStreamRequest(name="huge", subject="huge",
                                      partitions=(1 << 31) - 1).SerializeToString(), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert "at most" in err.value.details()
