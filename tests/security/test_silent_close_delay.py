# The silent close delay of the RabbitMQ Stream door (RabbitMQ 4's SILENT_CLOSE_DELAY): a
# refused login, Open or secret update is answered only after the configured delay, while other
# connections are served; a peer that hangs up meanwhile frees its place; the number waiting is
# bounded. Raw frames through riverlog's codec (tests/security/_raw_stream.py) and rstream.
# Timing: only lower bounds on the delay; a hang-up or the bound is checked against a delay far
# longer than what is waited for.
from __future__ import annotations

import asyncio
import logging
import time

from rstream import Producer

from _raw_stream import Raw
from _sec import PASSWORDS, running, security
from riverlog.protocol.rabbitmq_stream import OffsetType, ResponseCode, encode
from riverlog.protocol.rabbitmq_stream import frames as f

DELAY_MS = 300
LONG_MS = 60_000  # far longer than any test waits: an answer seen at all came without it


async def _refused_login(port: int, password: str = "wrong") -> Raw:
    """A raw connection whose SaslAuthenticate (alice, ``password``) is sent, unanswered yet."""
    raw = await Raw.connect(port)
    await raw.request(f.PeerProperties(1, {}))
    await raw.request(f.SaslHandshake(2))
    raw.writer.write(encode(f.SaslAuthenticate(3, "PLAIN", f"\0alice\0{password}".encode())))
    return raw


async def _waiting(app, count: int) -> None:
    """Until ``count`` connections wait in the delay (at most 10 s)."""
    for _ in range(1000):
        if app.rabbitmq_stream.silent_closes.waiting == count:
            return
        await asyncio.sleep(0.01)
    assert app.rabbitmq_stream.silent_closes.waiting == count


async def test_a_refused_login_waits_while_others_are_served(tmp_path, users, caplog):
    stream = {"silent_close_delay_ms": DELAY_MS}
    async with running(tmp_path, security(users), liftbridge=False, stream=stream) as app:
        port = app.rabbitmq_stream.port
        with caplog.at_level(logging.WARNING, "riverlog"):
            started = time.monotonic()
            refused = await _refused_login(port)
            # another connection logs in, opens and creates a stream meanwhile
            async with Producer("127.0.0.1", port=port, username="ops",
                                password=PASSWORDS["ops"]) as ops:
                await ops.create_stream("orders.eu")
            served = time.monotonic()
            # frames sent during the delay are not handled: no answer to this one
            refused.writer.write(encode(f.PeerProperties(9, {})))
            answer = await refused.next_frame()
            answered = time.monotonic()
            assert type(answer) is f.SaslAuthenticateResponse
            assert answer.response_code == ResponseCode.AUTHENTICATION_FAILURE
            assert answered - started >= DELAY_MS / 1000
            assert served < answered  # the other connection did not wait for it
            assert await refused.closed_by_server()  # nothing more: the socket closes
            assert app.rabbitmq_stream.silent_closes.waiting == 0
        assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_a_refused_open_and_secret_update_wait(tmp_path, users):
    stream = {"silent_close_delay_ms": DELAY_MS}
    async with running(tmp_path, security(users), liftbridge=False, stream=stream) as app:
        port = app.rabbitmq_stream.port
        raw = await Raw.connect(port)
        await raw.login("alice")
        assert type(await raw.next_frame()) is f.Tune
        started = time.monotonic()
        answer = await raw.request(f.Open(4, "no-such-vhost"))
        assert answer.response_code == ResponseCode.VIRTUAL_HOST_ACCESS_FAILURE
        assert time.monotonic() - started >= DELAY_MS / 1000
        # a secret update: a wrong password (0x08), another user (0x15), as RabbitMQ 4.1.4
        for user, password, code in (
                ("alice", "wrong", ResponseCode.AUTHENTICATION_FAILURE),
                ("bob", PASSWORDS["bob"], ResponseCode.SASL_CANNOT_CHANGE_USERNAME)):
            opened = await (await Raw.connect(port)).opened("alice")
            started = time.monotonic()
            answer = await opened.request(f.SaslAuthenticate(
                5, "PLAIN", f"\0{user}\0{password}".encode()))
            assert answer.response_code == code
            assert time.monotonic() - started >= DELAY_MS / 1000
            assert await opened.closed_by_server()


