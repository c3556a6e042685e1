# The embedded nats-servers of a cluster joined by routes (riverlog.server.embedded_nats
# route_settings): real nats-server children; two with the same Raft password form one NATS
# cluster (a message published on one reaches a subscriber on the other), a third with another
# password is refused by the route's authorization (nats-server logs the authentication error).
from __future__ import annotations

import asyncio
import logging

import nats

from compat._servers import HOST, free_port
from riverlog.server.embedded_nats import EmbeddedNats, route_settings


async def test_routes_join_only_with_the_raft_password(caplog):
    ports = [free_port() for _ in range(3)]
    servers = [EmbeddedNats(HOST, 0, name=f"n{i}", settings={"cluster": route_settings(
        "ns", HOST, ports[i], (f"{HOST}:{ports[0]}",) if i else (f"{HOST}:{ports[1]}",),
        "wrong" if i == 2 else "right")}) for i in range(3)]
    caplog.set_level(logging.WARNING, logger="riverlog.nats")
    for server in servers:
        await server.start()
    clients = []
    try:
        clients = [await nats.connect(s.url) for s in servers]
        sub = await clients[0].subscribe("t")
        await clients[0].flush()
        for _ in range(600):  # the route forms within seconds: publish until one arrives
            await clients[1].publish("t", b"over the route")
            try:
                msg = await sub.next_msg(timeout=0.1)
                break
            except nats.errors.TimeoutError:
                continue
        assert msg.data == b"over the route"
        for _ in range(600):
            if any("authentication error" in r.getMessage().lower() for r in caplog.records):
                break
            await asyncio.sleep(0.1)
        refused = [r.getMessage() for r in caplog.records  # a route (rid) refused
                   if "rid:" in r.getMessage() and "authentication error" in r.getMessage()]
        assert refused and all(f"[{servers[2].proc.pid}]" not in m for m in refused), refused
    finally:
        for client in clients:
            await client.close()
        for server in servers:
            await server.stop()
