# The silent close delay of the RabbitMQ Stream door: the door-wide count of connections whose
# refused login or Open waits before it is answered (RabbitMQ 4's SILENT_CLOSE_DELAY).
# Rules: at most ``limit`` connections wait at once (an attacker's failing connections cannot
# grow it past that; beyond it a refusal is answered at once); a slot is taken by ``take`` and
# given back exactly once by ``give_back``, whether the delay ran out or the peer hung up; no
# sockets, no frames, no timers here (connection.py owns those).
from __future__ import annotations

import logging

log = logging.getLogger("riverlog.rabbitmq_stream")


class SilentCloses:
    """How long refused connections wait (``delay_ms``, 0: not at all) and how many may wait
    at once (``limit``). ``waiting`` is how many wait now; ``answered_at_once`` counts the
    refusals answered without the delay because ``limit`` were waiting."""

    __slots__ = ("delay_ms", "limit", "waiting", "answered_at_once", "_full_logged")

    def __init__(self, delay_ms: int, limit: int) -> None:
        self.delay_ms = delay_ms
        self.limit = limit
        self.waiting = 0
        self.answered_at_once = 0
        self._full_logged = False

    def take(self) -> float:
        """A slot for one refused connection: the delay in seconds it waits (then the caller
        must ``give_back()`` once), or 0.0 when there is no delay or every slot is taken (the
        refusal is answered at once and nothing is to be given back)."""
        if not self.delay_ms:
            return 0.0
        if self.waiting >= self.limit:
            self.answered_at_once += 1
            if not self._full_logged:  # once per busy spell: an attack would flood the log
                self._full_logged = True
                log.warning("%d refused connections wait in the silent close delay: "
                            "further refusals are answered at once", self.waiting)
            return 0.0
        self.waiting += 1
        return self.delay_ms / 1000

    def give_back(self) -> None:
        """The slot ``take`` gave is free again (the delay ran out, or the peer is gone)."""
        self.waiting -= 1
        if self.waiting < self.limit // 2:
            self._full_logged = False
