# Tests of the 2020 draft dialect's sans-IO codec (riverlog.protocol.rabbitmq_stream.draft):
# round trips of every draft command in its direction (client frames written with DRAFT_CLIENT
# and read with DRAFT_SERVER, server frames the other way), exact bytes against layouts written
# out by hand from the seed, the translations (response codes and offset types minus one, no
# "no offset" code, dropped fields), the draft Deliver built from a stored chunk, the
# first-frame test, and the FrameError contract under fuzzing. Plain bytes, no sockets.
from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_rabbitmq_stream_codec import FAST, STRATEGIES, corr, props, text, u8, u16, u32, u64

from riverlog.log.chunk import encode_chunk, encode_entries
from riverlog.protocol.rabbitmq_stream import (CURRENT, FrameDecoder, FrameError, OffsetType,
                                             ResponseCode, decode, encode, simple_entry)
from riverlog.protocol.rabbitmq_stream import draft as d
from riverlog.protocol.rabbitmq_stream import frames as f
from riverlog.protocol.rabbitmq_stream.draft import DRAFT_CLIENT, DRAFT_SERVER, Key

# current codes that have a draft number (the 2020 Java client's list: OK 0 .. 16)
draft_code = st.integers(ResponseCode.OK, ResponseCode.PRECONDITION_FAILED)
draft_spec = (
    st.tuples(st.sampled_from([OffsetType.FIRST, OffsetType.LAST, OffsetType.NEXT]), st.none())
    | st.tuples(st.just(OffsetType.OFFSET), u64)
    | st.tuples(st.just(OffsetType.TIMESTAMP), st.integers(-(2**63), 2**63 - 1))
)
messages = st.lists(st.tuples(u64, st.binary(max_size=60).map(simple_entry)), max_size=8).map(tuple)


def _cr(cls):
    return st.builds(cls, corr, draft_code)


# frames a draft client sends (the server reads them) ...
CLIENT_FRAMES = {
    d.Publish: st.builds(d.Publish, text, u8, messages),
    f.Subscribe: st.builds(lambda c, s, n, sp, cr: f.Subscribe(c, s, n, sp[0], sp[1], cr, None),
                           corr, u8, text, draft_spec, u16),
    f.Credit: STRATEGIES[f.Credit],
    f.Unsubscribe: STRATEGIES[f.Unsubscribe],
    f.Metadata: STRATEGIES[f.Metadata],
    f.SaslHandshake: STRATEGIES[f.SaslHandshake],
    f.SaslAuthenticate: STRATEGIES[f.SaslAuthenticate],
    f.TuneResponse: STRATEGIES[f.TuneResponse],
    f.Open: STRATEGIES[f.Open],
    f.Close: st.builds(f.Close, corr, draft_code, st.none() | text),
    f.CloseResponse: _cr(f.CloseResponse),
    f.Heartbeat: STRATEGIES[f.Heartbeat],
    f.PeerProperties: STRATEGIES[f.PeerProperties],
    d.CommitOffset: st.builds(d.CommitOffset, corr, text, text, u64),
    f.QueryOffset: STRATEGIES[f.QueryOffset],
    f.Create: STRATEGIES[f.Create],
    f.Delete: STRATEGIES[f.Delete],
}
# ... and frames the server sends (a draft client reads them)
SERVER_FRAMES = {
    f.PublishConfirm: STRATEGIES[f.PublishConfirm],
    f.SubscribeResponse: _cr(f.SubscribeResponse),
    f.Deliver: STRATEGIES[f.Deliver],
    f.CreditResponse: st.builds(f.CreditResponse, draft_code, u8),
    f.UnsubscribeResponse: _cr(f.UnsubscribeResponse),
    f.PublishError: st.builds(f.PublishError, u8,
                              st.lists(st.tuples(u64, draft_code), max_size=10).map(tuple)),
    f.MetadataUpdate: st.builds(f.MetadataUpdate, draft_code, text),
    f.MetadataResponse: st.builds(
        f.MetadataResponse, corr,
        st.lists(st.builds(f.Broker, u16, text, u32), max_size=3).map(tuple),
        st.lists(st.builds(f.StreamMetadata, text, draft_code, u16,
                           st.lists(u16, max_size=3).map(tuple)), max_size=3).map(tuple)),
    f.SaslHandshakeResponse: st.builds(f.SaslHandshakeResponse, corr, draft_code,
                                       st.lists(text, max_size=4).map(tuple)),
    f.SaslAuthenticateResponse: st.builds(f.SaslAuthenticateResponse, corr, draft_code,
                                          st.none() | st.binary(max_size=30)),
    f.Tune: STRATEGIES[f.Tune],
    f.OpenResponse: st.builds(f.OpenResponse, corr, draft_code),
    f.Close: st.builds(f.Close, corr, draft_code, st.none() | text),
    f.CloseResponse: _cr(f.CloseResponse),
    f.Heartbeat: STRATEGIES[f.Heartbeat],
    f.PeerPropertiesResponse: st.builds(f.PeerPropertiesResponse, corr, draft_code, props),
    f.QueryOffsetResponse: st.builds(
        f.QueryOffsetResponse, corr,
        draft_code.filter(lambda c: c != ResponseCode.NO_OFFSET), u64),
    f.CreateResponse: _cr(f.CreateResponse),
    f.DeleteResponse: _cr(f.DeleteResponse),
}
DIRECTIONS = [(cls, DRAFT_CLIENT, DRAFT_SERVER) for cls in CLIENT_FRAMES] + [
    (cls, DRAFT_SERVER, DRAFT_CLIENT) for cls in SERVER_FRAMES]
