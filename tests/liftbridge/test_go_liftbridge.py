"""Liftbridge's own Go client, go-liftbridge v2.3.0, and nats.go v1.37.0 against one riverlog
server (the `server` fixture: an App with the real nats-server), one scenario of
tests/compat/go_liftbridge per test (built once per session by the `go_liftbridge` fixture).
What the client must see is Liftbridge's behaviour (liftbridge-io/liftbridge server/api.go,
partition.go; go-liftbridge's client.go maps the status codes to its errors). The cluster
failover: tests/cluster/test_go_liftbridge_cluster.py; logins: tests/security."""
from __future__ import annotations

import pytest

from compat._go_checks import (check_cursors, check_nats, check_pause, check_positions,
                               check_publish)
from riverlog.broker import StreamConfig

pytestmark = pytest.mark.timeout(120)
HOUR_MS = 3_600_000


async def run(go, server, scenario: str, **fields) -> dict:
    return await go.run(scenario, server.grpc_addr, server.nats_url, **fields)


async def test_create_stream_with_every_option_and_the_metadata(server, go_liftbridge):
    out = await run(go_liftbridge, server, "create_stream", stream="go-create",
                    subject="go.create")
    assert out["create"] is None
    assert out["again"]["is"] == "ErrStreamExists"
    # every option go-liftbridge sends is kept (durations arrive in ms)
    config = server.app.broker.streams["go-create"].config
    assert config == StreamConfig(
        subject="go.create", group="workers", partitions=3, retention_max_bytes=1 << 30,
        retention_max_messages=100000, retention_max_age_ms=48 * HOUR_MS,
        segment_max_bytes=1 << 20, segment_max_age_ms=24 * HOUR_MS, compact=True,
        cleaner_interval_ms=120_000, optimistic_concurrency=False, replication_factor=1,
        min_isr=1, compact_max_goroutines=3, auto_pause_time_ms=HOUR_MS,
        auto_pause_disable_if_subscribers=True, table=config.table)
    server_id = server.liftbridge.server_id
    # partitions held and led: the stream's 3 and the one of __cursors
    assert out["brokers"] == [{"id": server_id, "addr": server.grpc_addr, "partitions": 4,
                               "leaders": 4}]
    stream = out["stream"]
    assert (stream["name"], stream["subject"]) == ("go-create", "go.create")
    assert stream["created_ns"] > 0
    assert sorted(stream["partitions"]) == ["0", "1", "2"]
    for number, partition in stream["partitions"].items():
        assert partition == {"id": int(number), "leader": server_id, "replicas": [server_id],
                             "isr": [server_id], "high_watermark": -1, "newest_offset": -1,
                             "paused": False, "readonly": False}
    assert out["partition2"] == stream["partitions"]["2"]


async def test_delete_stream_ends_subscribers_and_is_not_found_after(server, go_liftbridge):
    await run(go_liftbridge, server, "create_stream", stream="go-delete", subject="go-delete")
    out = await run(go_liftbridge, server, "delete_stream", stream="go-delete")
    assert out["delete"] is None
    # a subscriber of a deleted stream ends with NotFound: go-liftbridge's ErrStreamDeleted
    assert out["subscriber"]["is"] == "ErrStreamDeleted"
    assert out["again"]["is"] == "ErrNoSuchStream"
    assert out["listed"] is False
    assert out["publish"]["is"] == "ErrNoSuchPartition"  # PublishAsyncError NOT_FOUND
    assert "go-delete" not in server.app.broker.streams


async def test_pause_resume_all_and_resume_on_publish_and_subscribe(server, go_liftbridge):
    stream = "go-pause"
    check_pause(await run(go_liftbridge, server, "pause", stream=stream), stream)


async def test_readonly_ends_subscribers_and_refuses_publishes(server, go_liftbridge):
    out = await run(go_liftbridge, server, "readonly", stream="go-readonly")
    assert out["set"] is None
    # the subscriber read the 3 messages, then ResourceExhausted "End of readonly partition"
    assert out["subscriber"] == {"received": 3, "end": {
        "error": "readonly partition", "code": "Unknown", "is": "ErrReadonlyPartition"}}
    assert out["publish"]["is"] == "ErrReadonlyPartition"
    assert out["publish_async"]["is"] == "ErrReadonlyPartition"
    assert out["new_subscriber"]["offsets"] == [0, 1, 2]
    assert out["new_subscriber"]["end"]["is"] == "ErrReadonlyPartition"
    assert out["unset"] is None
    assert out["publish_after"]["error"] is None
    assert out["publish_after"]["ack"]["offset"] == 3


async def test_publish_with_every_ack_policy_and_read_back(server, go_liftbridge):
    stream = "go-publish"
    check_publish(await run(go_liftbridge, server, "publish", stream=stream), stream)


async def test_subscribe_from_every_start_position(server, go_liftbridge):
    stream = "go-positions"
    check_positions(await run(go_liftbridge, server, "positions", stream=stream), stream)


async def test_cursors(server, go_liftbridge):
    stream = "go-cursors"
    check_cursors(await run(go_liftbridge, server, "cursors", stream=stream), stream)


