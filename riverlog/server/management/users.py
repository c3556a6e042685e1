# The management API's users and permissions (issue 30 item 2): RabbitMQ's /api/users and
# /api/permissions routes (rabbit_mgmt_wm_user, rabbit_mgmt_wm_users, rabbit_mgmt_wm_permission,
# rabbit_mgmt_wm_permissions) over the runtime table (riverlog.server.runtime_access).
# Rules:
# - every route is an administrator's (Caller.administrator); another authenticated caller gets
#   403 `{"error": "not_authorized", "reason": "Not administrator user"}` (RabbitMQ answers 401
#   with that reason; 403 tells a client its credentials were right), a caller without valid
#   credentials 401 (server.py's guard);
# - status codes are RabbitMQ's: 201 created, 204 updated or deleted, 404 `Object Not Found`
#   for a user, permission or virtual host that is not there, 400 `bad_request` for a bad body,
#   name, tag, hash or expression, and for a permission of a user or vhost that does not exist
#   (RabbitMQ's `vhost_or_user_not_found`); 503 when Raft cannot take a change now;
# - configuration-file users are listed (``"source": "configuration"``) but are the file's:
#   changing or deleting one is 400; their permissions may be set (then they decide for them);
# - passwords are hashed here with bcrypt (cost API_ROUNDS, off the event loop) and never
#   stored, logged or answered; each change is logged with the administrator who made it.
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from aiohttp import web

from ...errors import ClusterUnavailableError
from ...security.access_table import (BCRYPT, AccessError, NoSuchPermission, NoSuchUser,
                                      NoSuchVhost, check_name, parse_tags)
from ...security.users import hash_password
from .access import Caller
from .answers import error, listed, not_found

log = logging.getLogger("riverlog.management")

API_ROUNDS = 10
"""bcrypt's cost for passwords given through the API (~65 ms a check; users.GUEST_HASH's)."""


def add_routes(router: web.UrlDispatcher, guarded: Callable, app) -> None:
    """Add the users and permissions routes to ``router``, each behind ``guarded`` (the
    server's basic auth) and the administrator check; ``app`` is the running App."""
    routes = UserRoutes(app)
    for method, path, handler in (
            ("GET", "/api/users", routes.list_users),
            ("GET", "/api/users/{name}", routes.get_user),
            ("PUT", "/api/users/{name}", routes.put_user),
            ("DELETE", "/api/users/{name}", routes.delete_user),
            ("GET", "/api/users/{name}/permissions", routes.user_permissions),
            ("GET", "/api/permissions", routes.list_permissions),
            ("GET", "/api/vhosts/{vhost}/permissions", routes.vhost_permissions),
            ("GET", "/api/permissions/{vhost}/{user}", routes.get_permission),
            ("PUT", "/api/permissions/{vhost}/{user}", routes.put_permission),
            ("DELETE", "/api/permissions/{vhost}/{user}", routes.delete_permission)):
        register(router, method, path, guarded(administrator(handler)))


def register(router: web.UrlDispatcher, method: str, path: str, handler: Callable) -> None:
    """Add ``handler`` for ``method`` ``path`` (a GET with a trailing slash too, as
    RabbitMQ takes it)."""
    router.add_route(method, path, handler)
    if method == "GET":
        router.add_route(method, path + "/", handler)


def administrator(handler: Callable) -> Callable:
    """``handler(request, caller)`` for an administrator only: 403 for any other caller."""
    async def checked(request: web.Request, caller: Caller) -> web.StreamResponse:
        if not caller.administrator:
            raise error(web.HTTPForbidden, "not_authorized", "Not administrator user")
        return await handler(request, caller)
    return checked


def _bad(reason: str) -> web.HTTPException:
    return error(web.HTTPBadRequest, "bad_request", reason)


