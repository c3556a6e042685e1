# The compiled twin of the NATS client-protocol parser (riverlog/protocol/_nats_wire_c.pyx)
# held to its Python reference (nats_wire.py's NatsParser): for every feed() of generated
# server traffic (MSG and HMSG with and without reply, header blocks, empty and large payloads,
# PING/PONG/+OK/-ERR/INFO, odd but valid whitespace and leading zeros), split at every byte
# boundary and in several pieces, and of damaged traffic (bad, negative, huge and non-numeric
# sizes and sids, missing CRLF, over-long control lines, wrong argument counts, unknown
# operations, truncation, random edits): the same messages and operations with the same types,
# or the same exception type and message, and the same parser state afterwards (kept tail,
# max_message, subject cache). Every test runs on both implementations.
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _twins import IMPLEMENTATIONS, compiled_or_skip
from riverlog import _compiled
from riverlog.protocol import nats_wire

TWIN = "riverlog.protocol._nats_wire_c"
Reference = nats_wire._PyNatsParser


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def Parser(request):
    """The NatsParser class of one implementation."""
    if request.param == "python":
        return Reference
    return nats_wire._bind_twin(compiled_or_skip(TWIN))


def typed(value):
    """``value`` with the type of every part, so b"x" and bytearray(b"x"), 1 and True differ."""
    if isinstance(value, (list, tuple)):
        return type(value).__name__, [typed(v) for v in value]
    if isinstance(value, dict):
        return "dict", sorted((typed(k), typed(v)) for k, v in value.items())
    return type(value).__name__, value


def state(parser):
    return typed((parser._buf, parser.max_message, dict(parser._subjects)))


def step(parser, data):
    """What one feed gives (typed result, or exception type and message), and the state after."""
    try:
        result = typed(parser.feed(data))
    except Exception as exc:  # the same type and message is what both must give
        result = (type(exc), str(exc))
    return result, state(parser)


def same(Parser, pieces, max_message=64 * 1024 * 1024):
    """Feed ``pieces`` to one parser of each; assert every step agrees; the steps."""
    parser, ref = Parser(max_message), Reference(max_message)
    steps = []
    for piece in pieces:
        got, want = step(parser, piece), step(ref, piece)
        assert got == want
        steps.append(got)
    return steps


def split(data: bytes, cuts) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0] + points, points + [len(data)])]


# --- generated server traffic ---------------------------------------------------------------
tokens = st.binary(min_size=1, max_size=8).map(
    lambda b: bytes(c if c > 32 and c != 127 else 97 for c in b))  # no whitespace, any UTF-8 or not
subjects = st.lists(tokens, min_size=1, max_size=3).map(b".".join) | st.sampled_from(
    [b"orders", b"orders.0", b"_INBOX.x.1"])
