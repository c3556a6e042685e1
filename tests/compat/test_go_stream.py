"""RabbitMQ's Go stream client (github.com/rabbitmq/rabbitmq-stream-go-client, the version in
tests/compat/go/go.mod; the `go_client` fixture builds its scenario program once) against the
shared `stream_server`: producers with confirms, deduplication, sub-entry batching with every
compression the client offers, every offset specification, manual credit, heartbeats, offset tracking,
single active consumer, super streams, filtering, stream declare/delete with arguments and StreamStats, bad
input (unknown stream, wrong password, frame too large), and the reliable producer and
consumer (pkg/ha) across a restart. What each scenario does: tests/compat/go/*.go. The
expectations are RabbitMQ's behaviour as the Go client's own tests and RabbitMQ's stream
plugin source state it; docs/compatibility.md lists what is covered and what is not. With
RIVERLOG_TEST_PEER=rabbitmq:PORT the tests that RabbitMQ 3.10 can serve run against it
(riverlog_only marks the others, with the version that brought what they need).
TLS and permissions: tests/security/test_go_security.py; a cluster:
tests/cluster/test_go_cluster.py."""
from __future__ import annotations

import mmh3
import pytest

from ._helpers import stream_name

pytestmark = pytest.mark.timeout(180)

STREAM_DOES_NOT_EXIST, AUTHENTICATION_FAILURE, FRAME_TOO_LARGE = 0x02, 0x08, 0x0E
PRECONDITION_FAILED, NO_OFFSET, OK, UNKNOWN_FRAME = 0x11, 0x13, 0x01, 0x0D


@pytest.mark.riverlog_only  # StreamStats: RabbitMQ 3.11
async def test_publish_with_confirms_and_consume(stream_server, go_client):
    name = stream_name("go-pub")
    r = await go_client.run("publish_consume", stream_server.host, stream_server.port,
                            stream=name, count=100, batch=50, delete=True)
    assert (r["confirmed"], r["failed"]) == (150, 0)
    assert r["bodies"] == [f"s-{i}" for i in range(100)] + [f"b-{i}" for i in range(50)]
    assert r["offsets"] == list(range(150))
    assert r["stats"]["first_offset"] == 0
    # the last chunk holds the BatchSend's 50 messages: its first offset is 100
    assert r["stats"]["committed_chunk_id"] == 100
    assert r["leader"] == f"{stream_server.host}:{stream_server.port}"
    assert r["replicas"] == [] and r["deleted"] == OK


async def test_deduplication_with_a_named_producer(stream_server, go_client):
    r = await go_client.run("dedup", stream_server.host, stream_server.port,
                            stream=stream_name("go-dedup"))
    assert r["last_id_before_first"] == 0  # a name never seen (RabbitMQ answers 0)
    assert r["ids_first"] == list(range(1, 11))
    assert r["last_id_before_second"] == 10
    # ids 6..10 again: confirmed, not stored
    assert (r["confirmed_second"], r["failed_second"]) == (10, 0)
    assert r["last_id_before_third"] == 15
    assert r["ids_third"] == [16, 17, 18]  # the client numbers on from the stored id
    assert r["query_sequence"] == 18
    assert r["bodies"] == ([f"d-{i}" for i in range(1, 11)] +
                           [f"again-{i}" for i in range(11, 16)] +
                           [f"auto-{i}" for i in range(3)])


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
async def test_sub_entry_batching(stream_server, go_client, compression):
    r = await go_client.run("subentry", stream_server.host, stream_server.port,
                            stream=stream_name(f"go-sub-{compression}"),
                            compression=compression, count=95, size=10)
    assert (r["confirmed"], r["failed"]) == (95, 0)
    assert r["bodies"] == r["expected"]
    assert r["offsets"] == list(range(95))


async def test_every_offset_specification(stream_server, go_client):
    r = await go_client.run("offsets", stream_server.host, stream_server.port,
                            stream=stream_name("go-offsets"))
    assert r["first"] == {"count": 30, "first_offset": 0, "first_body": "o0-0",
                          "last_offset": 29}
    # last: the newest chunk (the third batch)
    assert r["last"] == {"count": 10, "first_offset": 20, "first_body": "o2-0",
                         "last_offset": 29}
    # offset 15 is inside the second chunk: the client drops 10..14
    assert r["offset_15"] == {"count": 15, "first_offset": 15, "first_body": "o1-5",
                              "last_offset": 29}
    assert r["timestamp_second_batch"] == {"count": 20, "first_offset": 10,
                                           "first_body": "o1-0", "last_offset": 29}
    assert r["next"] == {"before_publish": 0, "count": 1, "first_offset": 30,
                         "first_body": "after-0", "last_offset": 30}


async def test_manual_credit(stream_server, go_client):
    """ManualCreditStrategy with 1 initial credit: credit counts chunks (three of 10)."""
    r = await go_client.run("manual_credit", stream_server.host, stream_server.port,
                            stream=stream_name("go-credit"))
    assert r["counts"] == [10, 20, 30]


