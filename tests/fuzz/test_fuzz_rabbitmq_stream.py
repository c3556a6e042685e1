# Fuzzing the RabbitMQ Stream decoders (riverlog.protocol.rabbitmq_stream: the current dialect
# and both directions of the 2020 draft dialect, draft.py) with frames built from wire tokens: a size prefix that may lie, a known or random key and
# version, then a body of u8/u16/u32/u64 values, i16-sized strings and i32-sized byte strings and
# counts whose lengths may lie. The codec's contract (errors.py): bad peer bytes raise FrameError
# only, with code 0x0d or 0x0e; and how the bytes are split across feed() calls never changes
# the outcome. draft.opens_draft, which looks at a connection's first bytes, never raises.
from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from riverlog.protocol.rabbitmq_stream import CURRENT, FrameDecoder, FrameError, ResponseCode, decode
from riverlog.protocol.rabbitmq_stream.draft import DRAFT_CLIENT, DRAFT_SERVER, opens_draft

from ._budget import budget

CODES = {ResponseCode.UNKNOWN_FRAME, ResponseCode.FRAME_TOO_LARGE}
DIALECTS = [CURRENT, DRAFT_SERVER, DRAFT_CLIENT]

_edge_u32 = st.sampled_from([0, 1, 2, 7, 8, 12, 255, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF,
                             0x80000000, 0xFFFFFFFF])
_lengths = st.one_of(st.integers(-3, 48), st.sampled_from([0x7FFF, -0x8000, 0x7FFFFFFF]))

token = st.one_of(
    st.integers(0, 0xFF).map(lambda v: struct.pack(">B", v)),
    st.integers(0, 0xFFFF).map(lambda v: struct.pack(">H", v)),
    st.one_of(st.integers(0, 0xFFFFFFFF), _edge_u32).map(lambda v: struct.pack(">I", v)),
    st.integers(0, (1 << 64) - 1).map(lambda v: struct.pack(">Q", v)),
    # i16-sized string (maybe null, maybe lying about its length, maybe bad UTF-8)
    st.tuples(st.integers(-2, 40), st.one_of(st.text(max_size=20).map(str.encode),
                                             st.binary(max_size=40)))
    .map(lambda t: struct.pack(">h", t[0]) + t[1]),
    # i32-sized bytes, or an array/map count, followed by what may or may not match it
    st.tuples(_lengths, st.binary(max_size=48))
    .map(lambda t: struct.pack(">i", max(-(1 << 31), min(t[0], (1 << 31) - 1))) + t[1]),
)


@st.composite
def frame_bytes(draw, dialect=CURRENT) -> bytes:
    readers = dialect.readers
    key, version = draw(st.one_of(st.sampled_from(sorted(readers)),
                                  st.tuples(st.integers(0, 0xFFFF), st.integers(0, 4))))
    body = b"".join(draw(st.lists(token, max_size=14)))
    size = 4 + len(body)
    lie = draw(st.sampled_from([0, 0, 0, -1, 1, -4, 3, None]))
    prefix = draw(st.integers(0, 0xFFFFFFFF)) if lie is None else max(0, size + lie)
    return struct.pack(">IHH", prefix, key, version) + body


limits = st.sampled_from([0, 8192, 65536, 1 << 20])


def _outcome(pieces: list[bytes], limit: int, dialect):
    """(frames, error code or None) of feeding ``pieces`` one by one."""
    decoder = FrameDecoder(max_frame_size=limit, dialect=dialect)
    frames = []
    for piece in pieces:
        try:
            frames += decoder.feed(piece)
        except FrameError as exc:
            assert exc.code in CODES, exc
            return frames + list(exc.frames), exc.code
    return frames, None


@budget(700)
@given(st.sampled_from(DIALECTS), limits, st.data())
def test_token_frames_raise_only_frame_error_whatever_the_split(dialect, limit, data):
    wire = b"".join(data.draw(st.lists(frame_bytes(dialect), min_size=1, max_size=4)))
    assert opens_draft(wire) in (True, False, None)
    whole = _outcome([wire], limit, dialect)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    pieces = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)])]
    assert _outcome(pieces, limit, dialect) == whole


@budget(700)
@given(st.sampled_from(DIALECTS), st.data())
def test_decode_of_one_frame_raises_only_frame_error(dialect, data):
    wire = data.draw(frame_bytes(dialect))
    try:
        decode(wire, dialect)
    except FrameError as exc:
        # 0x0e only for an array over its bound (Metadata's names: MAX_METADATA_NAMES)
        assert exc.code == ResponseCode.UNKNOWN_FRAME or (
            exc.code == ResponseCode.FRAME_TOO_LARGE and "per frame" in str(exc)), exc
