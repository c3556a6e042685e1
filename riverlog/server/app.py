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
from .rabbitmq_stream import RabbitStreamServer

log = logging.getLogger("riverlog")


class App:
    """The broker and its doors. ``await start()``, then ``await stop()``."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.broker = Broker(config.data_dir, config.log)
        self.rabbitmq_stream: RabbitStreamServer | None = None

    async def start(self) -> None:
        self.broker.open()
        self.broker.start()
        try:
            self.rabbitmq_stream = RabbitStreamServer(self.broker, self.config.rabbitmq_stream)
            await self.rabbitmq_stream.start()
        except BaseException:
            await self.broker.close()
            raise
        log.info("riverlog %s serving %s (%d streams, durability %s)", __version__,
                 os.path.abspath(self.config.data_dir), len(self.broker.streams),
                 self.config.log.durability.value)

    async def stop(self) -> None:
        log.info("shutting down")
        if self.rabbitmq_stream is not None:
            await self.rabbitmq_stream.stop()
        await self.broker.close()
        log.info("stopped")
