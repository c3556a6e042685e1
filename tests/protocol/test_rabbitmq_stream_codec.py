# Tests of the sans-IO RabbitMQ Stream codec (riverlog.protocol.rabbitmq_stream): round trips of
# every frame type from hypothesis strategies, exact bytes against rstream's own encoder and
# decoder (a real third-party implementation), incremental feeding, the FrameError contract
# (codes 0x0e and 0x0d, nothing else ever escapes) and fuzzing. Plain bytes, no sockets.
from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rstream import schema as rs
from rstream.constants import OffsetType as RsOffsetType
from rstream.encoding import decode_frame as rs_decode, encode_frame as rs_encode, encode_publish

from riverlog.protocol.rabbitmq_stream import (
    CURRENT,
    FrameDecoder,
    FrameError,
    OffsetType,
    ResponseCode,
    decode,
    deliver_prefix,
    encode,
    simple_entry,
)
from riverlog.protocol.rabbitmq_stream import frames as f

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- strategies, one per frame class ------------------------------------------------------------

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
corr = u32
code = u16
text = st.text(max_size=12)
nullable_text = st.none() | text
props = st.dictionaries(text, nullable_text, max_size=4)
strings = st.lists(text, max_size=4).map(tuple)


@st.composite
def sub_batch_entry(draw) -> bytes:
    body = draw(st.binary(max_size=40))
    codec = draw(st.integers(0, 4))
    head = struct.pack(">BHII", 0x80 | codec << 4, draw(u16), draw(u32), len(body))
    return head + body


entry = st.binary(max_size=120).map(simple_entry) | sub_batch_entry()
spec = (
    st.tuples(st.sampled_from([1, 2, 3]), st.none())
    | st.tuples(st.just(4), u64)
    | st.tuples(st.just(5), i64)
)
trailing_spec = (
    st.tuples(st.sampled_from([0, 1, 2, 3]), st.none() | u64)
    | st.tuples(st.just(4), u64)
    | st.tuples(st.just(5), i64)
)
chunk = st.binary(max_size=200)
command_version = st.builds(f.CommandVersion, u16, u16, u16)


def _cr(cls):
    """A response made of correlation id and response code only."""
    return st.builds(cls, corr, code)


