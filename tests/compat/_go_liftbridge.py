# Liftbridge's own Go client (go-liftbridge v2.3.0) and nats.go, pinned in
# go_liftbridge/go.mod and go.sum, for the compat tests: `build` (_go.build_program) downloads the modules from the
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
from typing import Any

from ._go import GoUnavailable, build_program
from ._scripts import run_json_script

__all__ = ["BINARY", "GoLiftbridge", "GoUnavailable", "build"]

GO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "go_liftbridge")
BINARY = os.path.join(GO_DIR, "bin", "go_liftbridge")


def build(timeout: float = 600) -> str:
    """``build_program`` of the go-liftbridge and nats.go scenario program (BINARY)."""
    return build_program(GO_DIR, BINARY, timeout)


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
