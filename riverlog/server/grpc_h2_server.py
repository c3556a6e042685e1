# The `h2` transport of the Liftbridge gRPC door: an asyncio server that speaks gRPC over
# HTTP/2 through the sans-IO riverlog.protocol.grpc_h2 and runs the same method handlers the
# grpc.aio transport runs (grpc.RpcMethodHandler: unary_unary, unary_stream, stream_stream,
# raw request bytes in, the handler's response_serializer out). Owns sockets, TLS (ALPN h2),
# the call tasks and their deadlines. Rules: every message that arrived in one read is handed
# to its call before the loop turns, and every response produced in one loop turn leaves in one
# write (so PublishAsync batches end to end: one read -> one appended chunk -> one write); a
# call whose responses are not read stops taking requests (its window is not given back), so
# memory per call stays bounded; a deadline (grpc-timeout) cancels the handler and ends the
# call with DEADLINE_EXCEEDED; a handler's abort(code, details) ends it with that status and
# message in the trailers; a malformed frame closes only its connection (GOAWAY first).
# Before login (when the door authenticates): a connection is trusted with HTTP/2's full
# windows only once one of its calls is authenticated, which is checked as soon as the call's
# headers arrive (a refused call ends with UNAUTHENTICATED before its body is read); until
# then it may send at most 64 KiB (grpc_h2.UNTRUSTED_WINDOW), and a connection with no
# accepted call within ``handshake_timeout`` seconds is closed. Stream resets are counted per
# client host across its connections (grpc_h2.ResetBudget): a rapid-reset flood gets GOAWAY
# ENHANCE_YOUR_CALM, and so does a reconnected connection's first reset until the budget
# refills.
# Wire facts: grpc's PROTOCOL-HTTP2.md and doc/statuscodes.md, RFC 9113.
from __future__ import annotations

import asyncio
import collections
import logging
import ssl

import grpc

from ..protocol import grpc_h2
from ..protocol.grpc_h2 import frame_messages
from ..security.tls import common_name

log = logging.getLogger("riverlog.grpc")

OUT_LIMIT = 64 * 1024
"""Response bytes one call may have waiting (unsent) before its handler and its requests wait."""
CONNECTION_OUT_LIMIT = 1024 * 1024
"""Response bytes the calls of one connection may produce in one loop turn before they wait
for the next write: with 100 calls each at OUT_LIMIT, a turn's output (and its copies while
framed and written) stays bounded per connection, not per call."""
_OK, _CANCELLED, _UNKNOWN, _DEADLINE, _INTERNAL = 0, 1, 2, 4, 13


class _Abort(Exception):
    """Raised by ServicerContext.abort: the call ends with this status."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class ServicerContext:
    """What a handler sees of its call: the subset of grpc.aio.ServicerContext riverlog's
    handlers use (abort, time_remaining, invocation_metadata, peer, auth_context, code).
    ``takes_lists``: a streaming handler may yield a list of responses, sent as that many
    messages (grpc.aio has no such thing; handlers check this attribute)."""

    takes_lists = True

    __slots__ = ("_peer", "_metadata", "_deadline", "_auth", "_code", "_loop")

    def __init__(self, peer: str, metadata: tuple, deadline: float | None, auth: dict,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._peer = peer
        self._metadata = metadata
        self._deadline = deadline
        self._auth = auth
        self._code: grpc.StatusCode | None = None
        self._loop = loop

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()):
        """End the call with ``code`` and ``details`` (raises; never returns)."""
        self._code = code
        raise _Abort(code.value[0], details)

    def time_remaining(self) -> float | None:
        """Seconds left before the client's deadline; None without one."""
        if self._deadline is None:
            return None
        return max(self._deadline - self._loop.time(), 0.0)

    def invocation_metadata(self) -> tuple:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict:
        return self._auth

    def code(self) -> grpc.StatusCode | None:
        return self._code


class _Call:
    __slots__ = ("sid", "handler", "context", "inbox", "wake", "drained", "pending",
                 "pending_bytes", "remote_done", "task", "timer", "expired")

    def __init__(self, sid: int, handler, context: ServicerContext) -> None:
        self.sid = sid
        self.handler = handler
        self.context = context
        self.inbox: collections.deque[bytes] = collections.deque()
        self.wake = asyncio.Event()
        self.drained = asyncio.Event()  # set: responses may be produced
        self.drained.set()
        self.pending: list[bytes] = []  # responses of this loop turn, not framed yet
        self.pending_bytes = 0
        self.remote_done = False
        self.task: asyncio.Task | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.expired = False


