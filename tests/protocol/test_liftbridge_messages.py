# MessageEncoder (riverlog.protocol.liftbridge.messages) against the way Subscribe built its
# Messages before it: decode_record, then a pb.Message per record. Over generated records
# (keys, empty values, headers with subject/reply, invalid UTF-8, record-level subjects, values
# and keys past the 1- and 2-byte varint lengths, extreme timestamps and offsets, partitions,
# non-ASCII stream names), over batches that share what a read shares (the encoder's caches),
# over damaged and foreign records (the general way must take those), the parsed Messages must
# be equal; and riverlog's own records must take the encoder's own path.
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverlog.log.chunk import (CHUNK_TRACKING_DELTA, ChunkFormatError, encode_chunk,
                                encode_entries, parse_header)
from riverlog.log.segment import ChunkSlice
from riverlog.protocol.amqp10 import encode_str
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.messages import MessageEncoder, message_of_record
from riverlog.record import Record, decode_record, encode_record, encode_records
from riverlog.server.grpc_subscribe import WAIT_FOR_NEW, _serialize

pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference(raw: bytes, offset: int, default_ns: int, stream: str, partition: int) -> bytes:
    """What grpc_subscribe._serialize did for one record before MessageEncoder (decode_record,
    then a pb.Message), which is what the encoder falls back to for foreign records."""
    return message_of_record(raw, offset, default_ns, stream, partition)[0]


text = st.one_of(st.sampled_from(["", "orders.eu", "_INBOX.x", "ørders.日本", "😀"]),
                 st.text(alphabet=st.characters(codec="utf-8"), max_size=40))
# past the 1-byte (127) and 2-byte (16383) varint lengths, and the 255 of str8/vbin8
blob = st.one_of(st.just(b""), st.binary(max_size=40), st.binary(min_size=120, max_size=300),
                 st.just(b"v" * 16384), st.just(b"\xff" * 20000))
bad_utf8 = st.sampled_from([b"\xff\xfe", b"ok\xc3", b"\xed\xa0\x80", b"caf\xc3\xa9", b""])
header_value = st.one_of(blob, bad_utf8)
header_name = st.one_of(st.sampled_from(["subject", "reply", "trace", "ключ"]), text)
timestamps = st.one_of(st.sampled_from([0, 1, -1, 127, 128, -(2**63), 2**63 - 1,
                                        1_700_000_000_123_456_789]),
                       st.integers(min_value=-(2**63), max_value=2**63 - 1))
records = st.builds(
    Record,
    value=blob,
    key=st.one_of(st.none(), st.just(b""), blob, bad_utf8),
    headers=st.dictionaries(header_name, header_value, max_size=5),
    timestamp_ns=timestamps,
    subject=st.one_of(st.none(), text),
    reply=st.one_of(st.none(), text),
    correlation_id=st.one_of(st.none(), text),
    ack_inbox=st.one_of(st.none(), text),
)
offsets = st.one_of(st.sampled_from([0, 1, 127, 128, 16383, 16384, 2**21, 2**40, 2**63 - 1]),
                    st.integers(min_value=0, max_value=2**63 - 1))
streams = st.sampled_from(["orders", "", "strøm-日本", "s" * 200])
partitions = st.sampled_from([0, 1, 127, 128, 70000])


def check(raws: list[bytes], first: int, stream: str, partition: int,
          default_ns: int = 5_000_000) -> MessageEncoder:
    """Encode ``raws`` (offsets from ``first``) with one encoder; every Message must parse
    equal to the reference one. Returns the encoder."""
    encoder = MessageEncoder(stream, partition)
    out: list[bytes] = []
    pairs = [(first + i, raw) for i, raw in enumerate(raws)]
    assert encoder.extend(out, pairs, 0, WAIT_FOR_NEW, default_ns) is False
    assert len(out) == len(raws)
    for (offset, raw), message in zip(pairs, out):
        want = pb.Message.FromString(reference(raw, offset, default_ns, stream, partition))
        assert pb.Message.FromString(message) == want, (offset, raw)
    assert encoder.value_bytes == sum(len(decode_record(r).value) for r in raws)
    return encoder


@FAST
@given(st.lists(records, min_size=1, max_size=6), offsets, streams, partitions)
def test_records_encode_as_the_reference_does(batch, first, stream, partition) -> None:
    first = min(first, 2**63 - 1 - len(batch))
    encoder = check([encode_record(r) for r in batch], first, stream, partition)
    assert encoder.foreign == 0  # riverlog's own records: the encoder's own path


