# Chunk bytes -> Arrow record batches in the riverlog Spark schema (riverlog.spark.schema),
# in bulk. Owns the read path's hot loop: it runs on Spark executors, inside read().
# Rules: no per-record Python work for records in riverlog's own layout (what
# riverlog.record.encode_record writes). Entry starts are found with one vectorized scan (every
# record opens with the bytes 00 53 72 c1: a message-annotations map8) and then proven: the
# length prefixes must chain exactly from each data section's start to its end, with as many
# entries as the chunk header says; if not, a struct loop walks the entries. numpy gathers
# over unaligned word views then check the layout and locate timestamp, key, headers and value
# of all records at once, and Arrow builds the columns by slicing the received buffer
# (offsets with gaps, then ``take``). The empty headers named in the x-opt-empty-headers
# annotation are taken vectorized when it is exactly ["reply"] (every NATS publish without a
# reply subject, every gRPC PublishAsync; a unary Publish also has an ack inbox). Anything
# else (sub-batch entries, foreign AMQP layouts from other RabbitMQ clients, raw bytes, an
# ack inbox annotation, other empty headers) goes through riverlog.record.decode_record one
# record at a time, for that batch only, so the result is always exactly what
# decode_record gives (tests hold the two paths to that). numpy and
# pyarrow are imported here: import this module only where they are installed (executors).
from __future__ import annotations

import logging
import struct
from typing import Sequence

import numpy as np
import pyarrow as pa

from ..log.chunk import HEADER_SIZE, ChunkHeader, iter_records, log_unreadable
from ..record import _MA_EMPTY_REPLY as _EMPTY_REPLY  # the layout encode_record writes
from ..record import _MA_KEY
from ..record import _MA_TIMESTAMP as _MA_TS
from ..record import decode_record

log = logging.getLogger("riverlog.spark")

__all__ = ["arrow_schema", "chunks_to_batch"]

_U32 = struct.Struct(">I")
_MA_OPEN = b"\x00\x53\x72\xc1"  # message-annotations section holding a map8
# _MA_TS: 21 bytes, the name, then the constructor (ulong 0x80, or long 0x81), then 8 bytes;
# _MA_KEY: 11 bytes, then str8/32 or vbin8/32
_HEAD = _MA_OPEN + b"\0\0" + _MA_TS  # bytes 4 and 5 (map size and count) vary, and byte 26
_TS_AT = len(_HEAD)  # 27: the i64 timestamp
_KEY_AT = _TS_AT + 8  # 35: the key annotation, when there is one
_MIN_OWN = _KEY_AT + 5  # smallest record in our layout: annotations + empty data section
# the last annotation of a record whose only empty header is "reply" (32 bytes): the name
# "reply" is its bytes -7..-2 (_EMPTY_REPLY)
_REPLY_FROM_END = 7
_REPLY_BE = int.from_bytes(b"reply", "big")
_SEC_PROPERTIES, _SEC_APP_PROPERTIES, _SEC_DATA = 0x73, 0x74, 0x75
_MA_OPEN_BE = int.from_bytes(_MA_OPEN, "big")


def _word(data: bytes, at: int) -> int:
    return int.from_bytes(data[at:at + 8], "little")


# The 27-byte head checked as four little-endian u64 words at +0 (size/count masked), +8,
# +16 and +19 (the timestamp's constructor, byte 26, masked and checked apart); the key
# annotation as a word at +0 and the big-endian word at +8 that also holds the key's
# constructor and length.
_HEAD_MASK0 = 0xFFFF_0000_FFFF_FFFF
_HEAD_MASK19 = 0x00FF_FFFF_FFFF_FFFF
_HEAD_WORDS = ((0, _word(_HEAD, 0) & _HEAD_MASK0), (8, _word(_HEAD, 8)), (16, _word(_HEAD, 16)),
               (19, _word(_HEAD, 19) & _HEAD_MASK19))
_KEY_WORDS = ((0, _word(_MA_KEY, 0)),)
_EMPTY_REPLY_WORDS = tuple((at, _word(_EMPTY_REPLY, at)) for at in range(0, 32, 8))
_KEY_TAIL = int.from_bytes(_MA_KEY[8:], "big")  # "key": bytes 8-10, then the constructor


