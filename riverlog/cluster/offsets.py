# Stored consumer offsets (RabbitMQ StoreOffset / QueryOffset) in a cluster: a server that does
# not lead a partition passes them to the server that does, as RabbitMQ's stream reader sends
# both to the stream's leader from any node (rabbit_stream_reader.erl: store_offset and
# query_offset look the leader up, osiris:write_tracking / osiris:read_tracking on it).
# Rules: only the partition's leader stores an offset (a tracking chunk of its log, replicated
# with the data: broker/partition.py store_offset), so every replica, and a new leader after a
# failover, holds the same offsets; requests travel on NATS to `<ns>.tracking.<server id>`
# (riverlog's own namespace, no client reaches it), as JSON {"stream", "partition",
# "reference", "offset" (StoreOffset only)}; the answer to a query is {"offset": n or null} or
# {"error": reason}; a StoreOffset is not answered (RabbitMQ's is a cast: no response).
from __future__ import annotations

import json
import logging

from ..broker import Broker
from ..broker.placement import OffsetsUnavailable, Placement
from ..errors import LogError
from .replication_subjects import subject_token

log = logging.getLogger("riverlog.cluster")

QUERY_TIMEOUT_S = 5.0


def tracking_subject(namespace: str, server_id: str) -> str:
    """``<ns>.tracking.<server id token>``: where server ``server_id`` takes stored offsets of
    the partitions it leads."""
    return f"{namespace}.tracking.{subject_token(server_id)}"


class OffsetForwarding:
    """Both sides over the NATS link ``link`` (server.nats_link.NatsLink; its cluster
    connection, ``cluster_nc``): ``answer(nc)``
    takes requests for the partitions this server leads; ``store`` / ``query`` send them to
    a partition's leader."""

    def __init__(self, link, broker: Broker, placement: Placement) -> None:
        self.link = link
        self.broker = broker
        self.placement = placement

    def _subject(self, server_id: str) -> str:
        return tracking_subject(self.link.config.namespace, server_id)

    def _leader(self, stream: str, index: int) -> str:
        found = self.placement.of(stream, index)
        if found is None or found.leader is None:
            raise OffsetsUnavailable(f"{stream}/{index} has no leader")
        return found.leader

    async def store(self, stream: str, index: int, reference: str, offset: int) -> None:
        """Pass a StoreOffset to the partition's leader. Raises ``OffsetsUnavailable``."""
        nc = self.link.cluster_nc
        if nc is None:
            raise OffsetsUnavailable("no NATS connection")
        await nc.publish(self._subject(self._leader(stream, index)), json.dumps({
            "stream": stream, "partition": index, "reference": reference,
            "offset": offset}).encode())

    async def query(self, stream: str, index: int, reference: str) -> int | None:
        """The offset ``reference`` stored, as the partition's leader holds it (None: none).
        Raises ``OffsetsUnavailable``."""
        nc = self.link.cluster_nc
        if nc is None:
            raise OffsetsUnavailable("no NATS connection")
        request = json.dumps({"stream": stream, "partition": index,
                              "reference": reference}).encode()
        try:
            reply = await nc.request(self._subject(self._leader(stream, index)), request,
                                     timeout=QUERY_TIMEOUT_S)
            answer = json.loads(reply.data)
        except OffsetsUnavailable:
            raise
        except Exception as exc:  # no responders, timeout, a bad answer
            raise OffsetsUnavailable(f"{stream}/{index}: {exc!r}") from None
        if not isinstance(answer, dict) or "error" in answer:
            raise OffsetsUnavailable(f"{stream}/{index}: {answer!r}")
        offset = answer.get("offset")
        return offset if isinstance(offset, int) else None

    async def answer(self, nc) -> None:
        """Take StoreOffset and QueryOffset requests on this server's subject, on ``nc``
        (at start and again on every new NATS connection)."""
        async def handle(msg) -> None:
            answer = self._handle(msg.data)
            if msg.reply:
                await nc.publish(msg.reply, json.dumps(answer).encode())
        if nc is not None:
            await nc.subscribe(self._subject(self.placement.server_id), cb=handle)

    def _handle(self, data: bytes) -> dict:
        try:
            request = json.loads(data)
            stream, index = str(request["stream"]), int(request["partition"])
            reference, offset = str(request["reference"]), request.get("offset")
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("a bad stored-offset request: %s", exc)
            return {"error": "bad-request"}
        local = self.broker.streams.get(stream)
        if local is None or not 0 <= index < len(local.partitions) or \
                not self.placement.leads(stream, index):
            return {"error": "not-leader"}
        partition = local.partitions[index]
        if offset is None:
            return {"offset": partition.offsets.query(reference)}
        try:
            partition.store_offset(reference, int(offset))
        except (ValueError, TypeError, LogError) as exc:
            log.warning("StoreOffset %r on %s/%d refused: %s", reference, stream, index, exc)
            return {"error": "refused"}
        return {}
