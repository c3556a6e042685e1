# The HTTP side of `riverlog ctl` (cli_ctl.py): requests to a running server's management API
# (riverlog.server.management, RabbitMQ's management API shapes) with basic auth, and the
# failures `riverlog ctl` turns into rabbitmqctl's exit codes.
# Rules: stdlib urllib only, one request per call, JSON in and out; every failure is a
# CtlError carrying its exit code and the one message to print (never a traceback).
from __future__ import annotations

import base64
import json
import socket
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlsplit

# rabbitmqctl's exit codes (deps/rabbitmq_cli/lib/rabbitmq/cli/core/exit_codes.ex, BSD
# sysexits): usage 64, data error 65, no such user 67, node unavailable 69, software error
# 70, timeout 75; 77 (sysexits EX_NOPERM) is riverlog's own, for credentials the
# management API refuses (rabbitmqctl talks Erlang distribution and never meets a 401).
EX_USAGE, EX_DATAERR, EX_NOUSER, EX_UNAVAILABLE, EX_SOFTWARE = 64, 65, 67, 69, 70
EX_TEMPFAIL, EX_NOPERM = 75, 77

DEFAULT_URL = "http://127.0.0.1:15672"  # `riverlog serve`'s management port (ManagementConfig)


class CtlError(Exception):
    """A command failed: print ``message`` to stderr, exit with ``code``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def no_such_vhost(vhost: str) -> CtlError:
    """rabbitmqctl's error for a virtual host that does not exist (exit code EX_DATAERR)."""
    return CtlError(EX_DATAERR, f'Error:\n{{:no_such_vhost, "{vhost}"}}')


class HTTPFailure(CtlError):
    """The management API answered ``status`` (>= 400) with RabbitMQ's error body
    ``{"error": word, "reason": reason}`` (either may be empty for another body)."""

    def __init__(self, status: int, word: str, reason: str) -> None:
        super().__init__(EX_SOFTWARE, f"Error:\n{reason or word or f'HTTP {status}'}")
        self.status = status
        self.word = word
        self.reason = reason


def node_url(node: str | None) -> str | None:
    """The management URL of ``-n NODE``: a URL as given, ``rabbit@HOST`` or ``HOST`` as
    ``http://HOST:15672``, ``HOST:PORT`` as ``http://HOST:PORT``; None for None."""
    if node is None:
        return None
    if "://" in node:
        return node
    host = node.rpartition("@")[2]
    return f"http://{host}" if host.count(":") == 1 else f"http://{host}:15672"


def segment(value: str) -> str:
    """``value`` as one URL path segment (``/`` is ``%2F``, as RabbitMQ's API wants)."""
    return quote(value, safe="")


class Management:
    """A running server's management API at ``url`` (``http://host:port``), as ``user``
    with ``password``; each request waits at most ``timeout`` seconds."""

    def __init__(self, url: str, user: str, password: str, timeout: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CtlError(EX_USAGE, f"Error: {url!r} is no http(s)://host:port URL")
        self.url = url.rstrip("/")
        self.user = user
        self.timeout = timeout
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self._auth = f"Basic {token}"

    def request(self, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None) -> Any:
        """The JSON answer (None when empty) of ``method path`` with JSON ``body``. Raises
        CtlError: EX_UNAVAILABLE when the server cannot be reached, EX_TEMPFAIL on timeout,
        EX_NOPERM for a 401, HTTPFailure for any other status >= 400."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", self._auth)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise self._failure(exc) from None
        except (socket.timeout, TimeoutError):
            raise CtlError(EX_TEMPFAIL, f"Error: operation {method} {path} on {self.url} "
                                        f"timed out. Timeout: {self.timeout}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CtlError(EX_UNAVAILABLE, f"Error: unable to connect to the management API "
                                           f"at {self.url}: {reason}") from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise CtlError(EX_SOFTWARE, f"Error: {method} {path} answered no JSON") from None

    def _failure(self, exc: urllib.error.HTTPError) -> CtlError:
        try:
            body = json.loads(exc.read() or b"{}")
        except (ValueError, OSError):
            body = {}
        word, reason = ((str(body.get("error", "")), str(body.get("reason", "")))
                        if isinstance(body, dict) else ("", ""))
        if exc.code == 401:
            return CtlError(EX_NOPERM, f"Error: the management API at {self.url} refused "
                                       f"user '{self.user}': {reason or word or 'not authorized'}")
        if not (word or reason):
            reason = f"{exc.code} {exc.reason}"
        return HTTPFailure(exc.code, word, reason)

    def get(self, path: str) -> Any:
        return self.request("GET", path)
