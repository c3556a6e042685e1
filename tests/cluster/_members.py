# Raft metadata members as processes of their own (_raft_node.py) for tests/cluster: start,
# ask (one JSON request, one JSON answer), SIGKILL; and the generous poll the tests wait with.
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

NODE = os.path.join(os.path.dirname(__file__), "_raft_node.py")
WAIT_S = 90


class Member:
    """One _raft_node.py process; ``ask`` sends a request and returns its JSON answer."""

    def __init__(self, address: str, raft_dir: str, password: str, peers: list[str]) -> None:
        self.address, self.args = address, [raft_dir, password, *peers]
        self.proc: subprocess.Popen | None = None

    def start(self) -> dict:
        self.proc = subprocess.Popen([sys.executable, NODE, self.address, *self.args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        return json.loads(self.proc.stdout.readline())

    def ask(self, **request) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def submit(self, command: str, timeout: float = 60, **args) -> dict:
        return self.ask(op="submit", command=command, args=args, timeout=timeout)

    def state(self) -> dict:
        return self.ask(op="state")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


def wait_for(what: str, check):
    """Poll ``check`` until it returns something true, and return that (WAIT_S at most)."""
    deadline = time.monotonic() + WAIT_S
    while not (result := check()):
        assert time.monotonic() < deadline, f"still not: {what}"
        time.sleep(0.2)
    return result
