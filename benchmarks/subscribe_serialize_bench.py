"""Serialize cost of the gRPC Subscribe: µs per record to turn chunks of stored records into
serialized Liftbridge Messages, the general way (decode_record, then a pb.Message per record:
riverlog.protocol.liftbridge.messages.message_of_record, what grpc_subscribe._serialize did
before MessageEncoder) and with MessageEncoder (what it does now). Chunk walking included.

Cases are benchmarks/record_bench.py's (the records the doors write: a NATS publish without
a reply subject (headers subject, reply empty), the same with a reply subject, a gRPC
PublishAsync with a user header, a correlation id and reply empty), plus PublishAsyncs with
a key per record (what Liftbridge's bench/producer sends), and with a key and a user header
that differ on every record (the encoder's worst case: nothing
shared between records). CPU time of the process, the best of --repeat runs. No server and no network: the codec alone, in one
process. Both ways' Messages are checked equal (parsed) before timing.
Run: .venv/bin/python benchmarks/subscribe_serialize_bench.py [--records 100000] [--repeat 5]
Prints one line per case and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Callable

from riverlog.log.chunk import encode_chunk, encode_entries, parse_header
from riverlog.log.segment import ChunkSlice
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge.messages import MessageEncoder, message_of_record
from riverlog.record import Record, encode_records
from riverlog.server.grpc_subscribe import WAIT_FOR_NEW, _serialize

import record_bench  # benchmarks/ (this script's folder): the same cases

PER_CHUNK = 1000
STREAM, PARTITION = "orders", 0


def cases(value_size: int) -> dict[str, Callable[[int, int], Record]]:
    out = record_bench.cases(value_size)
    value = b"x" * value_size
    out["grpc async, key"] = lambda i, ts: Record(
        value, b"k%d" % i, {"subject": b"orders.eu", "reply": b""}, ts, "orders.eu",
        correlation_id=f"c-{i}")
    out["grpc async, key, unique header"] = lambda i, ts: Record(
        value, b"k%d" % i, {"trace": b"%016x" % i, "subject": b"orders.eu", "reply": b""},
        ts, "orders.eu", correlation_id=f"c-{i}")
    return out


def chunks_of(make: Callable[[int, int], Record], n: int) -> list[ChunkSlice]:
    out = []
    ts = 1_700_000_000_000_000_000
    for first in range(0, n, PER_CHUNK):
        # a gRPC read's records share their reception time, as the doors stamp them
        records = [make(i, ts + first) for i in range(first, first + PER_CHUNK)]
        raw = encode_chunk(encode_entries(encode_records(records)), PER_CHUNK, PER_CHUNK,
                           first_offset=first, timestamp_ms=ts // 1_000_000)
        out.append(ChunkSlice(parse_header(raw), raw))
    return out


def general(chunks: list[ChunkSlice]) -> list[bytes]:
    out = []
    for chunk in chunks:
        default_ns = chunk.header.timestamp_ms * 1_000_000
        for offset, raw in chunk.records():
            out.append(message_of_record(raw, offset, default_ns, STREAM, PARTITION)[0])
    return out


def encoded(chunks: list[ChunkSlice]) -> list[bytes]:
    encoder = MessageEncoder(STREAM, PARTITION)
    return _serialize(chunks, 0, WAIT_FOR_NEW, encoder, None)[0]


def cpu_us(fn) -> float:
    """CPU seconds of this process for one ``fn()`` (not wall time: on a shared machine the
    wall clock counts the other processes' turns too)."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--value-size", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    n = max(PER_CHUNK, args.records - args.records % PER_CHUNK)
    results = {}
    for name, make in cases(args.value_size).items():
        chunks = chunks_of(make, n)
        old, new = general(chunks), encoded(chunks)
        parse = pb.Message.FromString
        if len(old) != len(new) or any(parse(a) != parse(b) for a, b in zip(old, new)):
            raise SystemExit(f"{name}: the encoder's Messages differ from the general way's")
        t_old = min(cpu_us(lambda: general(chunks)) for _ in range(args.repeat)) / n * 1e6
        t_new = min(cpu_us(lambda: encoded(chunks)) for _ in range(args.repeat)) / n * 1e6
        results[name] = {"general_us": round(t_old, 3), "encoder_us": round(t_new, 3),
                         "speedup": round(t_old / t_new, 2)}
        print(f"{name:32s} general {t_old:6.2f} µs/record  encoder {t_new:6.2f} µs/record  "
              f"{t_old / t_new:5.1f}x")
    print(json.dumps({"records": n, "value_size": args.value_size, "cases": results}))


if __name__ == "__main__":
    main()
