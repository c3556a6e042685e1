# A riverlog server for the Spark tests: the real App (RabbitMQ Stream door only) on a free
# port, running on its own event loop in a daemon thread of the test process, so Spark's
# executors (other processes) reach it over TCP like any client.
from __future__ import annotations

import asyncio
import threading

from riverlog.client import Client
from riverlog.config import RabbitStreamConfig, SecurityConfig, ServerConfig
from riverlog.server.app import App


class ThreadServer:
    """``start()``, then ``servers`` ("127.0.0.1:PORT") and ``client()``; ``stop()``. With
    ``security`` holding TLS, the door's TLS listener is on ``app.rabbitmq_stream.tls_port``.
    ``config``: more ServerConfig fields (e.g. ``tables``)."""

    def __init__(self, data_dir: str, security: SecurityConfig | None = None, **config) -> None:
        self.data_dir = data_dir
        self.loop = asyncio.new_event_loop()
        self.app = App(ServerConfig(data_dir=data_dir,
                                    rabbitmq_stream=RabbitStreamConfig(
                                        port=0, tls_port=0, silent_close_delay_ms=0),
                                    security=security or SecurityConfig(), **config))
        self.thread = threading.Thread(target=self.loop.run_forever, name="riverlog-test-server",
                                       daemon=True)
        self.port = 0

    def start(self) -> "ThreadServer":
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.app.start(), self.loop).result(30)
        self.port = self.app.rabbitmq_stream.port
        return self

    @property
    def servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self) -> Client:
        return Client("127.0.0.1", self.port)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.app.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
