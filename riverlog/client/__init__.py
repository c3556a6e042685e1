# riverlog.client: a small riverlog client over the RabbitMQ Stream protocol (TCP 5552, TLS
# 5551), used by the Spark executors, the CLI, the demo jobs and the benchmarks. This file
# only re-exports the public names. Modules: connection (socket, handshake, requests,
# heartbeats, frame dispatch), async_client (AsyncClient: the requests as methods), writer
# (AsyncPublisher: publishing ids, confirms, flow control), reader (AsyncSubscription and
# Chunk: whole chunks, credit), blocking (Client, Publisher, Subscription: the same API over
# a loop in a daemon thread; read_range).
from __future__ import annotations

from ..protocol.rabbitmq_stream import OffsetType
from .async_client import AsyncClient
from .blocking import Client, Publisher, Subscription, read_range
from .connection import DEFAULT_PORT, DEFAULT_TIMEOUT, ClientError, parse_servers
from .reader import AsyncSubscription, Chunk
from .writer import AsyncPublisher

__all__ = ["AsyncClient", "AsyncPublisher", "AsyncSubscription", "Chunk", "Client",
           "ClientError", "DEFAULT_PORT", "DEFAULT_TIMEOUT", "OffsetType", "Publisher",
           "Subscription", "parse_servers", "read_range"]
