"""RabbitMQ's Java stream client (com.rabbitmq:stream-client 1.11.0, tests/compat/java, built
once per session by the `java_client` fixture) against one riverlog server: producers
(confirms, deduplication, sub-entry batches with every codec), consumers (every offset
specification, offset tracking, single active consumer, super streams, filtering), stream
arguments and StreamStats, automatic recovery through a server restart. Each test runs one
scenario (a JVM) and asserts on the JSON it prints. TLS and bad input: test_java_errors.py;
a 3-server cluster: tests/cluster/test_cluster_java.py. docs/compatibility.md sums it up."""
from __future__ import annotations

import asyncio

import mmh3
import pytest

from riverlog.client import AsyncClient
from riverlog.log.chunk import iter_entries
from riverlog.protocol.rabbitmq_stream import OffsetType
from riverlog.record import decode_record

from ._helpers import stream_name
from ._java import assert_recovered

pytestmark = pytest.mark.timeout(180)

CODECS = {"NONE": 0, "GZIP": 1, "SNAPPY": 2, "LZ4": 3, "ZSTD": 4}


def bodies(prefix: str, start: int, stop: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(start, stop)]


async def test_confirms_and_amqp_sections_round_trip(stream_server, java_client):
    r = await java_client.run("confirms", stream_server.host, stream_server.port,
                              stream=stream_name("java-confirms"), count=1000)
    assert (r["confirmed"], r["failed_codes"]) == (1000, [])
    assert r["offsets"] == list(range(1000))
    assert r["received"] == r["sent"]  # bodies, properties, application properties, annotations
    assert r["received"][0]["app.raw"] == "bytes:raw-0" and r["received"][0]["message_id"] == "id-0"


async def test_a_named_producer_is_deduplicated(stream_server, java_client):
    r = await java_client.run("dedup", stream_server.host, stream_server.port,
                              stream=stream_name("java-dedup"))
    # QueryPublisherSequence answers 0 for a new name; the client then starts at id 0
    assert r["last_before_first"] == 0
    assert r["first"] == {"confirmed": 10, "failed_codes": []}
    assert r["last_after_first"] == 9
    # ids 5..14: 5..9 are duplicates, confirmed and not stored
    assert r["second"] == {"confirmed": 10, "failed_codes": []}
    assert r["last_after_second"] == 14
    assert r["other_name_confirmed"] == 1  # another name's id 0 is new
    assert r["bodies"] == bodies("first", 0, 10) + bodies("second", 10, 15) + ["other-0"]
    assert r["offsets"] == list(range(16))


async def test_sub_entry_batches_with_every_codec_of_both_factories(stream_server, java_client):
    prefix = stream_name("java-codec")
    r = await java_client.run("compression", stream_server.host, stream_server.port,
                              stream=prefix, count=95, keep=True)
    assert sorted(r) == sorted(f"{factory}/{codec}" for factory in ("default", "commons-compress")
                               for codec in CODECS)
    client = await AsyncClient.connect(stream_server.host, stream_server.port)
    try:
        for case, got in r.items():
            factory, codec = case.split("/")
            expected = [f"{codec}-{i}-" + "abc" * (i % 40) for i in range(95)]
            assert (got["confirmed"], got["failed_codes"]) == (95, []), case
            assert got["bodies"] == expected, case
            assert got["offsets"] == list(range(95)), case
            # stored as the client sent it: sub-batches (of up to 10, as the client's batches
            # fill) in its codec, which riverlog's own readers (Liftbridge doors, Spark)
            # uncompress back to the same messages
            stream = f"{prefix}-{factory}-{codec}"
            entries, values = [], []
            subscription = await client.subscribe(stream, OffsetType.FIRST)
            while len(values) < 95:
                for chunk in await subscription.next_chunks(timeout=10):
                    entries += [(e.codec, e.records) for e in iter_entries(chunk.data)]
                    values += [decode_record(record).value.decode()
                               for _, record in chunk.records()]
            await subscription.close()
            assert {c for c, _ in entries} == {CODECS[codec]}, case
            assert sum(n for _, n in entries) == 95 and max(n for _, n in entries) == 10, case
            assert values == expected, case
            await client.delete_stream(stream)
    finally:
        await client.close()