ALL = {**CLIENT_FRAMES, **SERVER_FRAMES}


def test_every_draft_command_and_frame_class_is_covered():
    assert set(CLIENT_FRAMES) == set(DRAFT_CLIENT.writers)
    assert set(SERVER_FRAMES) == set(DRAFT_SERVER.writers)
    keys = {k for k, _ in [*DRAFT_CLIENT.keys.values(), *DRAFT_SERVER.keys.values()]}
    assert keys == set(Key) == {*range(18), 998, 999}  # the seed's "Commands" table
    assert {v for _, v in [*DRAFT_CLIENT.keys.values(), *DRAFT_SERVER.keys.values()]} == {0}


@pytest.mark.parametrize("cls, writer, reader", DIRECTIONS,
                         ids=lambda x: getattr(x, "__name__", getattr(x, "name", "?")))
@FAST
@given(data=st.data())
def test_round_trip(cls, writer, reader, data):
    frame = data.draw(ALL[cls])
    wire = encode(frame, writer)
    assert struct.unpack_from(">I", wire)[0] == len(wire) - 4
    assert struct.unpack_from(">HH", wire, 4) == writer.keys[cls]
    assert decode(wire, reader) == frame
    assert FrameDecoder(max_frame_size=0, dialect=reader).feed(wire) == [frame]


@FAST
@given(st.lists(st.sampled_from(sorted(CLIENT_FRAMES, key=lambda c: c.__name__))
                .flatmap(lambda c: CLIENT_FRAMES[c]), min_size=1, max_size=6), st.data())
