# Sans-IO gRPC over HTTP/2, server side: bytes in, events and bytes out, no sockets here.
# Owns HTTP/2 framing for gRPC calls: the `h2` library keeps the connection and stream state
# (preface, SETTINGS, HEADERS/CONTINUATION with HPACK, PING, RST_STREAM, GOAWAY, outbound flow
# control); DATA frames, the hot path, are split off before h2 sees them and parsed here into
# gRPC messages, because h2 costs ~8 us per DATA frame (measured, one core) and PublishAsync
# sends one frame per message. Rules: every DATA byte is charged to the connection and stream
# receive windows here, and window is given back (WINDOW_UPDATE) only for bytes the owner says
# it consumed, so a peer can never make us buffer more than the windows; a peer that overruns
# a window, sends DATA on a stream it never opened or breaks framing gets GOAWAY and
# ProtocolError (the owner closes the connection). Responses are queued per stream and sent as
# the peer's windows allow; trailers go after the last queued byte. A connection not trusted
# yet (no call authenticated) keeps HTTP/2's initial 65,535-byte connection window and lends
# no window for big messages: before login a peer can make us hold at most that much. Stream
# A message bigger than its call's window is lent the stream and connection window it needs
# (at most twice the largest message per connection; calls over that wait for a lend), so big
# messages never deadlock on the connection window nor take it from small calls. Stream
# resets from the peer are counted (ResetBudget, nghttp2's limits): a flood of them
# (HTTP/2 rapid reset, CVE-2023-44487) gets GOAWAY ENHANCE_YOUR_CALM and ProtocolError.
# Wire facts: RFC 9113 (HTTP/2: 4.1 frame layout, 6.1 DATA, 6.9 WINDOW_UPDATE, 5.1 stream
# states), gRPC's PROTOCOL-HTTP2.md (length-prefixed messages, grpc-timeout, grpc-status and
# grpc-message trailers, percent-encoding).
from __future__ import annotations

import base64
import struct
import time

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
STREAM_WINDOW = 1024 * 1024
"""Bytes a client may send on one call before we consume them (SETTINGS_INITIAL_WINDOW_SIZE)."""
CONNECTION_WINDOW = 8 * STREAM_WINDOW
"""Bytes a client may send on one connection before we consume them."""
UNTRUSTED_WINDOW = 65535
"""... and before the connection is trusted (RFC 9113 6.9.2: the initial window)."""
MAX_CONCURRENT_STREAMS = 100
MAX_FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE we keep (the RFC 9113 default)
RESET_BURST = 1000
"""Stream resets (RST_STREAM from the client) a connection may send at once, and
RESET_RATE: how many a second refill that allowance. More, and the connection gets GOAWAY
ENHANCE_YOUR_CALM (HTTP/2 rapid reset, CVE-2023-44487). nghttp2's defaults
(NGHTTP2_DEFAULT_STREAM_RESET_BURST 1000, _RATE 33, lib/nghttp2_session.c)."""
RESET_RATE = 33.0
H2_RUN = 64
"""Frames handed to h2 at most at once: h2 parses all it is given before its events are
seen, so a flood of HEADERS and RST_STREAM past the reset budget costs at most this many
frames' work before GOAWAY (a 256 KiB read holds ~2,500 such pairs)."""
_DATA, _HEADERS, _PUSH_PROMISE, _CONTINUATION = 0x0, 0x1, 0x5, 0x9
_END_STREAM, _END_HEADERS, _PADDED = 0x1, 0x4, 0x8
_FRAME_HEADER = struct.Struct(">IBI")  # length (24 bits) + type, flags, R + stream id
_MESSAGE_PREFIX = struct.Struct(">BI")  # compressed flag, message length
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}

# events returned by GrpcH2Connection.receive, as tuples (kind, stream id, ...)
CALL = 0      # (CALL, sid, method path str, metadata [(name, value)], timeout s or None)
MESSAGES = 1  # (MESSAGES, sid, [message bytes, ...]): whole gRPC messages, in order
END = 2       # (END, sid): the client half-closed the call
RESET = 3     # (RESET, sid): the client cancelled the call (RST_STREAM)
BAD_CALL = 4  # (BAD_CALL, sid, grpc status int, message): answer with trailers, call over
WINDOW = 5    # (WINDOW, sid): queued response bytes of sid were sent (room again)


class ProtocolError(Exception):
    """The connection broke HTTP/2 or gRPC framing; GOAWAY is queued, close after sending."""


