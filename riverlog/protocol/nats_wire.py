# The NATS client protocol, sans-IO: what riverlog's own data connection to nats-server reads
# and writes (riverlog/server/nats_data.py). Bytes in, parsed server operations out; commands
# out as bytes. Owns the framing of the server's MSG, HMSG, INFO, PING, PONG, +OK and -ERR and
# of the client's CONNECT, SUB, UNSUB, PING, PONG and status-only HPUB (PUB lines are built
# where they are cached: nats_bridge), and the parsing of a header block.
# Rules: ``feed`` parses every complete operation of what it is given in one pass and keeps
# the incomplete tail; a control line longer than MAX_CONTROL_LINE or a message over the
# size the parser was given (the server's max_payload plus the header room) raises
# NatsProtocolError (the caller drops the connection: nats-server itself closes one that
# breaks the protocol), and so does anything that is no server operation; payloads are never
# looked into. Wire facts: docs.nats.io "Client Protocol" (the operations, their arguments,
# CRLF line ends), ADR-4 "NATS Message Headers" (`NATS/1.0[ status[ description]]` then
# `Name: Value` lines, a blank line); nats-server's max_control_line is 4096 bytes.
# NatsParser runs once per read of every NATS message the door stores: a compiled twin
# (_nats_wire_c.pyx) replaces it when built, unless RIVERLOG_NO_EXTENSIONS is set; the class
# here stays the reference (_PyNatsParser) and the fallback (riverlog/_compiled.py).
from __future__ import annotations

import json

from .._compiled import twin

__all__ = ["MAX_CONTROL_LINE", "NatsParser", "NatsProtocolError", "PING", "PONG",
           "connect_command", "parse_headers", "status_command", "sub_command",
           "unsub_command"]

MAX_CONTROL_LINE = 4096
"""Longest control line (operation and arguments, without CRLF) accepted from the server, in
bytes: nats-server's own default limit for what clients send."""
PING = b"PING\r\n"
PONG = b"PONG\r\n"
_SUBJECTS_KEPT = 4096  # distinct subjects whose decoded text a parser keeps


class NatsProtocolError(ValueError):
    """Bytes from the server that are not the NATS client protocol (or exceed a limit)."""


class NatsParser:
    """Parses what a NATS server sends. ``feed(data)`` returns ``(messages, operations)``:

    - ``messages``: ``(sid, subject, reply, headers, payload)`` per MSG or HMSG, in order;
      ``sid`` an int, ``subject`` and ``reply`` str (UTF-8, bad bytes replaced; reply ""
      when none), ``headers`` the raw header block (bytes, see ``parse_headers``) or None
      for a MSG, ``payload`` bytes.
    - ``operations``: ``(name, argument)`` of the other operations, in order: ("INFO",
      dict), ("PING", None), ("PONG", None), ("+OK", None), ("-ERR", str).

    ``max_message`` bounds a message's total size (headers and payload) in bytes; raise it
    with the server's max_payload once INFO tells it. Raises NatsProtocolError."""

    __slots__ = ("_buf", "max_message", "_subjects")

    def __init__(self, max_message: int = 64 * 1024 * 1024) -> None:
        self._buf = b""
        self.max_message = max_message
        self._subjects: dict[bytes, str] = {}

    def _text(self, raw: bytes) -> str:
        text = self._subjects.get(raw)
        if text is None:
            if len(self._subjects) >= _SUBJECTS_KEPT:
                self._subjects.clear()
            text = self._subjects[raw] = raw.decode("utf-8", "replace")
        return text

    def feed(self, data: bytes) -> tuple[list, list]:
        buf = self._buf + data if self._buf else bytes(data)
        messages: list = []
        operations: list = []
        pos, n = 0, len(buf)
        find = buf.find
        while pos < n:
            end = find(b"\r\n", pos)
            if end < 0:
                if n - pos > MAX_CONTROL_LINE:
                    raise NatsProtocolError(f"a control line over {MAX_CONTROL_LINE} bytes")
                break
            if end - pos > MAX_CONTROL_LINE:
                raise NatsProtocolError(f"a control line over {MAX_CONTROL_LINE} bytes")
            head = buf[pos:pos + 4]
            if head == b"MSG " or head == b"HMSG":
                headers = head == b"HMSG"
                args = buf[pos + 4 + headers:end].split()
                if len(args) != 4 + headers and len(args) != 3 + headers:
                    raise NatsProtocolError(f"{head.strip().decode()} with {len(args)} "
                                            f"arguments")
                total = _size(args[-1], self.max_message)
                header_size = _size(args[-2], total) if headers else 0
                start = end + 2
                stop = start + total
                if stop + 2 > n:
                    break
                if buf[stop:stop + 2] != b"\r\n":
                    raise NatsProtocolError("a message payload not followed by CRLF")
                reply = args[2] if len(args) == 4 + headers else b""
                middle = start + header_size
                messages.append((_sid(args[1]), self._text(args[0]),
                                 self._text(reply) if reply else "",
                                 buf[start:middle] if headers else None, buf[middle:stop]))
                pos = stop + 2
            else:
                operations.append(_operation(buf[pos:end]))
                pos = end + 2
        self._buf = buf[pos:]
        return messages, operations


