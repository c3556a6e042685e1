"""Users and permissions at runtime through the management API (issue 30 item 2), over real
HTTP to a running App: RabbitMQ's routes, bodies and status codes (rabbit_mgmt_wm_user,
rabbit_mgmt_wm_permission), administrators only, configuration-file users read-only, every
change logged, and the table kept in DATA/access.json across a restart (hashes only)."""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import os

import pytest

from riverlog.security.access_table import (SHA256, AccessTable, Permission, put_user,
                                            set_permissions)
from riverlog.server.runtime_access import ACCESS_FILE
from server.test_management import _app, basic, call

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def app(tmp_path):
    app = await _app(tmp_path)
    yield app
    await app.stop()


def rabbit_sha256(password: str, salt: bytes = b"\x01\x02\x03\x04") -> str:
    """RabbitMQ's rabbit_password_hashing_sha256 hash: base64(salt + sha256(salt + pw))."""
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


async def test_users_shapes_and_status_codes(app, caplog):
    caplog.set_level(logging.INFO, "riverlog.management")
    status, users = await call(app, "GET", "/api/users")
    assert status == 200
    assert users == [{"name": "guest", "password_hash": users[0]["password_hash"],
                      "hashing_algorithm": "riverlog_password_hashing_bcrypt",
                      "tags": ["administrator"], "limits": {}, "source": "configuration"}]

    assert (await call(app, "PUT", "/api/users/alice",
                       json={"password": "alice-pw", "tags": "management,monitoring"}))[0] == 201
    status, alice = await call(app, "GET", "/api/users/alice")
    assert status == 200 and alice["tags"] == ["management", "monitoring"]
    assert alice["password_hash"].startswith("$2b$10$") and "alice-pw" not in json.dumps(alice)
    assert alice["hashing_algorithm"] == "riverlog_password_hashing_bcrypt"
    # she logs in with it; an update keeps her password when none is given
    assert (await call(app, "GET", "/api/whoami", auth=basic("alice", "alice-pw"))) == (
        200, {"name": "alice", "tags": ["management", "monitoring"], "is_internal_user": True})
    assert (await call(app, "PUT", "/api/users/alice", json={"tags": ["monitoring"]}))[0] == 204
    assert (await call(app, "GET", "/api/whoami", auth=basic("alice", "alice-pw")))[0] == 200
    # a new password: the old one no longer logs in (the next login sees it)
    assert (await call(app, "PUT", "/api/users/alice", json={"password": "new-pw"}))[0] == 204
    assert (await call(app, "GET", "/api/whoami", auth=basic("alice", "alice-pw")))[0] == 401
    assert (await call(app, "GET", "/api/whoami", auth=basic("alice", "new-pw")))[0] == 200

    # password_hash: bcrypt as given, and RabbitMQ's own salted SHA-256
    bcrypt_hash = alice["password_hash"]
    assert (await call(app, "PUT", "/api/users/bob", json={"password_hash": bcrypt_hash,
                                                           "tags": ""}))[0] == 201
    assert (await call(app, "GET", "/api/whoami", auth=basic("bob", "alice-pw")))[0] == 200
    assert (await call(app, "PUT", "/api/users/rabbit", json={
        "password_hash": rabbit_sha256("r-pw"), "hashing_algorithm": SHA256}))[0] == 201
    assert (await call(app, "GET", "/api/users/rabbit"))[1]["hashing_algorithm"] == SHA256
    assert (await call(app, "GET", "/api/whoami", auth=basic("rabbit", "r-pw")))[0] == 200
    assert (await call(app, "GET", "/api/whoami", auth=basic("rabbit", "wrong")))[0] == 401
    assert sorted(u["name"] for u in (await call(app, "GET", "/api/users"))[1]) == [
        "alice", "bob", "guest", "rabbit"]

    # bad input: 400 with RabbitMQ's body, never a crash
    for path, body in (("/api/users/x", {"password_hash": "not-a-hash"}),
                       ("/api/users/x", {"password": 5}),
                       ("/api/users/x", {"password": "p" * 73}),
                       ("/api/users/x", {"tags": 5}),
                       ("/api/users/x", {"tags": "bad tag!"}),
                       ("/api/users/x", {"password_hash": bcrypt_hash,
                                         "hashing_algorithm": "md5"}),
                       ("/api/users/x", [1]),
                       ("/api/users/a%01b", {"password": "p"}),
                       ("/api/users/riverlog-bridge-1234", {"password": "p"}),
                       ("/api/users/" + "n" * 256, {"password": "p"}),
                       ("/api/users/guest", {"password": "p"})):
        status, answer = await call(app, "PUT", path, json=body)
        assert status == 400 and answer["error"] == "bad_request", (path, body, answer)
    status, answer = await call(app, "PUT", "/api/users/x", data=b"{not json",
                                headers={"Content-Type": "application/json"})
    assert status == 400 and answer["error"] == "bad_request"
    assert "x" not in [u["name"] for u in (await call(app, "GET", "/api/users"))[1]]
    assert (await call(app, "DELETE", "/api/users/guest"))[0] == 400  # the file's
    assert (await call(app, "DELETE", "/api/users/nobody")) == (
        404, {"error": "Object Not Found", "reason": "Not Found"})
    assert (await call(app, "GET", "/api/users/nobody"))[0] == 404

    assert (await call(app, "DELETE", "/api/users/bob"))[0] == 204
    assert (await call(app, "GET", "/api/whoami", auth=basic("bob", "alice-pw")))[0] == 401
    assert "user 'alice' created by 'guest'" in caplog.text
    assert "user 'bob' deleted by 'guest'" in caplog.text
    assert "new-pw" not in caplog.text and "alice-pw" not in caplog.text


