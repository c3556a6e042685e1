# Fixtures shared by the rstream compat tests (the servers themselves come from tests/conftest.py).
from __future__ import annotations

import pytest
from rstream import Producer

from ._helpers import GUEST, stream_name


@pytest.fixture
async def stream(stream_server):
    """A new stream on ``stream_server``, created and deleted (when the server still runs)
    through rstream."""
    name = stream_name("rstream")
    async with Producer(stream_server.host, stream_server.port, **GUEST) as p:
        await p.create_stream(name)
    yield name
    if stream_server.alive():
        async with Producer(stream_server.host, stream_server.port, **GUEST) as p:
            await p.delete_stream(name, missing_ok=True)

