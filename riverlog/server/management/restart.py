# rabbitmq-streams restart_stream over the management API: riverlog's own route
# `POST /api/riverlog/stream/queues/{vhost}/{name}/restart` (RabbitMQ's CLI reaches
# rabbit_stream_queue:restart_stream by Erlang RPC, its management API has no such route),
# for administrators only, as the CLI needs the node's Erlang cookie.
# Rules: the answering server restarts its own connections' use of the stream (RabbitMQ
# restarts every member; in a riverlog cluster, ask each server); 200 `{"leader": node}`,
# the node rabbitmq-streams prints; 404 for a stream this server does not hold.
from __future__ import annotations

from typing import Callable

from aiohttp import web

from ...vhost_names import lookup
from .access import Caller
from .answers import not_found
from .users import administrator
from .vhosts import existing


def add_routes(router: web.UrlDispatcher, guarded: Callable, app,
               node: Callable[[], str]) -> None:
    """Add the restart route to ``router`` behind ``guarded`` (basic auth); ``app`` is the
    running App, ``node()`` this server's node name."""
    async def restart(request: web.Request, caller: Caller) -> web.Response:
        name = lookup(existing(app, request), request.match_info["name"])
        door = app.rabbitmq_stream
        if door is None or not door.restart(name):
            raise not_found()
        return web.json_response({"leader": node()})

    router.add_post("/api/riverlog/stream/queues/{vhost}/{name}/restart",
                    guarded(administrator(restart)))
