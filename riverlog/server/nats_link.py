# The server's nats-py connections: ``nc``, the control traffic (PublishToSubject and
# requests awaiting acks, forwarded PublishAsync answers; the NATS door's own data — the
# streams' subjects and their acks — travels on its data connection, nats_data.py), and in a
# cluster ``cluster_nc``, a second one for
# what the servers ask each other (riverlog/cluster/: replication fetches and notifications,
# partition status, joins, stored offsets), as Liftbridge keeps replication and Raft on NATS
# connections of their own: a flood of NATS publishes queued at nats-server for the door's
# connection (a publisher without flow control) must not hold up a follower's fetch behind it
# for seconds, or the followers report their leader silent and depose it (issue 29). Owns the
# embedded nats-server when riverlog runs its own (with riverlog's users and TLS,
# nats_auth.py, and the routes joining the other servers' nats-servers in a cluster), the
# nats-py connections and getting them back.
# Rules: start() is idempotent (whoever needs NATS first starts it); when the server closes
# either connection for good (nats-py reconnects by itself only after a lost socket, not after
# an -ERR), both are made anew every RECONNECT_WAIT_S until they are and every reconnect
# listener is called with the new ``nc`` (``cluster_nc`` is set by then), so its users
# subscribe again (the closed connections' subscriptions are gone); the state is logged and
# counted (riverlog_nats_connected, riverlog_nats_reconnects_total); the answers to its
# requests come under the namespace, out of every NATS user's reach (inbox_prefix).
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

import nats
from nats.aio.client import Client as NatsClient

from ..config import NatsConfig, SecurityConfig
from ..metrics import NATS_RECONNECTS
from ..protocol.liftbridge import api_pb2 as pb
from ..protocol.liftbridge.envelope import decode_ack
from ..security.guard import Guard
from ..security.nats_auth import NatsAuth, connect_options
from .embedded_nats import EmbeddedNats

log = logging.getLogger("riverlog.nats")

FIRST_CONNECT_TIMEOUT_S = 15.0
RECONNECT_WAIT_S = 1.0  # between attempts to connect again after the server closed the link

ReconnectListener = Callable[[NatsClient], Awaitable[None]]
"""Called (awaited, on the loop) with the new connection that replaced a closed one."""


async def settle(nc: NatsClient, timeout: float = 5.0) -> None:
    """Return once nats-server has read everything ``nc`` was asked to send before the call
    (a SUB just made is in effect for publishers on other connections). One ``flush()`` does
    not prove it: nats-py (2.x, ``Client._send_ping``) writes its PING straight to the socket,
    ahead of the commands still queued for its flusher task, so the PONG can come back before
    nats-server has read a SUB issued just before. The first round trip lets the flusher write
    the queue (its wake-up is scheduled before the PONG can be read); the second PING follows
    it on the wire. Raises nats-py's ``FlushTimeoutError`` after ``timeout`` s each."""
    await nc.flush(timeout)
    await nc.flush(timeout)