# what one read brings: records sharing timestamp, headers and subjects (the encoder's
# caches), each with its own value, correlation id, ack inbox and key (keys of one length, as
# a producer's usually are: the same message-annotations around them), unrelated records between
same_length_keys = st.one_of(st.none(), st.just("shared"), st.binary(min_size=3, max_size=3),
                             st.sampled_from([b"abc", "é!".encode(), b"\xff\xfe\xfd", b""]))
shared = st.builds(
    lambda base, parts, others: [
        Record(value=v, key=base.key if k == "shared" else k, headers=dict(base.headers),
               timestamp_ns=base.timestamp_ns, subject=base.subject, reply=base.reply,
               correlation_id=c, ack_inbox=base.ack_inbox if a == "shared" else a)
        for v, c, a, k in parts] + others + [base],
    records, st.lists(st.tuples(blob, st.one_of(st.none(), text),
                                st.one_of(st.just("shared"), st.none(), text),
                                same_length_keys), max_size=10),
    st.lists(records, max_size=2))


@FAST
@given(st.lists(shared, min_size=1, max_size=3), offsets, streams, partitions)
def test_batches_sharing_fields_encode_as_the_reference_does(reads, first, stream,
                                                             partition) -> None:
    raws = [raw for read in reads for raw in encode_records(read)]
    encoder = check(raws, min(first, 2**63 - 1 - len(raws)), stream, partition)
    assert encoder.foreign == 0


@FAST
@given(records, st.data())
def test_damaged_records_encode_as_the_reference_does(record, data) -> None:
    # a byte changed, cut or added anywhere: the encoder's checks must refuse exactly what
    # decode_record's fast path refuses (or read it the same), never read it otherwise
    check([encode_record(record), damage(encode_record(record), data), encode_record(record)],
          10, "s", 1)


def damage(good: bytes, data) -> bytes:
    """``good`` with 1-3 bytes set, cut or inserted, or cut short (hypothesis ``data``)."""
    raw = bytearray(good)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        pos = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
        how = data.draw(st.sampled_from(["set", "cut", "insert", "truncate"]))
        byte = data.draw(st.sampled_from([0x00, 0x40, 0x53, 0x80, 0x81, 0xA0, 0xA1, 0xB0, 0xB1,
                                          0xC0, 0xC1, 0xD0, 0xD1, 0xFF, 0x02, 0x06]))
        if how == "set":
            raw[pos] = byte
        elif how == "cut":
            del raw[pos]
        elif how == "insert":
            raw.insert(pos, byte)
        else:
            del raw[pos:]
        if not raw:
            raw.append(byte)
    return bytes(raw)


def test_edge_records() -> None:
    cases = [
        Record(),
        Record(value=b"x" * 20000, key=b"k" * 300, timestamp_ns=-(2**63)),
        Record(value=b"v", headers={"subject": b"\xff\xfehdr", "reply": b"r\xc3"},
               subject="own", reply="own-reply", timestamp_ns=2**63 - 1),
        Record(value=b"v", headers={"subject": b"", "reply": b""}, subject="own", reply="r"),
        Record(value=b"v", headers={"a": b"", "b": b"", "subject": b"x"}, subject="s"),
        Record(value=b"v", subject="ünï", reply="日本", correlation_id="c", ack_inbox="in"),
        Record(value=b"", key=b"", headers={"h": b"\x00\x01"}, timestamp_ns=-1),
    ]
    # one read's keys, all of one length: binary, ASCII and non-ASCII strings
    cases += [Record(value=b"k", key=k, timestamp_ns=i % 2, correlation_id=str(i))
              for i, k in enumerate([b"abc", b"abd", "é!".encode(), b"\xff\xfe\xfd", b"abc"])]
    for stream, partition in (("orders", 0), ("strøm-日本", 300), ("", 1)):
        for first in (0, 127, 16383, 2**62):
            encoder = check([encode_record(r) for r in cases], first, stream, partition)
            assert encoder.foreign == 0


