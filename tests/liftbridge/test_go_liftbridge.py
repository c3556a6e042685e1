"""Liftbridge's own Go client, go-liftbridge v2.3.0, and nats.go v1.37.0 against one riverlog
server (the `server` fixture: an App with the real nats-server), one scenario of
tests/compat/go_liftbridge per test (built once per session by the `go_liftbridge` fixture).
What the client must see is Liftbridge's behaviour (liftbridge-io/liftbridge server/api.go,
partition.go; go-liftbridge's client.go maps the status codes to its errors). The cluster
failover: tests/cluster/test_go_liftbridge_cluster.py; logins: tests/security."""
from __future__ import annotations

import pytest

from riverlog.broker import StreamConfig

pytestmark = pytest.mark.timeout(120)
HOUR_MS = 3_600_000
LEADER, ALL = 0, 1  # Liftbridge's AckPolicy values


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
    out = await run(go_liftbridge, server, "pause", stream="go-pause")
    assert out["pause_all"] is None
    # a subscriber of a partition being paused ends with FailedPrecondition (Liftbridge closes
    # the partition's log): go-liftbridge's ErrPartitionPaused
    assert out["subscriber"]["is"] == "ErrPartitionPaused"
    assert [f["paused"] for f in out["after_pause_all"]] == [True, True]
    assert all(f["pause_first_ns"] > 0 for f in out["after_pause_all"])
    # Subscribe on a paused partition without Resume is refused (FailedPrecondition)
    assert out["subscribe_paused"]["end"]["code"] == "FailedPrecondition"
    assert out["subscribe_paused"]["offsets"] == []
    # a publish to partition 1 of a stream paused with ResumeAll resumes both
    assert out["resume_ack_offset"] == 0
    assert [f["paused"] for f in out["after_publish_resume_all"]] == [False, False]
    # paused again without ResumeAll: a publish to 1 resumes only 1
    assert out["pause_0"] is None and out["pause_1"] is None
    assert [f["paused"] for f in out["after_publish_1"]] == [True, False]
    # Subscribe with Resume resumes partition 0 (empty: the subscription waits, nothing read)
    assert out["subscribe_resume"]["end"] is None
    assert [f["paused"] for f in out["after_subscribe_resume"]] == [False, False]


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


def ack_fields(ack: dict) -> tuple:
    return (ack["stream"], ack["partition_subject"], ack["msg_subject"], ack["offset"],
            ack["correlation_id"], ack["ack_policy"])


async def test_publish_with_every_ack_policy_and_read_back(server, go_liftbridge):
    s = "go-publish"
    out = await run(go_liftbridge, server, "publish", stream=s)
    leader, all_, none = out["leader"], out["all"], out["none"]
    assert leader["error"] is None and all_["error"] is None and none == {"ack": None,
                                                                          "error": None}
    assert ack_fields(leader["ack"]) == (s, s, s, 0, "c-leader", LEADER)
    # the partition subject is the stream's (Liftbridge's p.Subject), the message subject
    # the NATS subject of partition 1
    assert ack_fields(all_["ack"]) == (s, s, f"{s}.1", 0, "c-all", ALL)
    for ack in (leader["ack"], all_["ack"]):
        assert 0 < ack["reception_ns"] <= ack["commit_ns"]
    asyncs = out["async"]
    assert sorted(asyncs) == sorted(f"async{i}" for i in range(20))
    for i in range(20):
        got = asyncs[f"async{i}"]
        assert got["error"] is None and got["ack"]["msg_subject"] == (
            s if i % 2 == 0 else f"{s}.1")
    # PartitionByKey: crc32(key) % 2; round robin alternates
    assert set(out["by_key"].values()) <= {s, f"{s}.1"}
    assert out["round_robin"] in ([s, f"{s}.1"] * 2, [f"{s}.1", s] * 2)
    assert out["to_subject"]["error"] is None
    assert ack_fields(out["to_subject"]["ack"])[:3] == (s, s, f"{s}.1")
    assert out["to_subject"]["ack"]["correlation_id"] == "c-subject"
    assert out["to_subject_none"] == {"ack": None, "error": None}

    read = out["read"]
    for partition in ("0", "1"):
        assert read[partition]["end"]["is"] == "ErrReadonlyPartition"  # StopAtLatestReceived
        offsets = [m["offset"] for m in read[partition]["messages"]]
        assert offsets == list(range(len(offsets)))
    first = read["0"]["messages"][0]
    assert first["value"] == "leader" and first["key"] == "k1"
    assert first["stream"] == s and first["partition"] == 0
    assert first["subject"] == s
    # Liftbridge stores a gRPC publish as the envelope it sends on NATS, with the headers of
    # the message plus "subject" and "reply"
    assert {"h1": "v1", "h2": "v2"}.items() <= first["headers"].items()
    values0 = [m["value"] for m in read["0"]["messages"]]
    values1 = [m["value"] for m in read["1"]["messages"]]
    assert values0[:2] == ["leader", "none"]
    assert values1[0] == "all"
    assert [v for v in values0 if v.startswith("async")] == [f"async{i}" for i in range(0, 20, 2)]
    assert [v for v in values1 if v.startswith("async")] == [f"async{i}" for i in range(1, 20, 2)]
    assert values0.count("rr") == values1.count("rr") == 2
    assert "to-subject" in values1
    assert values0[-2:] == ["to-subject-none", "to-subject-last"]
    by_key = {m["key"]: p for p, r in read.items() for m in r["messages"]
              if m["value"].startswith("key-")}
    assert {k: (s if p == "0" else f"{s}.1") for k, p in by_key.items()} == out["by_key"]
    total = len(values0) + len(values1)
    assert total == 3 + 20 + 4 + 4 + 3


