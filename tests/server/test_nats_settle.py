# nats_link.settle: the barrier that proves nats-server read a SUB just made (a publisher on
# another connection then reaches it). Real nats-server and nats-py, with a loopback relay
# between them that records what the client wrote, in order.
from __future__ import annotations

import asyncio

import nats

from riverlog.server.embedded_nats import EmbeddedNats
from riverlog.server.nats_link import settle


class Relay:
    """Loopback TCP relay to ``port``; ``sent`` is every byte the client wrote, in order."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sent = bytearray()
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _relay(self, client_r, client_w) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.port)

        async def pump(reader, writer, record: bool) -> None:
            while data := await reader.read(65536):
                if record:
                    self.sent += data
                writer.write(data)
                await writer.drain()
            writer.close()

        await asyncio.gather(pump(client_r, server_w, True), pump(server_r, client_w, False),
                             return_exceptions=True)


async def test_settle_returns_after_the_server_read_a_sub_just_made():
    server = EmbeddedNats("127.0.0.1", 0)
    await server.start()
    relay = Relay(server.port)
    try:
        nc = await nats.connect(f"nats://127.0.0.1:{await relay.start()}")
        other = await nats.connect(server.url)
        for round_ in range(20):
            subject = f"settle.{round_}"
            before = len(relay.sent)
            sub = await nc.subscribe(subject)
            await settle(nc)
            written = bytes(relay.sent[before:])
            # the SUB went out before the last PING whose PONG settle() waited for
            assert written.rindex(b"PING\r\n") > written.index(f"SUB {subject} ".encode())
            await other.publish(subject, b"x")  # another connection's publish reaches it
            assert (await sub.next_msg(timeout=5)).data == b"x"
        await nc.close()
        await other.close()
    finally:
        relay.server.close()
        await server.stop()
