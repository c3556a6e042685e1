# rstream 0.20.x (the release the users ran, before 1.x changed send()) for the compat
# tests, beside the current rstream of the venv: `install` puts the pinned wheel into
# tests/compat/rstream020/site (git-ignored, kept between runs) without dependencies (0.20
# needs mmh3 and typing_extensions, which the venv has), and `run` starts one Python process
# with that folder first on sys.path for a script in tests/compat/rstream020. Rules: a script
# takes one JSON argument (host, port, credentials, the test's own fields) and prints exactly
# one JSON object as its last line; anything else fails the test with the script's stderr.
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from ._scripts import run_json_script

VERSION = "0.20.9"
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rstream020")
SITE = os.path.join(HERE, "site")


class RstreamUnavailable(Exception):
    """The package index could not be reached to install rstream 0.20."""


def install(timeout: float = 300) -> None:
    """pip-install rstream==VERSION into SITE (nothing to do when it is there). Raises
    RstreamUnavailable when pip cannot reach the index, RuntimeError for other failures."""
    marker = os.path.join(SITE, f"rstream-{VERSION}.dist-info")
    if os.path.isdir(marker):
        return
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--target", SITE, f"rstream=={VERSION}"],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        output = done.stdout + done.stderr
        if "No matching distribution" in output or "Could not fetch" in output \
                or "NewConnectionError" in output:
            raise RstreamUnavailable(f"pip cannot fetch rstream=={VERSION}: {output[-500:]}")
        raise RuntimeError(f"installing rstream=={VERSION} failed:\n{output}")


async def run(script: str, host: str, port: int, timeout: float = 120, **fields: Any) -> dict:
    """Run HERE/<script>.py with rstream VERSION against the RabbitMQ Stream door at
    ``host``:``port``; returns the JSON object it printed. Raises AssertionError when it
    exits non-zero, prints no JSON object or runs past ``timeout`` seconds (then it is
    killed)."""
    arg = json.dumps({"host": host, "port": port, "username": "guest", "password": "guest",
                      **fields})
    return await run_json_script(
        [sys.executable, os.path.join(HERE, f"{script}.py"), arg], f"{script}.py", timeout,
        env=dict(os.environ, PYTHONPATH=SITE))
