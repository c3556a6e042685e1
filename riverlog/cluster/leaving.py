# A cluster member's controlled shutdown (as Kafka's, broker setting
# controlled.shutdown.enable: a stopping broker's partitions get new leaders first): once the
# doors took their last write and it is committed, the server stops following the metadata
# and replicating (so no leader takes it back into an ISR), then every partition it leads
# that has another in-sync replica is handed to it (state.change_leader under the current leader
# epoch), and every partition it follows in sync lets it leave the ISR (state.shrink_isr),
# so clients find a leader at once, and ALL acks stop waiting for this server, instead of
# after the followers' replica.max.leader.timeout and the leader's replica.max.lag.time;
# then, when it leads the Raft, it hands that leadership over (RaftMetadata.step_down), so
# the others learn those commands committed without waiting for an election.
# Rules: best effort within deadlines, every command submitted at once (again while Raft
# cannot take it, e.g. no leader known for an instant); nothing is tried
# when no other Raft member is connected (the whole cluster stopping); a refusal (the
# leader or epoch changed meanwhile) or RaftUnavailable is logged and the stop goes on; a
# partition with no other in-sync replica keeps this server as its leader (no unclean
# election: it is unavailable until this server is back, as after a kill).
from __future__ import annotations

import asyncio
import logging

from .metadata import RaftUnavailable

log = logging.getLogger("riverlog.cluster")

LEAVE_TIMEOUT_S = 3.0  # for the commands, then again for the Raft leadership
RETRY_S = 0.1  # a command Raft could not take (no leader known) is asked again this soon


def leaving_commands(state, server_id: str) -> list[tuple[str, dict]]:
    """The metadata commands (name, arguments) of ``server_id``'s controlled shutdown in
    ``state`` (a ClusterState): ``change_leader`` for each partition it leads with another
    in-sync replica, ``shrink_isr`` of itself for each one it follows in sync; each under the
    partition's current leader epoch."""
    commands = []
    for stream in state.streams.values():
        for part in stream.partitions:
            if server_id not in part.isr:
                continue
            where = {"stream": stream.name, "index": part.index,
                     "leader_epoch": part.leader_epoch}
            if part.leader == server_id:
                if any(r != server_id for r in part.isr):
                    commands.append(("change_leader", where))
            elif part.leader:
                commands.append(("shrink_isr", {**where, "replica": server_id}))
    return commands


async def leave(node, timeout: float = LEAVE_TIMEOUT_S) -> int:
    """Submit ``leaving_commands`` of ``node`` (a ClusterNode) through Raft, all at once,
    and wait for them up to ``timeout`` seconds, once this server stopped following the
    metadata and replicating (``stop_following``: a replica still fetching, a deposed
    leader as a new follower too, would be taken back into the ISR by its leader; the doors
    stopped and what they took is committed, so the followers hold it). Returns how many
    were applied; never raises."""
    metadata = node.metadata
    if metadata is None or not any(metadata.connected(member) for member in metadata.members()
                                   if member != metadata.address):
        return 0  # alone (the others stopped too): nothing could be committed
    commands = leaving_commands(node.placement.state, node.server_id)
    if not commands:
        return 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout

    async def one(name: str, arguments: dict) -> bool:
        while True:
            try:
                await metadata.submit(name, timeout=max(deadline - loop.time(), 0.1),
                                      **arguments)
                return True
            except RaftUnavailable as exc:  # e.g. no leader known this instant: again
                if loop.time() + RETRY_S < deadline:
                    await asyncio.sleep(RETRY_S)
                    continue
                error: Exception = exc
            except Exception as exc:  # MetadataError (changed meanwhile), ...
                error = exc
            log.info("leaving: %s of %s/%d not applied: %s", name, arguments["stream"],
                     arguments["index"], error)
            return False

    await node.stop_following()
    try:
        done = await asyncio.wait_for(asyncio.gather(
            *(one(name, arguments) for name, arguments in commands)), timeout + 1)
    except asyncio.TimeoutError:
        log.warning("leaving: %d leadership and ISR changes not all applied within %.0f s",
                    len(commands), timeout)
        return 0
    handed = sum(ok for (name, _), ok in zip(commands, done) if name == "change_leader")
    left = sum(ok for (name, _), ok in zip(commands, done) if name == "shrink_isr")
    log.info("leaving: %d partition(s) handed to another in-sync replica, left the ISR of %d",
             handed, left)
    if handed or left:
        await metadata.step_down(timeout)
    return handed + left