async def body_of(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; 400 for anything else."""
    try:
        body = await request.json() if request.can_read_body else {}
    except ValueError as exc:
        raise _bad(f"the body is no JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object")
    return body


def _vhost(app, request: web.Request) -> str:
    """The request's ``{vhost}``; 404 when it does not exist."""
    vhost = request.match_info["vhost"]
    if not app.guard.runtime.has_vhost(vhost):
        raise not_found()
    return vhost


async def change(app, change: str, **arguments: Any) -> object:
    """app.access.change; AccessError as 400 (404 for NoSuchUser, NoSuchPermission,
    NoSuchVhost), 503 when the cluster cannot take it now."""
    try:
        return await app.access.change(change, **arguments)
    except (NoSuchUser, NoSuchPermission, NoSuchVhost):
        raise not_found() from None
    except AccessError as exc:
        raise _bad(str(exc)) from None
    except ClusterUnavailableError as exc:
        raise error(web.HTTPServiceUnavailable, "service_unavailable", str(exc)) from None


class UserRoutes:
    """The handlers, each ``(request, caller) -> response`` of an administrator."""

    def __init__(self, app) -> None:
        self.app = app

    @property
    def _users(self):
        return self.app.guard.users

    def _user_json(self, name: str) -> dict[str, Any]:
        """RabbitMQ's user (rabbit_mgmt_format:internal_user), with ``source``."""
        runtime = self._users.runtime(name)
        if runtime is not None:
            return {"name": name, "password_hash": runtime.password_hash,
                    "hashing_algorithm": runtime.algorithm, "tags": list(runtime.tags),
                    "limits": {}, "source": "runtime"}
        tags = ["administrator"] if self.app.guard.administrator(name) else []
        return {"name": name, "password_hash": self._users.hash_of(name),
                "hashing_algorithm": BCRYPT, "tags": tags, "limits": {},
                "source": "configuration"}

    @staticmethod
    def _permission_json(vhost: str, user: str, p) -> dict[str, Any]:
        return {"user": user, "vhost": vhost, "configure": p.configure, "write": p.write,
                "read": p.read}

    def _permissions(self, user: str | None = None, vhost: str | None = None
                     ) -> list[dict[str, Any]]:
        return [self._permission_json(v, name, p)
                for v, name, p in self.app.guard.runtime.every_permission()
                if (user is None or name == user) and (vhost is None or v == vhost)]

    async def _change(self, change_name: str, **arguments: Any) -> object:
        return await change(self.app, change_name, **arguments)

    # -- users ------------------------------------------------------------------------------
    async def list_users(self, request: web.Request, caller: Caller) -> web.Response:
        return listed(request, [self._user_json(name) for name in self._users])

    async def get_user(self, request: web.Request, caller: Caller) -> web.Response:
        name = request.match_info["name"]
        if name not in self._users:
            raise not_found()
        return web.json_response(self._user_json(name))

    async def put_user(self, request: web.Request, caller: Caller) -> web.Response:
        """Create or update a runtime user: body ``password`` (hashed here) or
        ``password_hash`` (bcrypt or RabbitMQ SHA-256; ``hashing_algorithm`` optional; ""
        for no password login; neither: keep the stored one), ``tags`` (a comma-separated
        string or a list). 201 created, 204 updated, 400 as the module says."""
        name = request.match_info["name"]
        body = await body_of(request)
        try:
            check_name(name)
            tags = parse_tags(body.get("tags"))
        except AccessError as exc:
            raise _bad(str(exc)) from None
        if self._users.in_file(name):
            raise _bad(f"user '{name}' is defined in the configuration file: change it there")
        password, password_hash = body.get("password"), body.get("password_hash")
        algorithm = body.get("hashing_algorithm")
        if password is not None:
            if not isinstance(password, str) or len(password.encode()) > 72:
                raise _bad("password must be a string of at most 72 bytes (bcrypt's)")
            password_hash = await asyncio.get_running_loop().run_in_executor(
                None, hash_password, password, API_ROUNDS)
            algorithm = BCRYPT
        created = await self._change("put_user", name=name, password_hash=password_hash,
                                     algorithm=algorithm, tags=tags)
        log.info("user %r %s by %r (tags [%s]%s)", name, "created" if created else "updated",
                 caller.user, ", ".join(tags),
                 "" if password_hash is None else ", password set")
        return web.Response(status=201 if created else 204)

    async def delete_user(self, request: web.Request, caller: Caller) -> web.Response:
        """Delete a runtime user and its permission: 204; 404 when there is none; 400 for a
        configuration-file user. Its connections are closed (runtime_access)."""
        name = request.match_info["name"]
        if self._users.in_file(name):
            raise _bad(f"user '{name}' is defined in the configuration file: change it there")
        await self._change("delete_user", name=name)
        log.info("user %r deleted by %r", name, caller.user)
        return web.Response(status=204)

    async def user_permissions(self, request: web.Request, caller: Caller) -> web.Response:
        name = request.match_info["name"]
        if name not in self._users:
            raise not_found()
        return listed(request, self._permissions(name))

    # -- permissions ------------------------------------------------------------------------
    async def list_permissions(self, request: web.Request, caller: Caller) -> web.Response:
        return listed(request, self._permissions())

    async def vhost_permissions(self, request: web.Request, caller: Caller) -> web.Response:
        return listed(request, self._permissions(vhost=_vhost(self.app, request)))

    async def get_permission(self, request: web.Request, caller: Caller) -> web.Response:
        vhost = _vhost(self.app, request)
        user = request.match_info["user"]
        found = self.app.guard.runtime.permission(vhost, user)
        if user not in self._users or found is None:
            raise not_found()
        return web.json_response(self._permission_json(vhost, user, found))

    async def put_permission(self, request: web.Request, caller: Caller) -> web.Response:
        """Set a user's configure, write and read expressions on a virtual host (all three
        required): 201 created, 204 updated; 400 for a missing key, a bad expression, or a
        user or vhost that does not exist (RabbitMQ's `vhost_or_user_not_found`)."""
        user, vhost = request.match_info["user"], request.match_info["vhost"]
        body = await body_of(request)
        missing = [key for key in ("configure", "write", "read") if key not in body]
        if missing:
            raise _bad(f"key_missing: {', '.join(missing)}")
        expressions = {key: body[key] for key in ("configure", "write", "read")}
        # a runtime user's existence is checked in the change itself: in Raft's order in a
        # cluster, so a user just made through another server is found
        created = await self._change("set_permissions", user=user, **expressions,
                                     runtime=not self._users.in_file(user), vhost=vhost)
        if not self.app.guard.config.authz:
            log.warning("permissions of %r are stored but decide nothing while authorization "
                        "is off (docs/security.md)", user)
        log.info("permissions of %r on vhost %r %s by %r: configure %r write %r read %r",
                 user, vhost, "set" if created else "changed", caller.user,
                 *expressions.values())
        return web.Response(status=201 if created else 204)

    async def delete_permission(self, request: web.Request, caller: Caller) -> web.Response:
        """Clear a user's permission on a virtual host: 204; 404 when there is none."""
        vhost = _vhost(self.app, request)
        user = request.match_info["user"]
        await self._change("clear_permissions", user=user, vhost=vhost)
        log.info("permissions of %r on vhost %r cleared by %r", user, vhost, caller.user)
        return web.Response(status=204)
