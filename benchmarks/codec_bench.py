# Micro-benchmark of the compiled twins (riverlog/_compiled.py) against their Python
# references: ns per message of each per-message function, both implementations, the median
# of 3 runs, on the same inputs in one process. No I/O. The machine is shared: compare the
# ratios of one run, not absolute numbers across runs (benchmarks/README.md records results).
# With --callgrind, CPU instructions per message instead (valgrind's callgrind, counting only
# inside the measuring loop: collections' consume_iterator), which load does not disturb.
# The NATS door's framing (NatsParser.feed) is measured on reads of 100 MSG or HMSG of 10 and
# 256 bytes. A follower's check of a replication fetch answer (chunk.count_entries, and
# check_chunks run with either count_entries) on chunks of 100 of the NATS door's records.
# --match TEXT keeps only the rows whose name holds TEXT.
#   .venv/bin/python benchmarks/codec_bench.py [--n 200000] [--match NatsParser]
#   .venv/bin/python benchmarks/codec_bench.py --callgrind [--n 5000]
from __future__ import annotations

import argparse
import importlib
import os
import re
import statistics
import subprocess
import sys
import time
from collections import deque
from itertools import repeat, starmap

from riverlog import record
from riverlog.log import chunk as chunkfmt
from riverlog.protocol import nats_wire
from riverlog.protocol.liftbridge import api_pb2, envelope, messages

NATS_PUBLISH = envelope.encode_publish(api_pb2.Message(
    key=b"key-0001", value=b"x" * 100, headers={"trace": b"abc123"}, ackInbox="_INBOX.xyz.1",
    correlationId="c4d7e2aa-0001", ackPolicy=api_pb2.LEADER, offset=-1))
PLAIN_PUBLISH = envelope.encode_publish(api_pb2.Message(value=b"x" * 100))


def read(m):
    """The fields nats_bridge._ingest_turn reads of a decoded publish (upb makes its Python
    objects only when read)."""
    return (m.ackInbox, m.offset, m.ackPolicy, m.value, m.key, m.correlationId,
            dict(m.headers) if m.headers else None)


def cases():
    """(name, {implementation: zero-argument callable run once per message})."""
    c_env = importlib.import_module("riverlog.protocol.liftbridge._envelope_c")
    py_ack = envelope._PyAckTemplate("s", "s", "s", 0, 1_700_000_000_000_000_000,
                                     envelope.ACK_HEADER)
    c_ack = c_env.AckTemplate("s", "s", "s", 0, 1_700_000_000_000_000_000, envelope.ACK_HEADER)
    inbox, corr, commit = b"_INBOX.xyz.1", b"c4d7e2aa-0001", 1_700_000_000_000_000_123
    yield "decode_publish + fields read (key, 1 header, ack inbox)", {
        "python": lambda: read(envelope._py_decode_publish(NATS_PUBLISH)),
        "compiled": lambda: read(c_env.decode_publish(NATS_PUBLISH))}
    yield "decode_publish + fields read (value only)", {
        "python": lambda: read(envelope._py_decode_publish(PLAIN_PUBLISH)),
        "compiled": lambda: read(c_env.decode_publish(PLAIN_PUBLISH))}
    yield "AckTemplate.ack", {
        "python": lambda: py_ack.ack(123456, inbox, corr, commit),
        "compiled": lambda: c_ack.ack(123456, inbox, corr, commit)}


# what the NATS door stores for an enveloped publish with an ack (nats_bridge._ingest_turn),
# and for a plain NATS message
NATS_RECORD = record.Record(b"x" * 100, b"key-0001", {"trace": b"abc123", "subject": b"orders",
                                                      "reply": b""}, 1_700_000_000_000_000_000,
                            "orders", None, "c4d7e2aa-0001", "_INBOX.xyz.1")
PLAIN_RECORD = record.Record(b"x" * 100, None, {"subject": b"orders", "reply": b""},
                             1_700_000_000_000_000_000, "orders")
BATCH = 100


def batch_cases():
    """(name, {implementation: zero-argument callable}, messages per call) for the functions
    that take a batch; reported per message."""
    c_rec = importlib.import_module("riverlog._record_c")
    c_msg = importlib.import_module("riverlog.protocol.liftbridge._messages_c")
    for name, rec in (("enveloped NATS publish", NATS_RECORD), ("plain NATS message", PLAIN_RECORD)):
        batch = [record.Record(rec.value, rec.key, dict(rec.headers), rec.timestamp_ns + i,
                               rec.subject, rec.reply, rec.correlation_id and f"corr-{i}",
                               rec.ack_inbox) for i in range(BATCH)]
        yield f"encode_record ({name})", {
            "python": lambda rec=rec: record._py_encode_record(rec),
            "compiled": lambda rec=rec: c_rec.encode_record(rec)}, 1
        yield f"encode_records, {BATCH} per batch ({name})", {
            "python": lambda batch=batch: record._py_encode_records(batch),
            "compiled": lambda batch=batch: c_rec.encode_records(batch)}, BATCH
        # a Subscribe's read of those records: one encoder per Subscribe (caches warm)
        pairs = list(enumerate(record._py_encode_records(batch)))
        encoders = {"python": messages._PyMessageEncoder("orders", 0),
                    "compiled": messages._bind_twin(c_msg)("orders", 0)}
        yield f"MessageEncoder.extend, {BATCH} per read ({name})", {
            impl: lambda pairs=pairs, e=e: e.extend([], pairs, 0, -1, 0)
            for impl, e in encoders.items()}, BATCH


