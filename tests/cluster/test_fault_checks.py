# The fault harness's checks (benchmarks/faults/checks.py) on made-up replica bytes: a clean
# log passes, and each kind of finding the harness reports (an acked message missing or at
# another offset, stored twice, out of order, replicas that differ, committed bytes rewritten,
# a read of a record the log no longer holds) is found. The harness itself runs a cluster
# (benchmarks/cluster_faults.py); it is a benchmark, not run here.
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from faults.checks import Mirror, compare_replicas  # noqa: E402  benchmarks/faults/
from faults.publishers import Ack, payload  # noqa: E402

from riverlog.log.chunk import encode_chunk, encode_entries  # noqa: E402
from riverlog.record import Record, encode_record  # noqa: E402


def chunk(first: int, values: list[bytes]) -> bytes:
    records = [encode_record(Record(value=v)) for v in values]
    return encode_chunk(encode_entries(records), len(records), len(records),
                        first_offset=first, timestamp_ms=0, epoch=1)


def log(*chunks: list[bytes]) -> bytes:
    out, offset = b"", 0
    for values in chunks:
        out += chunk(offset, values)
        offset += len(values)
    return out


def acks(door: str, offsets: dict[int, int | None]) -> list[Ack]:
    return [Ack(seq, offset, 0.0, 0.0) for seq, offset in offsets.items()]


def kinds(problems) -> list[str]:
    return [p.kind for p in problems]


def test_a_clean_log_and_its_acks_pass_and_a_later_round_reads_only_what_is_new():
    first = log([payload("grpc", 1), payload("nats", 1)], [payload("rstream", 1)])
    mirror = Mirror()
    assert mirror.advance(first, 2) == []
    assert mirror.check_acks("grpc", acks("grpc", {1: 0})) == []
    assert mirror.check_acks("nats", acks("nats", {1: 1})) == []
    assert mirror.check_acks("rstream", acks("rstream", {1: None})) == []
    assert mirror.check_served("s0", [(0, payload("grpc", 1)), (3, b"x")]) == ([], [(3, b"x")])
    second = first + chunk(3, [payload("grpc", 2)]) + chunk(4, [payload("grpc", 3)])
    assert mirror.advance(second, 3) == []  # the chunk past the high watermark waits
    assert mirror.high_watermark == 3
    assert mirror.check_acks("grpc", acks("grpc", {1: 0, 2: 3})) == []
    assert compare_replicas({"s0": second, "s1": second[:len(mirror.data)]},
                            len(mirror.data)) == []


def test_a_lost_a_misplaced_and_an_out_of_order_ack_are_found():
    mirror = Mirror()
    mirror.advance(log([payload("grpc", 2), payload("grpc", 1), payload("nats", 1)]), 2)
    assert kinds(mirror.check_acks("grpc", acks("grpc", {1: 1, 2: 0}))) == ["order"]
    assert kinds(mirror.check_acks("nats", acks("nats", {1: 0}))) == ["offset"]
    assert kinds(mirror.check_acks("rstream", acks("rstream", {1: None}))) == ["lost"]


def test_a_payload_stored_twice_is_found():
    mirror = Mirror()
    assert kinds(mirror.advance(log([payload("nats", 1)], [payload("nats", 1)]), 1)) == \
        ["duplicate"]


def test_replicas_that_differ_and_rewritten_committed_bytes_are_found():
    good = log([payload("grpc", 1)], [payload("grpc", 2)])
    other = log([payload("grpc", 1)], [payload("grpc", 3)])
    assert kinds(compare_replicas({"s0": good, "s1": other}, len(good))) == ["diverged"]
    mirror = Mirror()
    mirror.advance(good, 1)
    assert kinds(mirror.advance(other + chunk(2, [b"x"]), 2)) == ["rewritten"]


def test_a_served_record_the_log_does_not_hold_is_a_stale_read():
    mirror = Mirror()
    mirror.advance(log([payload("grpc", 1), payload("grpc", 2)]), 1)
    problems, later = mirror.check_served("s2", [(0, payload("grpc", 1)),
                                                 (1, payload("nats", 7))])
    assert kinds(problems) == ["stale read"] and later == []


def test_a_corrupt_chunk_is_found():
    data = bytearray(log([payload("grpc", 1)]))
    data[-1] ^= 0xFF
    assert kinds(Mirror().advance(bytes(data), 0)) == ["corrupt"]
