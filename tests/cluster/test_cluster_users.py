"""Runtime users and permissions in a cluster (issue 30 item 2): a change made through one
server's management API is agreed through Raft (the change_access command), so the user logs
in on every server, its permission holds there, its deletion reaches them all, and a server
restarted from its files catches up with a change it missed."""
from __future__ import annotations

from _apps import started, stopped, until
from riverlog.server.app import App
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
