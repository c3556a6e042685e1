# Appender sinks of the Liftbridge doors: what a write's ``written``/``committed``/``failed``
# moments answer. AckSink turns one write into a Liftbridge Ack; RunSink answers the records of
# one run (one Appender.extend) in order. Rules: LEADER answers once written, ALL (and every
# other policy a RunSink gets) once committed, NONE never; the first answer of each event-loop
# turn is the door's confirm latency observation (CONFIRMS, riverlog.metrics).
# Wire facts: reference/liftbridge.md (Ack fields, ack policies).
from __future__ import annotations

import asyncio
import time
from typing import Callable

from ..metrics import DOORS, TurnLatency
from ..protocol.liftbridge import api_pb2 as pb

LEADER, ALL = pb.AckPolicy.LEADER, pb.AckPolicy.ALL
CONFIRMS = {door: TurnLatency(door) for door in DOORS}
"""Confirm latency per door, observed once per event-loop turn (riverlog.metrics)."""


class AckSink:
    """Appender sink that turns a write into a Liftbridge Ack and hands it to ``deliver``.

    ``ack`` is prefilled (stream, subjects, inbox, correlation id, policy, reception time);
    ``offset`` and ``commitTimestamp`` are set when the policy's moment comes. ``fail`` is
    called with the exception when the write fails (None: the failure is only logged).
    ``door`` labels the confirm latency (reception to Ack), observed for the first Ack of
    each event-loop turn (CONFIRMS).
    """

    __slots__ = ("ack", "deliver", "fail", "door")

    def __init__(self, ack: pb.Ack, deliver: Callable[[pb.Ack], None],
                 fail: Callable[[BaseException], None] | None = None, door: str = "") -> None:
        self.ack = ack
        self.deliver = deliver
        self.fail = fail
        self.door = door

    def written(self, offset: int) -> None:
        ack = self.ack
        ack.offset = offset
        if ack.ackPolicy == LEADER:
            self._send(ack)

    def committed(self, offset: int) -> None:
        ack = self.ack
        if ack.ackPolicy == ALL:
            self._send(ack)

    def _send(self, ack: pb.Ack) -> None:
        ack.commitTimestamp = now = time.time_ns()
        if self.door:
            CONFIRMS[self.door].observe((now - ack.receptionTimestamp) / 1e9)
        self.deliver(ack)

    def failed(self, error: BaseException) -> None:
        if self.fail is not None:
            self.fail(error)


class RunSink:
    """Appender sink shared by the records of one run: consecutive publishes of one loop turn
    to one partition with one ack policy, handed in with one ``Appender.extend``. The appender
    tells it about them in order, so the n-th ``written``/``committed``/``failed`` call is about
    the run's n-th record. A subclass answers record ``i`` in ``answer(i, offset, commit_ns)``
    (LEADER: once written; any other policy: once committed) and reports a failed record not
    answered yet in ``fail(i, error)``. The answers of one loop turn share one commit timestamp
    (ns); the turn's first is the door's confirm latency observation (CONFIRMS). ``template``
    is any object with ``policy`` and ``reception_ns`` (an envelope.AckTemplate)."""

    __slots__ = ("template", "door", "answered", "failures", "on_commit", "now")

    def __init__(self, template, door: str) -> None:
        self.template = template
        self.door = door
        self.answered = 0
        self.failures = 0
        self.on_commit = template.policy != LEADER
        self.now: int | None = None  # commit timestamp of this loop turn's answers

    def answer(self, i: int, offset: int, commit_ns: int) -> None:
        raise NotImplementedError

    def fail(self, i: int, error: BaseException) -> None:
        raise NotImplementedError

    def _answer(self, offset: int) -> None:
        i = self.answered
        self.answered = i + 1
        now = self.now
        if now is None:
            now = self.now = time.time_ns()
            asyncio.get_running_loop().call_soon(self._turn_over)
            CONFIRMS[self.door].observe((now - self.template.reception_ns) / 1e9)
        self.answer(i, offset, now)

    def _turn_over(self) -> None:
        self.now = None

    def written(self, offset: int) -> None:
        if not self.on_commit:
            self._answer(offset)

    def committed(self, offset: int) -> None:
        if self.on_commit:
            self._answer(offset)

    def failed(self, error: BaseException) -> None:
        i = self.failures
        self.failures = i + 1
        if i >= self.answered:  # not answered yet
            self.fail(i, error)
