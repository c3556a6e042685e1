# The Node.js RabbitMQ Stream client (rabbitmq-stream-js-client, pinned in node/package.json
# and node/package-lock.json) for the compat tests: `install` runs `npm install` into
# tests/compat/node (node_modules is git-ignored and kept between runs, so later sessions
# reuse it), and NodeClient.run starts one `node` process per script in that folder against a
# stream server. Rules: a script takes one JSON argument (the server's host and port, the
# credentials, plus the test's own fields) and prints exactly one JSON object, its last line
# on stdout; anything else (non-zero exit, no JSON, running past the timeout) fails the test
# with what the script wrote on stderr.
from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

from ._scripts import run_json_script

NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node")
# npm's error codes when the registry cannot be reached at all: only these skip the tests
_UNREACHABLE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT",
                "ENETUNREACH", "EHOSTUNREACH")


class NodeUnavailable(Exception):
    """node or npm is not installed, or the npm registry cannot be reached."""


def install(timeout: float = 300) -> None:
    """``npm install`` the pinned client into NODE_DIR/node_modules (quick when it is there).
    Raises NodeUnavailable when node/npm is missing or the registry is unreachable, and
    RuntimeError (with npm's output) for any other failure."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise NodeUnavailable(f"`{tool}` is not on PATH (the Node.js client tests need "
                                  f"Node.js 18 or later with npm)")
    try:
        done = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--no-progress"],
                              cwd=NODE_DIR, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise NodeUnavailable(f"`npm install` in {NODE_DIR} did not finish within {timeout}s "
                              f"(registry unreachable?)") from None
    if done.returncode != 0:
        output = done.stdout + done.stderr
        if any(code in output for code in _UNREACHABLE):
            raise NodeUnavailable(f"the npm registry is unreachable: {output.strip()[-500:]}")
        raise RuntimeError(f"`npm install` in {NODE_DIR} failed ({done.returncode}):\n{output}")


class NodeClient:
    """Runs NODE_DIR/<script>.js against a RabbitMQ Stream door."""

    async def run(self, script: str, host: str, port: int, timeout: float = 60,
                  **fields: Any) -> dict:
        """Run ``script`` (a name in NODE_DIR, without .js) against the RabbitMQ Stream door
        at ``host``:``port`` with the JSON argument ``{"host", "port", "username": "guest",
        "password": "guest", "vhost": "/", **fields}`` (``fields`` may override the
        credentials); returns the JSON object it printed. Raises AssertionError when it exits
        non-zero, prints no JSON object, or is still running after ``timeout`` seconds (then
        it is killed)."""
        argument = {"host": host, "port": port, "username": "guest", "password": "guest",
                    "vhost": "/", **fields}
        return await run_json_script(
            ["node", os.path.join(NODE_DIR, f"{script}.js"), json.dumps(argument)],
            f"node {script}.js", timeout, cwd=NODE_DIR)
