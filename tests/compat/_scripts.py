# Runs a client script in a process of its own (the Node.js client, rstream 0.20) and reads
# its answer. Rules: the script prints exactly one JSON object as its last line on stdout;
# a non-zero exit, no JSON object, or running past the timeout fails the test (AssertionError)
# with the tail of what the script wrote.
from __future__ import annotations

import asyncio
import json
import subprocess


async def run_json_script(argv: list[str], what: str, timeout: float, *,
                          cwd: str | None = None, env: dict | None = None) -> dict:
    """Run ``argv`` and return the JSON object its last stdout line holds. ``what`` names the
    script in errors. Raises AssertionError as the module comment says (a script still
    running after ``timeout`` seconds is killed first)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)

    def output(out: bytes, err: bytes) -> str:
        return (f"stdout:\n{out.decode(errors='replace')[-4000:]}\n"
                f"stderr:\n{err.decode(errors='replace')[-4000:]}")

    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        raise AssertionError(f"{what} still running after {timeout}s; "
                             f"{output(out, err)}") from None
    lines = out.decode(errors="replace").strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"{what} exited with {proc.returncode}; {output(out, err)}")
    try:
        result = json.loads(lines[-1])
    except ValueError:
        result = None
    if not isinstance(result, dict):
        raise AssertionError(f"{what} printed no JSON object last: {lines[-1]!r}")
    return result
