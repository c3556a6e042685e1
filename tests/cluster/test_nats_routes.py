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
from riverlog.server.nats_link import settle


async def _first_arrival(nc, subject: str, data: bytes, sub, tries: int) -> bool:
    """Publish ``data`` on ``subject`` through ``nc`` every 0.1 s, at most ``tries`` times,
    until ``sub`` receives it: True once it did."""
    for _ in range(tries):
        await nc.publish(subject, data)
        try:
            msg = await sub.next_msg(timeout=0.1)
        except nats.errors.TimeoutError:
            continue
        return msg.data == data
    return False


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
        await settle(clients[0])
        # the route forms within seconds: publish until one arrives
        assert await _first_arrival(clients[1], "t", b"over the route", sub, 600)
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


async def test_a_clustered_nats_server_holds_no_password_in_clear(caplog):
    """nats-server warns "Plaintext passwords detected" at start for any user whose password
    is no bcrypt hash: a cluster member's embedded nats-server (users, no_auth_user, routes)
    starts without the warning, its users' passwords are bcrypt hashes only (the route
    authorization holds the password its route URLs log in with: nats-server logs in to the
    routes it learns by gossip with those credentials, so it cannot be a hash, and the warning
    does not look at routes), and a client without credentials still connects, kept out of
    riverlog's own subjects."""
    import json
    import re

    from riverlog.config import NatsConfig
    from riverlog.server.nats_link import NatsLink

    caplog.set_level(logging.DEBUG, logger="riverlog.nats")
    link = NatsLink(NatsConfig(host=HOST, port=0), name="n0", routes=route_settings(
        "ns", HOST, free_port(), (f"{HOST}:{free_port()}",), "right"))
    await link.start()
    errors = []

    async def on_error(exc):
        errors.append(str(exc).lower())
    try:
        with open(link.embedded.proc.args[-1]) as f:  # the file nats-server was started with
            text = f.read()
        config = json.loads(text)
        users = config["authorization"]["users"]
        # nats-server takes a password for a bcrypt hash by its prefix (auth.go isBcrypt)
        assert all(re.match(r"\$2[abxy]\$", u["password"]) for u in users if "password" in u)
        assert {u["nkey"] for u in users if "nkey" in u} == {config["no_auth_user"]}
        (password,) = set(re.findall(r"nats-route://riverlog-route:(\w+)@", text))
        assert config["cluster"]["authorization"]["password"] == password
        nc = await nats.connect(link.url, error_cb=on_error)
        await nc.subscribe("liftbridge-default.notify.a")
        await settle(nc)
        for _ in range(100):
            if errors:
                break
            await asyncio.sleep(0.05)
        assert errors and "permissions violation for subscription" in errors[0]
        await nc.close()
    finally:
        await link.stop()
    logged = [r.getMessage() for r in caplog.records if "nats-server:" in r.getMessage()]
    assert any("Server is ready" in line for line in logged)
    assert not [line for line in logged if "plaintext" in line.lower()]


async def test_answers_to_riverlogs_own_requests_are_out_of_users_reach():
    """A cluster member's NATS connection gets the answers to its requests (a follower's
    fetches: the leader's chunks, high watermark and Riverlog-Compaction-Point) on inboxes
    under `<namespace>.`, which no NATS user may subscribe or publish to. Before, they came
    on nats-py's `_INBOX.<random>.`, where a client without credentials (the no_auth_user)
    saw every answer and could race a forged one."""
    from riverlog.config import NatsConfig
    from riverlog.server.nats_link import NatsLink

    link = NatsLink(NatsConfig(host=HOST, port=0), name="n0", routes=route_settings(
        "ns", HOST, free_port(), (f"{HOST}:{free_port()}",), "right"))
    await link.start()
    spy = None
    try:
        async def leader(msg):
            await msg.respond(b"chunks")
        await link.nc.subscribe("liftbridge-default.s.0.replicate", cb=leader)
        spy = await nats.connect(link.url)  # no credentials
        seen = await spy.subscribe("_INBOX.>")
        await settle(spy)
        reply = await link.nc.request("liftbridge-default.s.0.replicate", b"fetch", timeout=10)
        assert reply.data == b"chunks"
        await spy.publish("_INBOX.after", b"")  # reaches the spy after any earlier answer
        assert (await seen.next_msg(timeout=10)).subject == "_INBOX.after"
    finally:
        if spy is not None:
            await spy.close()
        await link.stop()


async def test_a_cluster_links_two_connections_come_back_together():
    """A cluster member's NATS link has two connections: the door's (``nc``) and the
    servers' own (``cluster_nc``: replication, status, joins). When nats-server closes the
    cluster one for good (here: a control line over its max_control_line), both are made
    anew, and the reconnect listeners run once with the new door connection, the new cluster
    connection already in place (so the replication engine starts over on it)."""
    from riverlog.config import NatsConfig
    from riverlog.server.nats_link import NatsLink

    server = EmbeddedNats(HOST, 0, settings={"max_control_line": 512})
    await server.start()
    link = NatsLink(NatsConfig(servers=(server.url,)), clustered=True)
    try:
        await link.start()
        old, old_cluster = link.nc, link.cluster_nc
        assert old is not old_cluster and old_cluster.is_connected
        seen = []

        async def listener(nc):
            seen.append((nc, link.cluster_nc))
        link.add_reconnect_listener(listener)
        await old_cluster.publish("x" * 600, b"")  # -ERR maximum control line exceeded
        for _ in range(300):
            if seen:
                break
            await asyncio.sleep(0.05)
        assert seen == [(link.nc, link.cluster_nc)]
        assert link.nc is not old and link.cluster_nc not in (old_cluster, link.nc)
        assert link.nc.is_connected and link.cluster_nc.is_connected
        assert old.is_closed and old_cluster.is_closed
        sub = await link.nc.subscribe("t.both")  # both new connections carry messages
        await settle(link.nc)
        # publish until one arrives: right after a flushed SUB, a first message between two
        # plain nats-py connections of a fresh nats-server is lost in ~1 of 20 runs here
        assert await _first_arrival(link.cluster_nc, "t.both", b"over the cluster", sub, 100)
    finally:
        await link.stop()
        await server.stop()
