# The leader side of forwarded PublishAsync batches: a cluster server listens on its own
# `<namespace>.forward.<server id>` (riverlog.protocol.forward_batch; servers-only, as every
# `<namespace>.>` subject) for the batches other servers send on to the partitions it leads,
# stores each with the code its own PublishAsync uses on a loop turn's requests
# (grpc_publish_async._publish_batch: the same checks, runs, ack policies, expected offsets
# and size limits) and answers the batch's reply subject once, when every request is answered:
# the PublishResponses in the order they were made, as they would have gone to a client of
# its own. Rules: the reply must be one of riverlog's own inboxes (`<namespace>.ack.`); a
# malformed batch is answered as failed (or dropped without a usable reply) with a log line,
# never raises; a request for a partition this server does not lead waits (apart, up to
# LEAD_WAIT_S) for its placement to name it (the sender may have applied a leader change
# first) and then gets NOT_FOUND; an answer over NATS's max_payload is replaced by a failure.
# At stop (App.stop's order) it first refuses (``refuse``): the batches taken are answered
# (STOP_TIMEOUT_S), and every batch delivered after is answered with the status
# STOPPING_STATUS and not stored, which the sender takes as nats-server's "no responders" and
# sends on to the partitions' next leader. It keeps its subscription until its partitions
# are handed over (``close``, after cluster.leaving) and no batch came for CLOSE_IDLE_S: had it
# unsubscribed first, a batch crossing a NATS route while nats-server drops the interest
# would be dropped with no answer (only the publishing server answers "no responders").
from __future__ import annotations

import asyncio
import logging

from ..protocol.forward_batch import (ANSWER_MAGIC, MAGIC, MAX_ITEMS_DIVISOR, ForwardError,
                                      decode_items, encode_failed, encode_items,
                                      forward_subject)
from ..protocol.liftbridge import api_pb2 as pb
from ..protocol.nats_wire import status_command
from .grpc_publish_async import _AsyncSession, _publish_batch
from .liftbridge import Liftbridge

log = logging.getLogger("riverlog.grpc")

STOP_TIMEOUT_S = 5.0
CLOSE_IDLE_S = 0.2  # ``close`` unsubscribes once no batch came for this long ...
CLOSE_WAIT_S = 2.0  # ... or after this long
STOPPING_STATUS = b"503 Leader Stopping"
"""The status line's code and description a refused batch is answered with (nothing stored):
503 as nats-server's "no responders", which every riverlog that forwards sends on."""
POLL_S = 0.02  # how often a stop or a deferred batch looks again
LEAD_WAIT_S = 2.0  # how long a request for a partition led elsewhere waits to be led here


