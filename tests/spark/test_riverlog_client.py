# riverlog.client against a real server: handshake, streams, named publishers with
# deduplication and confirms, subscriptions handing over whole chunks, offsets and errors.
from __future__ import annotations

import asyncio
import time

import pytest

from riverlog.client import AsyncClient, Client, ClientError, OffsetType, parse_servers, read_range
from riverlog.protocol.rabbitmq_stream import ResponseCode
from riverlog.record import decode_record

from .conftest import publish, record


def test_parse_servers():
    assert parse_servers("a:1, b ,[::1]:7") == [("a", 1), ("b", 5552), ("::1", 7)]
    with pytest.raises(ValueError):
        parse_servers(" , ")


def test_streams_create_delete_metadata(client):
    name = f"client-{time.monotonic_ns()}"
    assert client.create_stream(name) is True
    assert client.create_stream(name, exist_ok=True) is False
    with pytest.raises(ClientError) as err:
        client.create_stream(name)
    assert err.value.code == ResponseCode.STREAM_ALREADY_EXISTS
    # other arguments than the existing stream's: 0x11 (RabbitMQ's assert_equivalence),
    # with exist_ok too (as rstream's exists_ok: only 0x05 is "exists")
    for exist_ok in (False, True):
        with pytest.raises(ClientError) as err:
            client.create_stream(name, {"max-age": "1h"}, exist_ok=exist_ok)
        assert err.value.code == ResponseCode.PRECONDITION_FAILED
    assert client.stream_exists(name)
    assert client.offset_range(name) == (0, 0)
    assert client.delete_stream(name) is True
    assert client.delete_stream(name, missing_ok=True) is False
    assert not client.stream_exists(name)
    with pytest.raises(ClientError) as err:
        client.stream_stats(name)
    assert err.value.code == ResponseCode.STREAM_DOES_NOT_EXIST


def test_publish_confirm_and_read_chunks(client, new_stream):
    s = new_stream()
    publish(client, s, [record(i) for i in range(250)], batch=100)
    assert client.offset_range(s) == (0, 250)
    client.store_offset("app", s, 120)  # tracking chunks at 250 and 251: no message
    client.store_offset("app", s, 130)
    assert client.query_offset("app", s) == 130
    assert client.offset_range(s) == (0, 250)
    chunks = list(read_range(client, s, 120, 250))
    assert chunks[0].first_offset == 100 and chunks[-1].next_offset == 250
    offsets = [o for c in chunks for o, _ in c.records()]
    assert offsets == list(range(100, 250))
    assert decode_record(next(chunks[0].records())[1]).value == b"v100"


def test_named_publisher_deduplicates(client, new_stream):
    s = new_stream()
    with client.publisher(s, "ref-a") as pub:
        pub.publish([record(i) for i in range(10)], range(1, 11))
        pub.flush()
        pub.publish([record(i) for i in range(15)], range(1, 16))  # 1..10 are replays
        pub.flush()
        assert pub.confirmed == 25
    assert client.query_publisher_sequence("ref-a", s) == 15
    assert client.offset_range(s) == (0, 15)


def test_subscribe_from_timestamp_and_offsets(client, new_stream):
    s = new_stream()
    publish(client, s, [record(i) for i in range(5)])
    time.sleep(0.02)
    middle = int(time.time() * 1000)
    time.sleep(0.02)
    publish(client, s, [record(i) for i in range(5, 9)])
    assert client.offset_for_timestamp(s, middle) == 5
    assert client.offset_for_timestamp(s, 0) == 0
    assert client.offset_for_timestamp(s, middle + 3_600_000) is None
    with client.subscribe(s, OffsetType.LAST) as sub:
        assert sub.next_chunk(5).first_offset == 5


def test_store_and_query_offset(client, new_stream):
    s = new_stream()
    assert client.query_offset("reader-1", s) is None
    client.store_offset("reader-1", s, 42)
    deadline = time.monotonic() + 5
    while client.query_offset("reader-1", s) != 42 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.query_offset("reader-1", s) == 42


def test_errors(riverlog_server, client):
    with pytest.raises(ClientError) as err:
        Client("127.0.0.1", riverlog_server.port, "guest", "wrong")
    assert err.value.code == ResponseCode.AUTHENTICATION_FAILURE
    with pytest.raises(ClientError):
        client.publisher("no-such-stream")
    with pytest.raises(ClientError):
        client.subscribe("no-such-stream")
    with pytest.raises(ClientError):
        Client("127.0.0.1", 1, timeout=2)


def test_deleted_stream_ends_subscription(client, new_stream, riverlog_server):
    s = new_stream()
    publish(client, s, [record(1)])
    other = riverlog_server.client()
    try:
        sub = other.subscribe(s, OffsetType.NEXT)
        client.delete_stream(s)
        with pytest.raises(ClientError) as err:
            sub.next_chunk(5)
        assert err.value.code == ResponseCode.STREAM_NOT_AVAILABLE
    finally:
        other.close()


def test_async_client(riverlog_server, new_stream):
    s = new_stream()

    async def main():
        c = await AsyncClient.connect("127.0.0.1", riverlog_server.port)
        try:
            pub = await c.publisher(s, "async-ref")
            await pub.publish([record(i) for i in range(3000)])
            await pub.flush()
            sub = await c.subscribe(s, OffsetType.FIRST, credit=2)
            n = 0
            async for chunk in sub:
                n += chunk.header.num_records
                if chunk.next_offset >= 3000:
                    break
            await sub.close()
            return n, await c.offset_range(s)
        finally:
            await c.close()

    assert asyncio.run(main()) == (3000, (0, 3000))


def test_frames_larger_than_the_receive_buffer(riverlog_server, new_stream, monkeypatch):
    import riverlog.client as rc
    import riverlog.client.connection as connection

    monkeypatch.setattr(connection, "_MIN_READ", 1000)  # a 4000-byte buffer that has to grow
    s = new_stream()
    with rc.Client("127.0.0.1", riverlog_server.port) as c:
        with c.publisher(s) as pub:
            pub.publish([b"x" * 300_000, b"y", b"z" * 900_000])
        chunks = list(read_range(c, s, 0, 3))
        records = [r for chunk in chunks for _, r in chunk.records()]
        assert records == [b"x" * 300_000, b"y", b"z" * 900_000]
        assert c.offset_range(s) == (0, 3)  # small frames still flow after big ones
