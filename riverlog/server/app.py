# The running server: opens the broker, starts every front door, and stops them in order on
# shutdown (stop accepting, finish in-flight confirms, close connections, close the logs).
# Rules: startup failures (a port taken, a data folder not writable) raise with a message
# that names the cause; shutdown never loses a confirmed message.
from __future__ import annotations

import logging
import os

from .. import __version__
from ..broker import Broker
from ..config import ServerConfig
from ..security.guard import Guard
from ..tables.service import TableService
from .rabbitmq_stream import RabbitStreamServer

# The Liftbridge doors (NATS bridge, gRPC API) import grpc and nats-py: loaded only when on.

log = logging.getLogger("riverlog")


class App:
    """The broker and its doors. ``await start()``, then ``await stop()``."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.guard = Guard(config.security)  # users, authorization, TLS (docs/security.md)
        self.broker = Broker(config.data_dir, config.log)
        self.rabbitmq_stream: RabbitStreamServer | None = None
        self.liftbridge = None  # server.liftbridge.Liftbridge, when a Liftbridge door is on
        self.nats = None  # server.nats_bridge.NatsBridge
        self.grpc = None  # server.grpc_api.GrpcApi
        self.metrics = None  # server.metrics_http.MetricsServer, when config.metrics is set
        self.tables = TableService(self.broker, config.tables, config.table_dir)

    async def start(self) -> None:
        self.broker.open()
        self.broker.start()
        self.tables.start()
        try:
            await self._start_liftbridge()
            self.rabbitmq_stream = RabbitStreamServer(self.broker, self.config.rabbitmq_stream,
                                                      self.guard)
            await self.rabbitmq_stream.start()
            if self.config.metrics is not None:
                from .metrics_http import MetricsServer
                self.metrics = MetricsServer(self, self.config.metrics)
                self.metrics.start()
        except BaseException:
            if self.rabbitmq_stream is not None:
                await self.rabbitmq_stream.stop()
            await self._stop_liftbridge()
            await self.tables.stop()
            await self.broker.close()
            raise
        log.info("riverlog %s serving %s (%d streams, durability %s)", __version__,
                 os.path.abspath(self.config.data_dir),
                 sum(1 for name in self.broker.streams if not name.startswith("__")),
                 self.config.log.durability.value)

    async def stop(self) -> None:
        log.info("shutting down")
        if self.metrics is not None:
            await self.metrics.stop()
        if self.rabbitmq_stream is not None:
            await self.rabbitmq_stream.stop()
        await self._stop_liftbridge()
        await self.tables.stop()
        await self.broker.close()
        log.info("stopped")

    async def _start_liftbridge(self) -> None:
        """NATS first (the embedded server, then the bridge's subscriptions), then gRPC."""
        if self.config.nats is None and self.config.grpc is None:
            return
        from ..config import GrpcConfig
        from .liftbridge import Liftbridge
        self.liftbridge = Liftbridge(self.broker, self.config.grpc or GrpcConfig(),
                                     self.config.nats)
        self.liftbridge.open()
        self.liftbridge.start()
        if self.config.nats is not None:
            from .nats_bridge import NatsBridge
            self.nats = NatsBridge(self.liftbridge, self.config.nats, self.guard)
            await self.nats.start()
        if self.config.grpc is not None:
            from .grpc_api import GrpcApi
            self.grpc = GrpcApi(self.liftbridge, self.config.grpc, self.guard)
            await self.grpc.start()

    async def _stop_liftbridge(self) -> None:
        """gRPC (stop taking calls), NATS bridge (acks out, unsubscribe, nats-server down),
        then the Liftbridge layer (pending appends written)."""
        grpc, self.grpc = self.grpc, None
        if grpc is not None:
            await grpc.stop()
        nats, self.nats = self.nats, None
        if self.liftbridge is not None:
            await self.liftbridge.appenders.drain()
        if nats is not None:
            await nats.stop()
        liftbridge, self.liftbridge = self.liftbridge, None
        if liftbridge is not None:
            await liftbridge.close()