def _size(raw: bytes, limit: int) -> int:
    if not raw.isdigit():
        raise NatsProtocolError(f"size {raw[:20]!r} is not a number")
    size = int(raw)
    if size > limit:
        raise NatsProtocolError(f"a message of {size} bytes, over {limit}")
    return size


def _sid(raw: bytes) -> int:
    if not raw.isdigit():
        raise NatsProtocolError(f"subscription id {raw[:20]!r} is not a number")
    return int(raw)


def _operation(line: bytes) -> tuple[str, object]:
    word, _, rest = line.partition(b" ")
    word = word.upper()
    if word == b"PING":
        return "PING", None
    if word == b"PONG":
        return "PONG", None
    if word == b"+OK":
        return "+OK", None
    if word == b"-ERR":
        return "-ERR", rest.strip().strip(b"'").decode("utf-8", "replace")
    if word == b"INFO":
        try:
            info = json.loads(rest)
        except (ValueError, RecursionError):
            raise NatsProtocolError("INFO that is not JSON") from None
        if not isinstance(info, dict):
            raise NatsProtocolError("INFO that is not a JSON object")
        return "INFO", info
    raise NatsProtocolError(f"unknown operation {line[:20]!r}")


def parse_headers(block: bytes) -> dict[str, str]:
    """The headers of an HMSG header block: ``{name: value}`` (the last value of a repeated
    name, as nats-py keeps it; names as sent). An empty or malformed block gives what could
    be read (the status line is not a header)."""
    headers: dict[str, str] = {}
    lines = block.decode("utf-8", "replace").split("\r\n")
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep and name:
            headers[name.strip()] = value.strip()
    return headers


def connect_command(options: dict) -> bytes:
    """The CONNECT command with ``options`` (verbose, pedantic, user, pass, name, lang,
    version, protocol, headers, no_responders: docs.nats.io "Client Protocol", CONNECT)."""
    return b"CONNECT " + json.dumps(options, separators=(",", ":")).encode() + b"\r\n"


def sub_command(subject: str, sid: int, queue: str = "") -> bytes:
    """``SUB <subject> [queue group] <sid>``; ``subject`` and ``queue`` must be valid (checked
    where they entered: riverlog.protocol.nats_subject)."""
    if queue:
        return b"SUB %b %b %d\r\n" % (subject.encode(), queue.encode(), sid)
    return b"SUB %b %d\r\n" % (subject.encode(), sid)


def unsub_command(sid: int) -> bytes:
    return b"UNSUB %d\r\n" % sid


def status_command(subject: bytes, status: bytes) -> bytes:
    """``HPUB`` of a message to ``subject`` (valid, checked where it entered) with no payload
    and a header block of only the status line ``NATS/1.0 <status>``, e.g. ``b"503 Leader
    Stopping"`` (a code, then a description: docs.nats.io "Client Protocol", HPUB; NATS
    ADR-4 and ADR-9, status codes; nats-server's own "no responders" answer is ``NATS/1.0 503``)."""
    block = b"NATS/1.0 %b\r\n\r\n" % status
    return b"HPUB %b %d %d\r\n%b\r\n" % (subject, len(block), len(block), block)


# The compiled twin (_nats_wire_c.pyx, riverlog/_compiled.py): its NatsParser bound over the
# class above, which stays the reference (_PyNatsParser) and the fallback.
_PyNatsParser = NatsParser


def _bind_twin(compiled) -> type:
    """Hand the twin the reference's error class, helpers and limits; its NatsParser class
    (also for tests that import the twin directly)."""
    compiled._bind(NatsProtocolError, _size, _sid, _operation, MAX_CONTROL_LINE, _SUBJECTS_KEPT)
    return compiled.NatsParser


_c = twin(__name__, "_nats_wire_c")
if _c is not None:
    NatsParser = _bind_twin(_c)  # type: ignore[misc] # noqa: F811
