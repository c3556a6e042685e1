# A follower's requests to its leader (ReplicationRequest, LeaderEpochOffsetRequest), sent on
# the cluster connection with replies to an inbox of the follower's own, so that an answer
# that comes after its request timed out is still seen (nats-py's request() drops it).
# Rules: every answer but "no responders" is handed to ``heard`` whenever it comes (the
# follower counts those that are not refusals as proof that the leader lives); asking the
# same request again after a timeout keeps the earlier asks open, and the first answer to
# any of them is taken: within one leader epoch the leader's log only grows, so an answer to
# the same request is as good as any (a busy leader
# whose answers take longer than the fetch timeout keeps its followers fetching, and is not
# reported silent, issue 29 item 5); once taken, later answers to that request only count as
# proof of life. At most MAX_OPEN asks are remembered; older answers are proof of life only.
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Callable

import nats.errors

if TYPE_CHECKING:
    import nats.aio.msg
    import nats.aio.subscription

    from .replication_context import ReplicationEngine

MAX_OPEN = 64
"""Asks remembered at once (answers to older ones are proof of life only)."""

NO_RESPONDERS = object()
"""What ``ask`` returns when nats-server answered that nothing listens on the subject."""

_STATUS = "Status"  # nats-server's status header of a no-responders answer (ADR-13)
_NO_RESPONDERS_STATUS = "503"


class Asks:
    """Requests of one follower, answered on ``<inbox>.<n>`` of ``engine.nc``.

    ``await ask(subject, request, headers, timeout)`` returns the answer (a nats-py Msg),
    ``NO_RESPONDERS``, or None when no answer came within ``timeout`` s; ``heard(msg)`` is
    called on the loop with every answer but no-responders, late ones included. ``close()``
    drops the inbox. Raises nats-py's errors when the request cannot be sent (connection closed)."""

    def __init__(self, engine: "ReplicationEngine",
                 heard: Callable[["nats.aio.msg.Msg"], None]) -> None:
        self.engine = engine
        self.heard = heard
        self._nc = None
        self._sub: "nats.aio.subscription.Subscription | None" = None
        self._inbox = ""
        self._sent = 0
        self._open: dict[str, tuple] = {}  # reply token -> the key of the request it asked
        self._key: tuple | None = None  # the request now awaited...
        self._answer: asyncio.Future | None = None  # ...and its first answer

    async def ask(self, subject: str, request: bytes, headers: dict[str, str] | None,
                  timeout: float) -> "nats.aio.msg.Msg | object | None":
        key = (subject, request, tuple(sorted(headers.items())) if headers else ())
        if key != self._key or self._answer is None:
            self._key, self._answer = key, asyncio.get_running_loop().create_future()
        answer = self._answer
        if not answer.done():  # an earlier ask of the same may have been answered since
            await self._send(subject, request, headers, key)
            try:
                await asyncio.wait_for(asyncio.shield(answer), timeout)
            except asyncio.TimeoutError:
                return None
        self._key = self._answer = None
        for token in [t for t, k in self._open.items() if k == key]:
            del self._open[token]  # its other asks' answers: proof of life only
        return answer.result()

    async def _send(self, subject: str, request: bytes, headers: dict[str, str] | None,
                    key: tuple) -> None:
        nc = self.engine.nc
        if self._sub is None or self._nc is not nc:  # first ask, or a new connection
            self._open.clear()
            self._inbox = nc.new_inbox()
            self._sub = await nc.subscribe(self._inbox + ".*", cb=self._on_answer)
            self._nc = nc
        self._sent += 1
        token = str(self._sent)
        self._open[token] = key
        if len(self._open) > MAX_OPEN:
            del self._open[next(iter(self._open))]
        await nc.publish(subject, request, reply=f"{self._inbox}.{token}", headers=headers)

    async def _on_answer(self, msg: "nats.aio.msg.Msg") -> None:
        key = self._open.get(msg.subject.rpartition(".")[2])
        if msg.headers and msg.headers.get(_STATUS) == _NO_RESPONDERS_STATUS:
            result: object = NO_RESPONDERS
        else:
            result = msg
            self.heard(msg)
        answer = self._answer
        if key is not None and key == self._key and answer is not None and not answer.done():
            answer.set_result(result)

    async def close(self) -> None:
        """Drop the inbox subscription (nothing when the connection is gone)."""
        sub, self._sub = self._sub, None
        self._open.clear()
        if sub is not None:
            try:
                await sub.unsubscribe()
            except nats.errors.Error:
                pass