async def test_idle_connections_keep_their_heartbeats(stream_server, go_client):
    """3 s heartbeats asked by the client (it closes a connection after two periods in a row
    without a frame): after 12 s idle a message still goes through the producer and the
    consumer."""
    r = await go_client.run("idle", stream_server.host, stream_server.port,
                            stream=stream_name("go-idle"), heartbeat_s=3, idle_s=12)
    # the client counts a period without any frame as a miss: RabbitMQ sends a heartbeat
    # after half a period of silence (rabbit_heartbeat's sender), so none is missed
    assert r["closed_for_heartbeats"] == 0 and r["missed_heartbeats"] == 0, r
    assert (r["send"], r["confirmed"], r["received"]) == (OK, 1, ["after idle"])


async def test_manual_and_automatic_offset_tracking(stream_server, go_client):
    r = await go_client.run("tracking", stream_server.host, stream_server.port,
                            stream=stream_name("go-track"))
    assert r["store_codes"] == [OK, OK]
    assert r["after_store_offset"] == 9  # StoreOffset at the 10th message
    assert (r["env_query_offset"], r["env_query_code"]) == (19, OK)
    # LastConsumed starts at the stored offset itself (the client subscribes at it)
    assert r["last_consumed"] == {"count": 11, "first_offset": 19, "first_body": "t-19",
                                  "last_offset": 29}
    assert r["auto_received"] == 30
    assert (r["auto_query_offset"], r["auto_query_code"]) == (29, OK)
    assert r["unknown_reference_code"] == NO_OFFSET


@pytest.mark.riverlog_only  # single active consumer: RabbitMQ 3.11
async def test_single_active_consumer(stream_server, go_client):
    r = await go_client.run("sac", stream_server.host, stream_server.port,
                            stream=stream_name("go-sac"))
    # the first consumer is active (ConsumerUpdate true), the second waits (no call)
    assert r["updates_before_close"] == ["one:true"]
    assert r["one"] == [f"a-{i}" for i in range(10)]
    # promoted: ConsumerUpdate(true), it resumes after the offset "one" stored
    assert r["updates"] == ["one:true", "two:true"]
    assert r["two"] == [f"b-{i}" for i in range(10)]


def partition_of(key: str, partitions: list[str]) -> str:
    """The Go client's HashRoutingStrategy: murmur3 32, seed 104729, modulo the count."""
    return partitions[mmh3.hash(key, 104729, signed=False) % len(partitions)]


@pytest.mark.riverlog_only  # CreateSuperStream: RabbitMQ 3.13
async def test_super_stream(stream_server, go_client):
    name = stream_name("go-super")
    r = await go_client.run("superstream", stream_server.host, stream_server.port,
                            stream=name)
    partitions = [f"{name}-{i}" for i in range(3)]
    assert r["declare"] == OK and r["partitions"] == partitions
    assert (r["route_of_binding_1"], r["route_code"]) == ([f"{name}-1"], OK)
    assert r["hash_failed"] == 0
    assert r["hash_routed"] == {f"h-{i}": partition_of(f"k-{i}", partitions)
                                for i in range(30)}
    # single active consumer per partition: each message reached one of the two consumers,
    # each partition was consumed by one of them only
    one, two = r["one_before_close"], r["two_before_close"]
    assert set(one).isdisjoint(two) and set(one) | set(two) <= set(partitions)
    got = sorted(b for bodies in list(one.values()) + list(two.values()) for b in bodies)
    assert got == sorted(f"h-{i}" for i in range(30))
    for partition, bodies in {**one, **two}.items():
        assert bodies == [b for b in (f"h-{i}" for i in range(30))
                          if r["hash_routed"][b] == partition]
    # after "one" closed, "two" has every partition and gets the 15 new messages
    after = sorted(b for bodies in r["two_after_close"].values() for b in bodies
                   if b.startswith("after-"))
    assert after == sorted(f"after-{i}" for i in range(30, 45))
    actives = {u.split(":")[1] for u in r["updates"] if u.endswith(":true")}
    assert actives == set(partitions)
    assert r["delete"] == OK and r["partitions_after_delete_code"] == STREAM_DOES_NOT_EXIST
    # binding keys: Route finds eu, not asia; the key strategy sends nothing for asia
    assert r["declare_keys"] == OK
    assert (r["route_eu"], r["route_eu_code"]) == ([f"{name}-keys-eu"], OK)
    assert r["route_asia"] == [] and r["route_asia_code"] == OK
    assert r["key_routed"] == {"region-eu": f"{name}-keys-eu", "region-us": f"{name}-keys-us"}
    assert r["key_send_codes"][:3] == [OK, OK, OK] and r["key_send_codes"][3] != OK
    assert r["delete_keys"] == OK