def test_foreign_records_are_read_the_general_way() -> None:
    # raw bytes, an AMQP message of another layout (a RabbitMQ client's: only a data section
    # and application properties, a subject in properties), a ulong timestamp over 2**63-1
    props = b"\x40\x40\x40" + encode_str("subj")
    foreign_amqp = (b"\x00\x53\x73\xc0" + bytes((len(props) + 1, 4)) + props
                    + b"\x00\x53\x75\xa0\x03abc")
    too_late = bytearray(encode_record(Record(value=b"x", timestamp_ns=5)))
    assert too_late[26] == 0x80  # the timestamp's ulong constructor
    too_late[27] = 0xFF  # its top byte: not a signed 64-bit timestamp any more
    miscounted = bytearray(encode_record(Record(value=b"x", timestamp_ns=5)))
    assert miscounted[5] == 2  # the message-annotations' count: the timestamp alone
    miscounted[5] = 4
    keyed = encode_record(Record(value=b"x", key=b"abc", timestamp_ns=5, subject="s"))
    long_key = bytearray(keyed)
    assert long_key[47] == 3  # the key's length: now past the end of the annotations
    long_key[47] = 5
    raws = [b"", b"plain bytes", b"\x00\x53\x75\xa0\x02hi", foreign_amqp, bytes(too_late),
            bytes(miscounted), keyed, bytes(long_key)]
    encoder = check(raws, 3, "orders", 2, default_ns=77_000_000)
    assert encoder.foreign == len(raws) - 1
    assert pb.Message.FromString(reference(foreign_amqp, 0, 0, "s", 0)).subject == "subj"


def chunk(records: list[Record], first: int, chunk_type: int = 0) -> ChunkSlice:
    raw = encode_chunk(encode_entries(encode_records(records)), len(records), len(records),
                       first_offset=first, timestamp_ms=1_000, chunk_type=chunk_type)
    return ChunkSlice(parse_header(raw), raw)


def test_serialize_start_stop_and_other_chunks() -> None:
    values = [b"v%d" % i for i in range(10)]
    chunks = [chunk([Record(value=v, timestamp_ns=i) for i, v in enumerate(values[:5])], 0),
              chunk([Record(value=b"tracking")], 5, CHUNK_TRACKING_DELTA),
              chunk([Record(value=v) for v in values[5:]], 6)]

    def values_of(batch):
        return [pb.Message.FromString(m).value for m in batch]

    batch, nbytes, nxt, problem = _serialize(chunks, 2, WAIT_FOR_NEW,
                                             MessageEncoder("s", 0), None)
    assert values_of(batch) == values[2:] and nbytes == sum(map(len, values[2:]))
    assert nxt == 11 and problem is None
    batch, nbytes, nxt, problem = _serialize(chunks, 3, 7, MessageEncoder("s", 0), None)
    assert values_of(batch) == values[3:7] and nbytes == 8 and nxt == 8 and problem is None
    assert [pb.Message.FromString(m).offset for m in batch] == [3, 4, 6, 7]


def test_serialize_reports_entries_that_cannot_be_walked() -> None:
    good = chunk([Record(value=b"a"), Record(value=b"bb")], 0)
    raw = bytearray(good.raw)
    raw[48 + 4 + len(encode_record(Record(value=b"a"))) + 3] = 0xFF  # 2nd entry runs over
    bad = ChunkSlice(parse_header(bytes(raw)), bytes(raw))
    batch, nbytes, nxt, problem = _serialize([bad], 0, WAIT_FOR_NEW, MessageEncoder("s", 0),
                                             None)
    assert [pb.Message.FromString(m).value for m in batch] == [b"a"] and nbytes == 1
    assert nxt == 0 and problem[0] == 0 and isinstance(problem[1], ChunkFormatError)


def test_records_with_large_headers_are_not_kept_by_the_encoder() -> None:
    """A publisher's records whose headers all differ and are large are encoded right, and
    the encoder keeps none of their bytes: before, each distinct header section (up to a
    record's size) stayed as a cache key, 1,024 of them per Subscribe."""
    records = [encode_record(Record(value=b"v", key=b"k%d" % (i % 3), headers={
        "big": b"%d" % i + b"x" * 20_000, "subject": b"s"})) for i in range(300)]
    encoder = MessageEncoder("stream", 0)
    out: list[bytes] = []
    encoder.extend(out, enumerate(records), 0, -1, 0)
    assert [pb.Message.FromString(m) for m in out] == [
        pb.Message.FromString(reference(raw, i, 0, "stream", 0)) for i, raw in enumerate(records)]
    assert encoder.foreign == 0  # read the fast way, only not kept
    kept = sum(len(b"".join(k)) if isinstance(k, tuple) else len(k)
               for cache in (encoder._heads, encoder._suffixes) for k in cache)
    assert kept < 100_000, kept
