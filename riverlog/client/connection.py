# riverlog.client.connection: one connection to a riverlog server (or RabbitMQ) over the
# RabbitMQ Stream protocol (TCP 5552, TLS 5551): the socket, the handshake (peer properties,
# SASL PLAIN or EXTERNAL, tune, open), request/response matching by correlation id,
# heartbeats, and the dispatch of server frames to the publishers and subscriptions registered
# on it (riverlog.client.writer, riverlog.client.reader), which it knows only by the calls it
# makes on them (_confirmed/_errors/_fail, _deliver/_error).
# Rules: frames are built and parsed only by riverlog.protocol.rabbitmq_stream (sans-IO),
# except Deliver frames, cut here with the chunk copied once; every failure raises ClientError
# (with the protocol's response code when the server gave one), never hangs past ``timeout``.
from __future__ import annotations

import asyncio
import itertools
import struct
import time

from .. import __version__
from ..errors import RiverlogError
from ..protocol.rabbitmq_stream import FrameError, ResponseCode, decode, encode
from ..protocol.rabbitmq_stream import frames as f
from ..security.tls import ClientTLS

__all__ = ["DEFAULT_PORT", "DEFAULT_TIMEOUT", "ClientError", "Connection", "parse_servers"]

DEFAULT_PORT = 5552
DEFAULT_TIMEOUT = 30.0
_OK = ResponseCode.OK
_U32 = struct.Struct(">I")


class ClientError(RiverlogError):
    """A request failed. ``code`` is the RabbitMQ Stream response code (``ResponseCode``)
    when the server answered with one, else None (connection lost, timeout, bad frame)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        if code is not None:
            try:
                name = ResponseCode(code).name
            except ValueError:
                name = "?"
            message = f"{message} (0x{code:02x} {name})"
        super().__init__(message)
        self.code = code


def parse_servers(servers: str, default_port: int = DEFAULT_PORT) -> list[tuple[str, int]]:
    """``"host[:port],host[:port]"`` -> ``[(host, port), ...]`` (IPv6 as ``[::1]:5552``).
    Raises ValueError for an empty list or a bad port."""
    out = []
    for item in servers.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port = item.rpartition(":") if item.count(":") == 1 else (item, "", "")
        out.append((host, int(port) if port else default_port))
    if not out:
        raise ValueError(f"no server in {servers!r}")
    return out


_DELIVER = 0x0008
_MIN_READ = 256 * 1024


class _Protocol(asyncio.BufferedProtocol):
    """Receives into one growing buffer and cuts frames out of it. Deliver frames (the bulk
    of the bytes) are cut here, the chunk copied once; every other frame goes through the
    codec's ``decode``."""

    def __init__(self, client: "Connection") -> None:
        self.client = client
        self.buf = bytearray(_MIN_READ * 4)
        self.start = self.end = 0
        self.frame = 0  # size of the frame waiting to complete (0: not known yet)

    def connection_made(self, transport) -> None:
        self.client._transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        # The buffer is resized only here: the transport holds a view of it while it calls
        # buffer_updated, and a bytearray with a live view cannot change size.
        pending = self.end - self.start
        want = max(sizehint, _MIN_READ, self.frame - pending)
        if len(self.buf) - self.end < want:
            if self.start:  # move the partial frame to the front
                self.buf[:pending] = self.buf[self.start:self.end]
                self.start, self.end = 0, pending
            if len(self.buf) - self.end < want:
                self.buf.extend(bytes(want - (len(self.buf) - self.end)))
        return memoryview(self.buf)[self.end:]

    def buffer_updated(self, nbytes: int) -> None:
        self.end += nbytes
        buf, pos, end = self.buf, self.start, self.end
        frames = []
        try:
            while end - pos >= 4:
                stop = pos + 4 + _U32.unpack_from(buf, pos)[0]
                if stop > end:
                    self.frame = stop - pos
                    break
                # Deliver (key 0x0008, version 1 or 2): the chunk, copied once
                if buf[pos + 4] == 0 and buf[pos + 5] == _DELIVER and buf[pos + 6] == 0 \
                        and buf[pos + 7] in (1, 2) and stop - pos >= 9 + 8 * (buf[pos + 7] - 1):
                    skip = 9 if buf[pos + 7] == 1 else 17
                    with memoryview(buf) as view:  # bytes(buf[a:b]) would copy twice
                        frames.append(f.Deliver(buf[pos + 8], bytes(view[pos + skip:stop])))
                else:
                    frames.append(decode(bytes(buf[pos:stop])))
                pos = stop
        except (FrameError, IndexError) as exc:
            self.start = pos
            for frame in frames:
                self.client._dispatch(frame)
            self.client._bad_frame(exc)
            return
        if pos == end:
            self.start = self.end = self.frame = 0
        else:
            self.start = pos
        for frame in frames:
            self.client._dispatch(frame)

    def eof_received(self):
        return None

    def connection_lost(self, exc) -> None:
        self.client._lost(exc)