@pytest.mark.riverlog_only  # filtering: RabbitMQ 3.13
async def test_filtering(stream_server, go_client):
    r = await go_client.run("filter", stream_server.host, stream_server.port,
                            stream=stream_name("go-filter"), debug=True)
    blue = [f"blue-{i}" for i in range(20)]
    strict, loose = r["match_unfiltered_false"], r["match_unfiltered_true"]
    assert strict["received"] == blue
    # the red chunks and the unfiltered one were never sent: the post filter saw only blue
    assert strict["post_filter_saw"] == 20
    assert loose["received"] == blue + [f"plain-{i}" for i in range(5)]
    assert loose["post_filter_saw"] == 25
    # a message without filter value from a filtering producer: the client writes a
    # malformed Publish v2 frame (its bug, see the scenario); the server closes that
    # connection with 0x0d (unknown frame), confirms nothing of it and loses nothing else
    assert r["empty_value_closes"] == [UNKNOWN_FRAME]
    assert r["empty_value_confirmed"] == 0 and r["stored_after"] == 65


@pytest.mark.riverlog_only  # StreamStats: RabbitMQ 3.11
async def test_declare_and_delete_with_arguments(stream_server, go_client):
    r = await go_client.run("declare", stream_server.host, stream_server.port,
                            stream=stream_name("go-declare"))
    assert r["declare"] == OK
    assert r["declare_same"] == OK  # 0x05, which the Environment takes as success
    # RabbitMQ's assert_equivalence: other arguments on an existing stream
    assert r["declare_other_max_age"] == PRECONDITION_FAILED
    assert r["exists"] is True and r["stats_code"] == OK
    assert r["empty_first_offset_error"] and r["empty_committed_error"]
    assert r["delete"] == OK and r["exists_after_delete"] is False
    assert r["delete_again"] == STREAM_DOES_NOT_EXIST
    assert r["declare_bad_segment"] == PRECONDITION_FAILED


@pytest.mark.riverlog_only  # StreamStats: RabbitMQ 3.11
async def test_unknown_stream(stream_server, go_client):
    r = await go_client.run("unknown_stream", stream_server.host, stream_server.port,
                            stream=stream_name("go-missing"))
    assert r == {"new_producer": STREAM_DOES_NOT_EXIST, "new_consumer": STREAM_DOES_NOT_EXIST,
                 "stream_stats": STREAM_DOES_NOT_EXIST, "stream_metadata": STREAM_DOES_NOT_EXIST,
                 "delete_stream": STREAM_DOES_NOT_EXIST, "exists": False, "exists_code": OK,
                 "query_partitions": STREAM_DOES_NOT_EXIST,
                 "new_super_stream_producer": STREAM_DOES_NOT_EXIST}


async def test_wrong_password(stream_server, go_client):
    r = await go_client.run("login", stream_server.host, stream_server.port,
                            password="not-the-password")
    assert r["code"] == AUTHENTICATION_FAILURE, r


@pytest.mark.riverlog_only  # frame_max on incoming frames: RabbitMQ 4.x
async def test_frame_too_large(stream_server, go_client):
    """The client refuses a message above the negotiated frame_max itself (0x0e in its
    confirm); a StoreOffset frame (unchecked by the client) of frame_max bytes after the size
    field is taken, one byte more gets Close 0x0e (rabbit_stream_core frame_size_ok, the
    reader's frame_too_large), and the Environment connects again."""
    since = stream_server.log_size()
    r = await go_client.run("frame_too_large", stream_server.host, stream_server.port,
                            stream=stream_name("go-frame"), max_frame_size=8192, debug=True,
                            timeout=120)
    assert r["send_code"] == FRAME_TOO_LARGE and r["small_send_code"] == OK
    assert (r["confirmed"], r["failed"], r["failed_codes"]) == (1, 1, {"14": 1})
    assert r["at_frame_max"] == {"store_code": OK, "closes": []}
    assert r["above_frame_max"] == {"store_code": OK, "closes": [FRAME_TOO_LARGE]}
    assert (r["exists_after"], r["exists_after_code"]) == (True, OK)
    assert r["delete"] == OK
    # the refused 8 KB reference is logged cut short (it was logged whole)
    assert "r" * 100 not in stream_server.log(since)


@pytest.mark.restart
async def test_reliable_producer_and_consumer_across_a_restart(stream_server_factory,
                                                               go_client):
    """pkg/ha: the server restarts (same data dir and port) while the reliable producer
    publishes; both reconnect, and every confirmed message is in the stream and reached
    the reliable consumer."""
    server = stream_server_factory()
    run = await go_client.start("reliable", server.host, server.port,
                                stream=stream_name("go-reliable"), before=300, after=300)
    await run.phase()
    server.restart()
    run.proceed()
    r = await run.result()
    assert r["recovered"] and r["all_answered"] and r["caught_up"], r
    assert r["producer_reconnected"] and r["consumer_reconnected"], r
    assert r["stored_missing"] == 0 and r["reliable_consumer_missing"] == 0, r
    assert r["reliable_consumer_duplicates"] == 0, r
    assert r["confirmed"] >= r["confirmed_at_signal"] + 300