class _Stream:
    __slots__ = ("buf", "window", "unacked", "lent", "held", "out", "trailers", "headers_sent", "remote_done",
                 "local_done")

    def __init__(self) -> None:
        self.buf = b""          # a partial gRPC message
        self.window = STREAM_WINDOW
        self.unacked = 0        # consumed bytes not yet given back
        self.lent = 0           # window granted beyond STREAM_WINDOW for one big message
        self.held = 0           # bytes received and not consumed yet (given back on _drop)
        self.out = bytearray()  # response bytes waiting for window
        self.trailers: list | None = None
        self.headers_sent = False
        self.remote_done = False
        self.local_done = False


def parse_timeout(value: bytes) -> float | None:
    """Seconds of a grpc-timeout value (``1..8 digits`` + unit H/M/S/m/u/n); None if bad."""
    unit = _TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        return None
    return int(digits) * unit


def encode_message(message: str) -> bytes:
    """grpc-message percent-encoding: bytes outside 0x20-0x7E and '%' become %XX."""
    out = bytearray()
    for byte in message.encode("utf-8"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


def frame_messages(messages: list[bytes]) -> bytes:
    """Uncompressed length-prefixed gRPC messages, concatenated."""
    parts = []
    for message in messages:
        parts.append(b"\x00" + len(message).to_bytes(4, "big"))
        parts.append(message)
    return b"".join(parts)


def _binary(value: bytes) -> bytes:
    """A ``-bin`` metadata value: base64, padded or not (PROTOCOL-HTTP2.md); kept as sent
    when it is not base64."""
    try:
        return base64.b64decode(value + b"==")
    except ValueError:  # binascii.Error
        return value


def _window_update(sid: int, increment: int) -> bytes:
    return b"\x00\x00\x04\x08\x00" + sid.to_bytes(4, "big") + increment.to_bytes(4, "big")


class ResetBudget:
    """Stream resets allowed: a token bucket of RESET_BURST tokens refilled at RESET_RATE a
    second. ``take()`` spends one (False: none left)."""

    __slots__ = ("tokens", "at", "clock")

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.tokens = float(RESET_BURST)
        self.at = clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(RESET_BURST, self.tokens + (now - self.at) * RESET_RATE)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def full(self) -> bool:
        return self.tokens + (self.clock() - self.at) * RESET_RATE >= RESET_BURST


class GrpcH2Connection:
    """One server-side connection. Feed ``receive(data)``, send ``data_to_send()``.

    ``max_message`` is the largest gRPC message accepted (bigger: BAD_CALL with
    RESOURCE_EXHAUSTED, as grpc's max_receive_message_length). Unless ``trusted``, the
    connection window stays UNTRUSTED_WINDOW and no window is lent for big messages until
    ``trust()`` (the owner calls it once a call is authenticated)."""

    def __init__(self, max_message: int, trusted: bool = True) -> None:
        self.max_message = max_message
        self.resets = ResetBudget()  # the owner may share one between connections
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config)
        self.h2.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 16384})
        self.h2.initiate_connection()
        self.streams: dict[int, _Stream] = {}
        self._in = b""
        self._preface = len(PREFACE)  # bytes of the client preface h2 has still to see
        self._header_block = False    # inside HEADERS..CONTINUATION: every frame goes to h2
        self._limit = self._window = UNTRUSTED_WINDOW  # the window we grant, what is left
        self._unacked = 0
        self.lend_limit = max(CONNECTION_WINDOW, 2 * (max_message + 5))
        self._lent = 0  # window lent to big messages, all calls
        self._lend_waiting: list[int] = []  # calls whose big message waits for a lend
        self._out = bytearray(self.h2.data_to_send())
        if trusted:
            self.trust()

    @property
    def trusted(self) -> bool:
        return self._limit == CONNECTION_WINDOW

    def trust(self) -> None:
        """Open the connection window to CONNECTION_WINDOW (a call was authenticated)."""
        if self.trusted:
            return
        self._window += CONNECTION_WINDOW - self._limit
        self._out += _window_update(0, CONNECTION_WINDOW - self._limit)
        self._limit = CONNECTION_WINDOW

    # -- receiving ----------------------------------------------------------------------
    def receive(self, data: bytes) -> list[tuple]:
        """Events for ``data`` (see the kinds above). Raises ProtocolError."""
        events: list[tuple] = []
        if self._preface:
            head, data = data[:self._preface], data[self._preface:]
            self._preface -= len(head)
            self._to_h2(head, events)
        buf = self._in + data if self._in else data
        end = len(buf)
        pos = 0
        passthrough = -1  # start of frames waiting to go to h2 together
        header = _FRAME_HEADER.unpack_from
        while end - pos >= 9:
            length_kind, flags, sid = header(buf, pos)
            length = length_kind >> 8
            if length > MAX_FRAME:  # h2 would buffer it whole before refusing it
                self._fail(h2.errors.ErrorCodes.FRAME_SIZE_ERROR,
                           f"a {length}-byte frame (SETTINGS_MAX_FRAME_SIZE {MAX_FRAME})")
            stop = pos + 9 + length
            if stop > end:
                break
            kind = length_kind & 0xFF
            if kind == _DATA and not self._header_block:
                if passthrough >= 0:
                    self._to_h2(buf[passthrough:pos], events)
                    passthrough = -1
                self._data(buf, pos + 9, stop, flags, sid & 0x7FFFFFFF, events)
            else:
                if passthrough < 0:
                    passthrough, run = pos, 0
                if kind in (_HEADERS, _PUSH_PROMISE, _CONTINUATION):
                    self._header_block = not buf[pos + 4] & _END_HEADERS
                run += 1
                if run == H2_RUN:  # h2 parses a whole run before its events are seen
                    self._to_h2(buf[passthrough:stop], events)
                    passthrough = -1
            pos = stop
        if passthrough >= 0:
            self._to_h2(buf[passthrough:pos], events)
        self._in = buf[pos:] if pos < end else b""
        return events

    def _data(self, buf: bytes, start: int, stop: int, flags: int, sid: int,
              events: list) -> None:
        """The payload of one DATA frame, ``buf[start:stop]``."""
        length = stop - start
        self._window -= length
        if self._window < 0:
            self._fail(h2.errors.ErrorCodes.FLOW_CONTROL_ERROR, "connection window overrun")
        stream = self.streams.get(sid)
        if stream is None or stream.remote_done:
            if sid == 0 or sid % 2 == 0 or sid > self.h2.highest_inbound_stream_id:
                self._fail(h2.errors.ErrorCodes.PROTOCOL_ERROR, f"DATA on idle stream {sid}")
            self.consumed(0, length)  # a call that ended here: dropped, window given back
            return
        stream.window -= length
        stream.held += length
        if stream.window < 0:
            self._fail(h2.errors.ErrorCodes.FLOW_CONTROL_ERROR, f"stream {sid} window overrun")
        if flags & _PADDED:
            pad = buf[start] if length else 256
            if pad + 1 > length:
                self._fail(h2.errors.ErrorCodes.PROTOCOL_ERROR, "DATA padding too long")
            self.consumed(sid, pad + 1)
            start, stop = start + 1, stop - pad
        if stream.buf:
            partial = stream.buf
            if len(partial) >= 5 and len(partial) + stop - start < \
                    _MESSAGE_PREFIX.unpack_from(partial)[1] + 5:
                # the message goes on past this frame: append (copying the whole of it for
                # every 16 KiB frame cost O(size^2), 0.1 s for one 4 MiB message)
                if type(partial) is not bytearray:
                    partial = stream.buf = bytearray(partial)
                partial += memoryview(buf)[start:stop]
                if self.trusted:
                    self._lend(sid, stream)
            else:
                self._messages(sid, stream, bytes(partial) + buf[start:stop], 0, None, events)
        else:
            self._messages(sid, stream, buf, start, stop, events)
        if flags & _END_STREAM:
            stream.remote_done = True
            if stream.buf:
                events.append((BAD_CALL, sid, 13, "the call ended inside a message"))
            # h2 moves the stream to half-closed (remote): an empty DATA frame with END_STREAM
            self._to_h2(b"\x00\x00\x00\x00\x01" + sid.to_bytes(4, "big"), events)

    def _messages(self, sid: int, stream: _Stream, data: bytes, pos: int, end: int | None,
                  events: list) -> None:
        """Whole gRPC messages of ``data[pos:end]`` to a MESSAGES event; the rest kept."""
        messages = []
        if end is None:
            end = len(data)
        max_message = self.max_message
        prefix = _MESSAGE_PREFIX.unpack_from
        while end - pos >= 5:
            compressed, size = prefix(data, pos)
            if compressed:
                events.append((BAD_CALL, sid, 12, "compressed messages are not supported "
                                                  "(grpc-accept-encoding: identity)"))
                stream.buf = b""
                return
            if size > max_message:
                events.append((BAD_CALL, sid, 8, f"received message larger than max "
                                                 f"({size} vs. {max_message})"))
                stream.buf = b""
                return
            if end - pos - 5 < size:
                break
            messages.append(data[pos + 5:pos + 5 + size])
            pos += 5 + size
        stream.buf = data[pos:end] if pos < end else b""
        if end - pos >= 5 and self.trusted:  # a message bigger than the window: lend
            self._lend(sid, stream)
        if messages:
            events.append((MESSAGES, sid, messages))

    def _lend(self, sid: int, stream: _Stream) -> None:
        """Lend call ``sid`` the stream and connection window its partial message still
        needs beyond its window, so one big message neither waits for itself nor takes the
        connection window other calls need. At most ``lend_limit`` bytes are lent per
        connection; a call over it waits (``_lend_waiting``) until lent bytes come back."""
        missing = _MESSAGE_PREFIX.unpack_from(stream.buf)[1] + 5 - len(stream.buf) \
            - stream.window
        if missing <= 0:
            return
        if self._lent + missing > self.lend_limit:
            if sid not in self._lend_waiting:
                self._lend_waiting.append(sid)
            return
        stream.lent += missing
        stream.window += missing
        self._lent += missing
        self._window += missing
        self._out += _window_update(sid, missing) + _window_update(0, missing)

    def _lent_back(self, nbytes: int) -> None:
        """``nbytes`` lent are consumed or dropped: lend to calls waiting for it."""
        self._lent -= nbytes
        waiting, self._lend_waiting = self._lend_waiting, []
        for sid in waiting:
            stream = self.streams.get(sid)
            if stream is not None and not stream.remote_done and len(stream.buf) >= 5:
                self._lend(sid, stream)

    def _to_h2(self, data: bytes, events: list) -> None:
        if not data:
            return
        try:
            h2_events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._out += self.h2.data_to_send()
            raise ProtocolError(str(exc) or type(exc).__name__) from None
        streams = self.streams
        for event in h2_events:
            if isinstance(event, h2.events.RequestReceived):
                self._request(event, events)
            elif isinstance(event, h2.events.StreamEnded):
                stream = streams.get(event.stream_id)
                if stream is not None:
                    stream.remote_done = True
                    events.append((END, event.stream_id))
                    if stream.local_done:
                        self._drop(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                if event.remote_reset:
                    self._reset_counted()
                if self._drop(event.stream_id) is not None:
                    events.append((RESET, event.stream_id))
            elif isinstance(event, h2.events.WindowUpdated):
                for sid in ([event.stream_id] if event.stream_id else list(streams)):
                    stream = streams.get(sid)
                    if stream is not None and (stream.out or stream.trailers):
                        self._pump(sid, stream)
                        if not stream.out:
                            events.append((WINDOW, sid))
            elif isinstance(event, h2.events.ConnectionTerminated):
                self._out += self.h2.data_to_send()
                raise ProtocolError(f"client sent GOAWAY ({event.error_code!r})")
        self._out += self.h2.data_to_send()

    def _request(self, event: h2.events.RequestReceived, events: list) -> None:
        sid = event.stream_id
        path = b""
        method = content_type = b""
        timeout = None
        metadata = []
        for name, value in event.headers:
            if name[:1] == b":":
                if name == b":path":
                    path = value
                elif name == b":method":
                    method = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                timeout = parse_timeout(value)
            elif name not in (b"te", b"grpc-encoding", b"grpc-accept-encoding",
                              b"user-agent"):
                key = name.decode("latin-1")
                metadata.append((key, _binary(value) if key.endswith("-bin")
                                 else value.decode("latin-1")))
        self.streams[sid] = _Stream()
        if method != b"POST" or not content_type.startswith(b"application/grpc"):
            self._send(sid, [(b":status", b"415")], end=True)
            self._drop(sid)
            return
        events.append((CALL, sid, path.decode("latin-1"), metadata, timeout))

    def _reset_counted(self) -> None:
        """One more stream reset by the client; past its ResetBudget the connection ends
        with ENHANCE_YOUR_CALM, as nghttp2 ends it."""
        if not self.resets.take():
            self._fail(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM,
                       f"more than {RESET_BURST} stream resets (at most {RESET_RATE:g}/s "
                       f"after them): rapid reset")

    def _fail(self, code: h2.errors.ErrorCodes, message: str):
        self.h2.close_connection(error_code=code)
        self._out += self.h2.data_to_send()
        raise ProtocolError(message)

    def consumed(self, sid: int, nbytes: int) -> None:
        """The owner is done with ``nbytes`` of DATA of call ``sid`` (0: of no call):
        window goes back to the client in quarter-window steps. A call that is over has
        given its bytes back already (``_drop``)."""
        stream = None
        if sid:
            stream = self.streams.get(sid)
            if stream is None:
                return
            stream.held -= nbytes
            if stream.lent:  # window lent for a big message is not given back
                kept = min(stream.lent, nbytes)
                stream.lent -= kept
                nbytes -= kept
                self._lent_back(kept)
        self._unacked += nbytes
        if self._unacked >= self._limit // 4:
            self._out += _window_update(0, self._unacked)
            self._window += self._unacked
            self._unacked = 0
        if stream is None or stream.remote_done:
            return
        stream.unacked += nbytes
        if stream.unacked >= STREAM_WINDOW // 4:
            self._out += _window_update(sid, stream.unacked)
            stream.window += stream.unacked
            stream.unacked = 0

    # -- sending ------------------------------------------------------------------------
    def send_messages(self, sid: int, data: bytes) -> int:
        """Queue framed messages (``frame_messages``) on call ``sid``; sends the response
        headers first. Returns the bytes still queued (waiting for the client's window)."""
        stream = self.streams.get(sid)
        if stream is None or stream.local_done:
            return 0
        if not stream.headers_sent:
            stream.headers_sent = True
            self._send(sid, [(b":status", b"200"), (b"content-type", b"application/grpc"),
                             (b"grpc-accept-encoding", b"identity")])
        stream.out += data
        self._pump(sid, stream)
        return len(stream.out)

    def queued(self, sid: int) -> int:
        """Response bytes of ``sid`` waiting for window."""
        stream = self.streams.get(sid)
        return len(stream.out) if stream is not None else 0

    def finish(self, sid: int, status: int, message: str = "") -> None:
        """End call ``sid`` with trailers (grpc-status, grpc-message), after what is queued;
        trailers-only when nothing was sent. A client still sending is reset (NO_ERROR)."""
        stream = self.streams.get(sid)
        if stream is None or stream.local_done:
            return
        trailers = [(b"grpc-status", str(status).encode())]
        if message:
            trailers.append((b"grpc-message", encode_message(message)))
        if not stream.headers_sent:
            stream.headers_sent = True
            stream.local_done = True
            self._send(sid, [(b":status", b"200"), (b"content-type", b"application/grpc")]
                       + trailers, end=True)
            self._closed_locally(sid, stream)
            return
        stream.trailers = trailers
        self._pump(sid, stream)

    def _pump(self, sid: int, stream: _Stream) -> None:
        conn = self.h2
        try:
            while stream.out:
                room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                if room <= 0:
                    return
                chunk = bytes(stream.out[:room])
                del stream.out[:room]
                conn.send_data(sid, chunk)
            if stream.trailers is not None and not stream.local_done:
                stream.local_done = True
                conn.send_headers(sid, stream.trailers, end_stream=True)
                self._closed_locally(sid, stream)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            stream.out.clear()
            self._drop(sid)
        finally:
            self._out += conn.data_to_send()

    def _closed_locally(self, sid: int, stream: _Stream) -> None:
        self._drop(sid)
        if not stream.remote_done:  # the client is still sending: it may stop (RFC 9113 8.1)
            try:
                self.h2.reset_stream(sid, h2.errors.ErrorCodes.NO_ERROR)
            except h2.exceptions.ProtocolError:
                pass
            self._out += self.h2.data_to_send()

    def _drop(self, sid: int) -> _Stream | None:
        """Forget call ``sid``; the bytes it holds unconsumed go back to the connection."""
        stream = self.streams.pop(sid, None)
        if stream is not None and stream.held:
            held, stream.held = stream.held, 0
            lent, stream.lent = min(stream.lent, held), 0
            if lent:
                self._lent_back(lent)
            self.consumed(0, held - lent)
        return stream

    def reset(self, sid: int) -> None:
        """Cancel call ``sid`` (RST_STREAM CANCEL)."""
        if self._drop(sid) is not None:
            try:
                self.h2.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
            except h2.exceptions.ProtocolError:
                pass
            self._out += self.h2.data_to_send()

    def goaway(self) -> None:
        """Tell the client no new calls are taken (GOAWAY NO_ERROR); calls in progress go on."""
        self.h2.close_connection(last_stream_id=self.h2.highest_inbound_stream_id)
        self._out += self.h2.data_to_send()

    def _send(self, sid: int, headers: list, end: bool = False) -> None:
        try:
            self.h2.send_headers(sid, headers, end_stream=end)
        except h2.exceptions.ProtocolError:  # the stream closed meanwhile (a client reset)
            self._drop(sid)
        self._out += self.h2.data_to_send()

    def data_to_send(self) -> bytes:
        """Bytes to write to the peer (and forget)."""
        out = bytes(self._out)
        self._out.clear()
        return out