def arrow_schema(columns: Sequence[str] | None = None) -> pa.Schema:
    """The Arrow schema Spark expects for riverlog.spark.schema, or for the subset
    ``columns`` of it (pyspark's own conversion: int32 partition, timestamp[us, UTC],
    map<string, binary>)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from .schema import projected_schema, spark_schema
    spark = spark_schema() if columns is None else projected_schema(tuple(columns))
    return to_arrow_schema(spark, timezone="UTC")


class _Views:
    """The batch buffer as bytes (``u8``) and as unaligned big-endian u32/i64/u64 and
    little-endian u64 at every byte position (``be4``, ``be8``, ``be8u``, ``le8``). The
    buffer ends with _PAD zero bytes so 8-byte reads near the end stay inside it."""

    __slots__ = ("raw", "u8", "be4", "be8", "be8u", "le8")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.u8 = np.frombuffer(raw, dtype=np.uint8)
        n = max(len(raw) - 7, 0)
        self.be4 = np.ndarray((max(len(raw) - 3, 0),), dtype=">u4", buffer=raw, strides=(1,))
        self.be8 = np.ndarray((n,), dtype=">i8", buffer=raw, strides=(1,))
        self.be8u = np.ndarray((n,), dtype=">u8", buffer=raw, strides=(1,))
        self.le8 = np.ndarray((n,), dtype="<u8", buffer=raw, strides=(1,))


_PAD = b"\0" * 8


class _Located:
    """Where each record of a batch is (numpy int64 arrays): ``starts``/``lens`` in the
    buffer, ``offsets`` in the partition."""

    __slots__ = ("starts", "lens", "offsets")

    def __init__(self, starts, lens, offsets) -> None:
        self.starts, self.lens, self.offsets = starts, lens, offsets


def _locate(v: _Views, bases: Sequence[int], headers: Sequence[ChunkHeader]) -> _Located | None:
    """Record starts and lengths for chunks of simple entries; None when a chunk holds a
    sub-batch or the entries do not chain (the caller takes the per-record path)."""
    c = len(headers)
    if any(h.num_records != h.num_entries for h in headers):
        return None
    counts = np.fromiter((h.num_entries for h in headers), dtype=np.int64, count=c)
    data_start = np.fromiter(bases, dtype=np.int64, count=c) + HEADER_SIZE
    data_end = data_start + np.fromiter((h.data_length for h in headers), dtype=np.int64,
                                        count=c)
    firsts = np.fromiter((h.first_offset for h in headers), dtype=np.int64, count=c)
    first_rec = np.zeros(c, dtype=np.int64)
    np.cumsum(counts[:-1], out=first_rec[1:])
    total = int(counts.sum())
    starts = _scan(v, data_start, data_end, counts, first_rec)
    if starts is None:
        starts = _walk(v.raw, data_start, data_end, counts, first_rec, total)
        if starts is None:
            return None
    lens = np.empty(total, dtype=np.int64)
    lens[:-1] = starts[1:] - 4
    lens[first_rec + counts - 1] = data_end  # a chunk's last record ends at its data end
    lens -= starts
    chunk_of = np.repeat(np.arange(c), counts)
    offsets = firsts[chunk_of] + (np.arange(total, dtype=np.int64) - first_rec[chunk_of])
    return _Located(starts, lens, offsets)


def _scan(v: _Views, data_start, data_end, counts, first_rec) -> np.ndarray | None:
    """Record starts found by their opening bytes, or None unless they provably are all the
    entries: per chunk the right count, the first right after the data section's first
    length prefix, and every length prefix leading exactly to the next start (the last to
    the data end). A false hit inside a value or a record in another layout breaks the
    chain, so the result is never wrong, only sometimes None."""
    u8 = v.u8
    hits = np.flatnonzero(u8 == 0xC1)
    hits = hits[hits >= 3] - 3
    hits = hits[v.be4[hits] == _MA_OPEN_BE]
    lo = np.searchsorted(hits, data_start + 4)
    hi = np.searchsorted(hits, data_end)
    if not np.array_equal(hi - lo, counts):
        return None
    # hits outside every data section (in a chunk header) are dropped
    starts = hits if int(counts.sum()) == len(hits) else np.concatenate(
        [hits[a:b] for a, b in zip(lo.tolist(), hi.tolist())])
    if not np.array_equal(starts[first_rec], data_start + 4):
        return None
    ends = starts + v.be4[starts - 4]
    want = np.empty_like(starts)
    want[:-1] = starts[1:] - 4
    want[first_rec + counts - 1] = data_end
    return starts if np.array_equal(ends, want) else None


def _walk(raw: bytes, data_start, data_end, counts, first_rec, total) -> np.ndarray | None:
    """Entry starts by following the length prefixes (a struct loop: the fallback)."""
    unpack = _U32.unpack_from
    starts = np.empty(total, dtype=np.int64)
    for c in range(len(counts)):
        pos = int(data_start[c])
        k = int(counts[c])
        row = [0] * k  # filling a list and copying it once beats numpy item assignment
        try:
            for i in range(k):
                n = unpack(raw, pos)[0]
                pos += 4
                row[i] = pos
                pos += n  # a sub-batch (top bit set) overshoots: caught below
        except struct.error:
            return None
        if pos != data_end[c]:
            return None
        starts[first_rec[c]:first_rec[c] + k] = row
    return starts


def _length(w: np.ndarray, small: np.ndarray) -> np.ndarray:
    """Lengths from ``w``, big-endian u64 words whose byte 3 is a vbin/str/list/map
    constructor: its u8 length (byte 4) when ``small``, else its u32 length (bytes 4-7)."""
    return np.where(small, (w >> 24) & 0xFF, w & 0xFFFF_FFFF).astype(np.int64)


class _Fields:
    """Where the parts of each record are (numpy arrays)."""

    __slots__ = ("ts_ns", "key_start", "key_len", "has_key", "value_start", "value_len",
                 "hdr_at", "has_hdr", "has_empty_reply", "reply_at")


def _section(v: _Views, pos: np.ndarray, end: np.ndarray):
    """(section code, constructor byte, word) of the section at each ``pos``, ``word`` being
    the 8 bytes there (big-endian u64: 00 53 code constructor length...); None unless every
    record has a section descriptor there with room for a constructor and a length byte."""
    if len(pos) and int((end - pos).min()) < 5:
        return None
    w = v.be8u[pos]
    if not np.all((w >> 48) == 0x0053):
        return None
    return (w >> 40) & 0xFF, (w >> 32) & 0xFF, w


def _fast_fields(v: _Views, loc: _Located) -> _Fields | None:
    """Locate timestamp, key, headers and value of every record, vectorized; None when a
    record is not in the layout encode_record writes."""
    s, n = loc.starts, loc.lens
    if len(s) == 0 or int(n.min()) < _MIN_OWN:
        return None
    le8 = v.le8
    w0 = le8[s]
    if not np.all((w0 & _HEAD_MASK0) == _HEAD_WORDS[0][1]):
        return None
    for at, word in _HEAD_WORDS[1:3]:
        if not np.all(le8[s + at] == word):
            return None
    w19 = le8[s + 19]
    if not np.all((w19 & _HEAD_MASK19) == _HEAD_WORDS[3][1]):
        return None
    end = s + n
    ma_end = s + 5 + ((w0 >> 32) & 0xFF).astype(np.int64)
    count = ((w0 >> 40) & 0xFF).astype(np.int64)
    f = _Fields()
    f.ts_ns = v.be8[s + _TS_AT].astype(np.int64)
    ts_code = w19 >> 56  # ulong (riverlog writes it unless negative) or long
    if not np.all((ts_code == 0x81) | ((ts_code == 0x80) & (f.ts_ns >= 0))):
        return None
    # the x-opt-empty-headers annotation ["reply"], last: the key (if any) ends before it
    empty = count >= 4
    if empty.any():
        tail = ma_end - len(_EMPTY_REPLY)
        for at, word in _EMPTY_REPLY_WORDS:
            empty &= le8[tail + at] == word
    key_end = ma_end - np.where(empty, len(_EMPTY_REPLY), 0)
    rest = count - 2 * empty
    has_key = rest == 4
    if not np.all(has_key | (rest == 2)):
        return None  # an ack inbox annotation, or something else
    if not np.array_equal(key_end[~has_key], s[~has_key] + _KEY_AT):
        return None
    f.has_empty_reply = empty
    f.reply_at = ma_end[empty] - _REPLY_FROM_END
    f.has_key = has_key
    f.key_start = np.zeros(len(s), dtype=np.int64)
    f.key_len = np.zeros(len(s), dtype=np.int64)
    if has_key.any():
        ks = s[has_key] + _KEY_AT
        if not np.all(le8[ks] == _KEY_WORDS[0][1]):
            return None
        w = v.be8u[ks + 8]  # "key", constructor, length
        code = (w >> 32) & 0xFF
        small = (code & 0x10) == 0
        if not np.all(((w >> 40) == _KEY_TAIL) & ((code & 0xEE) == 0xA0)):  # vbin or str
            return None
        klen = _length(w, small)
        kstart = ks + 11 + np.where(small, 2, 5)
        if not np.array_equal(kstart + klen, key_end[has_key]):
            return None
        text = (code & 1) == 1
        if text.any() and not _utf8(v, kstart[text], klen[text]):
            return None
        f.key_start[has_key] = kstart
        f.key_len[has_key] = klen
    pos = ma_end
    sec = _section(v, pos, end)
    if sec is None:
        return None
    props = sec[0] == _SEC_PROPERTIES  # subject/reply-to/correlation id: not in the schema
    if props.any():
        code = sec[1][props]
        small = code == 0xC0
        if not np.all(small | (code == 0xD0)):
            return None
        pos = pos.copy()
        pos[props] += 3 + np.where(small, 2, 5) + _length(sec[2][props], small)
        sec = _section(v, pos, end)
        if sec is None:
            return None
    f.has_hdr = sec[0] == _SEC_APP_PROPERTIES
    f.hdr_at = pos[f.has_hdr] + 3
    if f.has_hdr.any():
        code = sec[1][f.has_hdr]
        small = code == 0xC1
        if not np.all(small | (code == 0xD1)):
            return None
        pos = pos.copy()
        pos[f.has_hdr] += 3 + np.where(small, 2, 5) + _length(sec[2][f.has_hdr], small)
        sec = _section(v, pos, end)
        if sec is None:
            return None
    if not np.all(sec[0] == _SEC_DATA):
        return None
    small = sec[1] == 0xA0
    if not np.all(small | (sec[1] == 0xB0)):
        return None
    vlen = _length(sec[2], small)
    vstart = pos + 3 + np.where(small, 2, 5)
    if not np.array_equal(vstart + vlen, end):
        return None
    f.value_start, f.value_len = vstart, vlen
    return f


def _slices(buf: pa.Buffer, starts: np.ndarray, lens: np.ndarray, valid: np.ndarray | None,
            typ: pa.DataType) -> pa.Array:
    """A binary/string array of ``buf[starts[i]:starts[i]+lens[i]]`` (null where not
    ``valid``), built by Arrow: an array whose offsets alternate value/gap over the buffer
    (starts ascending, slices disjoint), then ``take`` of the values. Raises ArrowInvalid
    for a string that is not UTF-8."""
    m = len(starts)
    if m == 0:
        return pa.array([], type=typ)
    if valid is not None and not valid.all():
        # a null becomes an empty slice at the previous end, keeping offsets ascending
        lens = np.where(valid, lens, 0)
        starts = np.where(valid, starts, np.maximum.accumulate(np.where(valid, starts + lens, 0)))
    bounds = np.empty(2 * m + 1, dtype=np.int64)
    bounds[0:-1:2] = starts
    bounds[1::2] = starts + lens
    bounds[-1] = bounds[-2]
    big = bounds[-1] >= 2**31 - 1
    spread = pa.Array.from_buffers(pa.large_binary() if big else pa.binary(), 2 * m,
                                   [None, pa.py_buffer(bounds if big else bounds.astype(np.int32)),
                                    buf])
    picks = pa.array(np.arange(0, 2 * m, 2, dtype=np.int64),
                     mask=None if valid is None else ~valid)
    taken = spread.take(picks)
    return taken.cast(typ) if taken.type != typ else taken


def _utf8(v: _Views, starts: np.ndarray, lens: np.ndarray) -> bool:
    """Whether the (ascending, disjoint) slices of the buffer are all UTF-8: a string there
    is then the bytes decode_record gives (it replaces invalid sequences)."""
    try:
        _slices(pa.py_buffer(v.raw), starts, lens, None, pa.string())
    except pa.ArrowInvalid:
        return False
    return True


def _headers(v: _Views, buf: pa.Buffer, f: _Fields, n: int,
             map_type: pa.MapType) -> pa.Array | None:
    """The headers column (null where a record has none) in decode_record's order: "reply"
    with an empty value where x-opt-empty-headers names it, then the application-properties
    pairs (str -> str or binary). Every key and value is a slice of the buffer, in buffer
    order ("reply" is in the annotation, before the application-properties). None when a
    map holds anything else, or also names "reply"."""
    has = f.has_hdr
    extra = f.has_empty_reply
    if not has.any() and not extra.any():
        return pa.nulls(n, map_type)
    hp = f.hdr_at
    small = v.u8[hp] == 0xC1
    pairs = v.u8[hp + 2].astype(np.int64)
    if (~small).any():
        pairs[~small] = v.be4[hp[~small] + 5]
    if np.any(pairs & 1):
        return None
    pairs >>= 1
    counts = extra.astype(np.int64)
    counts[has] += pairs
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    parts = {name: np.empty(total, dtype=np.int64) for name in ("ks", "kl", "vs", "vl")}
    text = np.zeros(total, dtype=bool)  # values that are strings
    # step j reads the j-th pair of every record with more than j (sorted: a prefix)
    order = np.argsort(-pairs, kind="stable")
    pos = (hp + np.where(small, 3, 9))[order]
    base = (offsets[:-1] + extra)[has][order]
    left = pairs[order]
    active = len(left)
    for j in range(int(left[0]) if len(left) else 0):
        while active and left[active - 1] <= j:
            active -= 1
        p = pos[:active]
        slot = base[:active] + j
        for st, ln, mask in (("ks", "kl", 0xEF), ("vs", "vl", 0xEE)):
            w = v.be8u[p - 3]  # bytes p-3..p+4: the constructor is byte 3
            code = (w >> 32) & 0xFF
            if not np.all((code & mask) == (mask & 0xA1)):  # key: str; value: str or vbin
                return None
            if st == "vs":
                text[slot] = (code & 1) == 1
            sm = (code & 0x10) == 0
            length = _length(w, sm)
            start = p + np.where(sm, 2, 5)
            parts[st][slot] = start
            parts[ln][slot] = length
            p = start + length
        pos[:active] = p
    if extra.any():
        app_slot = np.repeat(extra, counts)  # slots of records with the annotation ...
        reply_slot = offsets[:-1][extra]
        app_slot[reply_slot] = False  # ... that are application properties
        maybe = np.flatnonzero(app_slot & (parts["kl"] == 5))
        if len(maybe) and np.any((v.be8u[parts["ks"][maybe]] >> 24) == _REPLY_BE):
            return None  # "reply" is also an application property: decode_record decides
        parts["ks"][reply_slot] = f.reply_at
        parts["kl"][reply_slot] = 5
        parts["vs"][reply_slot] = f.reply_at + 5  # empty, between key and next slice
        parts["vl"][reply_slot] = 0
    try:  # the cast to string checks UTF-8, as Spark strings must be
        keys = _slices(buf, parts["ks"], parts["kl"], None, pa.string())
    except pa.ArrowInvalid:
        return None
    if text.any() and not _utf8(v, parts["vs"][text], parts["vl"][text]):
        return None
    values = _slices(buf, parts["vs"], parts["vl"], None, pa.binary())
    return pa.MapArray.from_arrays(pa.array(offsets.astype(np.int32)), keys, values,
                                   type=map_type, mask=pa.array(~(has | extra)))


def _constant_string(value: str, n: int) -> pa.Array:
    data = value.encode()
    if len(data) * n < 2**31:
        offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(data))
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                      pa.py_buffer(data * n)])
    return pa.array([value] * n, type=pa.string())


_NO_PARSE = frozenset(("stream", "partition", "offset"))


def chunks_to_batch(chunks: Sequence, stream: str, partition: int, start: int, end: int,
                    schema: pa.Schema | None = None) -> pa.RecordBatch:
    """One Arrow record batch with the records of ``chunks`` (objects with ``raw`` bytes:
    chunk header + data section, and ``header``; in offset order) whose offsets are in
    ``[start, end)``. Columns: those of ``schema`` (default ``arrow_schema()``: all of
    them; a schema naming a subset, in any order, builds only those): key (binary, null when
    the record has none), value (binary), stream, partition, offset, timestamp (the record's
    ``x-opt-timestamp-ns``, else its chunk's; µs, UTC), headers (map<string, binary>, null
    when the record has none). Only stream/partition/offset: no record is parsed."""
    schema = schema or arrow_schema()
    if not chunks:
        return pa.RecordBatch.from_pylist([], schema=schema)
    names = set(schema.names)
    if names <= _NO_PARSE:
        offsets = np.concatenate([np.arange(max(c.header.first_offset, start),
                                            min(c.header.next_offset, end), dtype=np.int64)
                                  for c in chunks])
        return _assemble(schema, {}, stream, partition, offsets, None)
    raw = b"".join([c.raw for c in chunks] + [_PAD])
    bases = []
    pos = 0
    for c in chunks:
        bases.append(pos)
        pos += len(c.raw)
    views = _Views(raw)
    try:  # a malformed record may send a gather past the buffer: then the slow path
        loc = _locate(views, bases, [c.header for c in chunks])
        fields = _fast_fields(views, loc) if loc is not None else None
        batch = None if fields is None else _fast_batch(views, loc, fields, stream, partition,
                                                        start, end, schema)
    except IndexError:
        batch = None
    return batch if batch is not None else _slow_batch(chunks, stream, partition, start, end,
                                                        schema)


def _assemble(schema: pa.Schema, built: dict, stream: str, partition: int, offsets,
              ts_us) -> pa.RecordBatch:
    n = len(offsets)
    columns = []
    for name in schema.names:
        if name in built:
            columns.append(built[name])
        elif name == "stream":
            columns.append(_constant_string(stream, n))
        elif name == "partition":
            columns.append(pa.array(np.full(n, partition, dtype=np.int32)))
        elif name == "offset":
            columns.append(pa.array(offsets, type=pa.int64()))
        elif name == "timestamp":
            columns.append(pa.array(ts_us, type=pa.int64()).view(pa.timestamp("us", tz="UTC")))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _fast_batch(v: _Views, loc: _Located, f: _Fields, stream: str, partition: int,
                start: int, end: int, schema: pa.Schema) -> pa.RecordBatch | None:
    offsets = loc.offsets
    keep = (offsets >= start) & (offsets < end)
    buf = pa.py_buffer(v.raw)
    built = {}
    if "headers" in schema.names:
        built["headers"] = _headers(v, buf, f, len(offsets), schema.field("headers").type)
        if built["headers"] is None:
            return None
    if "key" in schema.names:
        built["key"] = _slices(buf, f.key_start, f.key_len, f.has_key, pa.binary())
    if "value" in schema.names:
        built["value"] = _slices(buf, f.value_start, f.value_len, None, pa.binary())
    ts_us = np.floor_divide(f.ts_ns, 1000)
    if not keep.all():
        idx = pa.array(np.flatnonzero(keep))
        built = {name: col.take(idx) for name, col in built.items()}
        ts_us, offsets = ts_us[keep], offsets[keep]
    return _assemble(schema, built, stream, partition, offsets, ts_us)


def _slow_batch(chunks, stream, partition, start, end, schema) -> pa.RecordBatch:
    keys, values, offsets, stamps, hdrs = [], [], [], [], []
    unreadable = log_unreadable(log, f"{stream}/{partition}")
    for c in chunks:
        h = c.header
        if h.next_offset <= start or h.first_offset >= end:
            continue
        default_ns = h.timestamp_ms * 1_000_000
        data = memoryview(c.raw)[HEADER_SIZE:HEADER_SIZE + h.data_length]
        for offset, record in iter_records(h, data, unreadable):
            if offset < start or offset >= end:
                continue
            r = decode_record(record, default_ns)
            keys.append(r.key)
            values.append(r.value)
            offsets.append(offset)
            stamps.append(r.timestamp_ns // 1000)
            hdrs.append(list(r.headers.items()) if r.headers else None)
    built = {"key": pa.array(keys, type=pa.binary()), "value": pa.array(values, type=pa.binary())}
    if "headers" in schema.names:
        built["headers"] = pa.array(hdrs, type=schema.field("headers").type)
    return _assemble(schema, built, stream, partition, offsets, stamps)
