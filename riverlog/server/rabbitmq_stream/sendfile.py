# Deliver frames whose chunk data goes from the segment file to the socket with os.sendfile,
# not through Python (as osiris does), on plain TCP connections of the current dialect. Owns
# which connections may do it, the writes made to the socket beside its transport, and the
# smallest chunk worth it.
# Rules: a write goes straight to the socket only while the transport's buffer is empty, so
# frames keep their order; what the socket does not take at once is read from the file and
# written through the transport (a copy); the socket's own errors are left to the transport,
# which meets them on its next write and closes the connection; a Deliver the file cannot
# complete once part of it went out aborts the connection (never half a frame then another).
# TLS, the draft dialect, filtered subscriptions and chunks under SENDFILE_MIN_BYTES keep the
# copying path (consuming.py).
from __future__ import annotations

import asyncio
import os

from ...log.spans import ChunkSpan

SENDFILE_MIN_BYTES = 64 * 1024
"""Chunks smaller than this (bytes on disk) are read and written as before: one read of a
run of small chunks and one write each cost less than a header read, a write and a sendfile
per chunk."""
WRITE_HIGH_WATER = 64 * 1024
"""The transport's write high-water mark (bytes; asyncio's default) on connections that
sendfile; their low-water mark is 0, so a paused subscription resumes once the transport's
buffer is empty, when its next chunks can go by sendfile again."""


def sendfile_fd(transport: asyncio.BaseTransport, tls: bool) -> int:
    """The socket descriptor a connection on ``transport`` may sendfile to, -1 when it may not
    (TLS, no os.sendfile on this system, a transport without a socket). On a descriptor it
    returns, the transport's write limits become WRITE_HIGH_WATER and 0."""
    sock = transport.get_extra_info("socket")
    if tls or sock is None or not hasattr(os, "sendfile"):
        return -1
    transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=0)
    return sock.fileno()


def deliver(transport: asyncio.WriteTransport, fd: int, head: bytes, span: ChunkSpan) -> int:
    """Write ``head`` (a Deliver's bytes before the chunk data: its prefix and the 48-byte
    chunk header) and the data of ``span``: straight to the socket ``fd`` (os.write, then
    os.sendfile from the segment file) when the transport's buffer is empty, and what the
    socket did not take (all of it when the buffer was not empty) through ``transport``.
    Returns the data bytes os.sendfile sent. Raises CorruptChunkError or OSError when the
    segment file cannot be read (the connection aborted if part of the frame went out)."""
    written = sent = 0
    length = span.header.data_length
    if not transport.get_write_buffer_size():
        try:
            written = os.write(fd, head)
            while written == len(head) and sent < length:
                n = span.sendfile(fd, sent)
                if not n:  # the file ended early: data_from says so
                    break
                sent += n
        except OSError:  # BlockingIOError: the socket is full; else the transport sees it
            pass
    if written == len(head) and sent == length:
        return sent
    try:
        rest = span.data_from(sent)
    except Exception:
        if written:
            transport.abort()
        raise
    transport.writelines((head[written:], rest))
    return sent