STRATEGIES = {
    f.DeclarePublisher: st.builds(f.DeclarePublisher, corr, u8, nullable_text, text),
    f.DeclarePublisherResponse: _cr(f.DeclarePublisherResponse),
    f.Publish: st.builds(f.Publish, u8, st.lists(st.tuples(u64, entry), max_size=8).map(tuple)),
    f.PublishV2: st.builds(
        f.PublishV2,
        u8,
        st.lists(
            st.tuples(u64, nullable_text, st.binary(max_size=80).map(simple_entry)), max_size=8
        ).map(tuple),
    ),
    f.PublishConfirm: st.builds(f.PublishConfirm, u8, st.lists(u64, max_size=20).map(tuple)),
    f.PublishError: st.builds(
        f.PublishError, u8, st.lists(st.tuples(u64, code), max_size=10).map(tuple)
    ),
    f.QueryPublisherSequence: st.builds(f.QueryPublisherSequence, corr, text, text),
    f.QueryPublisherSequenceResponse: st.builds(f.QueryPublisherSequenceResponse, corr, code, u64),
    f.DeletePublisher: st.builds(f.DeletePublisher, corr, u8),
    f.DeletePublisherResponse: _cr(f.DeletePublisherResponse),
    f.Subscribe: st.builds(
        lambda c, s, name, sp, credit, p: f.Subscribe(c, s, name, sp[0], sp[1], credit, p),
        corr, u8, text, spec, u16, st.none() | props,
    ),
    f.SubscribeResponse: _cr(f.SubscribeResponse),
    f.Deliver: st.builds(f.Deliver, u8, chunk),
    f.DeliverV2: st.builds(f.DeliverV2, u8, u64, chunk),
    f.Credit: st.builds(f.Credit, u8, u16),
    f.CreditResponse: st.builds(f.CreditResponse, code, u8),
    f.StoreOffset: st.builds(f.StoreOffset, text, text, u64),
    f.QueryOffset: st.builds(f.QueryOffset, corr, text, text),
    f.QueryOffsetResponse: st.builds(f.QueryOffsetResponse, corr, code, u64),
    f.Unsubscribe: st.builds(f.Unsubscribe, corr, u8),
    f.UnsubscribeResponse: _cr(f.UnsubscribeResponse),
    f.Create: st.builds(f.Create, corr, text, props),
    f.CreateResponse: _cr(f.CreateResponse),
    f.Delete: st.builds(f.Delete, corr, text),
    f.DeleteResponse: _cr(f.DeleteResponse),
    f.Metadata: st.builds(f.Metadata, corr, strings),
    f.MetadataResponse: st.builds(
        f.MetadataResponse,
        corr,
        st.lists(st.builds(f.Broker, u16, text, u32), max_size=3).map(tuple),
        st.lists(
            st.builds(f.StreamMetadata, text, code, u16, st.lists(u16, max_size=3).map(tuple)),
            max_size=3,
        ).map(tuple),
    ),
    f.MetadataUpdate: st.builds(f.MetadataUpdate, code, text),
    f.PeerProperties: st.builds(f.PeerProperties, corr, props),
    f.PeerPropertiesResponse: st.builds(f.PeerPropertiesResponse, corr, code, props),
    f.SaslHandshake: st.builds(f.SaslHandshake, corr),
    f.SaslHandshakeResponse: st.builds(f.SaslHandshakeResponse, corr, code, strings),
    f.SaslAuthenticate: st.builds(f.SaslAuthenticate, corr, text, st.none() | st.binary(max_size=30)),
    f.SaslAuthenticateResponse: st.builds(
        f.SaslAuthenticateResponse, corr, code, st.none() | st.binary(max_size=30)
    ),
    f.Tune: st.builds(f.Tune, u32, u32),
    f.TuneResponse: st.builds(f.TuneResponse, u32, u32),
    f.Open: st.builds(f.Open, corr, text),
    f.OpenResponse: st.builds(f.OpenResponse, corr, code, st.none() | props),
    f.Close: st.builds(f.Close, corr, code, nullable_text),
    f.CloseResponse: _cr(f.CloseResponse),
    f.Heartbeat: st.just(f.Heartbeat()),
    f.Route: st.builds(f.Route, corr, text, text),
    f.RouteResponse: st.builds(f.RouteResponse, corr, code, strings),
    f.Partitions: st.builds(f.Partitions, corr, text),
    f.PartitionsResponse: st.builds(f.PartitionsResponse, corr, code, strings),
    f.ConsumerUpdate: st.builds(f.ConsumerUpdate, corr, u8, st.booleans()),
    f.ConsumerUpdateResponse: st.builds(
        lambda c, rc, sp: f.ConsumerUpdateResponse(c, rc, sp[0], sp[1]), corr, code, trailing_spec
    ),
    f.ExchangeCommandVersions: st.builds(
        f.ExchangeCommandVersions, corr, st.lists(command_version, max_size=4).map(tuple)
    ),
    f.ExchangeCommandVersionsResponse: st.builds(
        f.ExchangeCommandVersionsResponse,
        corr,
        code,
        st.lists(command_version, max_size=4).map(tuple),
    ),
    f.StreamStats: st.builds(f.StreamStats, corr, text),
    f.StreamStatsResponse: st.builds(
        f.StreamStatsResponse, corr, code, st.dictionaries(text, i64, max_size=4)
    ),
    f.CreateSuperStream: st.builds(f.CreateSuperStream, corr, text, strings, strings, props),
    f.CreateSuperStreamResponse: _cr(f.CreateSuperStreamResponse),
    f.DeleteSuperStream: st.builds(f.DeleteSuperStream, corr, text),
    f.DeleteSuperStreamResponse: _cr(f.DeleteSuperStreamResponse),
    f.ResolveOffsetSpec: st.builds(
        lambda c, name, sp, p: f.ResolveOffsetSpec(c, name, sp[0], sp[1], p),
        corr, text, spec, st.none() | props,
    ),
    f.ResolveOffsetSpecResponse: st.builds(
        f.ResolveOffsetSpecResponse, corr, code, st.integers(0, 5), u64
    ),
}
FRAME_CLASSES = sorted(STRATEGIES, key=lambda c: CURRENT.keys[c])
any_frame = st.sampled_from(FRAME_CLASSES).flatmap(lambda c: STRATEGIES[c])