async def test_permissions_shapes_and_status_codes(app, caplog):
    caplog.set_level(logging.INFO, "riverlog.management")
    assert (await call(app, "PUT", "/api/users/alice", json={"password": "pw"}))[0] == 201
    path = "/api/permissions/%2F/alice"
    assert (await call(app, "GET", path))[0] == 404
    body = {"configure": "^alice\\.", "write": ".*", "read": ""}
    assert (await call(app, "PUT", path, json=body))[0] == 201
    assert (await call(app, "PUT", path, json={**body, "read": "x"}))[0] == 204
    expected = {"user": "alice", "vhost": "/", **body, "read": "x"}
    assert (await call(app, "GET", path)) == (200, expected)
    assert (await call(app, "GET", "/api/permissions"))[1] == [expected]
    assert (await call(app, "GET", "/api/users/alice/permissions"))[1] == [expected]
    assert (await call(app, "GET", "/api/vhosts/%2F/permissions"))[1] == [expected]
    assert (await call(app, "GET", "/api/vhosts/other/permissions"))[0] == 404
    # the configuration file's guest may get a permission (then it decides for guest)
    assert (await call(app, "PUT", "/api/permissions/%2F/guest",
                       json={"configure": ".*", "write": ".*", "read": ".*"}))[0] == 201

    for path_, body_, reason in (
            ("/api/permissions/other/alice", body, "vhost_or_user_not_found"),
            ("/api/permissions/%2F/nobody", body, "vhost_or_user_not_found"),
            (path, {"configure": "(", "write": "", "read": ""}, "invalid regular expression"),
            (path, {"configure": ".*", "write": 1, "read": ""}, "write must be a string"),
            (path, {"configure": ".*"}, "key_missing: write, read")):
        status, answer = await call(app, "PUT", path_, json=body_)
        assert status == 400 and answer["error"] == "bad_request", (path_, body_, answer)
        assert reason in answer["reason"]
    assert (await call(app, "GET", path))[1]["read"] == "x"  # unchanged by the refusals
    assert (await call(app, "GET", "/api/permissions/other/alice"))[0] == 404
    assert (await call(app, "DELETE", "/api/permissions/other/alice"))[0] == 404

    assert (await call(app, "DELETE", path))[0] == 204
    assert (await call(app, "DELETE", path))[0] == 404
    assert [p["user"] for p in (await call(app, "GET", "/api/permissions"))[1]] == ["guest"]
    # deleting a user takes its permission with it
    assert (await call(app, "PUT", path, json=body))[0] == 201
    assert (await call(app, "DELETE", "/api/users/alice"))[0] == 204
    assert [p["user"] for p in (await call(app, "GET", "/api/permissions"))[1]] == ["guest"]
    assert "permissions of 'alice' on vhost '/' set by 'guest'" in caplog.text
    assert "permissions of 'alice' on vhost '/' cleared by 'guest'" in caplog.text


