# riverlog's own NATS connection for the NATS door's data: the partitions' subscriptions and
# the acks (and forwarded publishes) sent back. It keeps nats-py's per-message machinery (a
# Msg object, a queue and an awaited callback per message) off the hot path: every MSG of a
# socket read is parsed in one pass (riverlog.protocol.nats_wire) and each subscription's
# handler gets that read's messages as one list; what is published in one loop turn goes out
# as one write. nats-py (NatsLink) keeps the control traffic.
# Owns: the socket, the handshake (INFO, TLS when the server requires it or options give a
# context, CONNECT as the same user as NatsLink, PING/PONG), the subscriptions by sid, and
# getting the connection back: when the socket closes (the server's -ERR, a slow-consumer cut,
# a lost network) it connects again every RECONNECT_WAIT_S and subscribes everything again.
# Rules: a server that breaks the protocol or a limit gets its connection dropped (and
# retried), never the process; nothing is published while disconnected (publishes are
# dropped, the caller logs them: an ack that never comes is what Liftbridge's publisher sees
# too); the server's PING is answered; a PING is sent every PING_INTERVAL_S and a connection
# with MAX_OUTSTANDING_PINGS unanswered is dropped.
from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Callable
from urllib.parse import urlsplit

from ..metrics import NATS_RECONNECTS
from ..protocol.nats_wire import (PING, PONG, NatsParser, NatsProtocolError, connect_command,
                                  sub_command, unsub_command)

log = logging.getLogger("riverlog.nats")

RECONNECT_WAIT_S = 1.0
CONNECT_TIMEOUT_S = 5.0
PING_INTERVAL_S = 30.0
MAX_OUTSTANDING_PINGS = 2
HEADER_ROOM = 64 * 1024  # bytes a message may carry on top of max_payload (its headers)

Handler = Callable[[list], None]
"""Called with a subscription's messages of one read: ``(sid, subject, reply, headers,
payload)`` tuples (nats_wire.NatsParser)."""


