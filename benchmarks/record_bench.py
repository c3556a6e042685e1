"""Record codec cost of what the Liftbridge doors store: µs per record to encode a read's
records (riverlog.record.encode_records, the NATS/gRPC ingest hot path) and to turn chunks of
them into one Arrow batch (riverlog.spark.arrow.chunks_to_batch, the Spark read path).

Cases are the records the doors write: a plain NATS publish without a reply subject (headers
subject, reply empty), the same with a reply subject (no empty header), and a gRPC
PublishAsync with a user header (a correlation id; reply empty). No server and no network:
the codec alone, in one process. Every case runs --repeat times and the best counts.
Run: .venv/bin/python benchmarks/record_bench.py [--records 200000] [--repeat 7]
Prints one line per case and one JSON line. To compare two versions of the code, run the
same script with PYTHONPATH pointing at the other version's source tree.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Callable

from riverlog.client import Chunk
from riverlog.log.chunk import encode_chunk, encode_entries
from riverlog.record import Record, encode_records

PER_CHUNK = 1000  # records per chunk, about what a NATS read of small messages appends


def cases(value_size: int) -> dict[str, Callable[[int, int], Record]]:
    value = b"x" * value_size
    return {
        "nats, no reply": lambda i, ts: Record(value, None, {"subject": b"orders.eu",
                                                             "reply": b""}, ts, "orders.eu"),
        "nats, reply": lambda i, ts: Record(value, None, {"subject": b"orders.eu",
                                                          "reply": b"_INBOX.abc"}, ts,
                                            "orders.eu", "_INBOX.abc"),
        "grpc async": lambda i, ts: Record(value, None, {"trace": b"0123456789abcdef",
                                                         "subject": b"orders.eu",
                                                         "reply": b""}, ts, "orders.eu",
                                           correlation_id=f"c-{i}"),
    }


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    from riverlog.spark.arrow import arrow_schema, chunks_to_batch

    schema = arrow_schema()
    n = args.records - args.records % PER_CHUNK
    results = {}
    for name, make in cases(args.value_size).items():
        # one timestamp per read of PER_CHUNK records, as the doors stamp them
        records = [make(i, 1_700_000_000_000_000_000 + i // PER_CHUNK) for i in range(n)]
        reads = [records[i:i + PER_CHUNK] for i in range(0, n, PER_CHUNK)]
        encode_s = best(lambda: [encode_records(r) for r in reads], args.repeat)
        chunks = [Chunk(encode_chunk(encode_entries(encode_records(r)), len(r), len(r),
                                     first_offset=i * PER_CHUNK, timestamp_ms=1))
                  for i, r in enumerate(reads)]
        read_s = best(lambda: chunks_to_batch(chunks, "s", 0, 0, n, schema), args.repeat)
        results[name] = {"encode_us": round(encode_s / n * 1e6, 3),
                         "chunks_to_batch_us": round(read_s / n * 1e6, 3)}
        print(f"{name:16} encode_records {results[name]['encode_us']:.3f} us/record   "
              f"chunks_to_batch {results[name]['chunks_to_batch_us']:.3f} us/record")
    print(json.dumps({"records": n, "value_size": args.value_size, "repeat": args.repeat,
                      "results": results}))


if __name__ == "__main__":
    main()
