# The management API's virtual hosts (issue 30 item 1): RabbitMQ's /api/vhosts routes
# (rabbit_mgmt_wm_vhost, rabbit_mgmt_wm_vhosts) over the runtime table's virtual hosts
# (riverlog.security.access_table, kept as users are: DATA/access.json, or Raft's
# change_access in a cluster; riverlog.server.runtime_access).
# Rules:
# - GET is any authenticated user's (RabbitMQ lists the vhosts a user may reach; an
#   administrator, or anyone while authorization is off, sees every one); PUT and DELETE are
#   an administrator's: 403 `not_authorized` otherwise, 401 without valid credentials;
# - codes are RabbitMQ's: 201 created, 204 described again or deleted, 404 `Object Not Found`,
#   400 `bad_request` for a bad name or body (and for deleting `/`: the Liftbridge doors live
#   there), 503 when Raft cannot take the change now;
# - deleting a virtual host first removes it (new Opens are refused 0x0c, the connections on
#   it are closed where they are: runtime_access), then deletes its super streams and
#   streams (through the placement in a cluster, from the server that took the request);
#   a create of one of its streams racing that is refused once the vhost is removed, in the
#   step that would create it (Broker.create alone, the Raft transition in a cluster:
#   cluster.state.create_stream), and a create that came before is a stream the sweep finds,
#   so no stream outlives its virtual host;
# - each change is logged with the administrator who made it.
from __future__ import annotations

import logging
from typing import Any, Callable

from aiohttp import web

from ...errors import StreamNotFoundError
from ...security.access_table import AccessError, NoSuchVhost, VirtualHost, parse_tags
from ...vhost_names import in_vhost
from .access import Caller
from .answers import UNAVAILABLE, bad_request, listed, not_found, unavailable
from .queues import delete
from .users import administrator, body_of, change

log = logging.getLogger("riverlog.management")


def add_routes(router: web.UrlDispatcher, guarded: Callable, app) -> None:
    """Add the virtual host routes to ``router``, each behind ``guarded`` (basic auth);
    ``app`` is the running App."""
    routes = VhostRoutes(app)
    for method, path, handler in (("GET", "/api/vhosts", routes.list_vhosts),
                                  ("GET", "/api/vhosts/{vhost}", routes.get_vhost),
                                  ("PUT", "/api/vhosts/{vhost}", administrator(routes.put_vhost)),
                                  ("DELETE", "/api/vhosts/{vhost}",
                                   administrator(routes.delete_vhost))):
        router.add_route(method, path, guarded(handler))
        if method == "GET":
            router.add_route(method, path + "/", guarded(handler))


def vhost_json(vhost: VirtualHost) -> dict[str, Any]:
    """RabbitMQ's virtual host (rabbit_mgmt_format:vhost): name, description, tags,
    default_queue_type, tracing, cluster_state, metadata."""
    return {"name": vhost.name, "description": vhost.description, "tags": list(vhost.tags),
            "default_queue_type": vhost.default_queue_type, "tracing": False,
            "cluster_state": {}, "metadata": {"description": vhost.description,
                                              "tags": list(vhost.tags),
                                              "default_queue_type": vhost.default_queue_type}}


def existing(app, request: web.Request) -> str:
    """The request's ``{vhost}`` (``/`` when the route has none); 404 when it does not
    exist."""
    name = request.match_info.get("vhost", "/")
    if not app.guard.runtime.has_vhost(name):
        raise not_found()
    return name


class VhostRoutes:
    """The handlers, each ``(request, caller) -> response``."""

    def __init__(self, app) -> None:
        self.app = app

    def _visible(self, caller: Caller) -> list[VirtualHost]:
        access = self.app.guard.authorizer.vhost_access
        return [v for v in self.app.guard.runtime.every_vhost()
                if caller.administrator or access(caller.user, v.name)]

    async def list_vhosts(self, request: web.Request, caller: Caller) -> web.Response:
        return listed(request, [vhost_json(v) for v in self._visible(caller)])

    async def get_vhost(self, request: web.Request, caller: Caller) -> web.Response:
        name = request.match_info["vhost"]
        for vhost in self._visible(caller):
            if vhost.name == name:
                return web.json_response(vhost_json(vhost))
        raise not_found()

    async def put_vhost(self, request: web.Request, caller: Caller) -> web.Response:
        """Create or describe a virtual host: body (optional) ``description``, ``tags`` (a
        comma-separated string or a list), ``default_queue_type``. 201 created, 204
        described again; 400 for a bad name or body."""
        name = request.match_info["vhost"]
        body = await body_of(request)
        try:
            tags = parse_tags(body.get("tags"))
        except AccessError as exc:
            raise bad_request(str(exc)) from None
        created = await change(self.app, "put_vhost", name=name,
                               description=body.get("description", ""), tags=tags,
                               default_queue_type=body.get("default_queue_type", "stream"))
        log.info("virtual host %r %s by %r", name, "created" if created else "described",
                 caller.user)
        return web.Response(status=201 if created else 204)

    async def delete_vhost(self, request: web.Request, caller: Caller) -> web.Response:
        """Delete a virtual host, its permissions, super streams and streams, and close its
        connections: 204; 404 when there is none; 400 for ``/``."""
        name = request.match_info["vhost"]
        if name == "/":
            raise bad_request("the default virtual host '/' cannot be deleted (the "
                              "Liftbridge doors are on it)")
        if not self.app.guard.runtime.has_vhost(name):
            raise not_found()
        await change(self.app, "delete_vhost", name=name)
        await self.app.policies.forget_vhost(name)
        log.info("virtual host %r deleted by %r", name, caller.user)
        await self._delete_streams(name)
        return web.Response(status=204)

    async def _delete_streams(self, vhost: str) -> None:
        """Delete the super streams and streams of ``vhost`` (503 when the cluster cannot
        delete one now: the vhost is gone already, a retry of DELETE answers 404, and the
        streams left are logged)."""
        door = self.app.rabbitmq_stream
        if door is not None:
            for super_stream in list(door.super_streams.every()):
                if in_vhost(super_stream.name, vhost):
                    try:
                        await door.super_streams.forget(super_stream.name)
                    except StreamNotFoundError:
                        pass
        placement = self.app.broker.placement
        known = placement.streams()
        names = list(known) if known is not None else list(self.app.broker.streams)
        for name in names:
            if not in_vhost(name, vhost):
                continue
            try:
                await delete(self.app, name)
            except StreamNotFoundError:
                pass
            except UNAVAILABLE as exc:
                log.error("virtual host %r deleted, but not its stream %r: %s", vhost,
                          name, exc)
                raise unavailable(exc) from None
