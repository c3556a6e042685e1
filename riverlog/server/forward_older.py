# Forwarded PublishAsync requests for a cluster that still has a server of riverlog before
# forwarded batches (features.FORWARD_BATCH inactive): each request goes enveloped to its
# partition's NATS subject, as Liftbridge's publishAsyncSession sends it and riverlog did
# before commit 7192c0d, and its ack comes back enveloped on the call's inbox
# ``<namespace>.ack.<id>.e`` (ENVELOPED_TOKEN). Owns: that fallback. Rules: every leader,
# older or newer, takes an enveloped publish on its partition's subject (the NATS door), so
# nothing is lost while the cluster is mixed; the order of one partition's requests is kept
# (they leave in order, after the partition's resume, as the batches do).
from __future__ import annotations

import asyncio

from ..protocol.liftbridge import api_pb2 as pb
from ..protocol.liftbridge import envelope
from .liftbridge import NONE, partition_subject

ENVELOPED_TOKEN = "e"
"""The last token of the inbox enveloped acks come back on (batches' answers: a number)."""
_ASYNC = pb.PublishAsyncError.Code


def send_enveloped(session, service, bridge, forwards: dict, after) -> None:
    """Send every request of ``forwards`` (leader -> [(request, its bytes, resuming)], as
    ``_AsyncSession.forward`` queued them) enveloped to its partition's subject, once
    ``session.acks`` (the inbox subscription) and the resumes it waits for are done
    (``after(first, then)``: a future done when both are). Requests of an unknown stream get
    NOT_FOUND; a failed resume INTERNAL; a failed subscription UNKNOWN."""
    streams = service.broker.placement.streams() or {}
    inbox = f"{session.inbox}.{ENVELOPED_TOKEN}"
    for items in forwards.values():
        for req, _, resuming in items:
            known = streams.get(req.stream)
            if known is None or not 0 <= req.partition < known[1]:
                session.send_error(req.correlationId, _ASYNC.NOT_FOUND, f"no stream "
                                   f"{req.stream} partition {req.partition} is known here")
                continue
            subject = partition_subject(known[0], req.partition)
            gate = session.gate or session.acks
            if resuming is not None:
                gate = session.gate = asyncio.ensure_future(after(resuming, gate))
            _send_one(session, bridge, req, subject, inbox, resuming, gate)


def _send_one(session, bridge, req, subject: str, inbox: str, resuming, gate) -> None:
    data = envelope.encode_publish(pb.Message(
        key=req.key, value=req.value, stream=req.stream, subject=subject,
        headers=dict(req.headers), ackInbox=inbox, correlationId=req.correlationId,
        ackPolicy=req.ackPolicy, offset=req.expectedOffset))
    acked = req.ackPolicy != NONE
    if acked:
        session.inflight += 1

    def send(subscribing: asyncio.Future) -> None:  # once the ack inbox listens
        problem = None
        if resuming is not None and not resuming.cancelled() and \
                resuming.exception() is not None:
            problem = (_ASYNC.INTERNAL, f"failed to resume stream: {resuming.exception()}")
        elif subscribing.cancelled() or subscribing.exception() is not None:
            problem = (_ASYNC.UNKNOWN, "cannot listen for the partition leader's ack")
        if problem is not None:
            if acked:
                session.inflight -= 1
            session.send_error(req.correlationId, *problem)
            return
        bridge.queue_publish(subject.encode(), data)
    gate.add_done_callback(send)


def on_enveloped_ack(session, data: bytes) -> None:
    """An enveloped ack on the ENVELOPED_TOKEN inbox: answered as a local one
    (``session.deliver``); anything else is ignored, as Liftbridge's client does."""
    ack = envelope.decode_ack(data)
    if ack is not None:
        session.deliver(ack)