class _Connection(asyncio.Protocol):
    """One client connection."""

    def __init__(self, server: GrpcH2Server) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.conn = grpc_h2.GrpcH2Connection(server.max_message,
                                             trusted=server.authenticate is None)
        self.handshake: asyncio.TimerHandle | None = None
        self.authenticating: set[asyncio.Task] = set()  # _authenticate tasks (kept referenced)
        self.calls: dict[int, _Call] = {}
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.auth: dict = {}
        self.paused = False
        self.closed = False
        self._dirty: list[_Call] = []
        self._dirty_bytes = 0  # response bytes of this loop turn, all calls
        self._scheduled = False

    # -- transport callbacks --------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        address = transport.get_extra_info("peername")
        if address:
            host, port = address[0], address[1]
            self.peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            if ssl_object.selected_alpn_protocol() != "h2":
                log.debug("gRPC client %s did not negotiate ALPN h2", self.peer)
                transport.close()
                return
            self.auth = {"transport_security_type": [b"ssl"]}
            cn = common_name(ssl_object.getpeercert())
            if cn is not None:
                self.auth["x509_common_name"] = [cn.encode()]
        self.server.connections.add(self)
        if address:
            self.conn.resets = self.server.reset_budget(address[0])
        self.handshake = self.loop.call_later(self.server.handshake_timeout, self._too_slow)
        transport.write(self.conn.data_to_send())

    def _too_slow(self) -> None:
        log.info("closing gRPC connection from %s: no %s call within %.1f s", self.peer,
                 "authenticated" if self.server.authenticate else "accepted",
                 self.server.handshake_timeout)
        self.goaway()
        self.transport.close()

    def _handshake_done(self) -> None:
        if self.handshake is not None:
            self.handshake.cancel()
            self.handshake = None

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive(data)
        except grpc_h2.ProtocolError as exc:
            log.info("closing gRPC connection from %s: %s", self.peer, exc)
            self.transport.write(self.conn.data_to_send())
            self.transport.close()
            return
        calls = self.calls
        for event in events:
            kind, sid = event[0], event[1]
            if kind == grpc_h2.MESSAGES:
                call = calls.get(sid)
                if call is not None:
                    call.inbox.extend(event[2])
                    call.wake.set()
            elif kind == grpc_h2.CALL:
                self._start(sid, event[2], event[3], event[4])
            elif kind == grpc_h2.END:
                call = calls.get(sid)
                if call is not None:
                    call.remote_done = True
                    call.wake.set()
                    if call.task is None:
                        self._unary(call)
            elif kind == grpc_h2.WINDOW:
                call = calls.get(sid)
                if call is not None and not self.paused:
                    call.drained.set()
            elif kind == grpc_h2.RESET:
                call = calls.pop(sid, None)
                if call is not None:
                    self._cancel(call)
            elif kind == grpc_h2.BAD_CALL:
                call = calls.pop(sid, None)
                if call is not None:
                    self._cancel(call)
                self.conn.finish(sid, event[2], event[3])
        self._write()

    def pause_writing(self) -> None:
        self.paused = True
        for call in self.calls.values():
            call.drained.clear()

    def resume_writing(self) -> None:
        self.paused = False
        for call in self.calls.values():
            if self.conn.queued(call.sid) <= OUT_LIMIT:
                call.drained.set()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._handshake_done()
        self.server.connections.discard(self)
        for call in list(self.calls.values()):
            self._cancel(call)
        self.calls.clear()

    # -- calls ----------------------------------------------------------------------------
    def _start(self, sid: int, path: str, metadata: list, timeout: float | None) -> None:
        handler = self.server.handlers.get(path)
        if handler is None:
            self.conn.finish(sid, 12, f"Method not found: {path}")  # UNIMPLEMENTED
            return
        deadline = None if timeout is None else self.loop.time() + timeout
        call = _Call(sid, handler, ServicerContext(self.peer, tuple(metadata), deadline,
                                                   self.auth, self.loop))
        self.calls[sid] = call
        if timeout is not None:
            call.timer = self.loop.call_at(deadline, self._expire, call)
        if self.conn.trusted:
            self._handshake_done()
        else:
            task = self.loop.create_task(self._authenticate(call))
            self.authenticating.add(task)
            task.add_done_callback(self.authenticating.discard)
        if handler.stream_stream is not None:
            call.task = self.loop.create_task(self._run(call, handler.stream_stream(
                self._requests(call), call.context)))

    async def _authenticate(self, call: _Call) -> None:
        """Check the credentials of a call on an untrusted connection as soon as its headers
        are in: refused, it ends with that status before its body is read; accepted, the
        connection is trusted (its windows open)."""
        try:
            await self.server.authenticate(call.context)
        except Exception as exc:  # _Abort: refused; anything else: a defect, refused too
            if not isinstance(exc, _Abort):
                log.error("authenticating a gRPC call from %s failed", self.peer, exc_info=exc)
                exc = _Abort(_INTERNAL, "authentication failed")
            if self.calls.pop(call.sid, None) is not None and not self.closed:
                self._cancel(call)
                self.conn.finish(call.sid, exc.code, exc.details)
                self._write()
            return
        if not self.closed:
            self._handshake_done()
            self.conn.trust()
            self._write()

    def _unary(self, call: _Call) -> None:
        """The request of a unary-request call is complete: run it."""
        if len(call.inbox) != 1:
            self.calls.pop(call.sid, None)
            self._cancel(call)
            self.conn.finish(call.sid, _INTERNAL, f"expected one request message, "
                                                  f"got {len(call.inbox)}")
            return
        raw = call.inbox.popleft()
        self.conn.consumed(call.sid, len(raw) + 5)
        handler = call.handler
        if handler.unary_unary is not None:
            call.task = self.loop.create_task(self._run_unary(call, raw))
        else:
            call.task = self.loop.create_task(self._run(call, handler.unary_stream(
                raw, call.context)))

    async def _requests(self, call: _Call):
        """The request iterator of a client-streaming call: waits while responses back up."""
        inbox, drained, sid = call.inbox, call.drained, call.sid
        taken = 0  # bytes handed out whose window is not given back yet
        while True:
            while inbox:
                if not drained.is_set():
                    self._consumed(sid, taken)
                    taken = 0
                    await drained.wait()
                raw = inbox.popleft()
                taken += len(raw) + 5
                yield raw
            self._consumed(sid, taken)
            taken = 0
            if call.remote_done:
                return
            call.wake.clear()
            await call.wake.wait()

    def _consumed(self, sid: int, nbytes: int) -> None:
        if nbytes:
            self.conn.consumed(sid, nbytes)
            if not self._scheduled:
                self._schedule()

    async def _run_unary(self, call: _Call, raw: bytes) -> None:
        handler = call.handler
        try:
            response = await handler.unary_unary(raw, call.context)
            serialize = handler.response_serializer
            self._push(call, serialize(response) if serialize is not None else response)
        except BaseException as exc:
            self._ended(call, exc)
            return
        self._ended(call, None)

    async def _run(self, call: _Call, responses) -> None:
        serialize = call.handler.response_serializer
        try:
            async for response in responses:
                if type(response) is list:
                    for message in response:
                        self._push(call, serialize(message) if serialize is not None
                                   else message)
                else:
                    self._push(call, serialize(response) if serialize is not None else response)
                if not call.drained.is_set():
                    await call.drained.wait()
        except BaseException as exc:
            self._ended(call, exc)
            return
        self._ended(call, None)

    def _ended(self, call: _Call, exc: BaseException | None) -> None:
        """The handler of ``call`` is done (``exc``: how it failed); send the trailers."""
        if call.timer is not None:
            call.timer.cancel()
        code, message = _OK, ""
        if isinstance(exc, _Abort):
            code, message = exc.code, exc.details
        elif isinstance(exc, asyncio.CancelledError):
            if not call.expired:  # the client cancelled, or the connection is gone
                self.calls.pop(call.sid, None)
                raise exc
            code, message = _DEADLINE, "Deadline Exceeded"
        elif exc is not None:
            if not isinstance(exc, Exception):
                raise exc
            log.error("gRPC handler failed on %s", call.handler, exc_info=exc)
            code, message = _UNKNOWN, f"Exception calling application: {exc}"
        if self.calls.pop(call.sid, None) is None or self.closed:
            return
        self._flush_call(call)
        self.conn.finish(call.sid, code, message)
        self._schedule()

    def _expire(self, call: _Call) -> None:
        call.expired = True
        if call.task is not None:
            call.task.cancel()
        else:  # still waiting for its request
            self.calls.pop(call.sid, None)
            self.conn.finish(call.sid, _DEADLINE, "Deadline Exceeded")
            self._write()

    def _cancel(self, call: _Call) -> None:
        if call.timer is not None:
            call.timer.cancel()
        if call.task is not None:
            call.task.cancel()

    # -- writing --------------------------------------------------------------------------
    def _push(self, call: _Call, message: bytes) -> None:
        if not call.pending:
            self._dirty.append(call)
        call.pending.append(message)
        call.pending_bytes += len(message) + 5
        self._dirty_bytes += len(message) + 5
        if call.pending_bytes > OUT_LIMIT or self._dirty_bytes > CONNECTION_OUT_LIMIT:
            call.drained.clear()
        if not self._scheduled:
            self._schedule()

    def _schedule(self) -> None:
        self._scheduled = True
        self.loop.call_soon(self._flush)

    def _flush_call(self, call: _Call) -> None:
        if not call.pending:
            return
        queued = self.conn.send_messages(call.sid, frame_messages(call.pending))
        call.pending.clear()
        call.pending_bytes = 0
        if queued > OUT_LIMIT or self.paused:
            call.drained.clear()
        else:
            call.drained.set()

    def _flush(self) -> None:
        """Once per loop turn: each call's responses of this turn framed and sent together."""
        self._scheduled = False
        dirty, self._dirty = self._dirty, []
        self._dirty_bytes = 0
        for call in dirty:
            self._flush_call(call)
        self._write()

    def _write(self) -> None:
        out = self.conn.data_to_send()
        if out and not self.closed:
            self.transport.write(out)

    def close(self) -> list[asyncio.Task]:
        """Cancel every call and close; returns the cancelled call tasks."""
        tasks = [call.task for call in self.calls.values() if call.task is not None]
        for call in self.calls.values():
            self._cancel(call)
        self.transport.close()
        return tasks

    def goaway(self) -> None:
        """No new calls (GOAWAY NO_ERROR)."""
        self.conn.goaway()
        self._write()


