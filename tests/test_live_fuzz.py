# Live fuzz, the short version of benchmarks/live_fuzz.py (which holds the frame generator, the
# well-behaved rstream client and the RSS sampling): 5,000 malformed frames over many raw
# connections to a `riverlog serve` subprocess while rstream publishes and consumes on it. The
# server must stay up, every connection that sent a bad frame must be closed by the server, the
# rstream consumer must read exactly what was confirmed, in order, and the peak RSS must stay
# under 300 MiB. RIVERLOG_LIVE_FUZZ_SEED replays a run.
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import live_fuzz  # noqa: E402  benchmarks/live_fuzz.py


@pytest.mark.timeout(120)
async def test_five_thousand_bad_frames_while_rstream_works(tmp_path):
    seed = os.environ.get("RIVERLOG_LIVE_FUZZ_SEED")
    result = await live_fuzz.run_live_fuzz(frames=5000, concurrency=16, workdir=str(tmp_path),
                                           rss_mb=300, seed=int(seed) if seed else None)
    assert result.problems == [], result.as_json()
    assert result.server_alive
    assert result.frames == 5000
    assert result.closed_by_server == result.connections, result.as_json()
    assert result.good_confirmed > 0 and result.good_consumed == result.good_confirmed
    assert set(result.by_kind) == {"random", "garbage-body", "truncated", "oversized",
                                   "unknown-key", "nonsense", "draft"}


@pytest.mark.timeout(60)
async def test_a_client_that_never_reads_does_not_grow_the_server(tmp_path):
    """Found by benchmarks/load_bench.py: answers to a peer that sends requests and reads
    nothing piled up in the server without limit (RSS +110 MiB in 15 s). Now the door stops
    reading such a peer once 4 MiB of output wait (OUTPUT_PAUSE_BYTES)."""
    import asyncio
    import subprocess

    from riverlog.protocol.rabbitmq_stream import encode
    from riverlog.protocol.rabbitmq_stream import frames as f

    port = live_fuzz.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "riverlog", "serve", "-d", str(tmp_path / "d"),
                             "--stream-port", str(port), "-p", "0", "--nats-port", "0",
                             "--metrics-port", "0", "--management-port", "0",
                             "--level", "error"], stdin=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                reader, writer = await asyncio.open_connection(live_fuzz.HOST, port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        await live_fuzz._handshake(reader, writer)
        before = live_fuzz.rss_kib(proc.pid)
        request = encode(f.Metadata(1, tuple(f"stream-{i:04d}" for i in range(200)))) * 50
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 4
        while loop.time() < deadline:  # never read a byte
            writer.write(request)
            await asyncio.sleep(0.001)
        await asyncio.sleep(1)
        grown_mib = (live_fuzz.rss_kib(proc.pid) - before) / 1024
        assert writer.transport.get_write_buffer_size() > 16 * 1024 * 1024, \
            "the server kept reading a peer that reads nothing"
        assert grown_mib < 30, f"server RSS grew {grown_mib:.0f} MiB"
        writer.transport.abort()
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(20)
