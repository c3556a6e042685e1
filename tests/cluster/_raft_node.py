# One Raft metadata member in a process of its own, for tests/cluster/test_raft_cluster.py.
# Usage: python _raft_node.py ADDRESS RAFT_DIR PASSWORD [PEER...]. Reads one JSON request a
# line on stdin and answers one JSON line on stdout:
#   {"op": "submit", "command": NAME, "args": {...}, "timeout": S} -> {"ok": true} or
#       {"ok": false, "error": EXCEPTION CLASS, "message": TEXT}
#   {"op": "state"} -> the metadata, the Raft leader seen, and how many changes were watched.
# At start it prints {"ready": true}, or {"error": ..., "message": ...} and exits 2.
from __future__ import annotations

import asyncio
import json
import sys

from riverlog.cluster.metadata import RaftMetadata, RaftSettings
from riverlog.cluster.state import ClusterState, Door, Server


def _summary(state: ClusterState, metadata: RaftMetadata, changes: int) -> dict:
    return {
        "servers": sorted(state.servers),
        "streams": {name: [[p.leader, list(p.isr), p.leader_epoch] for p in s.partitions]
                    for name, s in sorted(state.streams.items())},
        "leader": metadata.leader, "is_leader": metadata.is_leader, "changes": changes,
    }


def _arguments(command: str, args: dict) -> dict:
    if command == "add_server":
        server = args["server"]
        args = {"server": Server(server["id"], {k: Door(*v) for k, v in
                                                server.get("doors", {}).items()})}
    return args


async def main(address: str, raft_dir: str, password: str, peers: list[str]) -> int:
    try:
        metadata = await asyncio.to_thread(RaftMetadata, RaftSettings(
            address, raft_dir, tuple(peers), password))
    except Exception as exc:  # reported to the test, which checks the class and message
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        return 2
    changes = 0

    def changed(_state: ClusterState) -> None:
        nonlocal changes
        changes += 1

    metadata.watch(asyncio.get_running_loop(), changed)
    print(json.dumps({"ready": True}), flush=True)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        request = json.loads(line)
        if request["op"] == "state":
            answer = _summary(metadata.state, metadata, changes)
        else:
            try:
                await metadata.submit(request["command"], timeout=request.get("timeout", 60),
                                      **_arguments(request["command"], request["args"]))
                answer = {"ok": True}
            except Exception as exc:  # reported to the test
                answer = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
        print(json.dumps(answer), flush=True)
    metadata.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])))
