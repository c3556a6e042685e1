# The metadata Raft's settings (ServerConfig.cluster, docs/clustering.md): Liftbridge's
# clustering keys and flags with riverlog.raft.*, read into ClusterConfig and RaftSettings;
# without riverlog.raft.address nothing changes (the single-server default); clear refusals.
from __future__ import annotations

import asyncio
import os

import pytest

from compat._servers import HOST, free_port
from riverlog.cluster.metadata import RaftMetadata, RaftSettings
from riverlog.cluster.state import MetadataError, Server
from riverlog.config_file import ConfigError, build, load


def write(tmp_path, text: str) -> str:
    path = tmp_path / "liftbridge.yaml"
    path.write_text(text)
    return str(path)


CLUSTER_FILE = """
clustering:
  server.id: b
  namespace: prod
  raft.bootstrap.peers: [a, b, c]
riverlog:
  raft:
    address: 10.0.0.2:7000
    password: s3cret
    peers: {a: "10.0.0.1:7000", c: "10.0.0.3:7000"}
"""


def test_cluster_keys_make_the_raft_member(tmp_path):
    config, _ = build(load(write(tmp_path, CLUSTER_FILE), {}), {"data_dir": "/d"})
    cluster = config.cluster
    assert (cluster.server_id, cluster.peer_ids, cluster.bootstrap_seed) == ("b", ("a", "c"),
                                                                             False)
    assert config.nats.namespace == "prod"
    raft = RaftSettings.from_config(cluster, config.data_dir)
    assert raft == RaftSettings("10.0.0.2:7000", os.path.join("/d", "raft"),
                                ("10.0.0.1:7000", "10.0.0.3:7000"), "s3cret")


def test_environment_and_flags(tmp_path):
    env = {"LIFTBRIDGE_RIVERLOG_RAFT_ADDRESS": "127.0.0.1:7001",
           "LIFTBRIDGE_RIVERLOG_RAFT_PEERS": "a=127.0.0.1:7000",
           "LIFTBRIDGE_CLUSTERING_RAFT_BOOTSTRAP_PEERS": "a,b",
           "LIFTBRIDGE_RIVERLOG_RAFT_PASSWORD": "pw"}
    config, _ = build(load(None, env), {"server_id": "b"})
    assert config.cluster.peer_addresses == ("127.0.0.1:7000",)
    seed, _ = build(load(None, {"LIFTBRIDGE_RIVERLOG_RAFT_ADDRESS": "127.0.0.1:7001",
                                "LIFTBRIDGE_RIVERLOG_RAFT_PASSWORD": "pw"}),
                    {"server_id": "a", "raft_bootstrap_seed": True})
    assert seed.cluster.bootstrap_seed and seed.cluster.peer_addresses == ()
    assert seed.cluster.initial_cluster_size is None  # every server, RabbitMQ's default
    sized, _ = build(load(None, {**env, "LIFTBRIDGE_RIVERLOG_STREAM_INITIAL_CLUSTER_SIZE": "1"}),
                     {"server_id": "b"})
    assert sized.cluster.initial_cluster_size == 1


def test_without_raft_address_the_single_server_is_unchanged(tmp_path):
    text = "clustering: {server.id: a, raft.bootstrap.seed: true, raft.bootstrap.peers: [a]}"
    config, _ = build(load(write(tmp_path, text), {}), {"raft_bootstrap_seed": True})
    plain, _ = build(load(None, {}), {})
    assert config.cluster is None and plain.cluster is None
    assert config.log == plain.log and config.rabbitmq_stream == plain.rabbitmq_stream


