# The management HTTP server: aiohttp on the server's event loop, HTTP basic auth with
# riverlog's users (bcrypt checks off the loop, Guard.login_async, and the loopback rule:
# `guest` only from loopback), the routes of RabbitMQ's management API that stream users and
# clients use, and the web view at `/` (web/index.html, which reads the same API).
# Status codes and error bodies are RabbitMQ's (rabbit_mgmt_util): 401 with
# `{"error": "not_authorized", ...}` and a Basic challenge, 404 `{"error": "Object Not
# Found", "reason": "Not Found"}`, 400 `bad_request`, 201 for a queue created, 204 for one
# that existed, a deletion or a connection closed.
# Message rates and consumer lag over time (``message_stats``, history.py) are sampled here
# while the server runs; the web view's files are view.py's.
# Every route is wrapped by ``_guarded``, which logs the caller in and hands it to the handler.
# Users and permissions are users.py's routes (administrators only).
# Listings are sorted and paged as RabbitMQ's are (paging.py).
# Virtual hosts are vhosts.py's routes; every route with a {vhost} takes any existing one (404
# otherwise) and names streams as that vhost's clients do (riverlog.vhost_names.lookup).
# rabbitmq-streams restart_stream is restart.py's route; policies are policies.py's.
# Rules: per-server answers are this server's connections, publishers and consumers (RabbitMQ
# lists them per node too); queues and exchanges are the cluster's (queues.py); `alarms` of
# /api/nodes and /api/overview list the resource alarms in force (riverlog.alarms: this
# server's own; RabbitMQ's shape {"node", "resource": "disk"|"memory"}).
from __future__ import annotations

import base64
import binascii
import logging
import os
import platform
import time
from typing import Any, Callable
from urllib.parse import quote

from aiohttp import web

from ... import __version__
from ...alarms import DISK, MEMORY
from ...errors import (InvalidArgumentError, LimitExceededError, NoSuchVhostError,
                      ReservedStreamError, StreamExistsError, StreamNotFoundError)
from ...security.authz import CREATE, DELETE, PUBLISH
from ...vhost_names import external, lookup
from . import policies, restart, users, vhosts, view
from .access import Caller
from .answers import UNAVAILABLE
from .answers import error as _error
from .answers import listed as _listed
from .answers import not_found, unavailable
from .connections import (connection_json, connection_name, consumers, find, publishers,
                          visible)
from .history import SERVER, RateHistory, rates_window
from .peers import Peers
from .queues import (bindings_json, create, delete, exchange_json,
                     node_name, one_queue, queues, stream_arguments)
from .stream_groups import consumer_groups, group_consumers
from .super_streams import delete_super_stream, put_super_stream
from .vhosts import existing

log = logging.getLogger("riverlog.management")

RABBITMQ_VERSION = "3.13.0"  # what the stream door's PeerProperties says it is
REALM = 'Basic realm="RabbitMQ Management"'
CLOSE_REASON = "Closed via management plugin"  # rabbit_mgmt_wm_connection's default