def test_every_frame_class_of_the_table_has_a_strategy():
    assert set(STRATEGIES) == set(CURRENT.writers)
    keys = {k for k, _ in CURRENT.keys.values()}
    # every command 0x01..0x1f is covered (plus responses)
    assert set(range(0x01, 0x20)) <= keys


# -- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", FRAME_CLASSES, ids=lambda c: c.__name__)
@FAST
@given(data=st.data())
def test_round_trip(cls, data):
    frame = data.draw(STRATEGIES[cls])
    wire = encode(frame)
    assert struct.unpack_from(">I", wire)[0] == len(wire) - 4
    assert struct.unpack_from(">HH", wire, 4) == CURRENT.keys[cls]
    assert decode(wire) == frame
    assert FrameDecoder(max_frame_size=0).feed(wire) == [frame]


@FAST
@given(st.lists(any_frame, min_size=1, max_size=6))
def test_byte_by_byte_feeding(frames):
    wire = b"".join(encode(x) for x in frames)
    decoder = FrameDecoder(max_frame_size=0)
    out = []
    for i in range(len(wire)):
        out += decoder.feed(wire[i : i + 1])
    assert out == frames
    assert decoder.buffered == 0


@FAST
@given(st.lists(any_frame, min_size=1, max_size=6), st.data())
def test_arbitrary_split_points(frames, data):
    wire = b"".join(encode(x) for x in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    decoder = FrameDecoder(max_frame_size=0)
    out, prev = [], 0
    for cut in [*cuts, len(wire)]:
        out += decoder.feed(memoryview(wire)[prev:cut])
        prev = cut
    assert out == frames


# -- exact bytes against rstream's encoder and decoder ------------------------------------------


def _prop(k, v):
    return rs.Property(key=k, value=v)


RSTREAM_PAIRS = [
    (
        f.PeerProperties(7, {"product": "rstream", "version": "0.20"}),
        rs_encode(rs.PeerProperties(7, [_prop("product", "rstream"), _prop("version", "0.20")])),
    ),
    (
        f.SaslAuthenticate(3, "PLAIN", b"\0guest\0guest"),
        rs_encode(rs.SaslAuthenticate(3, "PLAIN", b"\0guest\0guest")),
    ),
    (f.Open(4, "/"), rs_encode(rs.Open(4, "/"))),
    (f.Tune(1_048_576, 60), rs_encode(rs.Tune(1_048_576, 60))),
    (
        f.DeclarePublisher(5, 1, "ref", "orders"),
        rs_encode(rs.DeclarePublisher(5, 1, "ref", "orders")),
    ),
    (
        f.Subscribe(9, 2, "orders", OffsetType.OFFSET, 42, 10, {"name": "c1"}),
        rs_encode(
            rs.Subscribe(
                9, 2, "orders", rs.OffsetSpec.from_params(RsOffsetType.OFFSET, 42), 10,
                [_prop("name", "c1")],
            )
        ),
    ),
    (
        f.Subscribe(9, 2, "orders", OffsetType.FIRST, None, 10, {}),
        rs_encode(
            rs.Subscribe(9, 2, "orders", rs.OffsetSpec.from_params(RsOffsetType.FIRST, None), 10, [])
        ),
    ),
    (f.Credit(2, 1), rs_encode(rs.Credit(2, 1))),
    (f.StoreOffset("c1", "orders", 99), rs_encode(rs.StoreOffset("c1", "orders", 99))),
    (
        f.Publish(1, ((1, simple_entry(b"hello")), (2, simple_entry(b"")))),
        encode_publish(
            rs.Publish(1, [rs.Message(1, None, b"hello"), rs.Message(2, None, b"")]), 1
        ),
    ),
    (
        f.PublishV2(1, ((1, "eu", simple_entry(b"hello")),)),
        encode_publish(rs.Publish(1, [rs.Message(1, "eu", b"hello")]), 2),
    ),
    (
        f.Publish(1, ((8, b"\x90" + struct.pack(">HII", 2, 14, 5) + b"zzzzz"),)),
        rs_encode(rs.PublishSubBatching(1, 1, 8, 0x90, 2, 14, 5, b"zzzzz")),
    ),
    (
        f.ExchangeCommandVersions(6, (f.CommandVersion(8, 1, 2),)),
        rs_encode(rs.ExchangeCommandVersionRequest(6, [rs.FrameHandlerInfo(8, 1, 2)])),
    ),
    (
        f.CreateSuperStream(3, "inv", ("inv-0", "inv-1"), ("0", "1"), {"max-age": "7D"}),
        rs_encode(
            rs.CreateSuperStream(3, "inv", ["inv-0", "inv-1"], ["0", "1"], [_prop("max-age", "7D")])
        ),
    ),
    (f.Route(2, "key", "inv"), rs_encode(rs.SuperStreamRoute(2, "key", "inv"))),
    (
        f.ConsumerUpdateResponse(11, ResponseCode.OK, OffsetType.NEXT, 0),
        rs_encode(rs.ConsumerUpdateServerResponse(11, 1, rs.OffsetSpecification(3, 0))),
    ),
    (f.Heartbeat(), rs_encode(rs.Heartbeat())),
]


@pytest.mark.parametrize("ours, theirs", RSTREAM_PAIRS, ids=lambda x: type(x).__name__)
def test_same_bytes_as_rstream_encoder(ours, theirs):
    assert encode(ours) == theirs
    assert decode(theirs) == ours


def _chunk(records: list[bytes], first_offset: int = 0) -> bytes:
    data = b"".join(simple_entry(r) for r in records)
    header = struct.pack(
        ">BBHIqQQIIIB3x", 0x50, 0, len(records), len(records), 1_700_000_000_000, 1,
        first_offset, zlib.crc32(data), len(data), 0, 0,
    )
    return header + data


SERVER_FRAMES = [
    (f.PeerPropertiesResponse(1, 1, {"product": "riverlog", "version": "3.13.0"}), rs.PeerPropertiesResponse),
    (f.SaslHandshakeResponse(2, 1, ("PLAIN",)), rs.SaslHandshakeResponse),
    (f.OpenResponse(4, 1, {"advertised_host": "localhost", "advertised_port": "5552"}), rs.OpenResponse),
    (f.QueryOffsetResponse(5, 1, 123), rs.QueryOffsetResponse),
    (f.QueryPublisherSequenceResponse(5, 1, 77), rs.QueryPublisherSequenceResponse),
    (f.PublishConfirm(1, (1, 2, 3)), rs.PublishConfirm),
    (f.PublishError(1, ((4, 0x12),)), rs.PublishError),
    (f.CreditResponse(0x04, 3), rs.CreditResponse),
    (f.MetadataUpdate(0x06, "orders"), rs.MetadataUpdate),
    (f.ConsumerUpdate(12, 2, True), rs.ConsumerUpdateResponse),  # rstream's name for 0x001a
    (
        f.MetadataResponse(
            6, (f.Broker(0, "localhost", 5552),), (f.StreamMetadata("orders", 1, 0, (0,)),)
        ),
        rs.MetadataResponse,
    ),
    (
        f.ExchangeCommandVersionsResponse(7, 1, (f.CommandVersion(1, 1, 1), f.CommandVersion(2, 1, 2))),
        rs.ExchangeCommandVersionResponse,
    ),
    (f.RouteResponse(8, 1, ("inv-1",)), rs.SuperStreamRouteResponse),
    (f.PartitionsResponse(8, 1, ("inv-0", "inv-1")), rs.SuperStreamPartitionsResponse),
    (f.Deliver(3, _chunk([b"hello", b"world"], 10)), rs.Deliver),
]


@pytest.mark.parametrize("ours, rs_cls", SERVER_FRAMES, ids=lambda x: type(x).__name__)
def test_rstream_decodes_what_we_encode(ours, rs_cls):
    wire = encode(ours)
    theirs = rs_decode(wire[4:])  # rstream decodes after the size prefix
    assert type(theirs) is rs_cls
    # rstream never sets the response bit when encoding, so compare everything after the key
    redone = rs_encode(theirs)
    assert redone[:4] == wire[:4] and redone[6:] == wire[6:]
    if isinstance(ours, f.Deliver):
        assert theirs.get_messages() == [b"hello", b"world"]
        assert theirs.chunk_first_offset == 10


# -- wire details the brief and the reference call out ------------------------------------------


def test_optional_trailing_parts_are_absent_not_empty():
    base = encode(f.Subscribe(1, 1, "s", OffsetType.NEXT, None, 5))
    with_empty_map = encode(f.Subscribe(1, 1, "s", OffsetType.NEXT, None, 5, {}))
    assert with_empty_map == base[:3] + bytes([base[3] + 4]) + base[4:] + b"\0\0\0\0"
    failed_open = encode(f.OpenResponse(4, ResponseCode.VIRTUAL_HOST_ACCESS_FAILURE))
    assert failed_open == bytes.fromhex("0000000a 8015 0001 00000004 000c")
    assert encode(f.SaslAuthenticateResponse(2, 1)) == bytes.fromhex("0000000a 8013 0001 00000002 0001")
    challenged = f.SaslAuthenticateResponse(2, ResponseCode.SASL_CHALLENGE, b"abc")
    assert encode(challenged) == bytes.fromhex("0000000f 8013 0001 00000002 000a 0003 616263")
    assert decode(encode(challenged)) == challenged


def test_credit_error_response_has_no_correlation_id():
    assert encode(f.CreditResponse(0x04, 7)) == bytes.fromhex("00000007 8009 0001 0004 07")


def test_tune_is_0x0014_and_its_echo_may_carry_the_response_bit():
    assert encode(f.Tune(1_048_576, 60)) == bytes.fromhex("0000000c 0014 0001 00100000 0000003c")
    echo = bytes.fromhex("0000000c 8014 0001 00100000 0000003c")
    assert decode(echo) == f.TuneResponse(1_048_576, 60)


def test_deliver_v2_and_prefix():
    c = _chunk([b"x"])
    assert deliver_prefix(3, len(c)) + c == encode(f.Deliver(3, c))
    assert deliver_prefix(3, len(c), 99) + c == encode(f.DeliverV2(3, 99, c))
    assert struct.unpack_from(">HHBQ", encode(f.DeliverV2(3, 99, c)), 4) == (8, 2, 3, 99)


def test_publish_entries_are_raw_slices_ready_for_a_chunk():
    entries = (simple_entry(b"a" * 100), b"\xb0" + struct.pack(">HII", 3, 30, 4) + b"zzzz")
    frame = decode(encode(f.Publish(9, ((1, entries[0]), (2, entries[1])))))
    assert [e for _, e in frame.entries] == list(entries)
    assert all(type(e) is bytes for _, e in frame.entries)


def test_consumer_update_response_value_rules():
    bare = bytes.fromhex("0000000c 801a 0001 00000001 0001 0003")
    assert decode(bare) == f.ConsumerUpdateResponse(1, 1, OffsetType.NEXT, None)
    ts = f.ConsumerUpdateResponse(1, 1, OffsetType.TIMESTAMP, -5)
    assert decode(encode(ts)) == ts
    with pytest.raises(FrameError) as err:  # an offset type that needs a value, without one
        decode(bytes.fromhex("0000000c 801a 0001 00000001 0001 0004"))
    assert err.value.code == ResponseCode.UNKNOWN_FRAME


def test_resolve_offset_spec_layout():
    # rabbit_stream_core.erl: C, Stream, OffsetType:16 [Value:64], [Count:32, map]
    frame = f.ResolveOffsetSpec(1, "s", OffsetType.TIMESTAMP, 1000, None)
    assert encode(frame) == bytes.fromhex("00000015 001f 0001 00000001 0001 73 0005 00000000000003e8")
    reply = f.ResolveOffsetSpecResponse(1, ResponseCode.OK, OffsetType.OFFSET, 42)
    assert encode(reply) == bytes.fromhex("00000014 801f 0001 00000001 0001 0004 000000000000002a")


def test_encode_rejects_bad_values():
    with pytest.raises(ValueError):
        encode(f.Credit(256, 1))
    with pytest.raises(ValueError):
        encode(f.Subscribe(1, 1, "s", OffsetType.OFFSET, None, 1))
    with pytest.raises(ValueError):
        encode(f.Delete(1, "x" * 40_000))
    with pytest.raises(TypeError):
        encode(object())


# -- FrameError contract ----------------------------------------------------------------------


def test_oversized_frame_is_refused_at_its_size_field_and_key():
    decoder = FrameDecoder(max_frame_size=8192)
    hb = encode(f.Heartbeat())
    assert decoder.feed(hb + struct.pack(">I", 8193)) == [f.Heartbeat()]  # the key decides
    with pytest.raises(FrameError) as err:
        decoder.feed(struct.pack(">H", 0x000D))  # Create; its body never sent
    assert err.value.code == ResponseCode.FRAME_TOO_LARGE == 0x0E
    assert err.value.frames == ()
    with pytest.raises(FrameError) as again:
        decoder.feed(hb)
    assert again.value.code == 0x0E
    # exactly at the limit is fine; the limit can be raised after Open
    body = struct.pack(">HHB", 8, 1, 1) + bytes(8187)
    assert FrameDecoder(max_frame_size=8192).feed(struct.pack(">I", len(body)) + body)
    decoder = FrameDecoder(max_frame_size=100)
    decoder.max_frame_size = 0
    assert decoder.feed(struct.pack(">I", len(body)) + body)


def test_a_publish_frame_may_exceed_frame_max_up_to_its_own_bound():
    """RabbitMQ 3.9-4.2 take any incoming frame; riverlog takes Publish frames above
    frame_max up to max_publish_frame_size, and refuses every other frame above frame_max."""
    publish = encode(f.Publish(1, tuple((i, simple_entry(b"x" * 90)) for i in range(200))))
    assert 8192 < len(publish) - 4 < 30_000
    decoder = FrameDecoder(max_frame_size=8192, max_publish_frame_size=30_000)
    (frame,) = decoder.feed(publish[:3]) + decoder.feed(publish[3:])
    assert len(frame.entries) == 200
    with pytest.raises(FrameError, match="Publish frame of 30001 bytes"):
        FrameDecoder(max_frame_size=8192, max_publish_frame_size=30_000).feed(
            struct.pack(">IHH", 30_001, 0x0002, 1))
    with pytest.raises(FrameError, match="frame of 8193 bytes is larger than the limit of 8192"):
        FrameDecoder(max_frame_size=8192, max_publish_frame_size=30_000).feed(
            struct.pack(">IHH", 8193, 0x0005, 1))
    # by default a Publish frame has no more room than any other
    with pytest.raises(FrameError):
        FrameDecoder(max_frame_size=8192).feed(publish)


@pytest.mark.parametrize(
    "wire",
    [
        bytes.fromhex("00000004 0020 0001"),  # key 0x20 does not exist
        bytes.fromhex("00000004 0017 0002"),  # Heartbeat v2 does not exist
        bytes.fromhex("00000004 8002 0001"),  # no Publish response
        bytes.fromhex("00000002 0017"),  # no version
        bytes.fromhex("00000000"),  # no key
    ],
)
def test_unknown_frames_raise_0x0d(wire):
    with pytest.raises(FrameError) as err:
        FrameDecoder().feed(wire)
    assert err.value.code == ResponseCode.UNKNOWN_FRAME == 0x0D


def _framed(hex_after_size: str) -> bytes:
    body = bytes.fromhex(hex_after_size)
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize(
    "after_size",
    [
        "0016 0001 00000001",  # Close cut after the correlation id
        "0017 0001 00",  # Heartbeat with a trailing byte
        "000e 0001 00000001 0003 fffe",  # string runs past the end
        "000e 0001 00000001 0002 fffe",  # invalid UTF-8
        "000e 0001 00000001 fffe fffe",  # string length -2
        "0002 0001 01 00000001 0000000000000001",  # entry header missing
        "0002 0001 01 00000001 0000000000000001 00000005 61",  # entry shorter than its length
        "0002 0001 01 00000002 0000000000000001 00000001 61",  # count larger than entries
        "0002 0001 01 00000001 0000000000000001 90",  # sub-batch header cut
        "0002 0002 01 00000001 0000000000000001 ffff 80000000",  # sub-batch in Publish v2
        "0003 0001 01 00000001",  # confirm count without ids
        "001a 0001 00000001 01 02",  # active is neither 0 nor 1
        "0007 0001 00000001 01 0000 0009 0001",  # offset type 9
        "0007 0001 00000001 01 0000 0004 0001",  # offset type 4 without its offset
        "000f 0001 00000001 ffffffff",  # negative array count
        "0011 0001 00000001 00000001 0001 61",  # map entry without its value
    ],
)
def test_truncated_or_garbled_bodies_raise_0x0d(after_size):
    with pytest.raises(FrameError) as err:
        FrameDecoder().feed(_framed(after_size))
    assert err.value.code == ResponseCode.UNKNOWN_FRAME


# -- fuzzing ----------------------------------------------------------------------------------


def _feed_all(decoder: FrameDecoder, chunks) -> None:
    for piece in chunks:
        try:
            out = decoder.feed(piece)
        except FrameError as exc:
            assert exc.code in (ResponseCode.UNKNOWN_FRAME, ResponseCode.FRAME_TOO_LARGE)
            assert all(isinstance(x, f.Frame) for x in exc.frames)
            return
        assert all(isinstance(x, f.Frame) for x in out)


limits = st.sampled_from([0, 16, 64, 8192])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8), limits)
def test_fuzz_arbitrary_bytes(pieces, limit):
    _feed_all(FrameDecoder(max_frame_size=limit), pieces)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(CURRENT.readers)), st.binary(max_size=48), limits)
