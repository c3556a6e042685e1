# The RabbitMQ Stream Go client (github.com/rabbitmq/rabbitmq-stream-go-client, pinned in
# go/go.mod and go/go.sum) for the compat tests: `build` runs `go build` once per session into
# go/bin/ (git-ignored; Go's own caches make a rebuild quick), and GoClient runs one scenario
# of that program (go/main.go lists them) per process against a stream server. Rules: the
# program takes a scenario name and one JSON argument and prints one JSON object, its last
# line on stdout; anything else (non-zero exit, no JSON, past the timeout) fails the test with
# what it wrote on stderr. Scenarios that wait for the test print {"phase": ...} lines and
# go on when the test writes a line on their stdin (GoRun).
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from typing import Any

from ._scripts import run_json_script

GO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "go")
BINARY = os.path.join(GO_DIR, "bin", "riverlog-go-compat")
# what `go` says when the module proxy cannot be reached at all: only these skip the tests
_UNREACHABLE = ("dial tcp", "no such host", "i/o timeout", "connection refused",
                "network is unreachable", "TLS handshake timeout", "connection reset",
                "server misbehaving", "Temporary failure in name resolution")


class GoUnavailable(Exception):
    """`go` is not installed, or the Go module proxy cannot be reached."""


def _go(args: list[str], go_dir: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly -buildvcs=false"}
    try:
        return subprocess.run(["go", *args], cwd=go_dir, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, env=env)
    except subprocess.TimeoutExpired:
        raise GoUnavailable(f"`go {' '.join(args)}` in {go_dir} did not finish within "
                            f"{timeout}s (module proxy unreachable?)") from None


def build_program(go_dir: str, binary: str, timeout: float = 600) -> str:
    """Download the modules pinned in ``go_dir``/go.mod and go.sum and ``go build`` the
    program there into ``binary``; returns its path. Raises GoUnavailable when `go` is
    missing or the module proxy is unreachable, RuntimeError (with go's output) for any other
    failure."""
    if shutil.which("go") is None:
        raise GoUnavailable("`go` is not on PATH (the Go client tests need Go 1.25 or later)")
    for args in (["mod", "download"], ["build", "-o", binary, "."]):
        done = _go(args, go_dir, timeout)
        if done.returncode != 0:
            output = done.stdout + done.stderr
            if any(text in output for text in _UNREACHABLE):
                raise GoUnavailable(f"the Go module proxy is unreachable: "
                                    f"{output.strip()[-500:]}")
            raise RuntimeError(f"`go {' '.join(args)}` in {go_dir} failed "
                               f"({done.returncode}):\n{output}")
    return binary


def build(timeout: float = 600) -> str:
    """``build_program`` of the RabbitMQ Stream Go client's scenario program (BINARY)."""
    return build_program(GO_DIR, BINARY, timeout)


def argument(host: str, port: int, fields: dict[str, Any]) -> str:
    """The JSON argument: the server, guest's credentials, then ``fields`` (which may
    override them, or give ``uris`` instead)."""
    return json.dumps({"host": host, "port": port, "username": "guest", "password": "guest",
                       "vhost": "/", **fields})


class GoClient:
    """Runs scenarios of the built program against a RabbitMQ Stream door."""

    def __init__(self, binary: str) -> None:
        self.binary = binary

    async def run(self, scenario: str, host: str, port: int, timeout: float = 60,
                  **fields: Any) -> dict:
        """Run ``scenario`` with ``argument(host, port, fields)``; returns the JSON object it
        printed. Raises AssertionError as the module comment says."""
        return await run_json_script([self.binary, scenario, argument(host, port, fields)],
                                     f"go scenario {scenario}", timeout)

    async def start(self, scenario: str, host: str, port: int, **fields: Any) -> "GoRun":
        """Start ``scenario`` (one that prints phases) and return it running."""
        proc = await asyncio.create_subprocess_exec(
            self.binary, scenario, argument(host, port, fields), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return GoRun(scenario, proc)


class GoRun:
    """A running scenario: ``phase()`` waits for its next {"phase": ...} line, ``proceed()``
    lets it go on, ``result()`` waits for its final JSON object."""

    def __init__(self, scenario: str, proc: asyncio.subprocess.Process) -> None:
        self.scenario, self.proc = scenario, proc
        self.stderr = bytearray()
        self._drain = asyncio.get_running_loop().create_task(self._read_stderr())

    async def _read_stderr(self) -> None:
        while chunk := await self.proc.stderr.read(65536):
            self.stderr += chunk

    def _failure(self, what: str) -> AssertionError:
        return AssertionError(f"go scenario {self.scenario}: {what}; stderr:\n"
                              f"{self.stderr.decode(errors='replace')[-6000:]}")

    async def phase(self, timeout: float = 60) -> dict:
        """The next phase line (a dict with "phase"). Raises AssertionError when the program
        ends or prints something else first, or after ``timeout`` seconds."""
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except asyncio.TimeoutError:
            await self.kill()
            raise self._failure(f"no phase within {timeout}s") from None
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not isinstance(event, dict) or "phase" not in event:
            await self.kill()
            raise self._failure(f"expected a phase line, got {line!r}")
        return event

    def proceed(self) -> None:
        self.proc.stdin.write(b"go\n")

    async def result(self, timeout: float = 180) -> dict:
        """The final JSON object. Raises AssertionError as GoClient.run does."""
        try:
            out = await asyncio.wait_for(self.proc.stdout.read(), timeout)
            await asyncio.wait_for(self.proc.wait(), 10)
        except asyncio.TimeoutError:
            await self.kill()
            raise self._failure(f"still running after {timeout}s") from None
        await self._drain
        lines = out.decode(errors="replace").strip().splitlines()
        if self.proc.returncode != 0 or not lines:
            raise self._failure(f"exited with {self.proc.returncode}, stdout {lines[-3:]}")
        try:
            result = json.loads(lines[-1])
        except ValueError:
            result = None
        if not isinstance(result, dict):
            raise self._failure(f"printed no JSON object last: {lines[-1]!r}")
        return result

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