class ManagementServer:
    """The management API and web view of ``app`` (riverlog.server.app.App) on
    ``config.host``:``config.port`` (ManagementConfig; 0 picks a free port, ``port`` tells
    which). ``await start()`` raises OSError naming the address when it cannot listen."""

    def __init__(self, app, config) -> None:
        self.app = app
        self.config = config
        self.port = config.port
        self.started = time.time()
        self._runner: web.AppRunner | None = None
        self.history = RateHistory(self._door, config.sample_interval_ms / 1000)
        self.peers = Peers(config.peers)  # the other workers of `serve --workers`

    @property
    def alarms(self) -> list[dict[str, Any]]:
        """This server's resource alarms in force, as RabbitMQ lists them (resource "disk" or
        "memory", riverlog.alarms)."""
        return [{"node": self.node, "resource": resource}
                for resource in sorted(self.app.broker.alarms.raised)]

    @property
    def url(self) -> str:
        host = self.config.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/"

    @property
    def node(self) -> str:
        return node_name(self.app, self.app.broker.placement.server_id)

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        web_app = web.Application()
        self._routes(web_app)
        runner = web.AppRunner(web_app, access_log=None, handle_signals=False)
        await runner.setup()
        host, port = self.config.host, self.config.port
        try:
            await self._listen(runner, host, port)
        except OSError as exc:
            if not (self.config.port_fallback and port):
                await runner.cleanup()
                raise OSError(exc.errno, f"cannot serve the management API on {host}:{port}: "
                                         f"{exc.strerror} (use --management-port, or "
                                         f"--no-management)") from None
            log.warning("management port %s:%d is taken; serving it on a free port instead "
                        "(pass --management-port to require one)", host, port)
            await self._listen(runner, host, 0)
        self._runner = runner
        self.port = runner.addresses[-1][1]
        self.history.start()
        log.info("management API and web view on %s", self.url)

    @staticmethod
    async def _listen(runner: web.AppRunner, host: str, port: int) -> None:
        await web.TCPSite(runner, host, port, reuse_address=True).start()

    async def stop(self) -> None:
        await self.history.stop()
        await self.peers.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # -- authentication -----------------------------------------------------------------
    def _guarded(self, handler: Callable) -> Callable:
        """``handler(request, caller)`` behind basic auth: 401 with a Basic challenge
        unless the request carries a user's valid credentials."""
        async def guarded(request: web.Request) -> web.StreamResponse:
            credentials = _basic_credentials(request.headers.get("Authorization", ""))
            refused = "password"
            if credentials is not None:
                refused = await self.app.guard.login_async(*credentials, request.remote)
            if refused is not None:
                reason = "Login failed" if credentials is not None else "Not management user"
                raise _error(web.HTTPUnauthorized, "not_authorized", reason,
                             headers={"WWW-Authenticate": REALM})
            return await handler(request, Caller(credentials[0], self.app.guard))
        return guarded

    # -- routes -------------------------------------------------------------------------
    def _routes(self, web_app: web.Application) -> None:
        get = {
            "/api/overview": self.overview, "/api/whoami": self.whoami,
            "/api/nodes": self.nodes, "/api/nodes/{node}": self.one_node,
            "/api/connections": self.connections,
            "/api/connections/{name}": self.connection,
            "/api/stream/connections": self.connections,
            "/api/stream/connections/{vhost}": self.connections,
            "/api/stream/connections/{vhost}/{name}": self.connection,
            "/api/stream/connections/{vhost}/{name}/publishers": self.connection_publishers,
            "/api/stream/connections/{vhost}/{name}/consumers": self.connection_consumers,
            "/api/vhosts/{vhost}/connections": self.connections,
            "/api/stream/publishers": self.publishers,
            "/api/stream/publishers/{vhost}": self.publishers,
            "/api/stream/publishers/{vhost}/{stream}": self.publishers,
            "/api/stream/consumers": self.consumers,
            "/api/stream/consumers/{vhost}": self.consumers,
            "/api/stream/consumers/{vhost}/{stream}": self.consumers,
            "/api/queues": self.queues, "/api/queues/{vhost}": self.queues,
            "/api/queues/{vhost}/{name}": self.queue,
            "/api/exchanges/{vhost}/{name}": self.exchange,
            "/api/exchanges/{vhost}/{name}/bindings/source": self.bindings,
            "/api/riverlog/stream/consumer-groups": self.consumer_groups,
            "/api/riverlog/stream/consumer-groups/{vhost}": self.consumer_groups,
            "/api/riverlog/stream/consumer-groups/{vhost}/{stream}/{reference}":
                self.group_consumers,
        }
        for path, handler in get.items():
            for variant in (path, path + "/"):  # RabbitMQ takes a trailing slash too
                web_app.router.add_get(variant, self._guarded(handler))
        router, guarded = web_app.router, self._guarded
        router.add_delete("/api/connections/{name}", guarded(self.close_connection))
        router.add_put("/api/queues/{vhost}/{name}", guarded(self.put_queue))
        router.add_delete("/api/queues/{vhost}/{name}", guarded(self.delete_queue))
        router.add_put("/api/exchanges/{vhost}/{name}", guarded(self.put_exchange))
        router.add_delete("/api/exchanges/{vhost}/{name}", guarded(self.delete_exchange))
        router.add_post("/api/bindings/{vhost}/e/{name}/q/{queue}",
                        guarded(self.post_binding))
        router.add_put("/api/stream/super-streams/{vhost}/{name}", guarded(self.put_super_stream))
        router.add_delete("/api/riverlog/stream/super-streams/{vhost}/{name}",
                          guarded(self.delete_super_stream))
        users.add_routes(router, guarded, self.app)
        vhosts.add_routes(router, guarded, self.app)
        policies.add_routes(router, guarded, self.app)
        restart.add_routes(router, guarded, self.app, lambda: self.node)
        view.add_routes(router, guarded)

    def _rates(self, request: web.Request, stream: str = SERVER) -> dict[str, Any]:
        """``message_stats`` and the consumer lag of ``stream`` (the server's: SERVER) as
        history.py gives them for the request's msg_rates_age/msg_rates_incr; 400 for bad
        ones."""
        try:
            window = rates_window(request.query)
        except ValueError as exc:
            raise _error(web.HTTPBadRequest, "bad_request", str(exc)) from None
        return {"message_stats": self.history.message_stats(stream, *window),
                **self.history.lag(stream, *window)}

    def _door(self) -> list:
        door = self.app.rabbitmq_stream
        return list(door.connections) if door is not None else []

    # -- overview, users, vhosts, nodes ---------------------------------------------------
    async def overview(self, request: web.Request, caller: Caller) -> web.Response:
        conns = visible(self._door(), caller)
        listed = await queues(self.app, caller, {})
        messages = sum(q.get("messages", 0) for q in listed)
        lag = self._rates(request)
        stats = lag.pop("message_stats")
        door = self.app.rabbitmq_stream
        listeners = [] if door is None else [  # RabbitMQ names the TLS one stream/ssl
            {"node": self.node, "protocol": protocol, "ip_address": door.config.host,
             "port": port} for protocol, port in (("stream", door.port), ("stream/ssl",
                                                  door.tls_port if door.tls_listening else None))
            if port is not None]
        return web.json_response({
            "management_version": RABBITMQ_VERSION, "rabbitmq_version": RABBITMQ_VERSION,
            "product_name": "riverlog", "product_version": __version__,
            "cluster_name": "riverlog", "node": self.node, "rates_mode": "basic",
            "erlang_version": platform.python_version(),
            "exchange_types": [{"name": "direct", "description": "AMQP direct exchange type",
                                "enabled": True}],
            "listeners": listeners,
            "contexts": [{"node": self.node, "description": "RabbitMQ Management",
                          "path": "/", "port": str(self.port)}],
            "object_totals": {
                "connections": len(conns), "channels": 0, "queues": len(listed),
                "consumers": sum(len(c.subscriptions) for c in conns),
                "exchanges": len(self._super_streams(caller))},
            "queue_totals": {"messages": messages, "messages_ready": messages,
                             "messages_unacknowledged": 0, **lag},
            "message_stats": stats, "statistics_db_event_queue": 0,
            "riverlog_sample_interval_ms": self.config.sample_interval_ms,
            "alarms": list(self.alarms),
        })

    async def whoami(self, request: web.Request, caller: Caller) -> web.Response:
        return web.json_response({"name": caller.user, "tags": caller.tags,
                                  "is_internal_user": True})

    async def nodes(self, request: web.Request, caller: Caller) -> web.Response:
        return _listed(request, [self._node_json(s) for s in self._servers()])

    async def one_node(self, request: web.Request, caller: Caller) -> web.Response:
        for server in self._servers():
            if node_name(self.app, server) == request.match_info["node"]:
                return web.json_response(self._node_json(server))
        raise not_found()

    def _servers(self) -> list[str]:
        placement = self.app.broker.placement
        return list(placement.servers()) if placement.clustered else [placement.server_id]

    def _node_json(self, server: str) -> dict[str, Any]:
        """A server as a RabbitMQ node; ``running`` says whether this one is in touch with it
        (its memory, disk and uptime are given for this server only)."""
        placement = self.app.broker.placement
        own = server == placement.server_id
        node: dict[str, Any] = {
            "name": node_name(self.app, server), "type": "disc",
            "running": own or placement.reachable(server), "being_drained": False,
            "mem_alarm": False, "disk_free_alarm": False, "partitions": [], "alarms": [],
        }
        if own:
            alarms = self.app.broker.alarms
            disk = os.statvfs(self.app.broker.data_dir)
            node.update(mem_alarm=MEMORY in alarms.raised, disk_free_alarm=DISK in alarms.raised,
                        alarms=self.alarms, mem_limit=alarms.memory_limit,
                        disk_free_limit=alarms.disk_limit)
            node.update(os_pid=str(os.getpid()), processors=os.cpu_count() or 1,
                        uptime=int((time.time() - self.started) * 1000),
                        disk_free=disk.f_bavail * disk.f_frsize,
                        mem_used=_rss_bytes(), run_queue=0)
        return node

    # -- connections ----------------------------------------------------------------------
    def _scope(self, request: web.Request) -> str | None:
        """The route's ``{vhost}`` (None when it has none); 404 when it does not exist."""
        return existing(self.app, request) if "vhost" in request.match_info else None

    async def connections(self, request: web.Request, caller: Caller) -> web.Response:
        vhost = self._scope(request)
        return _listed(request, [connection_json(c, self.node)
                                 for c in visible(self._door(), caller)
                                 if vhost is None or c.link.vhost == vhost]
                       + await self.peers.listings(request))

    def _find(self, request: web.Request, caller: Caller):
        vhost = self._scope(request)
        conn = find(self._door(), request.match_info["name"], caller)
        if conn is None or vhost is not None and conn.link.vhost != vhost:
            raise not_found()
        return conn

    async def _elsewhere(self, request: web.Request) -> web.Response:
        """The answer of the peer worker that holds the connection ``request`` names (404
        when none does: Peers.one)."""
        found = await self.peers.one(request)
        if found is None:
            raise not_found()
        return found

    async def connection(self, request: web.Request, caller: Caller) -> web.Response:
        try:
            conn = self._find(request, caller)
        except web.HTTPNotFound:
            return await self._elsewhere(request)
        return web.json_response(connection_json(conn, self.node))

    async def close_connection(self, request: web.Request, caller: Caller) -> web.Response:
        """Close a connection as RabbitMQ's stream reader does when the management plugin
        asks (rabbit_stream_reader, `{shutdown, Explanation}`): the reason (the
        ``X-Reason`` header, else "Closed via management plugin") is logged and the socket
        closed, no Close frame; 204."""
        try:
            conn = self._find(request, caller)
        except web.HTTPNotFound:
            return await self._elsewhere(request)
        reason = request.headers.get("X-Reason", CLOSE_REASON)
        log.info("forcing stream connection %s closing: %s (by %s)", connection_name(conn),
                 reason, caller.user)
        conn.close_for_shutdown()
        return web.Response(status=204)

    async def connection_publishers(self, request: web.Request, caller: Caller) -> web.Response:
        try:
            conn = self._find(request, caller)
        except web.HTTPNotFound:
            return await self._elsewhere(request)
        return _listed(request, publishers(self._door(), caller, self.node,
                                           connection=connection_name(conn)))

    async def connection_consumers(self, request: web.Request, caller: Caller) -> web.Response:
        try:
            conn = self._find(request, caller)
        except web.HTTPNotFound:
            return await self._elsewhere(request)
        return _listed(request, consumers(self._door(), caller, self.node,
                                          connection=connection_name(conn)))

    def _stream_scope(self, request: web.Request) -> dict[str, str | None]:
        """``vhost`` and ``stream`` (its broker name) of a publishers or consumers route."""
        vhost = self._scope(request)
        stream = request.match_info.get("stream")
        return {"vhost": vhost, "stream": None if stream is None else lookup(vhost, stream)}

    async def publishers(self, request: web.Request, caller: Caller) -> web.Response:
        return _listed(request, publishers(self._door(), caller, self.node,
                                           **self._stream_scope(request))
                       + await self.peers.listings(request))

    async def consumers(self, request: web.Request, caller: Caller) -> web.Response:
        return _listed(request, consumers(self._door(), caller, self.node,
                                          **self._stream_scope(request))
                       + await self.peers.listings(request))

    # -- single active consumer groups and whole super streams (stream_groups.py,
    # super_streams.py: riverlog's routes for rabbitmq-streams' commands) ----------------
    async def consumer_groups(self, request: web.Request, caller: Caller) -> web.Response:
        return _listed(request, consumer_groups(self.app, caller, self._scope(request)))

    async def group_consumers(self, request: web.Request, caller: Caller) -> web.Response:
        stream = lookup(existing(self.app, request), request.match_info["stream"])
        found = group_consumers(self.app, caller, stream, request.match_info["reference"])
        if found is None:
            raise not_found()
        return web.json_response(found)

    async def put_super_stream(self, request: web.Request, caller: Caller) -> web.Response:
        return await put_super_stream(self.app, request, caller, *self._queue_name(request))

    async def delete_super_stream(self, request: web.Request, caller: Caller) -> web.Response:
        return await delete_super_stream(self.app, caller, *self._queue_name(request))

    # -- queues and exchanges -------------------------------------------------------------
    def _consumer_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for conn in self._door():
            for sub in list(conn.subscriptions.values()):
                counts[sub.name] = counts.get(sub.name, 0) + 1
        return counts

    async def queues(self, request: web.Request, caller: Caller) -> web.Response:
        vhost = self._scope(request)
        listed = await queues(self.app, caller, self._consumer_counts(), vhost)
        for queue in listed:
            queue.update(self._rates(request, lookup(queue["vhost"], queue["name"])))
        return _listed(request, listed)

    def _queue_name(self, request: web.Request) -> tuple[str, str]:
        """(vhost, broker name) of a queue route."""
        vhost = existing(self.app, request)
        return vhost, lookup(vhost, request.match_info["name"])

    async def queue(self, request: web.Request, caller: Caller) -> web.Response:
        _, name = self._queue_name(request)
        found = one_queue(self.app, caller, name, self._consumer_counts().get(name, 0))
        if found is None:
            raise not_found()
        return web.json_response({**found, **self._rates(request, name)})

    async def put_queue(self, request: web.Request, caller: Caller) -> web.Response:
        """Declare a stream queue owned by the caller: 201 when created, 204 when it exists
        (its arguments are not compared), 400 for bad arguments, another queue type, a
        reserved name (``__cursors``, ``__activity``) or a caller at its stream limit
        (SecurityConfig.max_streams_per_user, as the doors count it), 401 without the
        ``create`` permission, 404 when its virtual host is gone, 503 when the cluster or the
        server cannot create it now."""
        vhost, name = self._queue_name(request)
        try:
            body = await request.json() if request.can_read_body else {}
            arguments = stream_arguments(dict(body.get("arguments") or {}))
        except (ValueError, AttributeError, TypeError) as exc:
            raise _error(web.HTTPBadRequest, "bad_request", str(exc)) from None
        if not external(name)[1]:  # a name no client may use (vhost_names.lookup)
            raise _error(web.HTTPBadRequest, "bad_request", "invalid queue name")
        if not caller.may(name, CREATE):
            raise _error(web.HTTPUnauthorized, "not_authorized",
                         f"access to queue '{external(name)[1]}' in vhost '{vhost}' refused "
                         f"for user '{caller.user}'")
        try:
            await create(self.app, name, arguments, caller.user)
        except StreamExistsError:
            return web.Response(status=204)
        except NoSuchVhostError:  # deleted since the request's check (vhosts.py)
            raise not_found() from None
        except (InvalidArgumentError, LimitExceededError) as exc:
            raise _error(web.HTTPBadRequest, "bad_request", str(exc)) from None
        except UNAVAILABLE as exc:
            raise unavailable(exc) from None
        return web.Response(status=201)

    async def delete_queue(self, request: web.Request, caller: Caller) -> web.Response:
        """Delete a stream queue: 204; 404 when the caller sees no such stream, 401 without
        the ``delete`` permission, 400 for a reserved name (``__cursors``, ``__activity``),
        503 when the cluster cannot delete it now."""
        vhost, name = self._queue_name(request)
        if not caller.sees_stream(name):
            raise not_found()
        if not caller.may(name, DELETE):
            raise _error(web.HTTPUnauthorized, "not_authorized",
                         f"access to queue '{external(name)[1]}' in vhost '{vhost}' refused "
                         f"for user '{caller.user}'")
        try:
            await delete(self.app, name)
        except ReservedStreamError as exc:
            raise _error(web.HTTPBadRequest, "bad_request", str(exc)) from None
        except (StreamNotFoundError, InvalidArgumentError):
            raise not_found() from None
        except UNAVAILABLE as exc:
            raise unavailable(exc) from None
        return web.Response(status=204)

    def _super_streams(self, caller: Caller) -> list:
        door = self.app.rabbitmq_stream
        if door is None:
            return []
        return [s for s in door.super_streams.every() if caller.sees_stream(s.name)]

    def _super_stream(self, request: web.Request, caller: Caller):
        _, name = self._queue_name(request)
        for super_stream in self._super_streams(caller):
            if super_stream.name == name:
                return super_stream
        raise not_found()

    async def exchange(self, request: web.Request, caller: Caller) -> web.Response:
        return web.json_response(exchange_json(self._super_stream(request, caller).name))

    async def bindings(self, request: web.Request, caller: Caller) -> web.Response:
        return web.json_response(bindings_json(self._super_stream(request, caller)))

    def _registry(self, request: web.Request, caller: Caller, action: str):
        """(the door's super streams, the vhost, the broker name of the one named), once
        ``caller`` may do ``action`` on it."""
        vhost, name = self._queue_name(request)
        if not caller.may(name, action):
            raise _error(web.HTTPUnauthorized, "not_authorized",
                         f"access to exchange '{external(name)[1]}' in vhost '{vhost}' "
                         f"refused for user '{caller.user}'")
        if self.app.rabbitmq_stream is None:
            raise not_found()
        return self.app.rabbitmq_stream.super_streams, vhost, name

    async def put_exchange(self, request: web.Request, caller: Caller) -> web.Response:
        """Declare an exchange: riverlog's exchanges are super streams, so this records one
        with no partition yet (bindings add them, as RabbitMQ's super stream exchange gets
        one binding per partition); 201 when new, 204 when it exists, 400 for a bad name, 503
        when the cluster cannot record it now (no Raft leader)."""
        registry, _, name = self._registry(request, caller, CREATE)
        if not external(name)[1]:  # a name no client may use (vhost_names.lookup)
            raise _error(web.HTTPBadRequest, "bad_request", "invalid exchange name")
        try:
            created = await registry.declare(name)
        except InvalidArgumentError as exc:
            raise _error(web.HTTPBadRequest, "bad_request", str(exc)) from None
        except UNAVAILABLE as exc:
            raise unavailable(exc) from None
        return web.Response(status=201 if created else 204)

    async def delete_exchange(self, request: web.Request, caller: Caller) -> web.Response:
        """Forget a super stream, its partition streams stay (RabbitMQ deletes the exchange
        and keeps the queues); 204, 404 when there is none, 503 when the cluster cannot
        forget it now."""
        registry, _, name = self._registry(request, caller, DELETE)
        try:
            await registry.forget(name)
        except StreamNotFoundError:
            raise not_found() from None
        except UNAVAILABLE as exc:
            raise unavailable(exc) from None
        return web.Response(status=204)

    async def post_binding(self, request: web.Request, caller: Caller) -> web.Response:
        """Bind a stream to a super stream: ``routing_key`` is its binding key,
        ``arguments["x-stream-partition-order"]`` its position (RabbitMQ's
        rabbit_stream_manager orders partitions by it); 201 with a Location, 404 when the
        super stream or the stream does not exist or the caller cannot see the stream, 400
        when it is bound already or the order is no integer, 503 when the cluster cannot
        record it now (no Raft leader), 401 unless the caller may ``create`` the super stream and
        ``publish`` to (or ``create``) the stream (RabbitMQ wants write on the queue)."""
        registry, vhost, name = self._registry(request, caller, CREATE)
        queue = lookup(vhost, request.match_info["queue"])
        found = registry.resolve(queue)
        target = found[0].name if found is not None else queue  # a partition: its stream
        if not caller.sees_stream(target):
            raise not_found()
        if not (caller.may(target, PUBLISH) or caller.may(target, CREATE)):
            raise _error(web.HTTPUnauthorized, "not_authorized",
                         f"access to queue '{external(queue)[1]}' in vhost '{vhost}' refused "
                         f"for user '{caller.user}'")
        try:
            body = await request.json() if request.can_read_body else {}
            key = str(body.get("routing_key", ""))
            order = (body.get("arguments") or {}).get("x-stream-partition-order")
            order = None if order is None else int(order)  # inf: OverflowError
        except (ValueError, AttributeError, TypeError, OverflowError) as exc:
            raise _error(web.HTTPBadRequest, "bad_request", str(exc)) from None
        if registry.find(name) is None or registry.resolve(queue) is None and \
                self.app.broker.placement.of(queue, 0) is None:
            raise not_found()
        try:
            await registry.bind(name, queue, key, order)
        except StreamNotFoundError:
            raise not_found() from None
        except InvalidArgumentError as exc:
            raise _error(web.HTTPBadRequest, "bad_request", str(exc)) from None
        except UNAVAILABLE as exc:
            raise unavailable(exc) from None
        location = "/".join(("/api/bindings", quote(vhost, safe=""), "e", quote(
            external(name)[1], safe=""), "q", quote(external(queue)[1], safe=""), key))
        return web.Response(status=201, headers={"Location": location})


def _basic_credentials(header: str) -> tuple[str, str] | None:
    """(user, password) of an ``Authorization: Basic ...`` header (RFC 7617, UTF-8); None
    when there is none or it is malformed."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, colon, password = base64.b64decode(encoded.strip(), validate=True).decode(
            ).partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if colon else None


def _rss_bytes() -> int:
    """This process's resident memory (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