def test_fuzz_known_header_random_body(key_version, body, limit):
    wire = struct.pack(">IHH", 4 + len(body), *key_version) + body
    _feed_all(FrameDecoder(max_frame_size=limit), [wire])


@settings(max_examples=400, deadline=None)
@given(any_frame, st.data())
def test_fuzz_mutated_valid_frames(frame, data):
    wire = bytearray(encode(frame))
    how = data.draw(st.sampled_from(["flip", "truncate", "insert", "size"]))
    if how == "flip" and len(wire) > 8:
        i = data.draw(st.integers(8, len(wire) - 1))
        wire[i] = data.draw(st.integers(0, 255))
    elif how == "truncate":
        cut = data.draw(st.integers(8, len(wire)))
        wire = wire[:cut]
        wire[0:4] = struct.pack(">I", len(wire) - 4)
    elif how == "insert":
        i = data.draw(st.integers(8, len(wire)))
        wire[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        wire[0:4] = struct.pack(">I", len(wire) - 4)
    else:
        wire[0:4] = struct.pack(">I", data.draw(st.integers(0, len(wire) + 8)))
    _feed_all(FrameDecoder(max_frame_size=0), [bytes(wire), encode(f.Heartbeat())])


# -- offset specifications refuse what they cannot carry (draft.py shares their code) -------------


@pytest.mark.parametrize("after_size", [
    "0007 0001 00000001 01 0001 73 0000 0001",  # Subscribe with offset type 0 (none)
    "001f 0001 00000001 0001 73 0006",  # ResolveOffsetSpec with offset type 6
])
def test_offset_specs_refuse_type_none_and_unknown_types(after_size):
    with pytest.raises(FrameError) as err:
        FrameDecoder().feed(_framed(after_size))
    assert err.value.code == ResponseCode.UNKNOWN_FRAME
