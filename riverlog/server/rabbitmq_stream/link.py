# What a command handler of the RabbitMQ Stream door may reach of its connection and server:
# the small interface every handler family (session, streams, publishing, consuming, single
# active consumer) is given instead of the connection itself. It owns the resolution of the
# stream names clients use (a stream, or ``<stream>-<i>`` for partition i of a stream with
# several) and the authorization check on them.
# Rules: handlers send, fail, hold reading and run background work only through this; each
# command resolves its stream name once (``resolve``) and hands the result to ``place``,
# ``missing`` and ``may``; nothing here decodes or encodes frames.
from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, ContextManager, Protocol

from ...broker import Broker, Partition, SingleActiveConsumers, Stream, SuperStreams
from ...broker.placement import PartitionPlacement
from ...broker.superstreams import split_member_name
from ...config import RabbitStreamConfig
from ...log import ChunkSpan
from ...protocol.rabbitmq_stream import ResponseCode
from ...protocol.rabbitmq_stream import frames as f
from ...security.guard import Guard
from .flow import FlowControl
from .silent_close import SilentCloses


class DoorServer(Protocol):
    """What connections use of the door's server (RabbitStreamServer)."""

    broker: Broker
    config: RabbitStreamConfig
    guard: Guard
    super_streams: SuperStreams
    sac: SingleActiveConsumers
    connections: set
    sendfile_bytes: int
    silent_closes: SilentCloses

    def advertised_for(self, tls: bool) -> tuple[str, int]: ...


class Link:
    """One connection as its handlers see it. ``send(frame)`` writes a frame;
    ``send_chunk(subscription_id, partition, chunk)`` a Deliver of a stored chunk, and
    ``send_span(subscription_id, partition, span)`` one whose data goes from its segment file
    by os.sendfile (sendfile.py) when ``sendfile_fd`` (the socket, -1: never) is not -1;
    ``fail(code, reason, linger=0.0, send_close=True)`` closes the connection because of the
    peer; ``refuse(response, reason, linger, silent_close)`` answers a refused login or Open
    with ``response`` and closes the socket ``linger`` s later, after the server's silent
    close delay when ``silent_close``; ``hold_for(change, respond)`` runs a cluster change,
    the connection reading and handling nothing else meanwhile, and sends ``respond(code)``
    when it ends;
    ``hang_up(delay)`` closes the socket (``delay`` s later, after what is buffered);
    ``abort()`` drops it; ``peer_certificate()`` is the verified client certificate of a TLS
    connection (None: none, or plain TCP); ``notify(frame)`` sends a notification
    (MetadataUpdate, ConsumerUpdate), after the response when a request is being handled
    inside ``with notes_after():`` or a cluster change runs (a response goes before the
    notifications it causes, as rabbit_stream_reader.erl orders them). ``user`` is the
    authenticated user (None before); ``client_properties`` the client's PeerProperties and
    ``connected_at`` (time.time()) when the socket opened, for the management API."""

    __slots__ = ("server", "broker", "config", "guard", "tls", "flow", "peer", "vhost", "peer_host",
                 "user", "client_properties", "connected_at", "pending", "last_received",
                 "last_sent", "send", "send_chunk", "send_span", "sendfile_fd",
                 "fail", "refuse", "hold_for", "hang_up", "abort", "peer_certificate", "notify",
                 "notes_after")

    def __init__(self, server: DoorServer, tls: bool, flow: FlowControl, *,
                 send: Callable[[f.Frame], None],
                 send_chunk: Callable[[int, Partition, memoryview], None],
                 send_span: Callable[[int, Partition, ChunkSpan], None],
                 fail: Callable[..., None], refuse: Callable[..., None],
                 hold_for: Callable[[Awaitable[int], Callable[[int], f.Frame]], None],
                 hang_up: Callable[[float], None], abort: Callable[[], None],
                 peer_certificate: Callable[[], dict | None],
                 notify: Callable[[f.Frame], None],
                 notes_after: Callable[[], ContextManager[None]]) -> None:
        self.server = server
        self.broker = server.broker
        self.config = server.config
        self.guard = server.guard
        self.tls = tls
        self.flow = flow
        self.peer = "?"
        self.vhost = "/"
        """The virtual host Open opened (``/`` before); names on the wire are its streams'
        (vhost_frames.py)."""
        self.peer_host: str | None = None
        self.user: str | None = None
        self.client_properties: dict[str, str] = {}
        self.connected_at = time.time()
        self.pending: set[asyncio.Future] = set()  # background work; shutdown waits for it
        self.last_received = self.last_sent = 0.0  # time.monotonic() of the last frame
        self.send = send
        self.send_chunk = send_chunk
        self.send_span = send_span
        self.sendfile_fd = -1
        self.fail = fail
        self.refuse = refuse
        self.hold_for = hold_for
        self.hang_up = hang_up
        self.abort = abort
        self.peer_certificate = peer_certificate
        self.notify = notify
        self.notes_after = notes_after

    def background(self, work: Awaitable[object]) -> asyncio.Future:
        """Run ``work`` as a task kept in ``pending`` while it runs (shutdown waits for it)."""
        task = asyncio.ensure_future(work)
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)
        return task

    # -- stream names -----------------------------------------------------------------------
    def resolve(self, name: str) -> tuple[Stream, Partition] | None:
        """The stream and partition the name ``name`` serves on this door; partition i of a
        stream with several partitions is ``<stream>-<i>`` (broker/superstreams.py)."""
        return self.server.super_streams.resolve(name)

    def place(self, name: str, found: tuple[Stream, Partition] | None
              ) -> tuple[str, int, PartitionPlacement | None] | None:
        """The broker stream, partition index and placement the name ``name`` stands for,
        whether or not this server holds a replica: a local stream as ``resolve`` found it
        (``found``: ``resolve(name)``, each command resolves its stream once), else, in a
        cluster, the partition the placement knows (``<stream>-<i>`` for partition i of a
        stream with several; a real stream's name wins). None when neither knows the name;
        the placement None when it does not know a local stream."""
        placement = self.broker.placement
        if found is not None:
            stream, index = found[0].name, found[1].index
        elif not placement.clustered:
            return None
        elif placement.of(name, 0) is not None and placement.of(name, 1) is None:
            stream, index = name, 0
        else:
            member = split_member_name(name)
            if member is None or placement.of(member[0], 1) is None:
                return None
            stream, index = member
            if placement.of(stream, index) is None:
                return None
        return stream, index, placement.of(stream, index)

    def missing(self, name: str) -> int:
        """The code for a name this server holds no replica of (``resolve`` found none):
        STREAM_NOT_AVAILABLE when the cluster has it on other servers (RabbitMQ's code for a
        stream it cannot reach from here), STREAM_DOES_NOT_EXIST otherwise."""
        return (ResponseCode.STREAM_DOES_NOT_EXIST if self.place(name, None) is None
                else ResponseCode.STREAM_NOT_AVAILABLE)

    def may(self, stream: str, action: str, found: tuple[Stream, Partition] | None) -> bool:
        """Authorization (riverlog.security.authz): False answers ACCESS_REFUSED (0x10), as
        RabbitMQ does for Create, Delete, DeclarePublisher, Subscribe and QueryOffset when the
        user lacks the configure, write or read permission. ``found``: ``resolve(stream)``
        (each command resolves its stream once); a partition ``<stream>-<i>`` is checked as
        its stream."""
        return self.guard.allowed(self.user, found[0].name if found else stream, action)
