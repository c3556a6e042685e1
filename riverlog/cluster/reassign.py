# Moving replicas between servers, as an operator asks it (`riverlog stream add-replica` /
# `delete-replica`, `riverlog cluster remove-server --move-replicas`; docs/clustering.md
# "Moving replicas"). Owns: which partitions a request names, waiting for a new replica to
# join the ISR, choosing the servers that take a removed server's replicas (balanced), and
# the order of a move. Rules: every change is a metadata command applied through Raft
# (metadata.admin_at over a member's Raft port, with the Raft password), never a file copied
# by hand: a new replica copies the leader's log as any follower does and the leader asks it
# into the ISR once it holds everything committed; a replica is deleted only after its
# replacement is in sync, and the transition itself (state.delete_replica) refuses to leave
# fewer in-sync replicas than the stream's minIsr. Blocking code for the command line.
from __future__ import annotations

import time
from typing import Callable

from ..errors import ClusterUnavailableError
from .metadata import RaftUnavailable, admin_at
from .state import MetadataError

POLL_S = 0.2
"""How often a wait for the ISR reads the metadata."""


class ReplicaNotInSync(ClusterUnavailableError):
    """A new replica did not join the ISR in time: it is still copying the leader's log
    (it joins once caught up), or cannot reach the leader."""


def partitions_of(state: dict, stream: str, partitions: tuple[int, ...] = ()) -> list[int]:
    """The partition indexes of ``stream`` a request names (``partitions``; empty: every
    partition) in the metadata ``state`` (metadata.summary). Raises MetadataError (no such
    stream or partition)."""
    found = state["streams"].get(stream)
    if found is None:
        partitions = state.get("super_streams", {}).get(stream)
        hint = "" if partitions is None else (
            f": {stream!r} is a super stream, name its partition streams "
            f"({', '.join(partitions)}) one by one")
        raise MetadataError(f"no stream {stream!r}{hint}")
    indexes = list(partitions) or [p["index"] for p in found]
    for index in indexes:
        if not 0 <= index < len(found):
            raise MetadataError(f"stream {stream!r} has no partition {index} (it has "
                                f"{len(found)})")
    return indexes


def server_with_raft_address(state: dict, address: str) -> str:
    """The id of the registered server whose Raft address is ``address``. Raises
    MetadataError."""
    for server_id, raft in state["servers"].items():
        if raft == address:
            return server_id
    raise MetadataError(f"no registered server has the Raft address {address} (servers: "
                        f"{state['servers']})")


def plan_moves(state: dict, server: str) -> list[tuple[str, int, str | None]]:
    """``(stream, index, target)`` for every partition with a replica on ``server``: the
    target is a registered server other than ``server`` holding no replica of that partition
    and the fewest replicas overall (those planned counted; ties: the smaller id), so the
    moved replicas spread evenly; None when every other server holds one already (a stream
    with a replica on every server, ``replicationFactor`` -1: it keeps one replica fewer)."""
    load = {s: 0 for s in state["servers"] if s != server}
    for parts in state["streams"].values():
        for part in parts:
            for replica in part["replicas"]:
                if replica in load:
                    load[replica] += 1
    moves = []
    for name in sorted(state["streams"]):
        for part in state["streams"][name]:
            if server not in part["replicas"]:
                continue
            free = [s for s in sorted(load) if s not in part["replicas"]]
            target = min(free, key=lambda s: load[s]) if free else None
            if target is not None:
                load[target] += 1
            moves.append((name, part["index"], target))
    return moves


