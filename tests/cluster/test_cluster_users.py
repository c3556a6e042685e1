"""Runtime users and permissions in a cluster (issue 30 item 2): a change made through one
server's management API is agreed through Raft (the change_access command), so the user logs
in on every server, its permission holds there, its deletion reaches them all, and a server
restarted from its files catches up with a change it missed. Virtual hosts are agreed the
same way."""
from __future__ import annotations

import asyncio

import pytest
from rstream import Producer

from _apps import started, stopped, until
from riverlog.broker.stream import StreamConfig
from riverlog.errors import NoSuchVhostError
from riverlog.server.app import App
from riverlog.vhost_names import internal
from server.test_management import basic, call


async def test_a_user_made_on_one_server_logs_in_on_the_others(tmp_path):
    cluster = await started(tmp_path)
    again = None
    try:
        a, b, c = cluster
        assert (await call(a, "PUT", "/api/users/carol",
                           json={"password": "c-pw", "tags": "administrator"}))[0] == 201
        assert (await call(b, "PUT", "/api/permissions/%2F/carol",
                           json={"configure": "^c", "write": "", "read": ".*"}))[0] == 201
        carol = basic("carol", "c-pw")

        async def everywhere(servers, expected: int):
            return all([(await call(x, "GET", "/api/whoami", auth=carol))[0] == expected
                        for x in servers])
        await until("carol logs in on every server", lambda: everywhere(cluster, 200))
        assert (await call(c, "GET", "/api/permissions/%2F/carol", auth=carol))[1] == {
            "user": "carol", "vhost": "/", "configure": "^c", "write": "", "read": ".*"}
        assert (await call(c, "GET", "/api/users/carol", auth=carol))[1]["tags"] == [
            "administrator"]

        # c stops; a new password is set on b meanwhile; c, started again from its files,
        # catches up with it
        await c.stop()
        cluster.remove(c)
        await until("a Raft leader both servers left know", lambda: any(
            x.cluster.metadata.is_leader for x in cluster) and len(
            {x.cluster.metadata.leader for x in cluster} - {None}) == 1)
        assert (await call(b, "PUT", "/api/users/carol", auth=carol,
                           json={"password": "c-pw2", "tags": "administrator"}))[0] == 204
        assert (await call(b, "GET", "/api/whoami", auth=carol))[0] == 401
        again = App(c.config)
        await again.start()
        carol = basic("carol", "c-pw2")
        await until("the new password on the restarted server", lambda: everywhere(
            [a, b, again], 200))

        assert (await call(a, "DELETE", "/api/users/carol"))[0] == 204
        assert (await call(b, "DELETE", "/api/users/carol"))[0] == 404  # agreed: gone there
        await until("carol deleted everywhere", lambda: everywhere([a, b, again], 401))
    finally:
        await stopped(cluster + ([again] if again is not None else []))


async def test_a_vhost_made_on_one_server_is_agreed_and_its_deletion_reaches_all(tmp_path):
    """Virtual hosts (issue 30 item 1) ride the same change_access command: made on a, seen
    and opened on c; its stream, made on c, is deleted through the placement when b deletes
    the virtual host, and the connection on it is closed."""
    cluster = await started(tmp_path)
    try:
        a, b, c = cluster
        assert (await call(a, "PUT", "/api/vhosts/shared", json={"description": "d"}))[0] == 201
        assert (await call(b, "PUT", "/api/vhosts/shared"))[0] == 204  # agreed: exists there

        async def seen(servers):
            return all([(await call(x, "GET", "/api/vhosts/shared"))[0] == 200
                        for x in servers])
        await until("the vhost on every server", lambda: seen(cluster))
        closed = asyncio.Event()
        async with Producer("127.0.0.1", c.rabbitmq_stream.port, username="guest",
                            password="guest", vhost="shared",
                            on_close_handler=lambda *a: closed.set()) as producer:
            await producer.create_stream("s")
            name = internal("shared", "s")
            await until("its stream everywhere", lambda: all(
                x.broker.placement.of(name, 0) is not None for x in cluster))
            await producer.send_wait("s", b"x")  # a publisher connection, to the leader
            assert any(c.link.vhost == "shared" for x in cluster
                       for c in x.rabbitmq_stream.connections)
            assert (await call(b, "DELETE", "/api/vhosts/shared"))[0] == 204
            await asyncio.wait_for(closed.wait(), 30)
        await until("its stream deleted everywhere", lambda: all(
            x.broker.placement.of(name, 0) is None for x in cluster))
        assert (await call(c, "GET", "/api/vhosts/shared"))[0] == 404
        # a create that passed its vhost check before the deletion and reaches Raft after
        # it: the transition refuses it on every server (no orphan stream)
        with pytest.raises(NoSuchVhostError):
            await a.broker.placement.create_stream(internal("shared", "late"), StreamConfig())
        assert all(x.broker.placement.of(internal("shared", "late"), 0) is None
                   for x in cluster)
    finally:
        await stopped(cluster)
