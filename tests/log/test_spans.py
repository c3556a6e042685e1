"""Chunks as spans (riverlog/log/spans.py): which chunks the RabbitMQ door may send from the
segment file with os.sendfile (large ones, and with verify_reads only those whose CRC this
process checked: written by it, or read and checked since it opened the log), and that a
span sends exactly the stored bytes."""
from __future__ import annotations

import glob
import os
import socket

import pytest

from riverlog.config import LogConfig
from riverlog.errors import CorruptChunkError
from riverlog.log import ChunkSlice, ChunkSpan, CommitLog
from riverlog.log.chunk import HEADER_SIZE

BIG = 64 * 1024
LARGE = [bytes([i % 256]) * 1000 for i in range(100)]  # one chunk of ~100 kB


def fill(log: CommitLog) -> None:
    """Chunks: large, large, small, large."""
    log.append(LARGE)
    log.append(LARGE[::-1])
    log.append([b"small"])
    log.append(LARGE)


def sent(span: ChunkSpan) -> bytes:
    """What a Deliver of ``span`` carries, the data through a real socket by os.sendfile."""
    out, into = socket.socketpair()
    with out, into:
        done = 0
        while done < span.header.data_length:
            done += span.sendfile(out.fileno(), done)
        out.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := into.recv(1 << 20):
            data += chunk
    return span.head + data


def kinds(chunks) -> list[str]:
    return ["span" if isinstance(c, ChunkSpan) else "read" for c in chunks]


def test_chunks_this_process_wrote_are_spans_with_their_stored_bytes(tmp_path):
    with CommitLog(tmp_path) as log:
        fill(log)
        read = log.read_chunks(0)
        spans = log.read_spans(0, min_bytes=BIG)
        assert kinds(spans) == ["span", "span"]  # the small chunk ends the run
        assert [sent(s) for s in spans] == [bytes(c.header_and_data) for c in read[:2]]
        small = log.read_spans(spans[-1].header.next_offset, min_bytes=BIG)
        assert kinds(small) == ["read"] and small[0].header.num_records == 1
        assert kinds(log.read_spans(small[0].header.next_offset, min_bytes=BIG)) == ["span"]


def test_a_reopened_log_checks_a_chunk_before_it_is_a_span(tmp_path):
    with CommitLog(tmp_path) as log:
        fill(log)
    with CommitLog(tmp_path) as log:
        first = log.read_spans(0, min_bytes=BIG)
        assert kinds(first) == ["read"] * 4 and all(isinstance(c, ChunkSlice) for c in first)
        assert kinds(log.read_spans(0, min_bytes=BIG)) == ["span", "span"]


def flip_byte(directory, at: int) -> None:
    (path,) = glob.glob(os.path.join(directory, "*.segment"))
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_corrupt_chunk_never_becomes_a_span(tmp_path):
    with CommitLog(tmp_path) as log:
        fill(log)
    flip_byte(tmp_path, HEADER_SIZE + 500)  # in the first chunk's data
    with CommitLog(tmp_path) as log:
        for _ in range(2):  # the failed check leaves the chunk unchecked
            with pytest.raises(CorruptChunkError):
                log.read_spans(0, min_bytes=BIG)
        assert log.segments[0].checked == 0


def test_without_verify_reads_every_large_chunk_is_a_span(tmp_path):
    with CommitLog(tmp_path) as log:
        fill(log)
    with CommitLog(tmp_path, LogConfig(verify_reads=False)) as log:
        assert kinds(log.read_spans(0, min_bytes=BIG)) == ["span", "span"]


def test_truncation_takes_the_mark_back_and_appends_move_it_again(tmp_path):
    with CommitLog(tmp_path) as log:
        fill(log)
        seg = log.segments[0]
        log.truncate(100)  # the second chunk and those after it go
        assert seg.checked == seg.size
        log.append(LARGE[::-1])
        (again,) = log.read_spans(100, min_bytes=BIG)
        assert sent(again) == bytes(log.read_chunks(100)[0].header_and_data)
        assert seg.checked == seg.size