async def test_every_offset_specification(stream_server, java_client):
    r = await java_client.run("offset_specs", stream_server.host, stream_server.port,
                              stream=stream_name("java-offsets"))
    everything = list(range(40))
    assert r["first"]["offsets"] == everything
    assert r["first"]["bodies"] == bodies("m", 0, 40)
    # last: the newest chunk, whose first offset StreamStats names as the committed chunk;
    # it holds messages of the last batch only (m-20..m-29, each batch confirmed before the
    # next; the client may send a batch in more than one frame, so more than one chunk)
    assert 20 <= r["committed_chunk_id"] <= 29
    assert r["last"]["offsets"] == everything[r["committed_chunk_id"]:]
    assert r["next"]["offsets"] == everything[30:]
    assert r["offset"]["offsets"] == everything[15:]  # the client drops 10..14 of that chunk
    # timestamp: taken between the first batch and the second: from the second's chunk on
    assert r["timestamp"]["offsets"] == everything[10:]
    assert r["timestamp"]["bodies"] == bodies("m", 10, 40)


async def test_manual_and_automatic_offset_tracking_resume_after_the_stored_offset(
        stream_server, java_client):
    r = await java_client.run("tracking", stream_server.host, stream_server.port,
                              stream=stream_name("java-tracking"))
    assert r["manual_stored"] == r["manual_stored_expected"] == 49  # m-49's offset
    assert r["manual_second"]["bodies"] == bodies("m", 50, 100)
    assert r["manual_second"]["offsets"][0] == 50
    # automatic: stored on close; the new consumer gets only what was published since
    assert r["auto_second"]["bodies"] == bodies("m", 100, 120)
    assert r["auto_stored"] == r["auto_second"]["offsets"][-1]
    # stored offsets take offsets of the log (osiris tracking chunks), never delivered
    assert all(b > a for a, b in zip(r["auto_first_offsets"], r["auto_first_offsets"][1:]))


async def test_single_active_consumer_fails_over_to_the_next(stream_server, java_client):
    r = await java_client.run("sac", stream_server.host, stream_server.port,
                              stream=stream_name("java-sac"))
    assert r["one"]["bodies"] == bodies("m", 0, 50)
    assert r["two_before"] == 0  # the second one gets nothing while the first is active
    # the first stored m-49's offset when closed (automatic tracking), the second starts after
    assert r["two"]["bodies"] == bodies("m", 50, 100)


async def test_super_streams_routing_and_single_active_consumers(stream_server, java_client):
    prefix = stream_name("java-super")
    r = await java_client.run("super_streams", stream_server.host, stream_server.port,
                              stream=prefix)
    # hash routing: murmur3 (seed 104729, as the client) of the key over Partitions' order
    hashed = {f"{prefix}-hash-{i}": [] for i in range(3)}
    for i in range(60):
        key = f"key-{i}"
        hashed[f"{prefix}-hash-{mmh3.hash(key, 104729, signed=False) % 3}"].append(key)
    assert r["hash"] == hashed
    # key routing: Route answers the partition bound to the key; no binding, no route
    assert r["key"] == {f"{prefix}-key-{region}": [region] * 10
                        for region in ("amer", "apac", "emea")}
    assert r["nowhere"] == {"confirmed": 0, "failed_codes": [10005]}  # the client's "no route"
    # single active consumers on the super stream: partition i goes to member i % 2
    sac = r["sac"]
    shared = [f"{prefix}-sac-{i}" for i in range(3)]
    assert sorted(sac["sac-"]["one"]) == [shared[0], shared[2]]
    assert sorted(sac["sac-"]["two"]) == [shared[1]]
    delivered = [b for side in ("one", "two") for got in sac["sac-"][side].values() for b in got]
    assert sorted(delivered) == sorted(bodies("sac", 0, 60))  # each once
    # the first closed: the second takes every partition, after what the first stored
    assert sac["after-"]["one"] == {}
    assert sorted(sac["after-"]["two"]) == shared
    assert sorted(b for got in sac["after-"]["two"].values() for b in got) == sorted(
        bodies("after", 0, 60))
    assert r["exists_after_delete"] == [False] * 6


