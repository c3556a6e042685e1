"""The Node.js client (rabbitmq-stream-js-client 1.0.0, installed by the `node_client`
fixture) against the `stream_server` fixture, where it broke on riverlog: closing a client
while one of its consumers closes, a refused login, a small segment size. (Records written
through the Liftbridge doors: tests/liftbridge/test_lb_cross_door.py.)"""
from __future__ import annotations

import pytest

from ._helpers import stream_name

pytestmark = pytest.mark.timeout(120)


async def test_client_close_while_a_consumer_closes_returns(stream_server, node_client):
    """consumer.close() and client.close() together send two Close frames on the consumer's
    connection; client.close() returns once both are answered (it hung when the server
    answered the first and hung up)."""
    result = await node_client.run("close_while_consumer_closes", stream_server.host,
                                   stream_server.port, timeout=30,
                                   stream=stream_name("node-close"))
    assert result == {"closed": True}


async def test_wrong_password_is_refused_without_a_server_close(stream_server, node_client):
    """The refusal (0x08) is all the client gets before the socket closes: a Close frame
    from the server there made it throw "Unknown response 22" from its socket handler."""
    result = await node_client.run("refused_connect", stream_server.host, stream_server.port,
                                   timeout=30, password="not-the-password")
    # this client version reports a refused login as an unhandled rejection
    assert result == {"closed": True, "errors": ["Unable Authenticate -> 8"]}


@pytest.mark.parametrize("segment_size", [1, 1000])
async def test_small_max_segment_size_is_accepted(stream_server, node_client, segment_size):
    """RabbitMQ takes any stream-max-segment-size-bytes up to 3 GB (riverlog raises those
    below its smallest segment, 4096); the stream then works as any other."""
    result = await node_client.run(
        "create_publish_consume", stream_server.host, stream_server.port,
        stream=stream_name("node-segment"), count=50,
        arguments={"stream-max-segment-size-bytes": segment_size})
    assert result == {"bodies": [f"message-{i}" for i in range(50)]}