async def test_subscribe_from_every_start_position(server, go_liftbridge):
    out = await run(go_liftbridge, server, "positions", stream="go-positions")
    a = [f"a{i}" for i in range(5)]
    b = [f"b{i}" for i in range(5)]
    assert out["earliest"]["values"] == a + b
    assert out["latest"]["offsets"] == [9]
    assert out["offset"]["offsets"] == list(range(3, 10))
    assert out["time"]["values"] == b
    assert out["time_delta"]["values"] == b
    assert out["default"]["offsets"] == []  # go-liftbridge's default: new messages only
    assert out["new_only"]["values"] == ["new"] and out["new_only"]["offsets"] == [10]
    # a stop position ends the subscription with ResourceExhausted (ErrReadonlyPartition)
    for name, offsets in (("stop_offset", range(5)), ("stop_time", range(5)),
                          ("stop_latest", range(8, 11))):
        assert out[name]["offsets"] == list(offsets), name
        assert out[name]["end"]["is"] == "ErrReadonlyPartition", name
    assert out["isr_replica"]["offsets"] == list(range(11))
    assert out["stop_before_start"]["end"]["code"] == "InvalidArgument"


async def test_cursors(server, go_liftbridge):
    out = await run(go_liftbridge, server, "cursors", stream="go-cursors")
    assert out["set0"] is None and out["set1"] is None and out["set0_again"] is None
    assert out["fetch"] == {"reader0": {"offset": 6, "error": None},
                            "reader1": {"offset": 7, "error": None},
                            "other0": {"offset": -1, "error": None}}


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
    s = "go-nats"
    out = await run(go_liftbridge, server, "nats", stream=s)
    acks = out["acks"]
    assert acks["none"] is None
    for name, policy, offset in (("leader", LEADER, 1), ("all", ALL, 2)):
        ack = acks[name]
        assert ack_fields(ack) == (s, s, s, offset, f"n-{name}", policy), name
        assert ack["ack_inbox"].startswith("_INBOX.")
    # a plain NATS subscriber of the subject sees PublishToSubject's envelope
    assert out["seen_on_subject"] == {"value": "via-grpc", "key": "kg"}
    p0, p1 = out["read"]["0"], out["read"]["1"]
    assert [m["value"] for m in p0] == ["plain", "env-leader", "env-all", "env-none",
                                        "env-no-inbox"]
    assert [m["offset"] for m in p0] == list(range(5))
    plain = p0[0]
    assert plain["key"] is None and plain["subject"] == s and plain["reply"] == ""
    assert plain["headers"] == {"subject": s, "reply": ""}
    enveloped = p0[1]
    assert enveloped["key"] == "k-leader" and enveloped["headers"]["h"] == "leader"
    assert enveloped["subject"] == s
    assert [m["value"] for m in p1] == ["plain-reply", "via-grpc"]
    assert p1[0]["subject"] == f"{s}.1" and p1[0]["reply"] == "reply.here"
    assert p1[1]["key"] == "kg"


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
