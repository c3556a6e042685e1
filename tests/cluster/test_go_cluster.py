# RabbitMQ's Go stream client (the `go_client` fixture, tests/compat/_go.py) against one real
# 3-server cluster (`riverlog cluster up`, shared by this module's tests): an Environment given
# every server's URI, streams created with RabbitMQ's default (a replica on every server),
# producers placed on the leader and consumers on a replica from Metadata, deduplication,
# offset tracking and super streams (without single active consumer: its groups are per
# server) across servers; last, the reliable producer and consumer
# (pkg/ha) while the stream's leader is SIGKILLed: every confirmed message survives.
from __future__ import annotations

import os
import signal

import pytest

from _cluster import read_table, start_cluster_up, stop_cluster_up

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """server id -> its row of the `cluster up` table, while the cluster runs."""
    proc = start_cluster_up(tmp_path_factory.mktemp("go-cluster") / "cluster")
    try:
        yield read_table(proc)
    finally:
        stop_cluster_up(proc)


def uris(rows) -> list[str]:
    return [f"rabbitmq-stream://guest:guest@{row['RabbitMQ Stream']}/%2f"
            for row in rows.values()]


async def run(go_client, rows, scenario, **fields):
    return await go_client.run(scenario, "", 0, timeout=120, uris=uris(rows), **fields)


async def test_publish_and_consume_across_servers(servers, go_client):
    addresses = sorted(row["RabbitMQ Stream"] for row in servers.values())
    r = await run(go_client, servers, "publish_consume", stream="go-cluster", count=100,
                  batch=50)
    assert (r["confirmed"], r["failed"]) == (150, 0)
    assert r["bodies"] == [f"s-{i}" for i in range(100)] + [f"b-{i}" for i in range(50)]
    assert r["offsets"] == list(range(150))
    # RabbitMQ's default: a member on every server; Metadata names the leader and the others
    assert sorted([r["leader"], *r["replicas"]]) == addresses
    assert r["stats"] == {"first_offset": 0, "committed_chunk_id": 100}


async def test_dedup_tracking_and_super_stream_across_servers(servers, go_client):
    r = await run(go_client, servers, "dedup", stream="go-cluster-dedup")
    assert (r["ids_third"], r["query_sequence"]) == ([16, 17, 18], 18)
    assert len(r["bodies"]) == 18 and r["confirmed_second"] == 10
    r = await run(go_client, servers, "tracking", stream="go-cluster-track")
    assert (r["env_query_offset"], r["auto_query_offset"]) == (19, 29)
    assert r["last_consumed"]["first_offset"] == 19
    # a plain SuperStreamConsumer: single active consumer groups are per server in riverlog
    # (docs/rabbitmq-stream.md), and the Go client places each partition's consumer on a
    # replica of its choosing, so a group's members may sit on different servers
    r = await run(go_client, servers, "superstream", stream="go-cluster-super", sac=False)
    assert r["hash_failed"] == 0 and len(r["hash_routed"]) == 30
    got = r["one_before_close"]
    assert {b: p for p, bodies in got.items() for b in bodies} == r["hash_routed"]
    assert sum(len(b) for b in got.values()) == 30
    assert r["delete"] == 0x01 and r["delete_keys"] == 0x01
    assert r["key_routed"] == {"region-eu": "go-cluster-super-keys-eu",
                               "region-us": "go-cluster-super-keys-us"}


async def test_reliable_producer_and_consumer_when_the_leader_is_killed(servers, go_client):
    """Kills a server of the module's cluster: keep this test last in the module."""
    running = await go_client.start("reliable", "", 0, uris=uris(servers),
                                    stream="go-cluster-kill", before=300, after=300,
                                    timeout_s=120)
    leader = (await running.phase(timeout=90))["leader"]
    (victim,) = [row for row in servers.values() if row["RabbitMQ Stream"] == leader]
    os.kill(int(victim["pid"]), signal.SIGKILL)
    running.proceed()
    r = await running.result(timeout=220)
    assert r["recovered"] and r["all_answered"] and r["caught_up"], r
    assert r["producer_reconnected"], r
    assert r["stored_missing"] == 0 and r["reliable_consumer_missing"] == 0, r
    assert r["reliable_consumer_duplicates"] == 0, r
    assert r["confirmed"] >= r["confirmed_at_signal"] + 300
