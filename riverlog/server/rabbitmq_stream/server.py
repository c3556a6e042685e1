# The listening side of the RabbitMQ Stream door: the TCP (and TLS) listeners and the set of
# connections (connection.py), the door-wide registries they share (super streams, single
# active consumer groups), and what the broker tells every connection: a stream deleted, a
# partition's leader changed, a stream restarted (rabbitmq-streams restart_stream).
# Rules: a taken port is a clear OSError; a deleted, restarted stream or a moved leader ends
# the publishers and subscriptions on it with MetadataUpdate, as RabbitMQ does when a stream member
# goes down (docs/rabbitmq-stream.md, "Cluster"); shutdown writes what was received and sends
# its confirms before it asks clients to close.
from __future__ import annotations

import asyncio
import logging
import time

from ...broker import Broker, SingleActiveConsumers, Stream, SuperStreams
from ...config import RabbitStreamConfig, SecurityConfig
from ...security.guard import Guard
from .connection import RabbitStreamConnection
from .silent_close import SilentCloses

log = logging.getLogger("riverlog.rabbitmq_stream")


class RabbitStreamServer:
    """The listening socket and its connections. ``await start()``, ``await stop()``.
    ``table_catalog``: the Iceberg catalog of the server's stream tables (its password left
    out; riverlog.tables.service.TableService.catalog_uri) that Open names to clients.
    ``sendfile_bytes`` counts the chunk data bytes its connections sent by os.sendfile;
    ``silent_closes`` holds the refused connections waiting to be answered (silent_close.py)."""

    def __init__(self, broker: Broker, config: RabbitStreamConfig,
                 guard: Guard | None = None, table_catalog: str | None = None) -> None:
        self.broker = broker
        self.table_catalog = table_catalog
        self.config = config
        self.guard = guard or Guard(SecurityConfig())
        self.connections: set[RabbitStreamConnection] = set()
        self.sendfile_bytes = 0
        self.silent_closes = SilentCloses(config.silent_close_delay_ms, config.silent_close_max)
        self._server: asyncio.AbstractServer | None = None
        self._tls_server: asyncio.AbstractServer | None = None
        self.port = config.port
        self.tls_port = config.tls_port
        self.super_streams = SuperStreams(broker)
        self.sac = SingleActiveConsumers()
        broker.deletion_listeners.append(self._stream_deleted)
        broker.leader_listeners.append(self._leader_changed)
        broker.alarms.listeners.append(self._alarm_changed)

    @property
    def advertised(self) -> tuple[str, int]:
        host = self.config.advertised_host or (
            "localhost" if self.config.host in ("0.0.0.0", "::", "") else self.config.host)
        return host, self.config.advertised_port or self.port

    @property
    def tls_listening(self) -> bool:
        """Whether the TLS listener is up (on ``tls_port``)."""
        return self._tls_server is not None

    def advertised_for(self, tls: bool) -> tuple[str, int]:
        """What Open and Metadata tell a client: the TLS listener's port on TLS connections."""
        host, port = self.advertised
        return (host, self.tls_port) if tls else (host, port)

    async def start(self) -> None:
        """Listen (and for TLS on ``tls_port`` when TLS is configured). Raises ``OSError``
        with a clear message when a port is taken."""
        self._server = await self._listen(self.config.port, None)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("RabbitMQ Stream door listening on %s:%d", self.config.host, self.port)
        context = self.guard.ssl_context()
        if context is not None:
            try:
                self._tls_server = await self._listen(self.config.tls_port, context)
            except OSError:
                self._server.close()
                raise
            self.tls_port = self._tls_server.sockets[0].getsockname()[1]
            log.info("RabbitMQ Stream door listening for TLS on %s:%d", self.config.host,
                     self.tls_port)

    async def _listen(self, port: int, context) -> asyncio.AbstractServer:
        timeout = self.config.handshake_timeout_ms / 1000
        tls = {"ssl_handshake_timeout": timeout} if context is not None and timeout else {}
        try:  # a TLS handshake counts against the handshake timeout too
            return await asyncio.get_running_loop().create_server(
                lambda: RabbitStreamConnection(self, tls=context is not None), self.config.host,
                port, reuse_address=True, ssl=context, **tls)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen for RabbitMQ Stream clients on "
                                     f"{self.config.host}:{port}: {exc.strerror}") from None

    def _stream_deleted(self, stream: Stream) -> None:
        for name in self.super_streams.door_names(stream):
            self.sac.drop_stream(name)  # its subscriptions end with MetadataUpdate
        for conn in list(self.connections):
            conn.drop(stream.partitions)

    def restart(self, name: str) -> bool:
        """rabbitmq-streams restart_stream on this server: the publishers and subscriptions
        on the name's partitions (every partition for a stream's own name, one for
        ``<stream>-<i>``) end with MetadataUpdate (0x06) and its single active consumer
        groups are forgotten, as when RabbitMQ's coordinator restarts the stream's members
        (rabbit_stream_queue:restart_stream); clients ask Metadata and come back. The data
        stays. False when no stream here has that name."""
        stream = self.broker.streams.get(name)
        if stream is not None:
            names, partitions = self.super_streams.door_names(stream), stream.partitions
        else:
            found = self.super_streams.resolve(name)
            if found is None:
                return False
            names, partitions = [name], [found[1]]
        for door_name in names:
            self.sac.drop_stream(door_name)
        for conn in list(self.connections):
            conn.drop(partitions)
        log.info("stream %r restarted: its publishers and subscriptions were ended", name)
        return True

    def _alarm_changed(self, blocked: bool) -> None:
        """Resource alarm listener: block (or release) every publishing connection."""
        for conn in list(self.connections):
            conn.alarm(blocked)

    def _leader_changed(self, stream: str, index: int) -> None:
        """Placement callback: the publishers and subscriptions on the partition end with
        MetadataUpdate (0x06), as RabbitMQ's do when a new leader restarts the stream's
        members; clients ask Metadata and come back (publishers to the new leader)."""
        found = self.broker.streams.get(stream)
        if found is None or not 0 <= index < len(found.partitions):
            return  # no replica here: nobody publishes or reads it on this server
        self.sac.drop_stream(self.super_streams.door_names(found)[index])
        partition = (found.partitions[index],)
        for conn in list(self.connections):
            conn.drop(partition)

    async def stop(self, grace: float = 1.0) -> None:
        """Stop accepting; stop reading, write what was received and send its confirms
        (waiting up to 5 s for fsyncs); end subscriptions; close every socket once its
        confirms are written (no Close frame: see ``close_for_shutdown``), waiting up to
        ``grace`` seconds for that, then closing what is left at once."""
        for server in (self._server, self._tls_server):
            if server is not None:
                server.close()
        connections = list(self.connections)
        for conn in connections:
            conn.stop_reading()
        pending = [t for c in connections for t in c.pending]
        if pending:
            await asyncio.wait(pending, timeout=5)
        for conn in connections:
            conn.close_for_shutdown()
        deadline = time.monotonic() + grace
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):  # peers that did not take their confirms
            if conn.transport is not None:
                conn.transport.abort()
        for server in (self._server, self._tls_server):
            if server is not None:
                await server.wait_closed()
