# The NATS front door of Liftbridge: makes NATS subjects durable. Owns the NATS connection,
# one queue subscription per partition of every stream attached to a subject, and the acks
# published back to ack inboxes; starts the embedded nats-server unless servers are given.
# Rules: partition N of a stream listens on `subject` (N = 0) or `subject.N`, in the stream's
# queue group; a payload that is a valid Publish envelope is stored with its key, value and
# headers and acked per its ack policy, anything else (including a broken envelope) is stored
# as a plain message (value = the payload, no key, no ack); paused partitions are not
# subscribed; read-only partitions drop what arrives; acks queued during one event-loop turn
# go out together. Wire facts: reference/liftbridge.md "Envelope and NATS subjects";
# the envelope codec is riverlog.protocol.liftbridge.envelope.
from __future__ import annotations

import asyncio
import logging

import nats
from nats.aio.client import Client as NatsClient

from ..broker import Partition, Stream
from ..config import NatsConfig, SecurityConfig
from ..metrics import NATS, error as count_error
from ..protocol.liftbridge import api_pb2 as pb
from ..protocol.liftbridge.envelope import MAGIC, decode_ack, decode_publish, encode_ack
from ..security.guard import Guard
from ..security.nats_auth import NatsAuth, connect_options
from .embedded_nats import EmbeddedNats
from .liftbridge import NONE, Liftbridge, partition_subject

log = logging.getLogger("riverlog.nats")

PENDING_BYTES_LIMIT = 512 * 1024 * 1024  # per subscription, before NATS "slow consumer" drops
FIRST_CONNECT_TIMEOUT_S = 15.0