async def test_consumer_group_members_cursors_and_split(server, go_liftbridge):
    group = "go-group"  # the scenario names the group as the stream
    out = await run(go_liftbridge, server, "group", stream=group, timeout=90)
    assert out["first"] == {"first": {"values": {"0": ["p0-0", "p0-1", "p0-2"],
                                                 "1": ["p1-0", "p1-1", "p1-2"]},
                                      "errors": None}}
    assert out["checkpoint"] is None
    # Close leaves the group (LeaveConsumerGroup), then waits for the consumer's loop, which
    # go-liftbridge v2.3.0 may never end (member.close in publish.go): "hung" is its bug
    closes = (out["close"], out["close_second"], out["close_third"])
    assert all(c in (None, "hung") for c in closes), closes
    assert out["cursors"] == [2, 2]  # the group's cursors, "__group:<group>"
    # a new member goes on after the group's cursors
    assert out["second"] == {"second": {"values": {"0": ["p0-new"], "1": ["p1-new"]},
                                        "errors": None}}
    # two members: one partition each (the newcomer starts from the group's cursor, so it may
    # get p1-new again: nobody checkpointed it)
    split = out["split"]
    owner = {v: member for member, r in split.items() for p, vs in r["values"].items()
             for v in vs}
    assert owner["p0-split"] != owner["p1-split"], split
    assert sum(vs.count(v) for r in split.values() for vs in r["values"].values()
               for v in ("p0-split", "p1-split")) == 2
    # the member that gave up a partition saw its subscription end as Liftbridge ends it (the
    # server closes the call: io.EOF); nothing else
    assert all(set(r["errors"] or ()) <= {"EOF"} for r in split.values()), split
    assert out["group"]["coordinator"] == server.liftbridge.server_id
    # the last member left: the group is gone
    assert out["group_after_close"] == ""
    assert server.liftbridge.groups.coordinator_of(group) is None


async def test_nats_go_plain_and_enveloped_publishes(server, go_liftbridge):
    stream = "go-nats"
    check_nats(await run(go_liftbridge, server, "nats", stream=stream), stream)


async def test_unknown_streams_and_partitions(server, go_liftbridge):
    out = await run(go_liftbridge, server, "unknown", stream="go-nothing",
                    existing="go-exists")
    # server answers, as go-liftbridge maps them (client.go, message.go)
    for name in ("publish", "publish_async", "publish_partition", "pause", "pause_partition",
                 "readonly"):
        assert out[name]["is"] == "ErrNoSuchPartition", name
    assert out["delete"]["is"] == "ErrNoSuchStream"
    # go-liftbridge looks these up in its metadata first and never asks the server
    assert out["subscribe"] == {"error": "no known stream", "code": "Unknown"}
    assert out["partition_metadata"] == {"error": "no known stream", "code": "Unknown"}
    # the raw answers (Liftbridge's api.go and metadata.go)
    assert out["raw_subscribe"] == {"error": "rpc error: code = NotFound desc = No such "
                                    "partition", "code": "NotFound"}
    assert out["raw_subscribe_partition"]["code"] == "NotFound"
    assert out["raw_partition_metadata"]["code"] == "NotFound"
    assert out["raw_publish"] == {"error": "rpc error: code = NotFound desc = no such stream: "
                                  "go-nothing", "code": "NotFound"}
    assert out["raw_metadata"] == ["go-nothing:UNKNOWN_STREAM"]
    # Liftbridge lists an unknown stream asked for by name (with UNKNOWN_STREAM and no
    # partitions), and go-liftbridge keeps it in its Metadata
    assert out["metadata"] == {"error": None, "listed": True}
    # cursors of a stream that does not exist: Liftbridge stores them without looking
    assert out["set_cursor"] is None
    assert out["fetch_cursor"] == {"offset": 1, "error": None}
    assert "go-nothing" not in server.app.broker.streams


async def test_refused_settings_sizes_and_expected_offsets(server, go_liftbridge):
    out = await run(go_liftbridge, server, "refused", stream="go-refused")
    assert out["empty_name"] == {"error": "rpc error: code = InvalidArgument desc = Name "
                                 "cannot be empty", "code": "InvalidArgument"}
    assert out["reserved"] == {"error": "rpc error: code = InvalidArgument desc = Stream is "
                               "reserved", "code": "InvalidArgument"}
    assert out["bad_subject"]["code"] == "InvalidArgument"
    assert out["encryption"]["code"] == "FailedPrecondition"
    assert out["too_many_replicas"]["code"] == "InvalidArgument"
    # over clustering.replication.max.bytes (1 MiB): Ack TOO_LARGE, which Liftbridge turns
    # into PublishAsyncError BAD_REQUEST "message exceeds max replication size"
    assert out["too_large"] == {"error": "message exceeds max replication size",
                                "code": "Unknown"}
    assert out["too_large_async"] == out["too_large"]
    # over gRPC's 4 MiB message limit (grpc-go's server default, Liftbridge sets no other)
    assert out["over_grpc_limit"]["code"] == "ResourceExhausted"
    assert out["next_offset"] == 0
    assert out["occ_first"]["error"] is None and out["occ_first"]["ack"]["offset"] == 0
    assert out["occ_wrong"] == {"error": "incorrect expected offset", "code": "Unknown"}
    assert out["occ_none"] == {"error": "rpc error: code = InvalidArgument desc = stream with "
                               "concurrency control must have AckPolicy set",
                               "code": "InvalidArgument"}
    # PublishToSubject on a subject no stream stores: no ack before the deadline
    assert out["no_stream_on_subject"]["is"] == "ErrAckTimeout"
