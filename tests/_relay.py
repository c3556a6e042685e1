# A loopback TCP relay for tests: clients connect to it and it connects them on to a real
# server (nats-server), recording what the clients wrote and, once ``delay_s`` is set, holding
# what the server sends for that long (the machine has no tc netem: this is the userspace
# delay). Order is kept in both directions.
from __future__ import annotations

import asyncio


class Relay:
    """``await start()`` returns the port clients connect to; ``sent`` holds every byte the
    clients wrote, in order; ``delay_s`` (s, 0 at first) holds the server's bytes back that long
    from the moment they are read; ``close()``."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.host, self.port = host, port
        self.sent = bytearray()
        self.delay_s = 0.0
        self.server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, self.host, 0)
        return self.server.sockets[0].getsockname()[1]

    async def _relay(self, client_r, client_w) -> None:
        self._tasks.add(asyncio.current_task())
        server_r, server_w = await asyncio.open_connection(self.host, self.port)
        held: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                self.sent += data
                server_w.write(data)
                await server_w.drain()
            server_w.close()

        async def downstream_read() -> None:
            while data := await server_r.read(65536):
                held.put_nowait((loop.time() + self.delay_s, data))
            held.put_nowait((0.0, b""))

        async def downstream_write() -> None:
            while True:
                due, data = await held.get()
                if not data:
                    break
                await asyncio.sleep(max(0.0, due - loop.time()))
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        try:
            await asyncio.gather(upstream(), downstream_read(), downstream_write())
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            client_w.close()
            server_w.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in self._tasks:
            task.cancel()
