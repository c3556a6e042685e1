# Single active consumer on the RabbitMQ Stream door: a connection's side of the groups kept
# (sans-IO) in broker/sac.py: joining and leaving them, ConsumerUpdate (0x1a) requests and
# the client's ConsumerUpdateResponse.
# Owns the ConsumerUpdate requests awaiting an answer and each member's Subscribe offset spec.
# Rules: as RabbitMQ's reader: a member's delivery stops at once when it is deactivated and
# starts when the client answers an activation, from the offset spec of its answer (NONE:
# its Subscribe's); this object is the members' owner in broker/sac.py, and every change the
# groups report goes to its owner through ``notify``.
from __future__ import annotations

import logging

from ...broker import Notification
from ...protocol.rabbitmq_stream import OffsetType, ResponseCode
from ...protocol.rabbitmq_stream import frames as f
from .consuming import Consuming, resolve_offset
from .link import Link

log = logging.getLogger("riverlog.rabbitmq_stream")


def notify(notes: list[Notification]) -> None:
    """Send each single-active-consumer change to its subscription's connection."""
    for note in notes:
        note.owner.consumer_update(note.subscription_id, note.active)


class SingleActive:
    """The single active consumers of one connection (``link``) among its subscriptions
    (``consuming``)."""

    def __init__(self, link: Link, consuming: Consuming) -> None:
        self.link = link
        self.consuming = consuming
        self.sac = link.server.sac
        # ConsumerUpdate requests awaiting an answer (correlation id -> subscription id,
        # active) and each member's Subscribe offset spec
        self._last_request = 0
        self._consumer_updates: dict[int, tuple[int, bool]] = {}
        self._specs: dict[int, tuple[int, int | None]] = {}

    def join(self, frame: f.Subscribe, group: str, index: int) -> None:
        """After SubscribeResponse, as RabbitMQ: register in the group; a ConsumerUpdate
        follows when the member is active at once. ``index``: the stream's position in
        the super stream named by the `super-stream` property, else -1."""
        self._specs[frame.subscription_id] = (frame.offset_type, frame.offset)
        notify(self.sac.register(frame.stream, group, index, self, frame.subscription_id))

    def leave(self, subscription_id: int) -> None:
        """The client ended the subscription: leave its group (another member may take
        over)."""
        if self._specs.pop(subscription_id, None) is not None:
            notify(self.sac.unregister(self, subscription_id))

    def forget(self, subscription_id: int) -> None:
        """The server dropped the subscription and its group (stream deleted, leader moved)."""
        self._specs.pop(subscription_id, None)

    def close(self) -> None:
        """The connection is gone: its members leave their groups."""
        notify(self.sac.unregister_owner(self))

    def consumer_update(self, subscription_id: int, active: bool) -> None:
        """Send ConsumerUpdate (0x1a). Delivery stops at once on deactivation and starts
        when the client answers an activation, from the offset spec of its answer."""
        sub = self.consuming.subscriptions[subscription_id]
        if not active:
            sub.cancel()
        self._last_request = self._last_request % 0xFFFFFFFF + 1
        self._consumer_updates[self._last_request] = (subscription_id, active)
        self.link.notify(f.ConsumerUpdate(self._last_request, subscription_id, active))

    def on_consumer_update_response(self, frame: f.ConsumerUpdateResponse) -> None:
        subscriptions = self.consuming.subscriptions
        request = self._consumer_updates.pop(frame.correlation_id, None)
        if request is None or request[0] not in subscriptions:
            log.info("ConsumerUpdateResponse %d from %s: no such request or subscription",
                     frame.correlation_id, self.link.peer)
            return
        if frame.response_code != ResponseCode.OK:  # RabbitMQ too only notes it
            log.info("ConsumerUpdateResponse from %s with code 0x%02x", self.link.peer,
                     frame.response_code)
        sub_id, active = request
        sac = self.sac
        if active and sac.is_active(self, sub_id):
            kind, value = frame.offset_type, frame.offset
            if kind == OffsetType.NONE:  # the Subscribe's spec
                kind, value = self._specs[sub_id]
            sub = subscriptions[sub_id]
            sub.start(resolve_offset(sub.partition, kind, value))
        elif not active:
            notify(sac.stepped_down(self, sub_id))
