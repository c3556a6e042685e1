# Fixtures shared by the compat tests (the servers themselves come from tests/conftest.py):
# an rstream-made `stream`, and `node_client`, the Node.js client installed with npm.
from __future__ import annotations

import pytest
from rstream import Producer

from ._helpers import GUEST, stream_name
from ._node import NodeClient, NodeUnavailable, install


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


@pytest.fixture(scope="session")
def node_client() -> NodeClient:
    """The Node.js RabbitMQ Stream client, installed with npm once per session
    (tests/compat/_node.py). Skips only when node/npm is missing or the registry is
    unreachable."""
    try:
        install()
    except NodeUnavailable as exc:
        pytest.skip(f"Node.js client tests: {exc}")
    return NodeClient()
