# riverlog.spark.arrow: chunk bytes -> Arrow batches. The vectorized path must give exactly
# what riverlog.record.decode_record gives, record by record, for every layout it accepts,
# and must hand everything else to the per-record path; projections and offset trimming.
from __future__ import annotations

import random

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from riverlog.client import Chunk  # noqa: E402
from riverlog.log.chunk import encode_chunk, encode_entries  # noqa: E402
from riverlog.record import Record, decode_record, encode_record  # noqa: E402
from riverlog.spark import arrow  # noqa: E402

SCHEMA = arrow.arrow_schema()


def make_record(rnd: random.Random, i: int, variety: int) -> bytes:
    """variety 0: value + timestamp; 1: + keys (None, empty, short); 2: + headers (with a
    value, and "reply" empty as NATS and gRPC write it); 3: + NATS properties; from 4 on,
    layouts the vectorized path leaves to decode_record: 4: + keys over 255 bytes (a map32
    of annotations) and other empty headers; 5: + ack inbox; 6: + raw non-AMQP bytes."""
    # keys and header values: ASCII and other UTF-8 (stored as strings) and not UTF-8 (binary)
    keys = [None, b"", b"k%d" % i, "ключ".encode(), b"\xff\xfe"] + (
        [b"K" * 300] if variety >= 4 else [])
    key = rnd.choice(keys) if variety >= 1 else None
    headers = {}
    if variety >= 2 and rnd.random() < 0.5:
        values = [b"x" * rnd.randint(1, 300), "värde".encode(), b"\x80\x81"] + (
            [b""] if variety >= 4 else [])
        headers = {f"h{j}": rnd.choice(values) for j in range(rnd.randint(0, 4))}
    if variety >= 2 and rnd.random() < 0.5:
        headers["reply"] = b""
    props = {}
    if variety >= 3 and rnd.random() < 0.3:
        props = {"subject": "sub", "reply": rnd.choice([None, "r"]),
                 "correlation_id": rnd.choice([None, "c"])}
    value = bytes(rnd.getrandbits(8) for _ in range(rnd.choice([0, 5, 100, 300])))
    r = Record(value=value, key=key, headers=headers,
               timestamp_ns=rnd.randint(-10**18, 10**18), **props)
    if variety >= 5 and rnd.random() < 0.1:
        r.ack_inbox = "inbox"
    if variety >= 6 and rnd.random() < 0.1:
        return b"raw bytes"
    return encode_record(r)


def make_chunks(variety: int, n_chunks: int, per: int, first: int = 100, seed: int = 1):
    rnd = random.Random(seed)
    out, offset = [], first
    for c in range(n_chunks):
        recs = [make_record(rnd, offset + i, variety) for i in range(per)]
        out.append((recs, Chunk(encode_chunk(encode_entries(recs), per, per,
                                             first_offset=offset, timestamp_ms=1000 + c))))
        offset += per
    return out


def expected(chunks, start, end):
    rows = []
    for recs, chunk in chunks:
        for i, data in enumerate(recs):
            offset = chunk.first_offset + i
            if start <= offset < end:
                r = decode_record(data, chunk.header.timestamp_ms * 1_000_000)
                rows.append((r.key, r.value, "s", 3, offset, r.timestamp_ns // 1000,
                             list(r.headers.items()) or None))
    return rows


def rows(batch):
    d = batch.to_pydict()
    ts = batch.column("timestamp").cast(pa.int64()).to_pylist()
    return [(d["key"][i], d["value"][i], d["stream"][i], d["partition"][i], d["offset"][i],
             ts[i], d["headers"][i])
            for i in range(batch.num_rows)]


@pytest.mark.parametrize("variety", range(7))
@pytest.mark.parametrize("n_chunks, per", [(1, 60), (3, 17), (40, 5), (20, 1)])
def test_same_as_decode_record(variety, n_chunks, per, monkeypatch):
    chunks = make_chunks(variety, n_chunks, per, seed=variety * 100 + per)
    if variety <= 3:  # riverlog's own layouts: the per-record path must not be needed
        monkeypatch.setattr(arrow, "_slow_batch", None)
    total = n_chunks * per
    for start, end in [(0, 10**9), (103, 100 + total - 2), (100 + per, 100 + per + 1)]:
        batch = arrow.chunks_to_batch([c for _, c in chunks], "s", 3, start, end, SCHEMA)
        assert batch.schema.equals(SCHEMA)
        assert rows(batch) == expected(chunks, start, end)


def test_timestamps_written_as_long_take_the_vectorized_path(monkeypatch):
    # before the timestamp became a ulong riverlog wrote a long (0x81) for every record: such
    # records stay on disk and must be read as fast, and the same
    recs = [bytearray(encode_record(Record(value=b"v%d" % i, key=b"k", headers={"h": b"\xff"},
                                           timestamp_ns=10**18 + i))) for i in range(30)]
    for r in recs:
        assert r[26] == 0x80
        r[26] = 0x81
    recs = [bytes(r) for r in recs]
    chunk = Chunk(encode_chunk(encode_entries(recs), 30, 30, first_offset=0, timestamp_ms=1))
    monkeypatch.setattr(arrow, "_slow_batch", None)
    batch = arrow.chunks_to_batch([chunk], "s", 3, 0, 30, SCHEMA)
    assert rows(batch) == expected([(recs, chunk)], 0, 30)


