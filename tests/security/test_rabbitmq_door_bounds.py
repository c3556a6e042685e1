# What one client may hold of the RabbitMQ Stream door before and outside its rights: the
# handshake timeout (a connection that has not opened a virtual host in time is closed, as
# rabbit_stream_reader's state_timeout), null and empty stream names answered with the
# protocol's codes (not INTERNAL_ERROR), and Partitions/Route only for super streams the
# user may see. Raw sockets for what no client library sends, rstream for the rest.
from __future__ import annotations

import asyncio
import time

import logging

import pytest
from rstream import Producer

from _raw_stream import Raw
from _sec import PASSWORDS, running, security
from riverlog.protocol.rabbitmq_stream import ResponseCode
from riverlog.protocol.rabbitmq_stream import frames as f

HANDSHAKE_MS = 400


async def test_connections_that_do_not_open_in_time_are_closed(tmp_path, users, pki):
    stream = {"handshake_timeout_ms": HANDSHAKE_MS}
    async with running(tmp_path, security(users, pki), liftbridge=False, stream=stream) as app:
        port = app.rabbitmq_stream.port
        async with Producer("127.0.0.1", port=port, username="ops",
                            password=PASSWORDS["ops"]) as ops:
            await ops.create_stream("orders.eu")
            started = time.monotonic()
            idle = [await Raw.connect(port) for _ in range(20)]
            # on the TLS listener, the TLS handshake itself must not wait forever either
            idle += [await Raw.connect(app.rabbitmq_stream.tls_port) for _ in range(3)]
            logged_in = await Raw.connect(port)  # authenticated, never opens
            await logged_in.login("alice")
            opened = await (await Raw.connect(port)).opened("alice")
            assert all(await asyncio.gather(*(raw.closed_by_server() for raw in idle),
                                            logged_in.closed_by_server()))
            assert time.monotonic() - started >= HANDSHAKE_MS / 1000
            # well past the timeout, the opened connections still work
            await asyncio.sleep(2 * HANDSHAKE_MS / 1000)
            answer = await opened.request(f.Metadata(5, ("orders.eu",)))
            assert answer.streams[0].response_code == ResponseCode.OK
            await ops.send_wait("orders.eu", b"still here")
            assert app.broker.streams["orders.eu"].partitions[0].next_offset == 1
            assert len(app.rabbitmq_stream.connections) == 2
            opened.writer.close()


@pytest.mark.parametrize("frame", [
    f.Create(7, None, {}), f.Delete(7, None), f.Metadata(7, ("orders.eu", None)),
    f.StreamStats(7, None), f.Partitions(7, None), f.Route(7, "k", None),
    f.CreateSuperStream(7, "orders.s", ("orders.s-0", None), ("a", "b"), {}),
    f.DeleteSuperStream(7, None), f.DeclarePublisher(7, 1, None, None),
    f.QueryPublisherSequence(7, "ref", None), f.Subscribe(7, 1, None, 1, None, 10),
    f.QueryOffset(7, "ref", None), f.ResolveOffsetSpec(7, None, 1, None),
    f.StoreOffset("ref", None, 1),
], ids=lambda frame: type(frame).__name__)
async def test_a_null_stream_name_is_a_malformed_frame(tmp_path, users, caplog, frame):
    """A null (-1 length) name: Close 0x0d unknown frame, as RabbitMQ (its reader cannot parse
    the frame), not INTERNAL_ERROR with a traceback; nothing is created."""
    async with running(tmp_path, security(users), liftbridge=False) as app:
        raw = await (await Raw.connect(app.rabbitmq_stream.port)).opened("ops")
        with caplog.at_level(logging.WARNING, "riverlog"):
            answer = await raw.request(frame)
            assert (type(answer), answer.code) == (f.Close, ResponseCode.UNKNOWN_FRAME)
            assert "null" in answer.reason
            assert await raw.closed_by_server()
        assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
        assert not app.broker.streams and not app.rabbitmq_stream.super_streams.super_streams


async def test_an_empty_stream_name_gets_the_protocols_codes(tmp_path, users):
    """"": Create 0x11 precondition failed (rabbit_stream_utils:enforce_correct_name refuses
    it), the other commands 0x02 stream does not exist; the connection stays open."""
    async with running(tmp_path, security(users), liftbridge=False) as app:
        raw = await (await Raw.connect(app.rabbitmq_stream.port)).opened("ops")
        assert (await raw.request(f.Create(7, "", {}))).response_code == \
            ResponseCode.PRECONDITION_FAILED
        for frame in (f.Delete(8, ""), f.StreamStats(9, ""), f.Partitions(10, ""),
                      f.DeclarePublisher(11, 1, None, ""), f.Subscribe(12, 1, "", 1, None, 10)):
            answer = await raw.request(frame)
            assert answer.response_code == ResponseCode.STREAM_DOES_NOT_EXIST, answer
        assert not app.broker.streams


async def test_partitions_and_route_answer_only_users_with_a_right(tmp_path, users):
    """bob may consume orders.* and do anything on bob.*; alice may only publish to
    orders.*: she learns nothing of bob.super (0x10), as she learns nothing of its streams."""
    async with running(tmp_path, security(users), liftbridge=False) as app:
        port = app.rabbitmq_stream.port
        ops = await (await Raw.connect(port)).opened("ops")
        for name in ("bob.super", "orders.super"):
            parts = tuple(f"{name}-{i}" for i in range(2))
            answer = await ops.request(f.CreateSuperStream(5, name, parts, ("0", "1"), {}))
            assert answer.response_code == ResponseCode.OK
        alice = await (await Raw.connect(port)).opened("alice")
        bob = await (await Raw.connect(port)).opened("bob")
        for frame in (f.Partitions(6, "bob.super"), f.Route(7, "1", "bob.super")):
            answer = await alice.request(frame)
            assert (answer.response_code, answer.streams) == (ResponseCode.ACCESS_REFUSED, ())
        assert (await bob.request(f.Partitions(6, "bob.super"))).streams == \
            ("bob.super-0", "bob.super-1")
        assert (await bob.request(f.Route(7, "1", "bob.super"))).streams == ("bob.super-1",)
        answer = await alice.request(f.Route(8, "0", "orders.super"))
        assert (answer.response_code, answer.streams) == (ResponseCode.OK, ("orders.super-0",))
        answer = await alice.request(f.Partitions(9, "nothing"))
        assert answer.response_code == ResponseCode.STREAM_DOES_NOT_EXIST