spaces = st.sampled_from([b" "] * 6 + [b"  ", b"\t", b" \t", b"\x0b", b"\x0c", b" \r ", b"\n"])
# payload sizes: mostly small, some empty, some larger than a read or the control-line limit
sizes = st.sampled_from([0, 0, 1, 10, 256, 4095, 4097, 70_000]) | st.integers(0, 300)
header_blocks = st.lists(st.tuples(tokens, tokens), max_size=3).map(
    lambda pairs: b"NATS/1.0\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in pairs) + b"\r\n")


NO_CRLF = bytes.maketrans(b"\r\n", b"rn")


def number(value: int, zeros: int = 0) -> bytes:
    return b"0" * zeros + str(value).encode()


@st.composite
def payloads(draw):
    size = draw(sizes)
    seed = draw(st.binary(min_size=1, max_size=16))
    return (seed * (size // len(seed) + 1))[:size]


@st.composite
def frames(draw):
    """Bytes nats-server could send (or the parser accepts): one operation."""
    kind = draw(st.sampled_from(["MSG", "HMSG", "MSG", "HMSG", "PING", "PONG", "+OK", "-ERR",
                                 "INFO"]))
    if kind in ("MSG", "HMSG"):
        sep = draw(spaces)
        zeros = draw(st.sampled_from([0, 0, 0, 1, 20]))
        args = [draw(subjects), number(draw(st.integers(0, 10**6) | st.integers(0, 10**25)),
                                       draw(st.sampled_from([0, 0, 2])))]
        if draw(st.booleans()):
            args.append(draw(subjects))
        payload = draw(payloads())
        if kind == "HMSG":
            block = draw(header_blocks | st.just(b""))
            args.append(number(len(block), zeros))
            payload = block + payload
        args.append(number(len(payload), zeros))
        lead = draw(st.sampled_from([b" ", b" ", b"  "]))
        return kind.encode() + lead + sep.join(args) + draw(st.sampled_from([b"", b" "])) \
            + b"\r\n" + payload + b"\r\n"
    if kind == "INFO":
        info = {"server_id": "x", "max_payload": draw(st.integers(1, 10**8))}
        return b"INFO " + json.dumps(info).encode() + b"\r\n"
    if kind == "-ERR":
        return b"-ERR '" + draw(st.binary(max_size=20)).translate(NO_CRLF) + b"'\r\n"
    return draw(st.sampled_from([kind, kind.lower()])).encode() + b"\r\n"


streams = st.lists(frames(), max_size=8).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(streams, st.lists(st.integers(0, 10**6), max_size=8))
def test_traffic_in_pieces_parses_as_the_reference(Parser, data, cuts):
    steps = same(Parser, split(data, cuts))
    assert all(type(result) is tuple and result[0] == "tuple" for result, _ in steps)


small_streams = st.lists(frames().filter(lambda f: len(f) < 400), max_size=5).map(b"".join)


@settings(max_examples=100, deadline=None)
@given(small_streams)
def test_traffic_split_at_every_byte_boundary_parses_as_the_reference(Parser, data):
    for at in range(len(data) + 1):
        same(Parser, [data[:at], data[at:]])
    same(Parser, [data[i:i + 1] for i in range(len(data))])  # a byte at a time


@settings(max_examples=200, deadline=None)
@given(streams, st.sampled_from([0, 1, 10, 255, 4096, 70_000, 10**18, 10**18 + 1, 1 << 80, -1,
                                 100.5, True]))
def test_max_message_of_any_value_limits_as_the_reference(Parser, data, max_message):
    same(Parser, [data], max_message)


# --- damaged traffic ------------------------------------------------------------------------
bad_numbers = st.sampled_from([b"-1", b"-0", b"+5", b"1.0", b"x1", b"1x", b"0x10", b"\xd9\xa1",
                               b"\xc2\xb2", b"9" * 19, b"0" * 30 + b"7", b"9" * 40, b"1_0"])


@st.composite
def damaged_frames(draw):
    """One MSG/HMSG (or other line) broken in one of the ways a server or a bad relay could."""
    subject, sid, payload = draw(subjects), draw(st.integers(0, 99)), draw(payloads())
    block = draw(header_blocks)
    how = draw(st.sampled_from(["size", "sid", "hsize", "count", "crlf", "long", "hmsg_word",
                                "over", "unknown", "info", "short"]))
    hmsg = draw(st.booleans())
    total = len(block) + len(payload) if hmsg else len(payload)
    args = [subject, number(sid)] + ([number(len(block))] if hmsg else []) + [number(total)]
    body = (block if hmsg else b"") + payload
    word = b"HMSG " if hmsg else b"MSG "
    if how == "size":
        args[-1] = draw(bad_numbers | st.integers(0, total + 5).map(number))
    elif how == "sid":
        args[1] = draw(bad_numbers)
    elif how == "hsize":
        word, args = b"HMSG ", [subject, number(sid),
                                draw(bad_numbers | st.integers(0, 500).map(number)), number(total)]
    elif how == "count":
        args = draw(st.lists(tokens, max_size=7))
    elif how == "crlf":
        return word + b" ".join(args) + b"\r\n" + body + draw(st.sampled_from(
            [b"", b"\r", b"\n", b"XY", b"\n\r", b"\rX"])) + draw(st.binary(max_size=3))
    elif how == "long":
        return word + b"x" * draw(st.sampled_from([4090, 4092, 4093, 4096, 5000])) + \
            draw(st.sampled_from([b"", b"\r\n", b" 1 0\r\n\r\n"]))
    elif how == "hmsg_word":
        word = draw(st.sampled_from([b"HMSG", b"HMSGX ", b"MSG", b"MSG\t", b"msg ", b"HMSG\r\n"]))
    elif how == "over":
        return word + b" ".join(args) + b"\r\n" + body + b"\r\n"  # with a small max_message
    elif how == "unknown":
        return draw(st.sampled_from([b"HELLO\r\n", b"\r\n", b"MS\r\n", b"+OKAY\r\n",
                                     b"INFO\r\n", b"INFO []\r\n", b"INFO {\r\n"]))
    elif how == "info":
        return b"INFO " + draw(st.binary(max_size=10)).translate(NO_CRLF) + b"\r\n"
    else:  # short: a message cut anywhere
        whole = word + b" ".join(args) + b"\r\n" + body + b"\r\n"
        return whole[:draw(st.integers(0, len(whole)))]
    return word + b" ".join(args) + b"\r\n" + body + b"\r\n"


edits = st.lists(st.tuples(st.sampled_from(["set", "insert", "delete"]),
                           st.integers(0, 10**6), st.sampled_from(b" \r\n0123456789-MSGH\t") |
                           st.integers(0, 255)), max_size=4)


def edit(data: bytes, changes) -> bytes:
    out = bytearray(data)
    for kind, at, value in changes:
        at = at % (len(out) + 1)
        if kind == "insert":
            out[at:at] = bytes([value])
        elif at < len(out):
            if kind == "set":
                out[at] = value
            else:
                del out[at]
    return bytes(out)


@settings(max_examples=500, deadline=None)
@given(streams, damaged_frames(), streams, edits, st.lists(st.integers(0, 10**6), max_size=6),
       st.sampled_from([64 * 1024 * 1024, 300, 20, 0]))
def test_damaged_traffic_fails_as_the_reference(Parser, before, damaged, after, changes, cuts,
                                                max_message):
    data = edit(before + damaged + after, changes)
    steps = same(Parser, split(data, cuts) + [b"PING\r\n", b""], max_message)
    # feeding on after an error keeps failing the same way (the tail was kept as it was)
    errors = [result for result, _ in steps if result[0] != "tuple"]
    assert all(result[0] is nats_wire.NatsProtocolError for result in errors)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(0, 10**6), max_size=4))
def test_random_bytes_fail_or_parse_as_the_reference(Parser, data, cuts):
    same(Parser, split(b"MSG " + data, cuts))
    same(Parser, split(data, cuts))


def test_inputs_of_other_types_give_the_references_results_or_errors(Parser):
    for first in (b"", b"MSG a 1 2\r\n"):
        for data in (b"ab\r\n", bytearray(b"ab\r\n"), memoryview(b"ab\r\n"), "ab\r\n", 3, None,
                     [97, 98, 13, 10], b"PI", bytearray(b"NG\r\n")):
            same(Parser, [first, data])


def test_the_subject_cache_is_cleared_when_the_reference_clears_it(Parser):
    """More distinct subjects and replies than the cache keeps, each cleared while a subject
    or a reply seen just before (the twin remembers the last of each) comes again."""
    data = b"".join(b"MSG orders 1 _INBOX.%d 1\r\nx\r\nMSG orders 2 0\r\n\r\n"
                    b"MSG s.%d 3 inbox 1\r\ny\r\nMSG t.%d 4 inbox 0\r\n\r\n" % (i, i, i)
                    for i in range(3000))
    same(Parser, split(data, range(1, 10**6, 9973)))
    parser = Parser()
    parser.feed(data)
    assert len(parser._subjects) < nats_wire._SUBJECTS_KEPT  # cleared at least once


def test_limits_have_the_references_messages(Parser):
    """The cases tests/protocol/test_nats_wire.py names, with the exact messages."""
    cases = [b"MSG " + b"x" * 4096, b"MSG a 1 101\r\n", b"MSG a 1 2\r\nabXY", b"HELLO\r\n",
             b"MSG a\r\n", b"MSG a x 1\r\nq\r\n", b"HMSG a 1 5 3\r\n", b"HMSG\r\n", b"MSG \r\n"]
    for data in cases:
        (kind, message), _ = same(Parser, [data], 100)[0]
        assert kind is nats_wire.NatsProtocolError and message
    parser = Parser(100)
    assert parser.feed(b"MSG a 1 5\r\nab") == ([], [])
    assert parser.feed(b"cde\r\nPING\r\n") == ([(1, "a", "", None, b"abcde")], [("PING", None)])
    parser.max_message = 3  # nats_data.py sets it from INFO's max_payload
    with pytest.raises(nats_wire.NatsProtocolError, match="a message of 5 bytes, over 3"):
        parser.feed(b"MSG a 1 5\r\n")


def test_the_module_runs_the_twin_when_built():
    compiled = compiled_or_skip(TWIN)
    if nats_wire.NatsParser is Reference:
        assert _compiled.disabled()  # RIVERLOG_NO_EXTENSIONS: nats_wire.py runs its Python code
        pytest.skip("RIVERLOG_NO_EXTENSIONS is set: nats_wire.py runs its Python code")
    assert nats_wire.NatsParser is compiled.NatsParser
    assert "_nats_wire_c" in _compiled.status()
