# The 2020 draft dialect on the RabbitMQ Stream door: one DraftAdapter per connection whose
# first frame is the draft's PeerProperties (key 15). It owns only what the draft does
# differently from the current protocol at the connection level: Publish naming its stream
# (the adapter declares the publisher the draft never declares, through publishing.py),
# CommitOffset (served as StoreOffset) and Deliver's draft chunk header. Everything else
# (handshake, streams, confirms, credit, offsets, authorization) goes through the door's own
# handlers, since the draft codec (riverlog.protocol.rabbitmq_stream.draft) decodes into and
# encodes from the same frames.
# Rules: no broker logic of its own; draft publishers have no reference, so no deduplication.
# Wire facts: ../shared/seeds/rabbitmq-stream-PROTOCOL-draft.adoc.
from __future__ import annotations

from typing import Optional

from ...protocol.rabbitmq_stream import FrameDecoder, ResponseCode
from ...protocol.rabbitmq_stream import draft
from ...protocol.rabbitmq_stream import frames as f
from .publishing import Publishing
from .state import ConnectionState


class DraftAdapter:
    """The draft side of one connection (its ``decoder``, ``publishing`` and ``state``), made
    when ``draft.opens_draft`` says so of its first bytes; switches the connection's decoder,
    and so its encoder, to ``draft.DRAFT_SERVER``."""

    __slots__ = ("publishing", "state")

    def __init__(self, decoder: FrameDecoder, publishing: Publishing,
                 state: ConnectionState) -> None:
        self.publishing = publishing
        self.state = state
        decoder.dialect = draft.DRAFT_SERVER  # the door encodes with the decoder's dialect

    def translate(self, frame: f.Frame) -> Optional[f.Frame]:
        """The door's frame for a decoded draft frame: draft Publish -> Publish (declaring its
        publisher), CommitOffset -> StoreOffset, the rest as it is. None when the adapter
        answered the frame itself (PublishError: the publisher could not be declared)."""
        kind = type(frame)
        if kind is draft.Publish:
            return self._publish(frame)
        if kind is draft.CommitOffset:
            return f.StoreOffset(frame.reference, frame.stream, frame.offset)
        return frame

    def _publish(self, frame: draft.Publish) -> Optional[f.Publish]:
        publishing = self.publishing
        pid = frame.publisher_id
        pub = publishing.publishers.get(pid)
        # before Open the door refuses the Publish itself; a deleted stream drops its publishers
        if self.state.open and (pub is None or pub.name != frame.stream):
            if pub is not None:  # the id moves to another stream (what it staged stays staged)
                del publishing.publishers[pid]
            code = publishing.declare_publisher(pid, None, frame.stream)
            if code != ResponseCode.OK:
                publishing.publish_error(pid, [i for i, _ in frame.entries], code)
                return None
        return f.Publish(pid, frame.entries)

    @staticmethod
    def deliver(subscription_id: int, chunk: memoryview) -> list:
        """Buffers of the draft Deliver of a stored chunk (48-byte header + data)."""
        return draft.deliver_parts(subscription_id, chunk)