@pytest.mark.parametrize("field", ["key", "header"])
def test_strings_that_are_not_utf8_read_as_decode_record_reads_them(field):
    # riverlog writes binary for bytes that are not UTF-8; another writer's str8 holding such
    # bytes reads as decode_record gives it (invalid sequences replaced)
    record = Record(value=b"v", key=b"\x80\x81" if field == "key" else None,
                    headers={"h": b"\x80\x81"} if field == "header" else {}, timestamp_ns=1)
    data = encode_record(record).replace(b"\xa0\x02\x80\x81", b"\xa1\x02\x80\x81")
    assert decode_record(data) != record  # now a string: read with replacement characters
    chunk = Chunk(encode_chunk(encode_entries([data]), 1, 1, first_offset=0, timestamp_ms=1))
    batch = arrow.chunks_to_batch([chunk], "s", 3, 0, 1, SCHEMA)
    assert rows(batch) == expected([([data], chunk)], 0, 1)


def _one_chunk(recs):
    return Chunk(encode_chunk(encode_entries(recs), len(recs), len(recs), first_offset=0,
                              timestamp_ms=1))


def test_empty_reply_header_takes_the_vectorized_path(monkeypatch):
    # what every plain NATS publish and every gRPC PublishAsync stores; a key over it too
    recs = [encode_record(Record(value=b"v%d" % i, key=None if i % 3 else b"k%d" % i,
                                 headers={"subject": b"s", "reply": b""} if i % 2 else
                                 {"reply": b""}, timestamp_ns=i, subject="s"))
            for i in range(30)]
    chunk = _one_chunk(recs)
    monkeypatch.setattr(arrow, "_slow_batch", None)
    got = rows(arrow.chunks_to_batch([chunk], "s", 3, 0, 30, SCHEMA))
    assert got == expected([(recs, chunk)], 0, 30)
    assert got[1][6] == [("reply", b""), ("subject", b"s")] and got[0][6] == [("reply", b"")]


@pytest.mark.parametrize("headers", [
    {"reply": b"", "other": b""},  # another empty header: a JSON array the fast path leaves
    {"other": b""},
])
def test_other_empty_headers_take_the_per_record_path(headers):
    recs = [encode_record(Record(value=b"v", headers=headers, timestamp_ns=1))] * 3
    chunk = _one_chunk(recs)
    batch = arrow.chunks_to_batch([chunk], "s", 3, 0, 3, SCHEMA)
    assert rows(batch) == expected([(recs, chunk)], 0, 3)
    assert batch.column("headers").to_pylist()[0] == list(headers.items())


def test_reply_annotated_and_an_application_property_reads_as_decode_record():
    # not what riverlog writes: "reply" both empty (annotation) and with a value; the value wins
    data = encode_record(Record(value=b"v", headers={"reply": b"", "rep1y": b"x"},
                                timestamp_ns=1)).replace(b"rep1y", b"reply")
    assert decode_record(data).headers == {"reply": b"x"}
    recs = [encode_record(Record(value=b"w", headers={"reply": b""}, timestamp_ns=2)), data]
    chunk = _one_chunk(recs)
    assert rows(arrow.chunks_to_batch([chunk], "s", 3, 0, 2, SCHEMA)) == expected(
        [(recs, chunk)], 0, 2)


def test_value_that_looks_like_a_record_start():
    # a value holding the 00 53 72 c1 opening: the scan must not be fooled
    fake = encode_record(Record(value=b"x", timestamp_ns=5))
    recs = [encode_record(Record(value=b"a" + fake + b"b", timestamp_ns=i)) for i in range(20)]
    chunk = Chunk(encode_chunk(encode_entries(recs), 20, 20, first_offset=0, timestamp_ms=1))
    batch = arrow.chunks_to_batch([chunk], "s", 0, 0, 20, SCHEMA)
    assert batch.column("value").to_pylist() == [b"a" + fake + b"b"] * 20
    assert batch.column("offset").to_pylist() == list(range(20))


def test_sub_batch_entries_take_the_slow_path():
    recs = [encode_record(Record(value=b"v%d" % i, timestamp_ns=i)) for i in range(3)]
    body = b"".join(len(r).to_bytes(4, "big") + r for r in recs)
    sub = bytes((0x80,)) + (3).to_bytes(2, "big") + len(body).to_bytes(4, "big") \
        + len(body).to_bytes(4, "big") + body
    simple = encode_entries([encode_record(Record(value=b"last", timestamp_ns=9))])
    chunk = Chunk(encode_chunk(sub + simple, 2, 4, first_offset=10, timestamp_ms=1))
    batch = arrow.chunks_to_batch([chunk], "s", 0, 11, 14, SCHEMA)
    assert batch.column("value").to_pylist() == [b"v1", b"v2", b"last"]
    assert batch.column("offset").to_pylist() == [11, 12, 13]


def test_projection_builds_only_named_columns(monkeypatch):
    chunks = [c for _, c in make_chunks(2, 4, 10)]
    schema = arrow.arrow_schema(("offset", "value"))
    batch = arrow.chunks_to_batch(chunks, "s", 0, 105, 125, schema)
    assert batch.schema.names == ["offset", "value"]
    assert batch.column("offset").to_pylist() == list(range(105, 125))
    full = arrow.chunks_to_batch(chunks, "s", 0, 105, 125, SCHEMA)
    assert batch.column("value").to_pylist() == full.column("value").to_pylist()
    monkeypatch.setattr(arrow, "_Views", None)  # offsets only: no record is parsed
    only = arrow.chunks_to_batch(chunks, "s", 7, 101, 139, arrow.arrow_schema(("partition", "offset")))
    assert only.column("offset").to_pylist() == list(range(101, 139))
    assert set(only.column("partition").to_pylist()) == {7}


def test_empty():
    assert arrow.chunks_to_batch([], "s", 0, 0, 10, SCHEMA).num_rows == 0