class GrpcH2Server:
    """Serves ``handlers`` ({"/package.Service/Method": grpc.RpcMethodHandler}) on
    ``host``:``port`` (0: a free port), with TLS when ``ssl_context`` is given (ALPN h2 is set
    on it). ``authenticate``: None (every connection is trusted), or an async function of a
    call's ServicerContext that returns once the caller is authenticated and raises through
    ``context.abort`` otherwise (GrpcAuth.user). A connection without an accepted call after
    ``handshake_timeout`` seconds is closed. ``await start()`` returns the port bound (raises
    OSError when it cannot listen); ``await stop(grace)``."""

    def __init__(self, handlers: dict, host: str, port: int,
                 ssl_context: ssl.SSLContext | None = None,
                 max_message: int = 4 * 1024 * 1024, authenticate=None,
                 handshake_timeout: float = 10.0) -> None:
        self.handlers = handlers
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.max_message = max_message
        self.authenticate = authenticate
        self.handshake_timeout = handshake_timeout
        self.connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._resets: dict[str, grpc_h2.ResetBudget] = {}

    def reset_budget(self, host: str) -> grpc_h2.ResetBudget:
        """The stream resets the connections from ``host`` may still send, shared, so a
        client that reconnects after GOAWAY does not start with a full budget again (nghttp2
        counts per connection). Budgets that have refilled are forgotten."""
        budget = self._resets.get(host)
        if budget is None:
            if len(self._resets) >= 1024:
                self._resets = {h: b for h, b in self._resets.items() if not b.full()}
            budget = self._resets[host] = grpc_h2.ResetBudget()
        return budget

    async def start(self) -> int:
        if self.ssl_context is not None:
            self.ssl_context.set_alpn_protocols(["h2"])
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), self.host, self.port,
                                                ssl=self.ssl_context, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self, grace: float = 2.0) -> None:
        """Stop accepting, GOAWAY every connection, let calls end for ``grace`` seconds, then
        cancel the rest and close."""
        if self._server is None:
            return
        self._server.close()
        for connection in list(self.connections):
            connection.goaway()
        deadline = asyncio.get_running_loop().time() + grace
        while any(c.calls for c in self.connections) and \
                asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        tasks = []
        for connection in list(self.connections):
            tasks += connection.close()
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        await self._server.wait_closed()
        self._server = None