async def test_nothing_is_delivered_during_the_delay(tmp_path, users):
    """A consumer whose secret update is refused gets no Deliver while it waits (RabbitMQ's
    reader sleeps): the refusal is the next frame, then the socket closes."""
    stream = {"silent_close_delay_ms": 1_000}
    async with running(tmp_path, security(users), liftbridge=False, stream=stream) as app:
        port = app.rabbitmq_stream.port
        async with Producer("127.0.0.1", port=port, username="ops",
                            password=PASSWORDS["ops"]) as ops:
            await ops.create_stream("orders.eu")
            bob = await (await Raw.connect(port)).opened("bob")
            answer = await bob.request(f.Subscribe(5, 1, "orders.eu", OffsetType.FIRST, None, 10))
            assert answer.response_code == ResponseCode.OK
            bob.writer.write(encode(f.SaslAuthenticate(6, "PLAIN", b"\0bob\0wrong")))
            await _waiting(app, 1)
            await ops.send_wait("orders.eu", b"during the delay")
            answer = await bob.next_frame()
            assert type(answer) is f.SaslAuthenticateResponse, answer
            assert answer.response_code == ResponseCode.AUTHENTICATION_FAILURE
            assert await bob.closed_by_server()


async def test_a_close_after_a_refused_secret_update_is_answered(tmp_path, users):
    """riverlog announces 3.13.0, so the Java client (1.11) answers a refused secret update
    with client.close() as a 3.13 connection stays open then; its Close, sent a little after
    the refusal, gets a CloseResponse before the socket closes (it waited 10 s for one when
    the socket closed 0.2 s after the refusal)."""
    stream = {"silent_close_delay_ms": DELAY_MS}
    async with running(tmp_path, security(users), liftbridge=False, stream=stream) as app:
        alice = await (await Raw.connect(app.rabbitmq_stream.port)).opened("alice")
        answer = await alice.request(f.SaslAuthenticate(
            5, "PLAIN", f"\0bob\0{PASSWORDS['bob']}".encode()))
        assert answer.response_code == ResponseCode.SASL_CANNOT_CHANGE_USERNAME
        await asyncio.sleep(0.4)
        answer = await alice.request(f.Close(6, ResponseCode.OK, "OK"))
        assert type(answer) is f.CloseResponse, answer
        assert await alice.closed_by_server()


async def test_refusals_not_delayed_as_in_rabbitmq(tmp_path, users):
    """An unknown mechanism (0x07) and a malformed PLAIN response (0x09) are answered at once
    (checked against a delay longer than the read's timeout), and the socket closed (not by
    the handshake timeout)."""
    stream = {"silent_close_delay_ms": LONG_MS, "handshake_timeout_ms": LONG_MS}
    async with running(tmp_path, security(users), liftbridge=False, stream=stream) as app:
        for mechanism, data, code in (
                ("FANCY-SASL", b"", ResponseCode.SASL_MECHANISM_NOT_SUPPORTED),
                ("PLAIN", b"no nul bytes", ResponseCode.SASL_ERROR)):
            raw = await Raw.connect(app.rabbitmq_stream.port)
            await raw.request(f.PeerProperties(1, {}))
            await raw.request(f.SaslHandshake(2))
            answer = await raw.request(f.SaslAuthenticate(3, mechanism, data))
            assert answer.response_code == code
            assert await raw.closed_by_server()


async def test_a_peer_gone_during_the_delay_frees_its_place(tmp_path, users, caplog):
    stream = {"silent_close_delay_ms": LONG_MS}
    async with running(tmp_path, security(users), liftbridge=False, stream=stream) as app:
        with caplog.at_level(logging.WARNING, "riverlog"):
            gone = await _refused_login(app.rabbitmq_stream.port)
            await _waiting(app, 1)
            gone.writer.close()
            await _waiting(app, 0)  # long before the delay ran out
            for _ in range(1000):
                if not app.rabbitmq_stream.connections:
                    break
                await asyncio.sleep(0.01)
            assert not app.rabbitmq_stream.connections
        assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_the_connections_waiting_are_bounded(tmp_path, users):
    stream = {"silent_close_delay_ms": LONG_MS, "silent_close_max": 2}
    async with running(tmp_path, security(users), liftbridge=False, stream=stream) as app:
        port = app.rabbitmq_stream.port
        waiting = [await _refused_login(port) for _ in range(2)]
        await _waiting(app, 2)
        beyond = await _refused_login(port)  # answered at once, as with no delay
        answer = await beyond.next_frame()
        assert answer.response_code == ResponseCode.AUTHENTICATION_FAILURE
        assert await beyond.closed_by_server()
        assert app.rabbitmq_stream.silent_closes.waiting == 2
        assert app.rabbitmq_stream.silent_closes.answered_at_once == 1
        for raw in waiting:
            raw.writer.close()
        await _waiting(app, 0)