# a read of the NATS door's data connection (nats_data.py): 100 messages on one subscription,
# as nats-server writes them for lift-bench's subject (no reply: the ack inbox is in the
# envelope), MSG or HMSG with one header
HEADER_BLOCK = b"NATS/1.0\r\nNats-Msg-Id: c4d7e2aa-0001\r\n\r\n"


def nats_read(size: int, headers: bool) -> bytes:
    payload = bytes(range(256))[:size]
    if headers:
        one = b"HMSG lift-bench 7 %d %d\r\n%b%b\r\n" % (
            len(HEADER_BLOCK), len(HEADER_BLOCK) + size, HEADER_BLOCK, payload)
    else:
        one = b"MSG lift-bench 7 %d\r\n%b\r\n" % (size, payload)
    return one * BATCH


def nats_cases():
    """NatsParser.feed of one read of BATCH messages, reported per message."""
    parsers = {"python": nats_wire._PyNatsParser(),
               "compiled": nats_wire._bind_twin(
                   importlib.import_module("riverlog.protocol._nats_wire_c"))()}
    for size in (10, 256):
        for headers in (False, True):
            data = nats_read(size, headers)
            name = f"NatsParser.feed, {BATCH} per read ({'HMSG' if headers else 'MSG'}, {size} B)"
            yield name, {impl: lambda p=p, data=data: p.feed(data)
                         for impl, p in parsers.items()}, BATCH


FETCH_CHUNKS = 16


def chunk_cases():
    """A follower's check of a fetch answer, reported per record: count_entries of one
    chunk's data section of BATCH enveloped NATS publishes (a memoryview, as counts_match
    passes it), and check_chunks of FETCH_CHUNKS such chunks back to back (CRC-32, headers,
    counts) run with either count_entries (bound over chunk.py's, as the twin is)."""
    c_chunk = importlib.import_module("riverlog.log._chunk_c")
    chunkfmt._bind_twin(c_chunk)
    data = chunkfmt.encode_entries(record._py_encode_records([NATS_RECORD] * BATCH))
    view = memoryview(data)
    yield f"count_entries, {BATCH} per chunk (enveloped NATS publish)", {
        "python": lambda: chunkfmt._py_count_entries(view),
        "compiled": lambda: c_chunk.count_entries(view)}, BATCH
    answer = b"".join(chunkfmt.encode_chunk(data, BATCH, BATCH, first_offset=i * BATCH,
                                            timestamp_ms=1) for i in range(FETCH_CHUNKS))

    def check(count_entries):
        def run():
            chunkfmt.count_entries = count_entries  # what counts_match calls
            return chunkfmt.check_chunks(answer, 0, 0)
        return run

    yield (f"check_chunks, {FETCH_CHUNKS} chunks of {BATCH} per fetch answer "
           "(enveloped NATS publish)"), {
        "python": check(chunkfmt._py_count_entries),
        "compiled": check(c_chunk.count_entries)}, FETCH_CHUNKS * BATCH


def ns_per_call(fn, n: int) -> float:
    runs = []
    for _ in range(3):
        start = time.perf_counter_ns()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter_ns() - start) / n)
    return statistics.median(runs)


def rows() -> list[tuple[str, dict, int]]:
    return ([(name, impls, 1) for name, impls in cases()] + list(batch_cases())
            + list(nats_cases()) + list(chunk_cases()))


def instructions_per_call(index: int, impl: str, n: int) -> float:
    """CPU instructions per call of row ``index``'s ``impl``, counted by callgrind."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         "--collect-atstart=no", "--toggle-collect=consume_iterator", sys.executable, __file__,
         "--only", str(index), "--impl", impl, "--n", str(n)],
        capture_output=True, text=True, check=True).stderr
    return int(re.search(r"Collected : (\d+)", out).group(1)) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=None, help="calls per run (3 runs; "
                        "default 200000, or 5000 with --callgrind)")
    parser.add_argument("--callgrind", action="store_true", help="count instructions")
    parser.add_argument("--only", type=int, help=argparse.SUPPRESS)  # one row, under valgrind
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--match", default="", help="only the rows whose name has this text")
    args = parser.parse_args()
    if args.only is not None:
        name, impls, per_call = rows()[args.only]
        deque(starmap(impls[args.impl], repeat((), max(1, args.n // per_call))), maxlen=0)
        return
    n = args.n or (5_000 if args.callgrind else 200_000)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    unit = "instructions" if args.callgrind else "ns"
    how = "callgrind" if args.callgrind else "3 runs, median"
    print(f"load average {load}; {n} messages per measure, {how}")
    print(f"| function | python {unit}/msg | compiled {unit}/msg | speedup |")
    print("|---|---|---|---|")
    for index, (name, impls, per_call) in enumerate(rows()):
        if args.match not in name:
            continue
        if args.callgrind:
            py = instructions_per_call(index, "python", n)
            c = instructions_per_call(index, "compiled", n)
        else:
            calls = max(1, n // per_call)
            py = ns_per_call(impls["python"], calls) / per_call
            c = ns_per_call(impls["compiled"], calls) / per_call
        print(f"| {name} | {py:,.0f} | {c:,.0f} | {py / c:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
