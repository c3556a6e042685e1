# Liftbridge's partition status requests between the servers of a cluster
# (`<namespace>.raft.metadata.status.<server id>`, PartitionStatusRequest/Response of the
# envelope's internal messages; Liftbridge's handlePartitionStatusRequest and
# waitForPartitionLeader): this server answers whether it holds and leads a partition, and
# asks the others after a change made here (a new stream, a resume) so the change is in effect
# on them before the call that made it returns.
# Rules: asking is best effort (STATUS_TRIES requests, a warning when one never says yes) and
# never raises; an answer first waits (up to STATUS_TIMEOUT_S) until this member applied the
# Raft index the request names (header APPLIED_HEADER), and, for a partition it leads, until
# its NATS door listens (``doors_synced``); each answer runs in a task of its own so one
# waiting holds up no other (nats-py runs a subscription's callbacks one after the other).
from __future__ import annotations

import asyncio
import logging
from typing import Mapping, Sequence

from ..protocol.liftbridge import api_pb2 as pb
from ..protocol.liftbridge.envelope import EnvelopeError, MsgType, decode_internal, encode_message

log = logging.getLogger("riverlog.cluster")

STATUS_TRIES, STATUS_WAIT_S, STATUS_TIMEOUT_S = 5, 0.1, 2.0
"""Liftbridge's waitForPartitionLeader: 5 status requests, 100 ms apart (best effort)."""
APPLIED_HEADER, APPLIED_POLL_S = "Riverlog-Raft-Applied", 0.01
"""riverlog's: the Raft index a partition status request's answer waits for (polled)."""


class PartitionStatus:
    """The partition status requests of ``node`` (a ClusterNode: its server id, Broker,
    placement, Raft metadata, NATS link and ``doors_synced``)."""

    def __init__(self, node) -> None:
        self.node = node
        self._answering: set[asyncio.Task] = set()

    def subject(self, server_id: str) -> str:
        return f"{self.node.link.config.namespace}.raft.metadata.status.{server_id}"

    async def answer(self, nc) -> None:
        """Answer PartitionStatusRequests on this server's subject on connection ``nc``."""
        node = self.node

        async def answer(msg) -> None:  # nats-py takes coroutine functions only
            task = asyncio.get_running_loop().create_task(answer_one(msg))
            self._answering.add(task)  # held until done (the loop keeps weak references)
            task.add_done_callback(self._answering.discard)

        async def answer_one(msg) -> None:
            try:
                req = decode_internal(msg.data, MsgType.PartitionStatusRequest)
            except EnvelopeError as exc:
                log.warning("invalid partition status request: %s", exc)
                return
            await self._applied(msg.headers)
            local = node.broker.streams.get(req.stream)
            exists = local is not None and 0 <= req.partition < len(local.partitions)
            leads = exists and node.placement.leads(req.stream, req.partition)
            if leads and node.doors_synced is not None:
                await node.doors_synced()  # the NATS door listens on its subject now
            if msg.reply:
                await nc.publish(msg.reply, encode_message(pb.PartitionStatusResponse(
                    exists=exists, isLeader=leads)))
        await nc.subscribe(self.subject(node.server_id), cb=answer)

    async def _applied(self, headers: Mapping[str, str] | None) -> None:
        """Return once this member applied the Raft index a status request names (header
        APPLIED_HEADER), or after STATUS_TIMEOUT_S, and its reconcile step ran."""
        try:
            index = int((headers or {}).get(APPLIED_HEADER, 0))
        except ValueError:
            return
        for _ in range(int(STATUS_TIMEOUT_S / APPLIED_POLL_S)):
            metadata = self.node.metadata
            if metadata is None or metadata.status()["last_applied"] >= index:
                break
            await asyncio.sleep(APPLIED_POLL_S)
        await asyncio.sleep(0)  # the reconcile step of that change was queued before

    async def wait_for_leaders(self, name: str,
                               partitions: Sequence[int] | None = None) -> None:
        """Best effort, as Liftbridge's waitForPartitionLeader: ask the leader (another
        server) of each partition of ``partitions`` (indexes; None: every partition) whether
        it leads it, until it says so (``ask``), so a change made here (a resume) is in
        effect on the leaders too."""
        node = self.node
        stream = node.placement.state.streams.get(name)
        if stream is None:
            return
        for part in stream.partitions:
            if part.leader not in (None, node.server_id) and (
                    partitions is None or part.index in partitions):
                await self.ask(part.leader, name, part.index, leads=True)

    async def wait_for_replicas(self, name: str) -> None:
        """Best effort, after a create applied here: ask every other server holding a
        replica of stream ``name`` (all at once) whether it has the partition (a follower
        this server's Raft member is not connected to is not waited for: it is down), and
        its leader whether it leads it, as osiris' start_cluster returns once the writer and the
        replicas it could start run: a client connecting to a replica a Metadata answer names
        right after the create finds the stream there (the Go client's consumers pick
        replicas; CI saw STREAM_DOES_NOT_EXIST when only the leaders were asked)."""
        node = self.node
        stream = node.placement.state.streams.get(name)
        if stream is None:
            return
        await asyncio.gather(*(
            self.ask(server, name, part.index, leads=server == part.leader)
            for part in stream.partitions for server in part.replicas
            if server != node.server_id and (
                server == part.leader or node.placement.reachable(server))))

    async def ask(self, server: str, name: str, index: int, leads: bool) -> bool:
        """Send PartitionStatusRequests for ``name``/``index`` to ``server`` until it says
        it has the partition (``leads``: and leads it), up to STATUS_TRIES times; it answers
        once it applied what this member knows committed (header APPLIED_HEADER: the commit
        index, not last applied: pysyncobj calls a command back before it counts it applied,
        so last applied read then can be one short). Returns whether it said so (a warning
        is logged when not)."""
        node = self.node
        nc = node.link.nc if node.link is not None else None
        if nc is None or node.metadata is None:
            return False
        applied = {APPLIED_HEADER: str(node.metadata.status()["commit_index"])}
        request = encode_message(pb.PartitionStatusRequest(stream=name, partition=index))
        for _ in range(STATUS_TRIES):
            try:
                reply = await nc.request(self.subject(server), request,
                                         timeout=STATUS_TIMEOUT_S, headers=applied)
                status = decode_internal(reply.data, MsgType.PartitionStatusResponse)
                if status.isLeader if leads else status.exists:
                    return True
            except Exception as exc:  # no responders, timeout, a bad answer: try again
                log.debug("partition status of %s/%d from %s: %s", name, index, server, exc)
            await asyncio.sleep(STATUS_WAIT_S)
        log.warning("%s did not say it %s %s/%d", server, "leads" if leads else "holds",
                    name, index)
        return False

    def stop(self) -> None:
        """Cancel the answers being made."""
        for task in self._answering:
            task.cancel()
