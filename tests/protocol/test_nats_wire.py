"""The NATS client protocol parser of the NATS door's data connection (riverlog.protocol.
nats_wire): what nats-server sends, split anywhere, parses to the same operations as whole;
damaged bytes raise NatsProtocolError and nothing else; limits hold. Its work against a real
nats-server is tested through the door (tests/liftbridge, tests/security)."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverlog.protocol.nats_wire import (MAX_CONTROL_LINE, NatsParser, NatsProtocolError,
                                         connect_command, parse_headers, sub_command,
                                         unsub_command)

tokens = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x2FF, blacklist_characters="."),
                 min_size=1, max_size=8)
subjects = st.lists(tokens, min_size=1, max_size=4).map(".".join)
payloads = st.binary(max_size=300)
header_blocks = st.dictionaries(
    st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ-abc", min_size=1, max_size=10),
    st.text("abc xyz{}\":0123", max_size=20).map(str.strip), max_size=3).map(
    lambda headers: "NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n")


@st.composite
def operations(draw):
    """(bytes the server sends, what the parser must give for it)."""
    kind = draw(st.sampled_from(["MSG", "HMSG", "PING", "PONG", "+OK", "-ERR", "INFO"]))
    if kind in ("MSG", "HMSG"):
        subject, sid, payload = draw(subjects), draw(st.integers(1, 10**6)), draw(payloads)
        reply = draw(st.one_of(st.just(""), subjects))
        middle = f" {reply}" if reply else ""
        if kind == "MSG":
            raw = f"MSG {subject} {sid}{middle} {len(payload)}\r\n".encode() + payload + b"\r\n"
            return raw, ("msg", (sid, subject, reply, None, payload))
        block = draw(header_blocks).encode()
        raw = (f"HMSG {subject} {sid}{middle} {len(block)} {len(block) + len(payload)}\r\n"
               .encode() + block + payload + b"\r\n")
        return raw, ("msg", (sid, subject, reply, block, payload))
    if kind == "INFO":
        info = {"server_id": draw(tokens), "max_payload": draw(st.integers(1, 10**8))}
        return b"INFO " + json.dumps(info).encode() + b"\r\n", ("op", ("INFO", info))
    if kind == "-ERR":
        text = draw(st.text("abcdefghij Maximum", max_size=30)).strip()
        return f"-ERR '{text}'\r\n".encode(), ("op", ("-ERR", text))
    return f"{kind}\r\n".encode(), ("op", (kind, None))


def _feed_all(parser: NatsParser, pieces: list[bytes]) -> tuple[list, list]:
    messages, ops = [], []
    for piece in pieces:
        m, o = parser.feed(piece)
        messages += m
        ops += o
    return messages, ops


@settings(max_examples=300)
@given(ops=st.lists(operations(), max_size=20), cuts=st.lists(st.integers(0, 10**5), max_size=8))
def test_operations_split_anywhere_parse_as_sent(ops, cuts):
    data = b"".join(raw for raw, _ in ops)
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0] + points, points + [len(data)])]
    messages, got_ops = _feed_all(NatsParser(), pieces)
    assert messages == [value for _, (kind, value) in ops if kind == "msg"]
    assert got_ops == [value for _, (kind, value) in ops if kind == "op"]


@settings(max_examples=500)
@given(ops=st.lists(operations(), min_size=1, max_size=5), flips=st.lists(
    st.tuples(st.integers(0, 10**5), st.integers(0, 255)), min_size=1, max_size=4),
    junk=st.binary(max_size=50))
def test_damaged_bytes_raise_only_the_protocol_error(ops, flips, junk):
    data = bytearray(b"".join(raw for raw, _ in ops) + junk)
    for at, value in flips:
        data[at % len(data)] = value
    try:
        messages, _ = NatsParser(max_message=1 << 20).feed(bytes(data))
    except NatsProtocolError:
        return
    for sid, subject, reply, headers, payload in messages:
        assert isinstance(sid, int) and isinstance(subject, str) and isinstance(payload, bytes)


def test_limits():
    with pytest.raises(NatsProtocolError, match="control line"):
        NatsParser().feed(b"MSG " + b"x" * MAX_CONTROL_LINE)  # no CRLF yet, already too long
    with pytest.raises(NatsProtocolError, match="over 100"):
        NatsParser(max_message=100).feed(b"MSG a 1 101\r\n")  # refused before it arrives
    with pytest.raises(NatsProtocolError, match="not followed by CRLF"):
        NatsParser().feed(b"MSG a 1 2\r\nabXY")
    with pytest.raises(NatsProtocolError, match="unknown operation"):
        NatsParser().feed(b"HELLO\r\n")
    with pytest.raises(NatsProtocolError, match="arguments"):
        NatsParser().feed(b"MSG a\r\n")
    with pytest.raises(NatsProtocolError, match="not a number"):
        NatsParser().feed(b"MSG a x 1\r\nq\r\n")
    parser = NatsParser()  # an incomplete message waits for the rest
    assert parser.feed(b"MSG a 1 5\r\nab") == ([], [])
    assert parser.feed(b"cde\r\nPING\r\n") == ([(1, "a", "", None, b"abcde")], [("PING", None)])


def test_headers_and_commands():
    block = b"NATS/1.0\r\nNats-Request-Info: {\"user\":\"alice\"}\r\nX: 1\r\nX: 2\r\n\r\n"
    assert parse_headers(block) == {"Nats-Request-Info": '{"user":"alice"}', "X": "2"}
    assert parse_headers(b"NATS/1.0 503\r\n\r\n") == {}
    assert sub_command("a.b", 7) == b"SUB a.b 7\r\n"
    assert sub_command("a.b", 7, "g") == b"SUB a.b g 7\r\n"
    assert unsub_command(7) == b"UNSUB 7\r\n"
    assert connect_command({"user": "u", "pass": "p"}) == b'CONNECT {"user":"u","pass":"p"}\r\n'
