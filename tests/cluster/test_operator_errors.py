"""Errors an operator meets (issue 21 item 6) say what to do: a Liftbridge configuration with
only Liftbridge's clustering keys names the riverlog keys a cluster member also needs, and a
CreateStream with replication factor 3 sent while the cluster is still forming gets a
retryable UNAVAILABLE that says so (not Liftbridge's "Invalid replicationFactor 3, cluster
size 0"), on a real cluster member whose two peers have not started yet."""
from __future__ import annotations

import grpc
import pytest
from _apps import configs

from riverlog.config_file import ConfigError, build, load
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.api_pb2_grpc import APIStub
from riverlog.server.app import App

pytestmark = pytest.mark.timeout(90)


def test_liftbridge_clustering_keys_alone_name_the_riverlog_keys(tmp_path):
    path = tmp_path / "liftbridge.yaml"
    path.write_text("clustering:\n  server.id: a\n  raft.bootstrap.peers: [a, b, c]\n"
                    "  min.insync.replicas: 2\n")
    with pytest.raises(ConfigError) as refused:
        build(load(str(path), {}), {})
    message = str(refused.value)
    assert "a single riverlog server has one replica, so min.insync.replicas must be 1" \
        in message
    for key in ("riverlog.raft.address", "riverlog.raft.peers", "riverlog.raft.password"):
        assert key in message


async def test_create_stream_while_the_cluster_forms_is_unavailable(tmp_path):
    app = App(configs(tmp_path)[0])  # server a; its bootstrap peers b and c never start
    await app.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}")
    try:
        assert app.broker.placement.forming()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await APIStub(channel).CreateStream(pb.CreateStreamRequest(
                name="early", subject="early", replicationFactor=3), timeout=20)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "the cluster is forming" in refused.value.details()
        assert "try again" in refused.value.details()
    finally:
        await channel.close()
        await app.stop()