async def test_filtering_skips_chunks_without_the_wanted_values(stream_server, java_client):
    r = await java_client.run("filtering", stream_server.host, stream_server.port,
                              stream=stream_name("java-filter"))
    california = bodies("m", 0, 50) + bodies("m", 150, 200)
    assert r["only"]["bodies"] == california
    # what the server sent (seen by the post-filter): the "texas" chunk and the chunk without
    # filter values were skipped by their bloom filters, as osiris does
    assert r["only"]["sent"] == {"california": 100}
    assert r["unfiltered"]["bodies"] == bodies("m", 0, 50) + bodies("m", 100, 200)
    assert r["unfiltered"]["sent"] == {"california": 100, "null": 50}


_streams_results: dict[int, dict] = {}  # server port -> the "streams" scenario's result


async def streams_result(server, java_client) -> dict:
    """The "streams" scenario's result against ``server``, run once for the two tests."""
    if server.port not in _streams_results:
        _streams_results[server.port] = await java_client.run(
            "streams", server.host, server.port, stream=stream_name("java-streams"))
    return _streams_results[server.port]


async def test_stream_arguments_and_stream_stats(stream_server, java_client):
    r = await streams_result(stream_server, java_client)
    for stat in ("first_offset", "committed_chunk_id", "committed_offset"):
        assert r["empty"][stat]["error"] == "NoOffsetException", stat  # nothing written yet
    filled = r["filled"]
    # max-length-bytes 20 kB of 500-byte messages in 5 kB segments: whole old segments go
    # (the newest segment stays)
    assert 0 < filled["first_offset"] < 200
    # retention deferred while an fsync is in flight (CommitLog.enforce_retention) may run
    # between the stats and the read: the read starts there or at a later segment, at the
    # latest the newest one, which begins by the last batch (180: a chunk never spans two
    # segments). Not at 160: as osiris, retention removes the oldest segments while the
    # stream is over max-length-bytes, so when the last two segments hold over 20 kB (how
    # batches fell into chunks under load) only the newest stays (a CI run: 180)
    assert filled["first_offset"] <= r["first_read"] <= 180 and r["last_read"] == 199
    # the last chunk holds the end of the last batch of 20 (offsets 180..199; a batch whose
    # frames arrive apart is more than one chunk); committed offset: the last message's
    # (RabbitMQ 4.3, osiris' committed_offset)
    assert 180 <= filled["committed_chunk_id"] <= 199
    assert filled["committed_offset"] == 199
    assert r["age_first_offset"] > 0  # max-age 2 s removed the first segments
    assert r["create_again"] == {"ok": True, "value": ""}  # same arguments: done
    assert r["exists"] is True
    assert r["delete_again"]["code"] == 0x02  # stream does not exist
    assert r["exists_after"] is False


async def test_creating_an_existing_stream_with_other_arguments_is_refused(stream_server,
                                                                           java_client):
    """RabbitMQ compares the arguments (rabbit_amqqueue:assert_equivalence): other ones are
    precondition failed, and the client throws; the same ones are "exists", the client's done
    (checked in test_stream_arguments_and_stream_stats)."""
    r = await streams_result(stream_server, java_client)
    assert r["create_again_other_args"].get("code") == 0x11, r["create_again_other_args"]


@pytest.mark.restart
async def test_producer_and_consumer_recover_from_a_server_restart(stream_server_factory,
                                                                   java_client):
    server = stream_server_factory()
    session = await java_client.start("through_fault", server.host, server.port,
                                      stream=stream_name("java-restart"))
    try:
        await session.event("publishing")
        await asyncio.to_thread(server.restart)  # SIGTERM, then the same data dir and port
        await session.send("done")
        r = await session.result()
    finally:
        await session.close()
    assert_recovered(r)
