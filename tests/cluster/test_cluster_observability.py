# Watching a cluster (docs/clustering.md "Watching a cluster"): three real cluster members in
# this process (_apps.py), their Prometheus endpoints scraped over HTTP and `riverlog stream
# describe` / `riverlog stats` (riverlog.ops) run against them, as an operator would.
# The counters (elections, ISR shrinks and expands) live in one registry per process: with
# three members in one process each applied change counts once per member holding a replica,
# so the tests read differences.
from __future__ import annotations

import asyncio

from _apps import IDS, stub_of, until
from riverlog.broker import StreamConfig
from riverlog.broker.broker import CURSORS_STREAM
from riverlog.ops import Target, scrape, stats_tables, stream_describe
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.server.app import App


async def samples_of(app: App) -> dict:
    """``{sample name: {labels tuple: value}}`` of ``app``'s /metrics (scraped off the loop:
    the endpoint reads server state on it)."""
    scraped = await asyncio.to_thread(scrape, app.metrics.url)
    return {name: {tuple(sorted(labels.items())): value for labels, value in found}
            for name, found in scraped.items()}


def of(samples: dict, name: str, **labels) -> float | None:
    return samples.get(name, {}).get(tuple(sorted(labels.items())))


async def scraped_until(what: str, app: App, check) -> dict:
    """Scrape ``app`` until ``check(samples)`` holds; return those samples."""
    async def poll():
        for _ in range(600):
            samples = await samples_of(app)
            if check(samples):
                return samples
            await asyncio.sleep(0.1)
        raise AssertionError(f"still not: {what}")
    return await poll()


def target_of(app: App) -> Target:
    host, port = app.rabbitmq_stream.advertised
    return Target(server=f"{host}:{port}", grpc=f"127.0.0.1:{app.grpc.port}",
                  metrics=app.metrics.url)


async def test_metrics_and_describe_follow_the_isr_and_the_leader(cluster):
    """ISR 3 with no lag after writes; a stopped follower leaves the ISR (under-replicated,
    one shrink per member applying it); change_leader counts one election per member and the
    new leader reports the next epoch; describe and stats show leader, replicas, ISR, epoch,
    high watermark and each follower's lag."""
    a = cluster[0]
    await a.broker.placement.create_stream("watched", StreamConfig(
        subject="watched", replication_factor=3, min_isr=2))
    await until("watched everywhere", lambda: all(
        "watched" in x.broker.streams and x.broker.placement.of("watched", 0) is not None
        for x in cluster))
    leader_id = a.broker.placement.of("watched", 0).leader
    leader = cluster[IDS.index(leader_id)]
    followers = [x for x in cluster if x is not leader]
    channel, stub = stub_of(leader)
    try:
        for value in (b"one", b"two", b"three"):
            await stub.Publish(pb.PublishRequest(stream="watched", value=value,
                                                 ackPolicy=pb.AckPolicy.ALL), timeout=10)
    finally:
        await channel.close()
    part = {"vhost": "/", "stream": "watched", "partition": "0"}
    follower_ids = sorted(f.config.cluster.server_id for f in followers)
    samples = await scraped_until("both followers caught up", leader, lambda s: all(
        of(s, "riverlog_follower_lag_messages", **part, replica=r) == 0 for r in follower_ids))
    assert [of(samples, f"riverlog_partition_{n}", **part) for n in (
        "replicas", "isr", "under_replicated", "under_min_isr", "leader_epoch",
        "high_watermark")] == [3, 3, 0, 0, 1, 2]
    assert of(samples, "riverlog_partition_leader_info", **part, leader=leader_id) == 1
    assert all(of(samples, "riverlog_follower_lag_bytes", **part, replica=r) == 0
               for r in follower_ids)
    assert of(samples, "riverlog_raft_term") >= 1
    assert of(samples, "riverlog_raft_commit_index") >= 1
    raft_leaders = [of(await samples_of(x), "riverlog_raft_leader") for x in cluster]
    assert sorted(raft_leaders) == [0, 0, 1]

    rows = dict(await asyncio.to_thread(stream_describe, target_of(leader), "watched"))
    assert (rows["leader server"], rows["replicas"], rows["isr"], rows["leader epoch"],
            rows["high watermark"]) == (leader_id, ", ".join(IDS), ", ".join(IDS), "1", "2")
    assert all(rows[f"follower {r}"].startswith("in sync, lag 0 messages (0 B)")
               for r in follower_ids)
    rows = dict(await asyncio.to_thread(stream_describe, target_of(followers[0]), "watched"))
    assert rows["follower lag"] == f"shown by the leader's metrics ({leader_id})"

    # a stopped follower leaves the ISR as it stops (its controlled shutdown, cluster/leaving.py):
    # under-replicated, not under min ISR
    stopped, kept = followers
    stopped_id = stopped.config.cluster.server_id
    shrinks = of(samples, "riverlog_isr_shrinks_total")
    cluster.remove(stopped)
    await stopped.stop()
    samples = await scraped_until("the stopped follower out of the ISR", leader, lambda s: (
        of(s, "riverlog_partition_isr", **part) == 2))
    assert of(samples, "riverlog_partition_under_replicated", **part) == 1
    assert of(samples, "riverlog_partition_under_min_isr", **part) == 0
    assert of(samples, "riverlog_partition_replica_in_sync", **part, replica=stopped_id) == 0
    # the stopped server also leaves the ISR of __cursors (a replica on every server)
    await until("both live members applied both shrinks", lambda: all(
        stopped_id not in x.broker.placement.of(name, 0).isr for x in cluster
        for name in ("watched", CURSORS_STREAM)))
    # two shrinks, each counted by the two live members (the stopping one stopped following
    # the metadata before it left the ISRs)
    assert of(await samples_of(leader), "riverlog_isr_shrinks_total") == shrinks + 4
    rows = dict(await asyncio.to_thread(stream_describe, target_of(leader), "watched"))
    assert rows["isr"] == ", ".join(sorted((leader_id, kept.config.cluster.server_id))) + \
        " (under-replicated)"
    assert rows[f"follower {stopped_id}"].startswith("out of sync, ")

    # change_leader: the one in-sync follower leads under epoch 2; each live member counts it
    elections = of(await samples_of(leader), "riverlog_leader_elections_total")
    await kept.broker.placement.submit("change_leader", stream="watched", index=0)
    kept_id = kept.config.cluster.server_id
    await until("the new leader everywhere", lambda: all(
        x.broker.placement.of("watched", 0).leader == kept_id for x in cluster))
    samples = await scraped_until("the new leader's view", kept, lambda s: (
        of(s, "riverlog_partition_leader_info", **part, leader=kept_id) == 1))
    assert of(samples, "riverlog_partition_leader_epoch", **part) == 2
    assert of(samples, "riverlog_leader_elections_total") == elections + 2
    tables = {title: (header, rows) for title, header, rows in stats_tables(
        await asyncio.to_thread(scrape, kept.metrics.url))}
    header, partitions = tables["partitions"]
    assert header[:5] == ["vhost", "stream", "partition", "leader", "epoch"]
    assert [row[:5] for row in partitions if row[1] == "watched"] == [
        ["/", "watched", "0", kept_id, "2"]]
    assert tables["raft"][1][0][3] == str(int(elections + 2))
