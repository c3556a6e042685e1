# What go-liftbridge and nats.go must see in the scenarios of tests/compat/go_liftbridge that
# run the same on one server (tests/liftbridge/test_go_liftbridge.py) and on a cluster
# (tests/cluster/test_go_liftbridge_cluster.py): Liftbridge's behaviour (liftbridge-io/liftbridge
# server/api.go, partition.go; go-liftbridge's client.go maps status codes to its errors).
# Each check_<scenario>(out, s) asserts on the JSON object the scenario printed for stream s.
from __future__ import annotations

LEADER, ALL = 0, 1  # Liftbridge's AckPolicy values


def ack_fields(ack: dict) -> tuple:
    return (ack["stream"], ack["partition_subject"], ack["msg_subject"], ack["offset"],
            ack["correlation_id"], ack["ack_policy"])


def check_pause(out: dict, s: str) -> None:
    """The 'pause' scenario's answer for stream s."""
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


def check_publish(out: dict, s: str) -> None:
    """The 'publish' scenario's answer for stream s."""
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
    # PublishToSubject goes through any server: one call's message may overtake another's
    assert sorted(values0[-2:]) == ["to-subject-last", "to-subject-none"]
    by_key = {m["key"]: p for p, r in read.items() for m in r["messages"]
              if m["value"].startswith("key-")}
    assert {k: (s if p == "0" else f"{s}.1") for k, p in by_key.items()} == out["by_key"]
    total = len(values0) + len(values1)
    assert total == 3 + 20 + 4 + 4 + 3


def check_positions(out: dict, s: str) -> None:
    """The 'positions' scenario's answer for stream s."""
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


def check_cursors(out: dict, s: str) -> None:
    """The 'cursors' scenario's answer for stream s."""
    assert out["set0"] is None and out["set1"] is None and out["set0_again"] is None
    assert out["fetch"] == {"reader0": {"offset": 6, "error": None},
                            "reader1": {"offset": 7, "error": None},
                            "other0": {"offset": -1, "error": None}}


def check_nats(out: dict, s: str) -> None:
    """The 'nats' scenario's answer for stream s."""
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
