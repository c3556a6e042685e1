# Liftbridge's own Go client (go-liftbridge v2.3.0) and nats.go, pinned in
# go_liftbridge/go.mod and go.sum, for the compat tests: `build` downloads the modules from the
# Go module proxy and builds the one program of go_liftbridge/ into go_liftbridge/bin/ (git-ignored;
# the Go build cache keeps later builds quick), and GoLiftbridge.run starts it once per
# scenario against riverlog's Liftbridge doors. Rules: the program takes a scenario name and one
# JSON argument (the doors' addresses plus the test's own fields) and prints exactly one JSON
# object, its last line on stdout; anything else (non-zero exit, no JSON, running past the
# timeout) fails the test with what it wrote on stderr. Only a missing `go` or an unreachable
# module proxy skips the tests.
from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

from ._scripts import run_json_script

GO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "go_liftbridge")
BINARY = os.path.join(GO_DIR, "bin", "go_liftbridge")
# what `go mod download` says when the proxy cannot be reached at all: only these skip
_UNREACHABLE = ("no such host", "connection refused", "i/o timeout", "network is unreachable",
                "TLS handshake timeout", "dial tcp", "server misbehaving",
                "Temporary failure in name resolution")


class GoUnavailable(Exception):
    """go is not installed, or the Go module proxy cannot be reached."""


def _go(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly -buildvcs=false"}
    try:
        return subprocess.run(["go", *args], cwd=GO_DIR, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, env=env)
    except subprocess.TimeoutExpired:
        raise GoUnavailable(f"`go {' '.join(args)}` in {GO_DIR} did not finish within "
                            f"{timeout}s (module proxy unreachable?)") from None


def build(timeout: float = 600) -> str:
    """Download the pinned modules and build BINARY; returns its path. Raises GoUnavailable
    when go is missing or the proxy is unreachable, RuntimeError (with go's output) for any
    other failure."""
    if shutil.which("go") is None:
        raise GoUnavailable("`go` is not on PATH (the go-liftbridge tests need Go 1.21 or "
                            "later)")
    done = _go(["mod", "download"], timeout)
    if done.returncode != 0:
        output = done.stdout + done.stderr
        if any(text in output for text in _UNREACHABLE):
            raise GoUnavailable(f"the Go module proxy is unreachable: {output.strip()[-500:]}")
        raise RuntimeError(f"`go mod download` in {GO_DIR} failed:\n{output}")
    done = _go(["build", "-o", BINARY, "."], timeout)
    if done.returncode != 0:
        raise RuntimeError(f"`go build` in {GO_DIR} failed:\n{done.stdout}{done.stderr}")
    return BINARY


class GoLiftbridge:
    """Runs one scenario of the built program against riverlog's Liftbridge doors."""

    def __init__(self, binary: str = BINARY) -> None:
        self.binary = binary

    async def run(self, scenario: str, grpc: list[str] | str, nats: str = "",
                  timeout: float = 60, **fields: Any) -> dict:
        """Run ``scenario`` with the JSON argument ``{"grpc": [addresses], "nats": url,
        **fields}``; returns the JSON object it printed. Raises AssertionError when it exits
        non-zero, prints no JSON object, or is still running after ``timeout`` seconds (then
        it is killed)."""
        addresses = [grpc] if isinstance(grpc, str) else list(grpc)
        argument = {"grpc": addresses, "nats": nats, **fields}
        return await run_json_script([self.binary, scenario, json.dumps(argument)],
                                     f"go_liftbridge {scenario}", timeout)