class Connection:
    """One connection speaking the RabbitMQ Stream protocol: ``await Connection.connect(...)``
    (or a subclass's, AsyncClient), ``await close()``. Every request waits at most
    ``timeout`` seconds; errors raise ``ClientError``. ``_publishers`` and ``_subscriptions``
    (by id) are the registries the frames it receives are dispatched to."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        self.frame_max = 0
        self.heartbeat = 0
        self.server_properties: dict = {}
        self._transport: asyncio.Transport | None = None
        self._correlation = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._tune: asyncio.Future | None = None
        self._publishers: dict = {}  # publisher id -> riverlog.client.writer.AsyncPublisher
        self._subscriptions: dict = {}  # subscription id -> reader.AsyncSubscription
        self._closed: ClientError | None = None
        self._heartbeat_task: asyncio.Task | None = None
        self._last_sent = time.monotonic()
        self._writable = asyncio.Event()
        self._writable.set()

    # -- connection -------------------------------------------------------------------------
    @classmethod
    async def connect(cls, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                      user: str = "guest", password: str = "guest", *, vhost: str = "/",
                      connection_name: str = "riverlog-client",
                      timeout: float = DEFAULT_TIMEOUT, tls: ClientTLS | None = None,
                      mechanism: str = "PLAIN") -> "Connection":
        """Open a connection and run the handshake; with ``tls``, over TLS (the door's TLS
        port, 5551 by default), verifying the server. ``mechanism``: SASL ``PLAIN`` (``user``
        and ``password``) or ``EXTERNAL`` (the user is named by the client certificate of
        ``tls``; ``user`` and ``password`` are not sent). Raises ClientError (refused
        connection, unreadable TLS files, failed TLS handshake or verification, a mechanism
        the server does not offer, failed authentication, unknown virtual host)."""
        if mechanism not in ("PLAIN", "EXTERNAL"):
            raise ClientError(f"SASL mechanism {mechanism!r}: PLAIN or EXTERNAL")
        self = cls(timeout)
        loop = asyncio.get_running_loop()
        where = f"{host}:{port}" + (" over TLS" if tls else "")
        try:
            context = tls.context() if tls else None
        except OSError as exc:  # ssl.SSLError included
            raise ClientError(f"TLS settings for {where}: {exc}") from None
        try:
            await asyncio.wait_for(loop.create_connection(
                lambda: _Protocol(self), host, port, ssl=context,
                server_hostname=(tls.server_name or host) if tls else None), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise ClientError(f"cannot connect to {where}: {exc}") from None
        self._tune = loop.create_future()
        try:
            await self._request(lambda c: f.PeerProperties(c, {
                "product": "riverlog-client", "version": __version__, "platform": "Python",
                "connection_name": connection_name,
                "riverlog_table_catalog": "?"}))  # asks the Open answer to name it
            offered = await self._request(f.SaslHandshake)
            if mechanism not in offered.mechanisms:
                raise ClientError(f"{where} offers SASL {', '.join(offered.mechanisms)}, not "
                                  f"{mechanism} (EXTERNAL needs TLS and a client certificate "
                                  f"the server verifies)")
            data = b"" if mechanism == "EXTERNAL" else (
                b"\0" + user.encode() + b"\0" + password.encode())
            await self._request(lambda c: f.SaslAuthenticate(c, mechanism, data))
            tune = await asyncio.wait_for(self._tune, timeout)
            self.frame_max, self.heartbeat = tune.frame_max, tune.heartbeat
            self._send(f.Tune(self.frame_max, self.heartbeat))
            opened = await self._request(lambda c: f.Open(c, vhost))
            self.server_properties = dict(opened.properties or {})
        except BaseException as exc:
            hung_up = exc is self._closed  # the server closed the connection
            if not self._tune.done():  # nobody waits for it any more
                self._tune.cancel()
            elif not self._tune.cancelled():
                self._tune.exception()  # retrieved: no "never retrieved" noise on stderr
            self._abort()
            if hung_up:
                raise ClientError(f"{where} closed the connection during the handshake "
                                  f"({exc}; a TLS port spoken to without TLS, or the "
                                  f"other way round?)") from None
            raise
        if self.heartbeat:
            self._heartbeat_task = loop.create_task(self._heartbeats())
        return self

    async def close(self) -> None:
        """Close politely (Close frame, then the socket); safe to call twice."""
        if self._closed is None and self._transport is not None:
            try:
                await asyncio.wait_for(self._request(lambda c: f.Close(c, _OK, "bye")), 2)
            except (ClientError, asyncio.TimeoutError):
                pass
        self._abort()

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def _abort(self) -> None:
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        if self._transport is not None:
            self._transport.close()
        self._lost(None)

    async def _heartbeats(self) -> None:
        period = max(self.heartbeat / 2, 0.5)
        while True:
            await asyncio.sleep(period)
            if time.monotonic() - self._last_sent >= period:
                self._send(f.Heartbeat())

    # -- frames in --------------------------------------------------------------------------
    def _bad_frame(self, exc: Exception) -> None:
        self._fail(ClientError(f"bad frame from the server: {exc}"))
        self._transport.close()

    def _dispatch(self, frame: f.Frame) -> None:
        kind = type(frame)
        if kind is f.Deliver or kind is f.DeliverV2:
            sub = self._subscriptions.get(frame.subscription_id)
            if sub is not None:
                sub._deliver(frame.chunk)
        elif kind is f.PublishConfirm:
            pub = self._publishers.get(frame.publisher_id)
            if pub is not None:
                pub._confirmed(frame.publishing_ids)
        elif kind is f.PublishError:
            pub = self._publishers.get(frame.publisher_id)
            if pub is not None:
                pub._errors(frame.errors)
        elif kind is f.Heartbeat:
            pass
        elif kind is f.Tune:
            if self._tune is not None and not self._tune.done():
                self._tune.set_result(frame)
        elif kind is f.Close:
            self._send(f.CloseResponse(frame.correlation_id, _OK))
            self._fail(ClientError(f"server closed the connection: {frame.reason}", frame.code))
            self._transport.close()
        elif kind is f.MetadataUpdate:
            err = ClientError(f"stream {frame.stream!r} is no longer available", frame.response_code)
            for sub in list(self._subscriptions.values()):
                if sub.stream == frame.stream:
                    sub._error(err)
            for pub in list(self._publishers.values()):
                if pub.stream == frame.stream:
                    pub._fail(err)
        elif kind is f.CreditResponse:
            sub = self._subscriptions.get(frame.subscription_id)
            if sub is not None:
                sub._error(ClientError("credit refused", frame.response_code))
        else:
            corr = getattr(frame, "correlation_id", None)
            fut = self._pending.pop(corr, None)
            if fut is not None and not fut.done():
                fut.set_result(frame)

    def _lost(self, exc: Exception | None) -> None:
        self._fail(ClientError(f"connection lost: {exc}" if exc else "connection closed"))

    def _fail(self, err: ClientError) -> None:
        if self._closed is not None:
            return
        self._closed = err
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()
        if self._tune is not None and not self._tune.done():
            self._tune.set_exception(err)
        for pub in list(self._publishers.values()):
            pub._fail(err)
        for sub in list(self._subscriptions.values()):
            sub._error(err)
        self._writable.set()

    # -- frames out -------------------------------------------------------------------------
    def _send(self, frame: f.Frame) -> None:
        self._send_bytes(encode(frame))

    def _send_bytes(self, data: bytes) -> None:
        if self._closed is not None:
            raise self._closed
        self._transport.write(data)
        self._last_sent = time.monotonic()

    async def _request(self, make, expect_ok: bool = True, what: str = "") -> f.Frame:
        if self._closed is not None:
            raise self._closed
        corr = next(self._correlation)
        frame = make(corr)
        fut = asyncio.get_running_loop().create_future()
        self._pending[corr] = fut
        self._send(frame)
        try:
            response = await asyncio.wait_for(fut, self.timeout)
        except asyncio.TimeoutError:
            self._pending.pop(corr, None)
            raise ClientError(f"no answer to {type(frame).__name__} in {self.timeout}s") from None
        code = getattr(response, "response_code", _OK)
        if expect_ok and code != _OK:
            raise ClientError(what or f"{type(frame).__name__} failed", code)
        return response

    @property
    def table_catalog(self) -> str | None:
        """The Iceberg catalog (a URI, its password shown as ``***``) where the server's
        stream tables are, ``riverlog.<stream>`` in it, as its Open answer names it; None
        when the server's tables are not Iceberg tables."""
        return self.server_properties.get("riverlog_table_catalog")

    @property
    def server_address(self) -> tuple[str, int] | None:
        """(host, port) the server advertises for this connection (its Open answer), as
        Metadata names it; None when the server does not say."""
        props = self.server_properties
        try:
            return props["advertised_host"], int(props["advertised_port"])
        except (KeyError, ValueError):
            return None
