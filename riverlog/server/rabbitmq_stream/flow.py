# Flow control of one RabbitMQ Stream connection (uvicorn's flow_control.py idea): whether its
# socket is read, and whether output may be written.
# Reading stops while any reason holds it: too many unconfirmed publishes (UNCONFIRMED), too
# much output the peer does not read (OUTPUT), a cluster change the connection waits for
# (CLUSTER), a password check under way (LOGIN), a resource alarm on a connection with
# publishers (ALARM, riverlog.alarms); it resumes once none does, unless the
# connection is closing. Writing waits while the socket's send buffer is over its high-water
# mark (the transport's pause_writing / resume_writing).
# Rules: only this object pauses and resumes the transport's reading; no frames, no broker.
from __future__ import annotations

import asyncio

from .state import CLOSE, ConnectionState

UNCONFIRMED, OUTPUT, CLUSTER, LOGIN, ALARM = "unconfirmed", "output", "cluster", "login", "alarm"


class FlowControl:
    """Pause and resume of a transport (set ``transport`` once the connection is made) of a
    connection in ``state``: once it is closing, reading is never resumed."""

    __slots__ = ("transport", "state", "_holds", "_writable")

    def __init__(self, state: ConnectionState) -> None:
        self.transport: asyncio.Transport | None = None
        self.state = state
        self._holds: set[str] = set()
        self._writable = asyncio.Event()
        self._writable.set()

    # -- reading --------------------------------------------------------------------------
    def hold(self, reason: str) -> None:
        """Stop reading until ``release(reason)`` (and every other hold is released)."""
        self._holds.add(reason)
        if self.transport is not None:
            self.transport.pause_reading()

    def release(self, reason: str) -> None:
        """Drop the hold ``reason``; read again when nothing holds reading any more."""
        self._holds.discard(reason)
        if self._holds or self.state.closing:
            return
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def holds(self, reason: str) -> bool:
        return reason in self._holds

    def stop(self) -> None:
        """Read nothing more (shutdown): the connection is closing."""
        self.state.on(CLOSE)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    # -- writing --------------------------------------------------------------------------
    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()
        if OUTPUT in self._holds:
            self.release(OUTPUT)

    async def writable(self) -> None:
        """Wait while the socket's send buffer is over its high-water mark."""
        if not self._writable.is_set():
            await self._writable.wait()

    def lost(self) -> None:
        """The connection is gone: nothing waits to write any more."""
        self._writable.set()

    def gone(self) -> bool:
        """True once the socket is closed or closing."""
        return self.transport is None or self.transport.is_closing()

    def idle(self) -> bool:
        """True when the socket has taken every byte written so far (nothing buffered)."""
        return self.transport is not None and self.transport.get_write_buffer_size() == 0