async def test_only_an_administrator_changes_users(app):
    assert (await call(app, "PUT", "/api/users/mona", json={"password": "m-pw",
                                                           "tags": "monitoring"}))[0] == 201
    assert (await call(app, "PUT", "/api/users/root", json={"password": "r-pw",
                                                           "tags": "administrator"}))[0] == 201
    mona = basic("mona", "m-pw")
    for method, path, body in (
            ("GET", "/api/users", None), ("GET", "/api/users/mona", None),
            ("PUT", "/api/users/mona", {"tags": "administrator"}),  # no escalation
            ("PUT", "/api/users/eve", {"password": "e", "tags": "administrator"}),
            ("DELETE", "/api/users/root", None), ("GET", "/api/permissions", None),
            ("PUT", "/api/permissions/%2F/mona", {"configure": ".*", "write": ".*",
                                                  "read": ".*"}),
            ("DELETE", "/api/permissions/%2F/mona", None)):
        assert (await call(app, method, path, auth=mona, json=body)) == (
            403, {"error": "not_authorized", "reason": "Not administrator user"}), path
        status, answer = await call(app, method, path, auth=basic("mona", "wrong"), json=body)
        assert status == 401 and answer["error"] == "not_authorized"
        assert (await call(app, method, path, auth={}, json=body))[0] == 401
    assert (await call(app, "GET", "/api/users/mona"))[1]["tags"] == ["monitoring"]
    assert (await call(app, "GET", "/api/users/eve"))[0] == 404
    # a runtime administrator may; and may take its own tag away
    root = basic("root", "r-pw")
    assert (await call(app, "PUT", "/api/users/eve", auth=root, json={"password": "e"}))[0] == 201
    assert (await call(app, "PUT", "/api/users/root", auth=root, json={"tags": ""}))[0] == 204
    assert (await call(app, "GET", "/api/users", auth=root))[0] == 403


async def test_the_table_survives_a_restart_with_hashes_only(tmp_path):
    app = await _app(tmp_path)
    try:
        assert (await call(app, "PUT", "/api/users/alice",
                           json={"password": "secret-pw", "tags": "administrator"}))[0] == 201
        assert (await call(app, "PUT", "/api/permissions/%2F/alice",
                           json={"configure": "c", "write": "w", "read": "r"}))[0] == 201
    finally:
        await app.stop()
    path = os.path.join(app.config.data_dir, ACCESS_FILE)
    stored = open(path).read()
    assert "secret-pw" not in stored and "$2b$10$" in stored
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert not os.path.exists(path + ".tmp")
    app = await _app(tmp_path)
    try:
        alice = basic("alice", "secret-pw")
        assert (await call(app, "GET", "/api/whoami", auth=alice))[1]["tags"] == ["administrator"]
        assert (await call(app, "GET", "/api/permissions/%2F/alice", auth=alice))[1] == {
            "user": "alice", "vhost": "/", "configure": "c", "write": "w", "read": "r"}
    finally:
        await app.stop()


def test_expressions_apply_as_rabbitmq_applies_them():
    """re:run semantics (rabbit_auth_backend_internal:check_resource_access): unanchored, ""
    matches nothing; configure = create and delete, write = publish, read = consume."""
    p = Permission(configure="^orders\\.", write="eu", read="")
    assert p.permits("orders.eu", "create") and p.permits("orders.eu", "delete")
    assert not p.permits("my.orders.eu", "create")
    assert p.permits("orders.eu", "publish") and p.permits("x-eu-y", "publish")  # unanchored
    assert not p.permits("orders.us", "publish")
    assert not p.permits("orders.eu", "consume") and not p.permits("", "consume")
    assert not p.permits("orders.eu", "admin")
    table, created = set_permissions(AccessTable(), "a", ".*", ".*", ".*")
    assert created and set_permissions(table, "a", "", "", "")[1] is False
    table, _ = put_user(table, "a", rabbit_sha256("pw"), SHA256, ("administrator",))
    assert table.users["a"].check("pw") and not table.users["a"].check("pw2")
    assert table.administrator("a")
