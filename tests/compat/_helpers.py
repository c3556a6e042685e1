# Helpers shared by the compat tests: unique stream names, deterministic payloads, a bounded
# "wait until" and an rstream message collector. Nothing here knows which server it talks to.
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Callable

from ._raw import RawPeer
from riverlog.protocol.rabbitmq_stream import frames as f

GUEST = {"username": "guest", "password": "guest"}


def stream_name(prefix: str = "compat") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def payload(i: int) -> bytes:
    """Message ``i``: distinct, varying length (0..63 extra bytes), easy to read in a diff."""
    return b"msg-%07d|" % i + bytes((i * 7 + k) % 256 for k in range(i % 64))


def now_ms() -> int:
    return int(time.time() * 1000)


async def wait_until(pred: Callable[[], bool], timeout: float, what: str | Callable[[], str],
                     interval: float = 0.01) -> None:
    """Poll ``pred``; on timeout fail with ``what`` (a callable is evaluated then)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what() if callable(what) else what}")
        await asyncio.sleep(interval)


class Collector:
    """rstream message callback that records ``(offset, message, chunk timestamp)``."""

    def __init__(self) -> None:
        self.items: list[tuple[int, Any, int]] = []

    async def __call__(self, msg: Any, ctx: Any) -> None:
        self.items.append((ctx.offset, msg, ctx.timestamp))

    def _span(self) -> str:
        return f"{self.items[0][0]}..{self.items[-1][0]}" if self.items else "none"

    @property
    def offsets(self) -> list[int]:
        return [o for o, _, _ in self.items]

    @property
    def messages(self) -> list[Any]:
        return [m for _, m, _ in self.items]

    async def wait_for(self, n: int, timeout: float = 30, settle: float = 0.3) -> None:
        """Wait for at least ``n`` messages, then ``settle`` seconds more so that extra
        (duplicate or unexpected) deliveries show up in ``items`` too."""
        await wait_until(lambda: len(self.items) >= n, timeout,
                         lambda: f"{n} messages (got {len(self.items)}, offsets {self._span()})")
        await asyncio.sleep(settle)


async def wait_stream_ready(server, stream: str, timeout: float = 60) -> None:
    """After a restart: wait until Metadata names a leader for ``stream`` (RabbitMQ takes a
    moment to bring stream members back; riverlog should answer at once)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            peer = await RawPeer.open(server.host, server.port)
            try:
                r = await peer.request(f.Metadata(peer.next_corr(), (stream,)))
            finally:
                peer.close()
            if r.streams and r.streams[0].response_code == 1 and r.streams[0].leader_reference != 0xFFFF:
                # a stream member can be listed before it accepts subscriptions/publishers
                await asyncio.sleep(0.5 if server.kind == "rabbitmq" else 0)
                return
        except Exception:  # connection refused, reset, timeout, not yet open
            pass
        if loop.time() > deadline:
            raise AssertionError(f"stream {stream} not available {timeout}s after restart")
        await asyncio.sleep(0.2)


