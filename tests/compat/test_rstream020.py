"""rstream 0.20.x, unmodified, in a process of its own (tests/compat/_rstream020.py), against
the `stream_server` fixture: its plain send() loop sends ~100,000 buffered messages as one
Publish frame of ~1.2 MB, which RabbitMQ 3.10.8 confirms whole (issue 12, items 3 and 4);
a Consumer deletes the three streams it reads on its one connection (issue 20, item 7)."""
from __future__ import annotations

import pytest
from rstream import Producer

from . import _rstream020
from ._helpers import GUEST, stream_name

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="session")
def rstream020() -> None:
    try:
        _rstream020.install()
    except _rstream020.RstreamUnavailable as exc:
        pytest.skip(str(exc))


async def test_a_send_loop_of_100000_messages_is_confirmed_stored_and_chunked(
        rstream020, stream_server):
    n = 100_000
    out = await _rstream020.run("send_loop", stream_server.host, stream_server.port,
                                messages=n, stream=stream_name("rstream020"))
    assert out["module"].startswith(_rstream020.SITE), out  # really rstream 0.20
    assert (out["confirmed"], out["errors"]) == (n, 0), out
    assert out["first_read"] == n and out["in_order"], out
    # a consumer at `last` starts at the newest chunk: a short recent slice, not the frame
    assert out["last_first_offset"] is not None, out
    assert out["last_first_offset"] >= n - 8192, out


async def test_deleting_the_streams_a_consumer_reads_on_its_own_connection_completes(
        rstream020, stream_server):
    # issue 20 item 7: the DeleteResponse goes before the MetadataUpdate the deletion causes
    # on the same connection (rabbit_stream_reader.erl: delete_stream calls response_ok, then
    # sends metadata_update). rstream 0.20 closes its connection inside its frame reader when
    # the connection's last stream gets a MetadataUpdate: a DeleteResponse sent after it was
    # never read and the last delete timed out.
    streams = [stream_name("rstream020-del") for _ in range(3)]
    out = await _rstream020.run("delete_consumed", stream_server.host, stream_server.port,
                                streams=streams, delete_timeout=15)
    assert out["module"].startswith(_rstream020.SITE), out  # really rstream 0.20
    assert out["received"] == 3, out
    assert out["results"] == ["ok"] * 3, out
    async with Producer(stream_server.host, stream_server.port, **GUEST) as p:
        for stream in streams:
            assert not await p.stream_exists(stream), stream