class NatsLink:
    """riverlog's NATS connection. ``await start()``, ``nc`` (None until started or while
    reconnecting), ``await stop()``. ``routes``: the embedded nats-server's ``cluster`` block
    (nats-server configuration format: name, listen, routes, authorization), None alone.
    ``auth`` is the embedded server's users and TLS when riverlog manages them (the NATS door
    tells it the streams' subjects before start); ``embedded`` the child nats-server, named
    ``name`` (nats-server's server name, unique in a NATS cluster). ``clustered``: the
    servers' own traffic gets a connection of its own (``cluster_nc``)."""

    def __init__(self, config: NatsConfig, guard: Guard | None = None,
                 routes: dict | None = None, name: str | None = None,
                 clustered: bool = False) -> None:
        self.config = config
        self.guard = guard = guard or Guard(SecurityConfig())
        self.routes = routes
        self.name = name
        self.auth: NatsAuth | None = None
        if config.embedded and not config.embedded_config:
            auth = NatsAuth(guard, config.host, config.namespace, clustered=routes is not None)
            if auth.needed:
                self.auth = auth
        self.embedded: EmbeddedNats | None = None
        self.nc: NatsClient | None = None
        self.clustered = clustered
        self._cluster_nc: NatsClient | None = None
        self.servers: list[str] = list(config.servers)
        self._listeners: list[ReconnectListener] = []
        self._stopping = False
        self._reconnect_task: asyncio.Task | None = None

    @property
    def inbox_prefix(self) -> str:
        """Where the answers to this connection's requests come (a follower's fetches, a
        server's status requests): `<namespace>._INBOX`, which every NATS user of the
        embedded server is denied (nats_auth.py) and riverlog's own user needs anyway on
        other NATS servers; nats-py's default `_INBOX` lets a user read the answers and race
        a forged one."""
        return f"{self.config.namespace}._INBOX"

    @property
    def url(self) -> str:
        """The NATS address clients can use (the first server)."""
        return self.servers[0] if self.servers else ""

    @property
    def cluster_nc(self) -> NatsClient | None:
        """The connection the servers' requests to each other use: a connection of its own
        when ``clustered``, else ``nc``; None until started or while reconnecting."""
        return self._cluster_nc if self.clustered else self.nc

    @property
    def started(self) -> bool:
        return self.nc is not None or self._reconnect_task is not None

    def add_reconnect_listener(self, listener: ReconnectListener) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        """Start the embedded nats-server (unless servers were given) and connect; nothing
        when already started. Raises ``OSError`` (port taken, no server) naming the
        address."""
        if self.started:
            return
        if self.config.embedded:
            settings = None
            if self.auth is not None or self.routes is not None:
                settings = self.auth.settings() if self.auth is not None else {}
                if self.routes is not None:
                    settings["cluster"] = self.routes
            self.embedded = EmbeddedNats(self.config.host, self.config.port,
                                         self.config.embedded_config, self.config.binary,
                                         self.config.port_fallback, settings, self.name)
            await self.embedded.start()
            self.servers = [self.embedded.url]
        try:
            self.nc, self._cluster_nc = await self._connect_all()
        except Exception as exc:
            if self.embedded is not None:
                await self.embedded.stop()
            reason = str(exc) or f"no connection within {FIRST_CONNECT_TIMEOUT_S:.0f}s (the " \
                                 f"errors logged above say why)"
            raise OSError(f"cannot connect to NATS at {', '.join(self.servers)}: "
                          f"{reason}") from None

    async def reload(self) -> None:
        """Have the embedded nats-server take ``auth``'s current settings (the streams'
        subjects changed); the file is assembled off the loop. Raises ``OSError``."""
        if self.embedded is None or self.auth is None:
            return
        settings = await asyncio.to_thread(self.auth.settings, self.auth.snapshot())
        if self.routes is not None:
            settings["cluster"] = self.routes
        await self.embedded.reload(settings)

    async def _connect_all(self) -> tuple[NatsClient, NatsClient | None]:
        """New connections: the door's and, when ``clustered``, the cluster's (else None).
        Raises as ``_connect``, having closed the one made when the other fails."""
        nc = await self._connect("riverlog")
        if not self.clustered:
            return nc, None
        try:
            return nc, await self._connect("riverlog-cluster")
        except BaseException:
            await nc.close()
            raise

    async def _connect(self, name: str) -> NatsClient:
        """A new connection to ``servers``, ``name`` the client name nats-server shows.
        nats-py retries a failing first connection forever (max_reconnect_attempts -1, kept
        for later reconnects): this gives up after FIRST_CONNECT_TIMEOUT_S (e.g. on a TLS
        mismatch) with ``asyncio.TimeoutError``."""
        return await asyncio.wait_for(nats.connect(
            self.servers, name=name, connect_timeout=5, allow_reconnect=True,
            max_reconnect_attempts=-1, reconnect_time_wait=1,
            error_cb=self._error, disconnected_cb=self._disconnected,
            reconnected_cb=self._reconnected, closed_cb=self._closed,
            pending_size=64 * 1024 * 1024, inbox_prefix=self.inbox_prefix,
            **connect_options(self.config, self.guard, self.auth)), FIRST_CONNECT_TIMEOUT_S)

    async def stop(self) -> None:
        """Close the connection (its users flushed what they send first) and stop the
        embedded nats-server."""
        self._stopping = True
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
        connections = (self.nc, self._cluster_nc)
        self.nc = self._cluster_nc = None
        for nc in connections:
            if nc is not None:
                try:
                    await asyncio.wait_for(nc.flush(), 5)
                except Exception:
                    pass
                await nc.close()
        if self.embedded is not None:
            await self.embedded.stop()

    async def _error(self, exc: Exception) -> None:
        log.error("NATS: %s", exc)

    async def _disconnected(self) -> None:
        if self.nc is not None:  # None: we are closing it
            log.warning("disconnected from NATS, reconnecting")

    async def _reconnected(self) -> None:
        NATS_RECONNECTS.inc()
        log.info("reconnected to NATS at %s", self.nc.connected_url.netloc if self.nc else "?")

    async def _closed(self) -> None:
        """nats-py closed a connection for good: the server sent -ERR (e.g. "maximum
        control line exceeded", "authorization violation") and nats-py does not reconnect
        after that. Unless stopping, connect again (both connections)."""
        nc, cluster_nc = self.nc, self._cluster_nc
        closed = [c for c in (nc, cluster_nc) if c is not None and c.is_closed]
        if self._stopping or nc is None or not closed or self._reconnect_task is not None:
            return
        log.error("the NATS server closed riverlog's connection (%s): NATS publishes are not "
                  "stored until riverlog is connected again",
                  closed[0].last_error or "no reason given")
        self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        """Close the connection still open, connect both again (every RECONNECT_WAIT_S until
        it works or the link stops), then hand the new door connection to every reconnect
        listener."""
        try:
            for old in (self.nc, self._cluster_nc):  # the one still open goes too
                if old is not None and not old.is_closed:
                    try:
                        await old.close()
                    except Exception:
                        pass
            while True:
                try:
                    nc, cluster_nc = await self._connect_all()
                except Exception as exc:
                    log.error("cannot connect to NATS at %s again: %s; next try in %.0fs",
                              ", ".join(self.servers), str(exc) or "timed out",
                              RECONNECT_WAIT_S)
                    await asyncio.sleep(RECONNECT_WAIT_S)
                    continue
                if self._stopping:
                    for new in (nc, cluster_nc):
                        if new is not None:
                            await new.close()
                    return
                self.nc, self._cluster_nc = nc, cluster_nc
                for listener in list(self._listeners):
                    try:
                        await listener(nc)
                    except Exception:
                        log.exception("a NATS reconnect listener failed")
                NATS_RECONNECTS.inc()
                log.warning("reconnected to NATS at %s", nc.connected_url.netloc)
                return
        finally:
            self._reconnect_task = None


async def publish_wait_ack(nc: NatsClient | None, subject: str, data: bytes, inbox: str,
                           timeout: float | None) -> pb.Ack | None:
    """Publish ``data`` on ``subject`` through ``nc`` (NatsLink.nc) and, with a ``timeout``
    (s), wait for the first Ack on ``inbox``; None without timeout. Raises
    ``asyncio.TimeoutError`` when no ack comes in time and ``OSError`` when NATS is not
    connected."""
    if nc is None or not nc.is_connected:
        raise OSError("not connected to NATS")
    if timeout is None:
        await nc.publish(subject, data)
        return None
    sub = await nc.subscribe(inbox, max_msgs=1)
    try:
        await nc.publish(subject, data)
        while True:
            msg = await sub.next_msg(timeout=timeout)
            ack = decode_ack(msg.data)
            if ack is not None:
                return ack
    except nats.errors.TimeoutError:
        raise asyncio.TimeoutError from None
    finally:
        try:
            await sub.unsubscribe()
        except Exception:
            pass
