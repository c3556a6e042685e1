# Micro-benchmark of the compiled twins (riverlog/_compiled.py) against their Python
# references: ns per message of each per-message function, both implementations, the median
# of 3 runs, on the same inputs in one process. No I/O. The machine is shared: compare the
# ratios of one run, not absolute numbers across runs (benchmarks/README.md records results).
#   .venv/bin/python benchmarks/codec_bench.py [--n 200000]
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time

from riverlog.protocol.liftbridge import api_pb2, envelope

NATS_PUBLISH = envelope.encode_publish(api_pb2.Message(
    key=b"key-0001", value=b"x" * 100, headers={"trace": b"abc123"}, ackInbox="_INBOX.xyz.1",
    correlationId="c4d7e2aa-0001", ackPolicy=api_pb2.LEADER, offset=-1))
PLAIN_PUBLISH = envelope.encode_publish(api_pb2.Message(value=b"x" * 100))


def cases():
    """(name, {implementation: zero-argument callable run once per message})."""
    c_env = importlib.import_module("riverlog.protocol.liftbridge._envelope_c")
    py_ack = envelope._PyAckTemplate("s", "s", "s", 0, 1_700_000_000_000_000_000,
                                     envelope.ACK_HEADER)
    c_ack = c_env.AckTemplate("s", "s", "s", 0, 1_700_000_000_000_000_000, envelope.ACK_HEADER)
    inbox, corr, commit = b"_INBOX.xyz.1", b"c4d7e2aa-0001", 1_700_000_000_000_000_123
    yield "decode_publish (key, 1 header, ack inbox)", {
        "python": lambda: envelope._py_decode_publish(NATS_PUBLISH),
        "compiled": lambda: c_env.decode_publish(NATS_PUBLISH)}
    yield "decode_publish (value only)", {
        "python": lambda: envelope._py_decode_publish(PLAIN_PUBLISH),
        "compiled": lambda: c_env.decode_publish(PLAIN_PUBLISH)}
    yield "AckTemplate.ack", {
        "python": lambda: py_ack.ack(123456, inbox, corr, commit),
        "compiled": lambda: c_ack.ack(123456, inbox, corr, commit)}


def batch_cases():
    """(name, {implementation: callable(batch size) -> callable run once per batch}) for the
    functions that take a batch; reported per message."""
    return ()


def ns_per_call(fn, n: int) -> float:
    runs = []
    for _ in range(3):
        start = time.perf_counter_ns()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter_ns() - start) / n)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200_000, help="calls per run (3 runs)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f}; {args.n} calls x 3 runs, median")
    print(f"| function | python ns/msg | compiled ns/msg | speedup |")
    print("|---|---|---|---|")
    rows = list(cases())
    for name, make in batch_cases():
        rows.append((name, make))
    for name, impls in rows:
        py = ns_per_call(impls["python"], args.n)
        c = ns_per_call(impls["compiled"], args.n)
        print(f"| {name} | {py:,.0f} | {c:,.0f} | {py / c:.1f}x |")


if __name__ == "__main__":
    main()