@pytest.mark.parametrize("extra, message", [
    ({"riverlog.raft.password": None}, "riverlog.raft.password: a Raft member needs a password"),
    ({"riverlog.raft.password": None, "clustering.raft.bootstrap.peers": None,
      "clustering.raft.bootstrap.seed": True}, "riverlog.raft.password: a Raft member needs"),
    ({"clustering.raft.bootstrap.seed": True}, "give at most one"),
    ({"riverlog.raft.peers": {"a": "10.0.0.1:7000"}}, "no Raft address for server 'c'"),
    ({"riverlog.raft.peers": "a"}, "riverlog.raft.peers: expected server id to host:port"),
    ({"riverlog.raft.peers": {"a": "nowhere"}}, "riverlog.raft.peers: could not parse"),
    ({"clustering.server.id": ""}, "clustering.server.id: a cluster member needs an id"),
    ({"riverlog.raft.address": "7000"}, "riverlog.raft.address: could not parse"),
    ({"riverlog.raft.address": ":7000"}, "riverlog.raft.address: give host:port"),
    ({"riverlog.raft.address": "0.0.0.0:7000"}, "riverlog.raft.address: 0.0.0.0 is no address"),
    ({"riverlog.raft.address": "[::]:7000"}, "riverlog.raft.address: :: is no address"),
    ({"riverlog.stream.initial.cluster.size": 0},
     "riverlog.stream.initial.cluster.size must be >= 1"),
])
def test_bad_cluster_settings_refused(tmp_path, extra, message):
    values = {**load(write(tmp_path, CLUSTER_FILE), {}), **extra}
    with pytest.raises(ConfigError, match=message):
        build(values, {})


@pytest.mark.parametrize("peers", [None, []])
def test_neither_seed_nor_peers_joins_a_running_cluster(tmp_path, peers):
    """Liftbridge's rule: a server that does not bootstrap joins (riverlog.cluster.join)."""
    values = {**load(write(tmp_path, CLUSTER_FILE), {}), "riverlog.raft.peers": None,
              "clustering.raft.bootstrap.peers": peers}
    config, _ = build(values, {})
    assert config.cluster.joins and config.cluster.peer_addresses == ()
    seeded, _ = build({**values, "clustering.raft.bootstrap.seed": True}, {})
    assert not seeded.cluster.joins


def test_seed_member_from_config_serves_metadata(tmp_path):
    address = f"{HOST}:{free_port()}"
    config, _ = build(load(None, {"LIFTBRIDGE_RIVERLOG_RAFT_ADDRESS": address,
                                  "LIFTBRIDGE_RIVERLOG_RAFT_PASSWORD": "pw"}),
                      {"server_id": "a", "raft_bootstrap_seed": True,
                       "data_dir": str(tmp_path)})

    async def run() -> None:
        metadata = await asyncio.to_thread(
            RaftMetadata, RaftSettings.from_config(config.cluster, config.data_dir))
        try:
            assert await metadata.submit("add_server", server=Server("a")) == Server("a")
            with pytest.raises(MetadataError, match="create_stream: .*'nme'"):
                await metadata.submit("create_stream", nme="x")  # refused in every member
            with pytest.raises(KeyError, match="unknown metadata command"):
                await metadata.submit("drop_everything")
            assert list(metadata.state.servers) == ["a"] and metadata.state.streams == {}
        finally:
            metadata.close()
    asyncio.run(run())
    assert os.path.exists(tmp_path / "raft" / "journal")


def test_a_cluster_member_takes_min_insync_replicas_and_nats_routes(tmp_path):
    values = {**load(write(tmp_path, CLUSTER_FILE), {}), "clustering.min.insync.replicas": 2}
    config, _ = build(values, {"nats_cluster_port": 6222,
                               "nats_routes": ["10.0.0.1:6222", "10.0.0.3:6222"]})
    assert config.cluster.min_insync_replicas == 2
    assert (config.nats.cluster_port, config.nats.routes) == (6222, ("10.0.0.1:6222",
                                                                     "10.0.0.3:6222"))
    with pytest.raises(ConfigError, match="a single riverlog server has one replica"):
        build(load(None, {"LIFTBRIDGE_CLUSTERING_MIN_INSYNC_REPLICAS": "2"}), {})
    with pytest.raises(ConfigError, match="set riverlog.raft.address too"):
        build(load(None, {}), {"nats_cluster_port": 6222})
