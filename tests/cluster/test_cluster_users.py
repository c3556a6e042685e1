"""Runtime users and permissions in a cluster (issue 30 item 2): a change made through one
server's management API is agreed through Raft (the change_access command), so the user logs
in on every server, its permission holds there, and its deletion reaches them all."""
from __future__ import annotations

from _apps import until
from server.test_management import basic, call


async def test_a_user_made_on_one_server_logs_in_on_the_others(cluster):
    a, b, c = cluster
    assert (await call(a, "PUT", "/api/users/carol",
                       json={"password": "c-pw", "tags": "administrator"}))[0] == 201
    assert (await call(b, "PUT", "/api/permissions/%2F/carol",
                       json={"configure": "^c", "write": "", "read": ".*"}))[0] == 201
    carol = basic("carol", "c-pw")

    async def everywhere(expected: int):
        return all([(await call(x, "GET", "/api/whoami", auth=carol))[0] == expected
                    for x in cluster])
    await until("carol logs in on every server", lambda: everywhere(200))
    assert (await call(c, "GET", "/api/permissions/%2F/carol", auth=carol))[1] == {
        "user": "carol", "vhost": "/", "configure": "^c", "write": "", "read": ".*"}
    assert (await call(c, "GET", "/api/users/carol", auth=carol))[1]["tags"] == [
        "administrator"]
    # an update made on a third server (she changes her password herself: an administrator)
    assert (await call(c, "PUT", "/api/users/carol", auth=carol,
                       json={"password": "c-pw2", "tags": "administrator"}))[0] == 204
    assert (await call(c, "GET", "/api/whoami", auth=carol))[0] == 401
    await until("the old password refused everywhere", lambda: everywhere(401))
    assert (await call(a, "DELETE", "/api/users/carol"))[0] == 204
    assert (await call(c, "DELETE", "/api/users/carol"))[0] == 404  # agreed: gone there too
    carol = basic("carol", "c-pw2")
    await until("carol deleted everywhere", lambda: everywhere(401))