class NatsBridge:
    """The NATS side of the Liftbridge doors. ``await start()``, ``await stop()``."""

    def __init__(self, service: Liftbridge, config: NatsConfig,
                 guard: Guard | None = None) -> None:
        self.service = service
        self.config = config
        self.guard = guard
        self.auth: NatsAuth | None = None  # the embedded server's TLS and users, when ours
        self._reload_pending = False
        self.embedded: EmbeddedNats | None = None
        self.nc: NatsClient | None = None
        self.servers: list[str] = list(config.servers)
        self._subs: dict[int, object] = {}
        self._pending: set[asyncio.Task] = set()
        self._out: list[tuple[str, bytes]] = []
        self._out_task: asyncio.Task | None = None
        service.bridge = self

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Start the embedded nats-server (unless servers were given), connect, and subscribe
        every partition of every stream that has a subject. Raises ``OSError`` (port taken,
        no server) with a message naming the address."""
        guard = self.guard or Guard(SecurityConfig())
        settings = None
        if self.config.embedded:
            auth = NatsAuth(guard, self.config.host)
            if auth.needed and not self.config.embedded_config:
                self.auth = auth
                settings = auth.settings(self.service.broker.streams.values())
            self.embedded = EmbeddedNats(self.config.host, self.config.port,
                                         self.config.embedded_config, self.config.binary,
                                         self.config.port_fallback, settings)
            await self.embedded.start()
            self.servers = [self.embedded.url]
        try:
            # nats-py retries a failing first connection forever (max_reconnect_attempts -1,
            # kept for later reconnects): give up after a while, e.g. on a TLS mismatch
            self.nc = await asyncio.wait_for(nats.connect(
                self.servers, name="riverlog", connect_timeout=5, allow_reconnect=True,
                max_reconnect_attempts=-1, reconnect_time_wait=1,
                error_cb=self._error, disconnected_cb=self._disconnected,
                reconnected_cb=self._reconnected, pending_size=64 * 1024 * 1024,
                **connect_options(self.config, guard, self.auth)), FIRST_CONNECT_TIMEOUT_S)
        except Exception as exc:
            if self.embedded is not None:
                await self.embedded.stop()
            reason = str(exc) or f"no connection within {FIRST_CONNECT_TIMEOUT_S:.0f}s (the " \
                                 f"errors logged above say why)"
            raise OSError(f"cannot connect to NATS at {', '.join(self.servers)}: "
                          f"{reason}") from None
        for stream in list(self.service.broker.streams.values()):
            self.attach(stream)
        await self.sync()
        log.info("NATS bridge connected to %s", ", ".join(self.servers))

    async def stop(self) -> None:
        """Unsubscribe, send the acks still queued, close the connection, stop nats-server."""
        nc, self.nc = self.nc, None
        if nc is not None:
            if self._pending:
                await asyncio.wait(list(self._pending), timeout=5)
            for sub in list(self._subs.values()):
                try:
                    await sub.unsubscribe()
                except Exception:
                    pass
            self._subs.clear()
            await self._send_out(nc)
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
        log.info("reconnected to NATS at %s", self.nc.connected_url.netloc if self.nc else "?")

    @property
    def url(self) -> str:
        """The NATS address clients can use (the first server)."""
        return self.servers[0] if self.servers else ""

    # -- subscriptions ------------------------------------------------------------------
    def _task(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("NATS subscription change failed: %s", task.exception())

    async def sync(self) -> None:
        """Wait until subscription changes made so far are in effect at the NATS server."""
        while self._pending:
            await asyncio.wait(list(self._pending))
        if self.nc is not None and self.nc.is_connected:
            await self.nc.flush(5)

    def attach(self, stream: Stream) -> None:
        """Subscribe every unpaused partition of a stream that has a subject."""
        if stream.config.subject:
            for partition in stream.partitions:
                if not partition.paused:
                    self._task(self._subscribe(stream, partition))
            self._permissions_changed()

    def detach(self, stream: Stream) -> None:
        for partition in stream.partitions:
            self.pause(stream, partition)
        if stream.config.subject:
            self._permissions_changed()

    def _permissions_changed(self) -> None:
        """A stream's subjects came or went: the embedded server's user permissions follow
        (in effect once ``sync()`` returns)."""
        if self.auth is None or not self.auth.users_on or self._reload_pending:
            return
        self._reload_pending = True
        self._task(self._reload())

    async def _reload(self) -> None:
        await asyncio.sleep(0)  # one reload for every change made in this turn
        self._reload_pending = False
        if self.embedded is not None:
            await self.embedded.reload(self.auth.settings(self.service.broker.streams.values()))

    def pause(self, stream: Stream, partition: Partition) -> None:
        sub = self._subs.pop(id(partition), None)
        if sub is not None:
            self._task(sub.unsubscribe())

    def resume(self, stream: Stream, partition: Partition) -> None:
        if stream.config.subject and id(partition) not in self._subs:
            self._task(self._subscribe(stream, partition))

    async def _subscribe(self, stream: Stream, partition: Partition) -> None:
        if self.nc is None or id(partition) in self._subs:
            return
        subject = partition_subject(stream.config.subject or "", partition.index)
        sub = await self.nc.subscribe(subject, queue=stream.config.group or "",
                                      cb=self._handler(stream, partition),
                                      pending_msgs_limit=0,
                                      pending_bytes_limit=PENDING_BYTES_LIMIT)
        if id(partition) in self._subs or partition.paused or \
                self.service.broker.streams.get(stream.name) is not stream:
            await sub.unsubscribe()  # lost a race with pause/delete
            return
        self._subs[id(partition)] = sub
        log.debug("partition %s/%d listens on %s (queue group %r)", stream.name,
                  partition.index, subject, stream.config.group or "")

    def _handler(self, stream: Stream, partition: Partition):
        ingest = self.service.ingest
        send_ack = self.send_ack

        async def on_message(msg) -> None:
            if partition.readonly or partition.paused:
                return
            data = msg.data
            envelope = decode_publish(data) if data[:4] == MAGIC else None
            try:
                if envelope is None:
                    ingest(stream, partition, value=data, key=None, headers=None,
                           msg_subject=msg.subject, reply=msg.reply, ack_inbox="",
                           correlation_id="", ack_policy=NONE, expected_offset=None,
                           size=len(data), deliver=None, door=NATS)
                else:
                    offset = envelope.offset
                    inbox = envelope.ackInbox
                    ingest(stream, partition, value=envelope.value, key=envelope.key or None,
                           headers=envelope.headers, msg_subject=msg.subject, reply=msg.reply,
                           ack_inbox=inbox, correlation_id=envelope.correlationId,
                           ack_policy=envelope.ackPolicy,
                           expected_offset=None if offset == -1 else offset, size=len(data),
                           deliver=send_ack if inbox else None, door=NATS)
            except Exception as exc:  # a closed/deleted partition: the message is not stored
                log.error("message on %s not stored: %s", msg.subject, exc)
                count_error(NATS, type(exc).__name__)

        return on_message

    # -- publishing ---------------------------------------------------------------------
    def send_ack(self, ack: pb.Ack) -> None:
        """Queue an enveloped Ack for its ack inbox."""
        if ack.ackInbox:
            self.publish(ack.ackInbox, encode_ack(ack))

    def publish(self, subject: str, data: bytes) -> None:
        """Queue a NATS publish; everything queued in one loop turn is sent together."""
        self._out.append((subject, data))
        if self._out_task is None:
            self._out_task = asyncio.get_running_loop().create_task(self._flush_out())

    async def _flush_out(self) -> None:
        try:
            nc = self.nc
            if nc is not None:
                await self._send_out(nc)
            else:
                self._out.clear()
        finally:
            self._out_task = None
            if self._out:  # queued while the last awaits ran
                self._out_task = asyncio.get_running_loop().create_task(self._flush_out())

    async def _send_out(self, nc: NatsClient) -> None:
        out, self._out = self._out, []
        for subject, data in out:
            try:
                await nc.publish(subject, data)
            except Exception as exc:
                log.error("NATS publish to %s failed: %s", subject, exc)

    async def publish_wait_ack(self, subject: str, data: bytes, inbox: str,
                               timeout: float | None) -> pb.Ack | None:
        """Publish ``data`` on ``subject`` and, with a ``timeout`` (s), wait for the first
        Ack on ``inbox``; None without timeout. Raises ``asyncio.TimeoutError`` when no ack
        comes in time and ``OSError`` when NATS is not connected."""
        nc = self.nc
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