def test_client_frames_split_anywhere(frames, data):
    wire = b"".join(encode(x, DRAFT_CLIENT) for x in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    decoder = FrameDecoder(max_frame_size=0, dialect=DRAFT_SERVER)
    out, prev = [], 0
    for cut in [*cuts, len(wire)]:
        out += decoder.feed(wire[prev:cut])
        prev = cut
    assert out == frames


# -- exact bytes, written out from the seed's layouts ---------------------------------------------


def _framed(key: int, body: str) -> bytes:
    raw = bytes.fromhex(body)
    return struct.pack(">IHH", 4 + len(raw), key, 0) + raw


EXACT = [
    # Publish: Stream "s", PublisherId 7, [PublishingId 1, Message "hi"]
    (d.Publish("s", 7, ((1, simple_entry(b"hi")),)), DRAFT_CLIENT,
     _framed(0, "0001 73 07 00000001 0000000000000001 00000002 6869")),
    # Subscribe: C 1, SubscriptionId 2, Stream "s", OffsetType 3 (offset) 42, Credit 10
    (f.Subscribe(1, 2, "s", OffsetType.OFFSET, 42, 10), DRAFT_CLIENT,
     _framed(2, "00000001 02 0001 73 0003 000000000000002a 000a")),
    (f.Subscribe(1, 2, "s", OffsetType.FIRST, None, 10), DRAFT_CLIENT,
     _framed(2, "00000001 02 0001 73 0000 000a")),
    # CommitOffset: C, Reference "r", Stream "s", Offset 5
    (d.CommitOffset(9, "r", "s", 5), DRAFT_CLIENT,
     _framed(16, "00000009 0001 72 0001 73 0000000000000005")),
    (f.PeerProperties(1, {"a": "b"}), DRAFT_CLIENT, _framed(15, "00000001 00000001 0001 61 0001 62")),
    (f.TuneResponse(1_048_576, 60), DRAFT_CLIENT, _framed(11, "00100000 0000003c")),
    (f.Create(3, "s", {}), DRAFT_CLIENT, _framed(998, "00000003 0001 73 00000000")),
    (f.Delete(3, "s"), DRAFT_CLIENT, _framed(999, "00000003 0001 73")),
    # responses reuse the request key; OK is 0
    (f.SubscribeResponse(1, ResponseCode.OK), DRAFT_SERVER, _framed(2, "00000001 0000")),
    (f.CreateResponse(3, ResponseCode.STREAM_ALREADY_EXISTS), DRAFT_SERVER, _framed(998, "00000003 0004")),
    (f.PublishConfirm(7, (1, 2)), DRAFT_SERVER,
     _framed(1, "07 00000002 0000000000000001 0000000000000002")),
    (f.PublishError(7, ((1, ResponseCode.STREAM_DOES_NOT_EXIST),)), DRAFT_SERVER,
     _framed(6, "07 00000001 0000000000000001 0001")),
    (f.CreditResponse(ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST, 4), DRAFT_SERVER, _framed(4, "0003 04")),
    (f.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, "s"), DRAFT_SERVER, _framed(7, "0005 0001 73")),
    (f.Tune(1_048_576, 60), DRAFT_SERVER, _framed(11, "00100000 0000003c")),
    (f.SaslAuthenticateResponse(2, ResponseCode.OK), DRAFT_SERVER, _framed(10, "00000002 0000 ffffffff")),
    (f.OpenResponse(4, ResponseCode.OK), DRAFT_SERVER, _framed(12, "00000004 0000")),
    (f.Close(0, ResponseCode.UNKNOWN_FRAME, "x"), DRAFT_SERVER, _framed(13, "00000000 000c 0001 78")),
    (f.CloseResponse(5, ResponseCode.OK), DRAFT_SERVER, _framed(13, "00000005 0000")),
    (f.QueryOffsetResponse(6, ResponseCode.OK, 9), DRAFT_SERVER, _framed(17, "00000006 0000 0000000000000009")),
]


@pytest.mark.parametrize("frame, writer, wire", EXACT, ids=lambda x: type(x).__name__)
def test_exact_bytes(frame, writer, wire):
    assert encode(frame, writer) == wire
    reader = DRAFT_SERVER if writer is DRAFT_CLIENT else DRAFT_CLIENT
    assert decode(wire, reader) == frame


def test_what_the_draft_cannot_say():
    # no "no offset" code: the 2020 broker answered OK with offset 0
    no_offset = f.QueryOffsetResponse(6, ResponseCode.NO_OFFSET, 0)
    assert decode(encode(no_offset, DRAFT_SERVER), DRAFT_CLIENT) == f.QueryOffsetResponse(6, ResponseCode.OK, 0)
    # Open has no properties: advertised host and port are left out
    opened = f.OpenResponse(4, ResponseCode.OK, {"advertised_host": "h", "advertised_port": "1"})
    assert encode(opened, DRAFT_SERVER) == _framed(12, "00000004 0000")
    # frames of later protocol versions are not draft frames
    for frame in (f.DeclarePublisher(1, 1, "r", "s"), f.ExchangeCommandVersions(1, ()),
                  f.DeliverV2(1, 2, b"")):
        with pytest.raises(TypeError):
            encode(frame, DRAFT_SERVER)
        with pytest.raises(TypeError):
            encode(frame, DRAFT_CLIENT)
    with pytest.raises(ValueError):  # code 0 has no draft number (draft codes are current - 1)
        encode(f.SubscribeResponse(1, 0), DRAFT_SERVER)


def test_first_frame_tells_the_dialects_apart():
    ours = encode(f.PeerProperties(1, {}), DRAFT_CLIENT)
    current = encode(f.PeerProperties(1, {}))
    assert d.opens_draft(ours) is True and d.opens_draft(current) is False
    assert ours[4:6] == b"\x00\x0f" and current[4:6] == b"\x00\x11"
    # too few bytes to tell: wait, unless the size field cannot even hold a key
    assert [d.opens_draft(ours[:n]) for n in range(6)] == [None] * 6
    assert d.opens_draft(b"\0\0\0\0") is False and d.opens_draft(b"\0\0\0\1\0") is False
    # key 15 in the current protocol is Metadata (never a first frame), and with version 0 it
    # is no current frame at all; 0x0011 is no draft frame
    assert CURRENT.keys[f.Metadata] == (15, 1)
    with pytest.raises(FrameError):
        decode(ours)
    with pytest.raises(FrameError):
        decode(current, DRAFT_SERVER)