def wait_in_sync(member: str, password: str, replicas: list[tuple[str, int, str]],
                 wait_s: float) -> None:
    """Return once every ``(stream, index, server)`` of ``replicas`` is in its partition's
    ISR. Raises ReplicaNotInSync after ``wait_s`` seconds, MetadataError (the stream was
    deleted meanwhile), RaftUnavailable."""
    deadline = time.monotonic() + wait_s
    while True:
        state = admin_at(member, password, "state")
        missing = []
        for stream, index, server in replicas:
            partitions_of(state, stream, (index,))
            if server not in state["streams"][stream][index]["isr"]:
                missing.append(f"{stream}/{index} on {server}")
        if not missing:
            return
        if time.monotonic() > deadline:
            raise ReplicaNotInSync(
                f"not in sync after {wait_s:g} s: {', '.join(missing)} (still copying the "
                f"leader's log, or cannot reach it; it joins the ISR once caught up: see "
                f"`riverlog stream describe`)")
        time.sleep(POLL_S)


def add_replicas(member: str, password: str, replicas: list[tuple[str, int, str]],
                 wait_s: float, echo: Callable[[str], None] = print) -> None:
    """Add each ``(stream, index, server)`` replica through Raft, then wait until all are
    in sync (``wait_in_sync``). A replica that exists already is refused (MetadataError)."""
    for stream, index, server in replicas:
        admin_at(member, password, "add_replica", stream=stream, index=index, server=server)
        echo(f"added a replica of {stream} partition {index} on {server}; it copies the "
             f"leader's log")
    wait_in_sync(member, password, replicas, wait_s)
    for stream, index, server in replicas:
        echo(f"{stream} partition {index}: {server} is in sync")


def delete_replicas(member: str, password: str, replicas: list[tuple[str, int, str]],
                    echo: Callable[[str], None] = print) -> None:
    """Delete each ``(stream, index, server)`` replica through Raft (state.delete_replica:
    leadership moves first, refused under minIsr); the server removes its files when it
    applies the change."""
    for stream, index, server in replicas:
        admin_at(member, password, "delete_replica", stream=stream, index=index, server=server)
        echo(f"deleted the replica of {stream} partition {index} on {server}")


def move_replicas_off(member: str, password: str, server: str, wait_s: float,
                      echo: Callable[[str], None] = print) -> list[tuple[str, int, str | None]]:
    """Move every replica ``server`` holds to other servers (``plan_moves``): add each new
    replica, wait until every one is in sync, then delete ``server``'s (also where no
    server was free to take it). Returns the moves. Raises MetadataError (e.g. a partition
    no other server can take whose deletion would go under minIsr: found before anything
    changes), ReplicaNotInSync (nothing deleted then), RaftUnavailable."""
    state = admin_at(member, password, "state")
    moves = plan_moves(state, server)
    for stream, index, target in moves:  # refused before anything changes
        part = state["streams"][stream][index]
        isr = [r for r in part["isr"] if r != server]
        if target is None and server in part["isr"] and len(isr) < part["min_isr"]:
            raise MetadataError(
                f"stream {stream!r} partition {index}: every other server holds a replica, and "
                f"deleting {server!r}'s would leave {len(isr)} in-sync replicas, below the "
                f"stream's minimum of {part['min_isr']}: add a server first (nothing was moved)")
    add_replicas(member, password, [m for m in moves if m[2] is not None], wait_s, echo)
    delete_replicas(member, password, [(s, i, server) for s, i, _ in moves], echo)
    return moves


def wait_applied_off(address: str, password: str, server: str, wait_s: float) -> bool:
    """Return True once the member at Raft ``address`` (``server``'s own) has applied the
    deletion of all its replicas (then it removes their files), False at once when it does
    not answer (not running: it removes them when it restarts and catches up). A server is
    removed from the Raft only after this: removed earlier, it may never hear of the last
    deletions, and would keep their files. Raises ReplicaNotInSync after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            state = admin_at(address, password, "state")
        except RaftUnavailable:
            return False
        held = [f"{name}/{p['index']}" for name, parts in state["streams"].items()
                for p in parts if server in p["replicas"]]
        if not held:
            return True
        if time.monotonic() > deadline:
            raise ReplicaNotInSync(f"{server} has not applied the deletion of its replicas "
                                   f"{', '.join(held)} after {wait_s:g} s")
        time.sleep(POLL_S)