class ForwardedPublishes:
    """Takes the batches forwarded to this server. ``await start()`` subscribes (again after
    the NATS link reconnects); at stop ``await refuse()``, later ``await close()``."""

    def __init__(self, service: Liftbridge, link) -> None:
        self.service = service
        self.link = link
        self.subject = forward_subject(service.namespace, service.broker.placement.server_id)
        self._inboxes = f"{service.namespace}.ack."
        self._sub = None
        self.batches = 0  # batches taken (each request of one is counted by its stream)
        self.refusing = False  # ``refuse`` began: batches are answered STOPPING_STATUS
        self.refused = 0  # batches so answered (``batches`` counts them too)
        self._last_batch = 0.0  # the loop's time of the last batch delivered
        self.answering: set[_Answer] = set()  # batches taken whose answer is not sent yet
        self._waiting: set[asyncio.Task] = set()  # ``_later`` of batches with deferred ones
        link.add_reconnect_listener(self._resubscribe)

    async def start(self) -> None:
        self._sub = await self.link.nc.subscribe(self.subject, cb=self._on_batch)

    async def refuse(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Store no more batches: each one delivered from now on is answered STOPPING_STATUS
        (its sender sends it on to the partitions' next leader); then wait up to ``timeout``
        s until every batch taken is answered (its writes committed, while replication still
        runs: App.stop's order). The subscription stays until ``close``."""
        self.refusing = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.answering and loop.time() < deadline:
            await asyncio.sleep(POLL_S)
        if self.answering:
            log.warning("%d forwarded batches not answered at stop", len(self.answering))

    async def close(self, idle: float = CLOSE_IDLE_S, timeout: float = CLOSE_WAIT_S) -> None:
        """After ``refuse`` and the hand-over of this server's partitions: unsubscribe once no
        batch came for ``idle`` s (the senders applied the new leaders), ``timeout`` s at most
        (a partition no other replica could take keeps this server its leader)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() - self._last_batch < idle and loop.time() < deadline:
            await asyncio.sleep(POLL_S)
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.drain()  # the batches delivered already are answered
            except Exception:  # the connection went, and the subscription with it
                pass
        if self.refused:
            log.info("%d forwarded batches refused while stopping (sent on by their senders)",
                     self.refused)

    async def _resubscribe(self, nc) -> None:
        if self._sub is not None:
            self._sub = await nc.subscribe(self.subject, cb=self._on_batch)

    async def _on_batch(self, msg) -> None:
        self._last_batch = asyncio.get_running_loop().time()
        self.batches += 1
        reply = msg.reply
        if not reply.startswith(self._inboxes):
            log.error("forwarded batch on %s dropped: its reply %r is no riverlog inbox",
                      msg.subject, reply[:64])
            return
        bridge = self.service.bridge
        if self.refusing:
            self.refused += 1
            if bridge.data is None or not bridge.data.publish(
                    status_command(reply.encode(), STOPPING_STATUS)):
                log.error("forwarded batch on %s not answered: the data connection is down",
                          msg.subject)
            return
        max_payload = self.link.nc.max_payload
        try:
            raws = decode_items(msg.data, MAGIC, 2 * max(1, max_payload // MAX_ITEMS_DIVISOR))
        except ForwardError as exc:
            log.error("malformed forwarded batch on %s: %s", msg.subject, exc)
            bridge.queue_publish(reply.encode(), encode_failed(f"malformed batch: {exc}"))
            return
        answer = _Answer(bridge, reply.encode(), max_payload, self.answering)
        answer.batch = raws
        self.answering.add(answer)
        self._store(answer)
        if not answer.deferred:
            answer.stored = True
            answer.finish()
            return
        # the sender may have applied a leader change this server has not yet: wait for it
        # apart, so the batches after this one are not held
        task = asyncio.get_running_loop().create_task(self._later(answer))
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    async def _later(self, answer: "_Answer") -> None:
        """Store ``answer``'s deferred requests once this server leads their partitions, or
        refuse them after LEAD_WAIT_S; then answer the batch."""
        answer.deferring = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LEAD_WAIT_S
        placement = self.service.broker.placement
        while loop.time() < deadline and not all(
                placement.leads(req.stream, req.partition) for req, _ in answer.deferred):
            await asyncio.sleep(POLL_S)
        answer.batch, answer.deferred = [raw for _, raw in answer.deferred], []
        self._store(answer)  # what this server still does not lead is refused now
        answer.stored = True
        answer.finish()

    def _store(self, answer: "_Answer") -> None:
        try:
            _publish_batch(self.service, answer)
        except Exception as exc:  # a bug: the forwarding server still gets its answer
            log.exception("forwarded batch to %s failed", self.subject)
            answer.error = (None, f"forwarded batch failed: {exc}")


class _Answer(_AsyncSession):
    """The session a forwarded batch is stored with: it collects the PublishResponses and
    sends them back in one message when the last awaited ack came."""

    __slots__ = ("bridge", "reply", "max_payload", "stored", "answered", "answering",
                 "deferring", "deferred")

    def __init__(self, bridge, reply: bytes, max_payload: int, answering: set) -> None:
        super().__init__()
        self.bridge = bridge
        self.reply = reply
        self.max_payload = max_payload
        self.stored = False  # _publish_batch returned: every request is stored or answered
        self.answered = False
        self.answering = answering  # ForwardedPublishes': left once answered
        self.deferring = True  # requests led elsewhere here wait (once) for the placement
        self.deferred: list = []  # (request, its bytes) waiting

    def forward(self, service: Liftbridge, req: pb.PublishRequest, raw: bytes,
                resuming=None) -> None:
        """Led elsewhere as this server sees it: first kept for a second look (the sender
        may have applied a leader change that names this server before it did); then, still
        led elsewhere (the leader changed while the batch travelled), refused."""
        if self.deferring:
            self.deferred.append((req, raw))
            return
        self.send_error(req.correlationId, pb.PublishAsyncError.Code.NOT_FOUND,
                        f"server {service.broker.placement.server_id} no longer leads "
                        f"partition {req.partition} of stream {req.stream}")

    def send(self, data: bytes) -> None:
        self.out.append(data)
        self.finish()

    def finish(self) -> None:
        if not self.stored or self.inflight > 0 or self.answered:
            return
        self.answered = True
        self.answering.discard(self)
        if self.error is not None:
            data = encode_failed(self.error[1])
        else:
            data = encode_items(ANSWER_MAGIC, self.out)
            if len(data) > self.max_payload:
                log.error("answer to a forwarded batch not sent: %d bytes exceed max_payload",
                          len(data))
                data = encode_failed("the answer exceeds NATS's max_payload")
        self.bridge.queue_publish(self.reply, data)