# -- Deliver --------------------------------------------------------------------------------------


def _stored_chunk(data: bytes, entries: int, records: int, first: int = 100) -> bytes:
    chunk = encode_chunk(data, entries, records, first_offset=first, timestamp_ms=1_700_000_000_000,
                         epoch=3, trailer=b"TRAILER", bloom_size=0)
    return chunk[:-len(b"TRAILER")]  # the log hands the door header + data, never the trailer


def _draft_deliver(sub: int, stored: bytes) -> tuple[tuple, bytes]:
    wire = b"".join(bytes(p) for p in d.deliver_parts(sub, memoryview(stored)))
    frame = decode(wire, DRAFT_CLIENT)
    assert frame.subscription_id == sub and struct.unpack_from(">HH", wire, 4) == (3, 0)
    head = struct.unpack_from(">BHIQQII", frame.chunk)
    return head, frame.chunk[31:]


def test_deliver_has_the_seeds_chunk_header_and_the_data_as_stored():
    data = encode_entries([b"a", b"bb", b"ccc"])
    (magic, entries, records, epoch, first, crc, length), rest = _draft_deliver(
        5, _stored_chunk(data, 3, 3))
    assert (magic, entries, records, epoch, first) == (0x50, 3, 3, 3, 100)
    assert rest == data and length == len(data) and crc == zlib.crc32(data)


def test_deliver_rewrites_sub_batches_to_the_draft_entry_header():
    body = struct.pack(">I", 1) + b"x" + struct.pack(">I", 2) + b"yz"
    current = struct.pack(">BHII", 0x80, 2, len(body), len(body)) + body  # codec 0 (none)
    gz = zlib.compress(b"whatever")
    current_gzip = struct.pack(">BHII", 0x90, 7, 99, len(gz)) + gz
    data = simple_entry(b"one") + current + simple_entry(b"two") + current_gzip
    (magic, entries, records, _, first, crc, length), rest = _draft_deliver(
        1, _stored_chunk(data, 4, 11))
    # osiris 348db05: 1|codec:3|0:4, records u16, size u32, body (no uncompressed length)
    expected = (simple_entry(b"one") + struct.pack(">BHI", 0x80, 2, len(body)) + body
                + simple_entry(b"two") + struct.pack(">BHI", 0x90, 7, len(gz)) + gz)
    assert rest == expected
    assert (entries, records, length, crc) == (4, 11, len(expected), zlib.crc32(expected))


# -- bad input: FrameError only, with the codes the door closes with --------------------------------


@pytest.mark.parametrize("wire", [
    _framed(0, "0001 73 07 00000001 0000000000000001 ffffffff"),  # null message
    _framed(0, "0001 73 07 00000001 0000000000000001 00000005 61"),  # message cut short
    _framed(0, "0001 73 07 00000002 0000000000000001 00000001 61"),  # count above the messages
    _framed(2, "00000001 02 0001 73 0005 000a"),  # offset type 5 does not exist in the draft
    _framed(2, "00000001 02 0001 73 0003 000a"),  # offset type 3 without its offset
    _framed(13, "00000001 0000 0005 61"),  # Close reason runs past the end
    _framed(14, "00"),  # Heartbeat with a trailing byte
    _framed(18, ""),  # DeclarePublisher of later drafts: no such key here
    struct.pack(">IHH", 4, 15, 1),  # version 1: the draft has only 0
    encode(f.PeerProperties(1, {})),  # a current frame
])
def test_bad_frames_raise_unknown_frame(wire):
    with pytest.raises(FrameError) as err:
        FrameDecoder(dialect=DRAFT_SERVER).feed(wire)
    assert err.value.code == ResponseCode.UNKNOWN_FRAME


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(DRAFT_SERVER.readers) + sorted(DRAFT_CLIENT.readers)),
       st.binary(max_size=48), st.sampled_from([0, 16, 8192]))
def test_fuzz_known_header_random_body(key_version, body, limit):
    for dialect in (DRAFT_SERVER, DRAFT_CLIENT):
        try:
            out = FrameDecoder(max_frame_size=limit, dialect=dialect).feed(
                struct.pack(">IHH", 4 + len(body), *key_version) + body)
        except FrameError as exc:
            assert exc.code in (ResponseCode.UNKNOWN_FRAME, ResponseCode.FRAME_TOO_LARGE)
        else:
            assert all(isinstance(x, f.Frame) for x in out)