class NatsDataLink:
    """The data connection to the first of ``servers`` (``nats://`` or ``tls://`` URLs) that
    answers, as ``user``/``password`` (None: no user; a URL's own user is used otherwise)
    with the TLS context ``tls`` when given. ``await start()`` raises OSError when no
    server can be reached; ``subscribe``/``unsubscribe``/``publish`` may be called at any
    time after; ``await flush()`` returns once the server has taken everything sent before
    (its PONG); ``await stop()`` closes for good."""

    def __init__(self, servers: list[str], user: str | None = None,
                 password: str | None = None, tls: ssl.SSLContext | None = None,
                 name: str = "riverlog-data") -> None:
        self.servers = servers
        self.user, self.password, self.tls, self.name = user, password, tls, name
        self._subs: dict[int, tuple[str, str, Handler]] = {}
        self._next_sid = 1
        self._conn: _Connection | None = None
        self._stopping = False
        self._task: asyncio.Task | None = None
        self.max_payload = 1024 * 1024

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    async def start(self) -> None:
        self._conn = await self._connect()
        self._task = asyncio.get_running_loop().create_task(self._keep())

    async def stop(self) -> None:
        """Send what is queued and close the connection; no reconnect after."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await asyncio.wait_for(conn.flush(), 2)
            except Exception:
                pass
            conn.close()

    def subscribe(self, subject: str, queue: str, handler: Handler) -> int:
        """Subscribe ``subject`` in queue group ``queue`` ("" for none); returns the sid.
        In effect at the server once ``flush`` returns."""
        sid = self._next_sid
        self._next_sid += 1
        self._subs[sid] = (subject, queue, handler)
        if self.connected:
            self._conn.write(sub_command(subject, sid, queue))
        return sid

    def unsubscribe(self, sid: int) -> None:
        if self._subs.pop(sid, None) is not None and self.connected:
            self._conn.write(unsub_command(sid))

    def publish(self, commands: bytes) -> bool:
        """Write ``commands`` (PUB commands: ``PUB <subject> <#bytes>``, the payload) as one
        write; False when disconnected (nothing is sent)."""
        if not self.connected:
            return False
        self._conn.write(commands)
        return True

    async def flush(self, timeout: float = 5.0) -> None:
        """Wait until the server has read everything sent so far (a PING's PONG). Raises
        ``asyncio.TimeoutError``, ``ConnectionError`` when disconnected."""
        if not self.connected:
            raise ConnectionError("not connected to NATS")
        await asyncio.wait_for(self._conn.flush(), timeout)

    # -- connecting -----------------------------------------------------------------------
    async def _connect(self) -> "_Connection":
        """A handshaken connection to the first server that answers; raises OSError."""
        errors = []
        for url in self.servers:
            try:
                return await asyncio.wait_for(self._connect_to(url), CONNECT_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError, NatsProtocolError, ssl.SSLError) as exc:
                errors.append(f"{url}: {exc or type(exc).__name__}")
        raise OSError("cannot open the NATS data connection: " + "; ".join(errors))

    async def _connect_to(self, url: str) -> "_Connection":
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        loop = asyncio.get_running_loop()
        conn = _Connection(self)
        await loop.create_connection(lambda: conn, parts.hostname or "127.0.0.1",
                                     parts.port or 4222)
        try:
            return await self._handshake(conn, parts)
        except BaseException:
            conn.close()
            raise

    async def _handshake(self, conn: "_Connection", parts) -> "_Connection":
        loop = asyncio.get_running_loop()
        info = await conn.info
        tls = self.tls
        if tls is None and (parts.scheme == "tls" or info.get("tls_required")):
            tls = ssl.create_default_context()
        if tls is not None:
            transport = await loop.start_tls(conn.transport, conn, tls,
                                             server_hostname=parts.hostname)
            conn.transport = transport
        options = {"verbose": False, "pedantic": False, "name": self.name, "lang": "python",
                   "version": "riverlog", "protocol": 1, "headers": True,
                   "no_responders": True}
        user = self.user if self.user is not None else parts.username
        password = self.password if self.user is not None else parts.password
        if user:
            options.update(user=user, **{"pass": password or ""})
        conn.write(connect_command(options))
        self.max_payload = int(info.get("max_payload", self.max_payload))
        conn.parser.max_message = self.max_payload + HEADER_ROOM
        for sid, (subject, queue, _) in self._subs.items():
            conn.write(sub_command(subject, sid, queue))
        await conn.flush()  # a refused CONNECT answers -ERR and closes: ConnectionError
        return conn

    async def _keep(self) -> None:
        """Ping the server; connect again whenever the connection closes."""
        while not self._stopping:
            conn = self._conn
            try:
                await asyncio.wait_for(asyncio.shield(conn.lost), PING_INTERVAL_S)
            except asyncio.TimeoutError:
                if conn.pings_out >= MAX_OUTSTANDING_PINGS:
                    log.warning("NATS data connection: %d PINGs unanswered, reconnecting",
                                conn.pings_out)
                    conn.close()
                else:
                    conn.ping()
                continue
            if self._stopping:
                return
            log.warning("NATS data connection lost (%s), reconnecting", conn.error or "closed")
            while not self._stopping:
                await asyncio.sleep(RECONNECT_WAIT_S)
                try:
                    self._conn = await self._connect()
                except OSError as exc:
                    log.error("%s; next try in %.0fs", exc, RECONNECT_WAIT_S)
                    continue
                NATS_RECONNECTS.inc()
                log.warning("reconnected to NATS (the NATS door's data connection); %d "
                            "subscriptions again", len(self._subs))
                break

    def _deliver(self, messages: list) -> None:
        """Hand one read's messages to their subscriptions, a list per subscription."""
        subs = self._subs
        if len(messages) == 1 or all(m[0] == messages[0][0] for m in messages):
            sub = subs.get(messages[0][0])
            if sub is not None:
                sub[2](messages)
            return
        by_sid: dict[int, list] = {}
        for message in messages:
            by_sid.setdefault(message[0], []).append(message)
        for sid, batch in by_sid.items():
            sub = subs.get(sid)
            if sub is not None:
                sub[2](batch)


class _Connection(asyncio.Protocol):
    """One socket to nats-server: parses what it reads (messages to the link's handlers,
    PING answered, PONG waking ``flush``), writes what the link gives it."""

    def __init__(self, link: NatsDataLink) -> None:
        loop = asyncio.get_running_loop()
        self.link = link
        self.parser = NatsParser()
        self.transport: asyncio.Transport | None = None
        self.info: asyncio.Future = loop.create_future()
        self.lost: asyncio.Future = loop.create_future()
        self.pongs: list[asyncio.Future] = []
        self.pings_out = 0
        self.error: str | None = None
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            messages, operations = self.parser.feed(data)
        except NatsProtocolError as exc:
            self.error = f"protocol error: {exc}"
            log.error("NATS data connection: %s", exc)
            self.close()
            return
        for name, argument in operations:
            if name == "PING":
                self.write(PONG)
            elif name == "PONG":
                self.pings_out = 0
                if self.pongs:
                    waiter = self.pongs.pop(0)
                    if not waiter.done():
                        waiter.set_result(None)
            elif name == "INFO":
                if not self.info.done():
                    self.info.set_result(argument)
            elif name == "-ERR":
                self.error = argument
                log.error("NATS data connection: -ERR %s", argument)
        if messages:
            try:
                self.link._deliver(messages)
            except Exception:  # a handler's bug: logged, the connection and the rest go on
                log.exception("NATS data connection: a subscription's handler failed")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if exc is not None and self.error is None:
            self.error = str(exc)
        failure = ConnectionError(self.error or "NATS connection closed")
        if not self.info.done():
            self.info.set_exception(failure)
            self.info.exception()  # retrieved: nobody may be waiting any more
        for waiter in self.pongs:
            if not waiter.done():
                waiter.set_exception(failure)
        self.pongs.clear()
        if not self.lost.done():
            self.lost.set_result(None)

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def ping(self) -> asyncio.Future:
        waiter = asyncio.get_running_loop().create_future()
        if self.closed:
            waiter.set_exception(ConnectionError(self.error or "NATS connection closed"))
            return waiter
        self.pongs.append(waiter)
        self.pings_out += 1
        self.transport.write(PING)
        return waiter

    async def flush(self) -> None:
        await self.ping()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
