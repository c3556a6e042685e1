# nats_link.settle: the barrier that proves nats-server read a SUB just made (a publisher on
# another connection then reaches it). Real nats-server and nats-py, with a loopback relay
# between them that records what the client wrote, in order.
from __future__ import annotations

import nats

from _relay import Relay
from riverlog.server.embedded_nats import EmbeddedNats
from riverlog.server.nats_link import settle


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
        relay.close()
        await server.stop()
