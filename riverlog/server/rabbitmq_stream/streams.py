# Stream administration on the RabbitMQ Stream door: Create, Delete, Metadata, StreamStats,
# and super streams (CreateSuperStream, DeleteSuperStream, Partitions, Route).
# Rules: in a cluster, Create and Delete (and the super stream ones) go through the placement
# (``Broker.placement``) and are answered once this server applied them, the connection
# reading nothing else meanwhile (``Link.hold_for``), as RabbitMQ's reader waits for the
# stream coordinator; reserved amq.* names are refused with 0x11; a partition of a stream
# with several partitions is named ``<stream>-<i>`` and cannot be deleted alone; Metadata
# lists the servers as rabbit_stream_reader does. Registry and routing of super streams live
# in broker/superstreams.py; Create arguments in arguments.py.
from __future__ import annotations

import dataclasses
import logging
from functools import partial
from typing import Awaitable, Callable

from ...broker import RESERVED_STREAMS, Partition, Stream, StreamConfig, SuperStream
from ...errors import (InvalidArgumentError, LimitExceededError, ResourceExhaustedError,
                       StreamExistsError, StreamNotFoundError)
from ...protocol.rabbitmq_stream import ResponseCode
from ...protocol.rabbitmq_stream import frames as f
from ...security.authz import CONSUME, CREATE, DELETE, PUBLISH, super_stream_rights
from ...broker.placement import Placement
from .arguments import equivalence_arguments, stream_config_for, stream_config_from_arguments
from .link import Link
from .vhost_frames import client_name

log = logging.getLogger("riverlog.rabbitmq_stream")

OK = ResponseCode.OK
# the names of this door's listeners in Placement.door (Metadata answers with the one of the
# connection's kind, as rabbit_stream_reader's advertised_host_fun/advertised_port_fun)
DOOR = "rabbitmq-stream"
TLS_DOOR = "rabbitmq-stream-tls"
NO_LEADER = 0xFFFF  # StreamMetadata leader reference when there is none


def _create_refused(name: str, exc: StreamExistsError | InvalidArgumentError) -> int:
    """The Create (and CreateSuperStream) code for ``exc``: 0x05 when the stream exists, 0x11
    for bad arguments or names."""
    if isinstance(exc, StreamExistsError):
        return ResponseCode.STREAM_ALREADY_EXISTS
    log.info("creating %r refused: %s", name, exc)
    return ResponseCode.PRECONDITION_FAILED


def _reserved(name: str) -> bool:
    """A (broker) name Create refuses with 0x11: riverlog's internal streams, RabbitMQ's
    reserved ``amq.`` prefix (rabbit_stream_utils:enforce_correct_name, check_name), and the
    empty name (what vhost_frames makes of a name no client may use)."""
    name = client_name(name)
    return not name or name in RESERVED_STREAMS or name.startswith("amq.")


def _exists_code(found: tuple[Stream, Partition] | None,
                 arguments: dict[str, str] | None) -> int:
    """The Create code for a stream that exists (``found``: the local one, if any): 0x11
    precondition failed when its kept Create arguments differ from ``arguments`` (a key on
    one side only counts), as RabbitMQ's rabbit_amqqueue:assert_equivalence refuses, else
    0x05 (also when nothing was kept to compare: a stream made through Liftbridge, or one
    this server holds no replica of)."""
    kept = found[0].config.rabbitmq_arguments if found else None
    if kept is None:
        return ResponseCode.STREAM_ALREADY_EXISTS
    try:
        same = equivalence_arguments(dict(arguments or {})) == kept
    except ValueError:
        same = False
    return ResponseCode.STREAM_ALREADY_EXISTS if same else ResponseCode.PRECONDITION_FAILED


async def _deleted(delete: Awaitable[None]) -> int:
    """The Delete (and DeleteSuperStream) code of a deletion through the cluster."""
    try:
        await delete
    except StreamNotFoundError:
        return ResponseCode.STREAM_DOES_NOT_EXIST
    return OK


def _config(arguments: dict[str, str] | None, owner: str | None,
            placement: Placement | None = None) -> StreamConfig:
    """The StreamConfig of Create ``arguments`` on a server with ``placement`` (None: a
    single server), owned by ``owner`` (the connection's user). Raises
    InvalidArgumentError."""
    config = stream_config_from_arguments(dict(arguments or {})) if placement is None else \
        stream_config_for(dict(arguments or {}), placement)
    return dataclasses.replace(config, owner=owner)


def _create(name: str, arguments: dict[str, str] | None, owner: str | None,
            create: Callable[[StreamConfig], object]) -> int:
    """Run ``create`` with the StreamConfig of Create ``arguments``, owned by ``owner``; the
    response code (0x05 when it exists, 0x11 for bad arguments or names, 0x0f without file
    descriptors)."""
    try:
        create(_config(arguments, owner))
        return OK
    except (StreamExistsError, InvalidArgumentError) as exc:
        return _create_refused(name, exc)
    except ResourceExhaustedError as exc:
        return _no_resources(name, exc)


def _no_resources(name: str, exc: ResourceExhaustedError) -> int:
    """The Create code when the server has no file descriptor for the stream: 0x0f internal
    error, what RabbitMQ answers when its stream coordinator cannot start a stream
    (rabbit_stream_manager ``{error, internal_error}``); the protocol has no resource code
    (0x0e is frame too large). Only this request fails; nothing of the stream is kept."""
    log.warning("creating %r refused: %s", name, exc)
    return ResponseCode.INTERNAL_ERROR



class Streams:
    """The stream administration commands of one connection (``link``)."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.broker = link.broker
        self.send = link.send

    def on_create(self, frame: f.Create) -> None:
        """In a cluster through ``Placement.create_stream`` (``x-initial-cluster-size``: the
        replication factor), answered once this server has applied it."""
        link = self.link
        found = link.resolve(frame.stream)
        if not link.may(frame.stream, CREATE, found):
            self.send(f.CreateResponse(frame.correlation_id, ResponseCode.ACCESS_REFUSED))
            return
        respond = partial(f.CreateResponse, frame.correlation_id)
        if _reserved(frame.stream):
            self.send(respond(ResponseCode.PRECONDITION_FAILED))
        elif link.place(frame.stream, found) is not None:  # the partitions of a stream too
            self.send(respond(_exists_code(found, frame.arguments)))
        elif self._over_quota(frame.stream, 1):
            self.send(respond(ResponseCode.PRECONDITION_FAILED))
        elif self.broker.placement.clustered:
            link.hold_for(self._create_in_cluster(
                frame.stream, frame.arguments, self.broker.placement.create_stream), respond)
        else:
            self.send(respond(_create(frame.stream, frame.arguments, link.user,
                                      partial(self.broker.create, frame.stream))))

    async def _create_in_cluster(self, name: str, arguments: dict[str, str] | None,
                                 create: Callable[[str, StreamConfig], Awaitable[object]]) -> int:
        """``_create`` in a cluster: ``await create(name, config)``, the replication factor
        from ``initial-cluster-size`` over the cluster's servers."""
        try:
            config = _config(arguments, self.link.user, self.broker.placement)
            await create(name, config)
            return OK
        except (StreamExistsError, InvalidArgumentError) as exc:
            return _create_refused(name, exc)

    def _over_quota(self, name: str, streams: int) -> bool:
        """Whether the user may not own ``streams`` more streams (Broker.check_quota): then
        0x11 precondition failed, as RabbitMQ refuses a queue over its user's or virtual
        host's ``max-queues`` (AMQP precondition_failed, "queue limit ... is reached")."""
        try:
            self.broker.check_quota(self.link.user, streams)
        except LimitExceededError as exc:
            log.warning("creating %r refused: %s", name, exc)
            return True
        return False

    def on_delete(self, frame: f.Delete) -> None:
        """A stream with several partitions is no stream here (0x02; DeleteSuperStream
        deletes it); one of its partitions cannot go alone (0x11). In a cluster through
        ``Placement.delete_stream``."""
        link = self.link
        found = link.resolve(frame.stream)
        if not link.may(frame.stream, DELETE, found):
            self.send(f.DeleteResponse(frame.correlation_id, ResponseCode.ACCESS_REFUSED))
            return
        respond = partial(f.DeleteResponse, frame.correlation_id)
        placed = link.place(frame.stream, found)
        if frame.stream in RESERVED_STREAMS:  # as RabbitMQ answers its reserved amq.* names
            code = ResponseCode.PRECONDITION_FAILED
        elif placed is None:
            code = ResponseCode.STREAM_DOES_NOT_EXIST
        elif placed[0] != frame.stream:
            log.info("Delete %r refused: a partition of stream %r", frame.stream, placed[0])
            code = ResponseCode.PRECONDITION_FAILED
        elif self.broker.placement.clustered:
            link.hold_for(_deleted(self.broker.placement.delete_stream(frame.stream)), respond)
            return
        else:
            with link.notes_after():  # DeleteResponse, then MetadataUpdate
                self.broker.delete(frame.stream)
                self.send(respond(OK))
            return
        self.send(respond(code))

    def on_metadata(self, frame: f.Metadata) -> None:
        """Metadata (0x0f) as rabbit_stream_reader builds it: the brokers are the servers
        leading or following the asked streams that advertise this connection's kind of
        listener (``Placement.door``), sorted by (host, port) and numbered from 0, and this
        server, always (RabbitMQ lists no broker when no asked stream exists); a
        stream's replicas are its in-sync followers, the leader not among them (RabbitMQ
        lists the members whose replica runs); a partition without a leader is OK with
        leader 0xFFFF (clients ask again); 0x06 when the placement of a local stream is
        unknown, 0x02 for a name no server has. A name asked twice is answered once (RabbitMQ
        answers from a map); a frame of more than MAX_METADATA_NAMES names never gets here
        (the codec refuses it, 0x0e)."""
        link = self.link
        placement = self.broker.placement
        door = TLS_DOOR if link.tls else DOOR
        endpoints: dict[str, tuple[str, int] | None] = {}

        def endpoint(server: str) -> tuple[str, int] | None:
            if server not in endpoints:
                endpoints[server] = (link.server.advertised_for(link.tls)
                                     if server == placement.server_id
                                     else placement.door(server, door))
            return endpoints[server]

        endpoint(placement.server_id)
        asked = []
        for name in dict.fromkeys(frame.streams):  # each name once, as RabbitMQ's map
            placed = link.place(name, link.resolve(name))
            where = placed[2] if placed else None
            if where is None:
                asked.append((name, placed, None, ()))
                continue
            leader = endpoint(where.leader) if where.leader is not None else None
            followers = [endpoint(s) for s in where.replicas
                         if s != where.leader and s in where.isr]
            asked.append((name, placed, leader, [ep for ep in followers if ep is not None]))
        brokers = sorted({ep for ep in endpoints.values() if ep is not None})
        reference = {ep: i for i, ep in enumerate(brokers)}
        streams = []
        for name, placed, leader, followers in asked:
            if placed is None or placed[2] is None:
                code = (ResponseCode.STREAM_DOES_NOT_EXIST if placed is None
                        else ResponseCode.STREAM_NOT_AVAILABLE)
                streams.append(f.StreamMetadata(name, code, NO_LEADER, ()))
            else:
                streams.append(f.StreamMetadata(
                    name, OK, NO_LEADER if leader is None else reference[leader],
                    tuple(reference[ep] for ep in followers)))
        self.send(f.MetadataResponse(frame.correlation_id, tuple(
            f.Broker(i, host, port) for i, (host, port) in enumerate(brokers)), tuple(streams)))

    def on_stream_stats(self, frame: f.StreamStats) -> None:
        link = self.link
        found = link.resolve(frame.stream)
        if not link.may(frame.stream, CONSUME, found):
            self.send(f.StreamStatsResponse(frame.correlation_id, ResponseCode.ACCESS_REFUSED,
                                            {}))
            return
        if found is None:
            self.send(f.StreamStatsResponse(frame.correlation_id,
                                            link.missing(frame.stream), {}))
            return
        partition = found[1]
        committed = partition.committed_offset
        stats = {  # osiris:get_stats; committed_offset (the last committed offset): RabbitMQ 4.3
            "first_chunk_id": partition.first_offset if committed >= 0 else -1,
            "committed_chunk_id": partition.last_chunk_offset if committed >= 0 else -1,
            "last_chunk_id": partition.last_chunk_offset if committed >= 0 else -1,
            "committed_offset": committed if committed >= 0 else -1,
        }
        self.send(f.StreamStatsResponse(frame.correlation_id, OK, stats))

    # -- super streams (registry and routing in broker/superstreams.py) -------------------
    def on_create_super_stream(self, frame: f.CreateSuperStream) -> None:
        """Partitions are ordinary streams made with the Create arguments (in a cluster one
        Raft entry with the super stream); 0x05 when the super stream or a partition
        exists, 0x11 for a bad list (reference doc). 0x10 unless the user may create the
        super stream and its partitions, consume from the super stream and publish to the
        partitions: RabbitMQ's configure on the exchange and the streams, read on the
        exchange and write on the streams (rabbit_stream_utils,
        check_super_stream_management_permitted)."""
        link = self.link
        respond = partial(f.CreateSuperStreamResponse, frame.correlation_id)
        super_streams = link.server.super_streams
        wanted = super_stream_rights(frame.name, frame.partitions, CREATE)
        if not all(link.may(name, action, link.resolve(name)) for name, action in wanted):
            self.send(respond(ResponseCode.ACCESS_REFUSED))
        elif any(_reserved(name) for name in (frame.name, *frame.partitions)):
            self.send(respond(ResponseCode.PRECONDITION_FAILED))
        elif self._over_quota(frame.name, len(frame.partitions)):
            self.send(respond(ResponseCode.PRECONDITION_FAILED))
        elif self.broker.placement.clustered:
            link.hold_for(self._create_in_cluster(
                frame.name, frame.arguments, lambda name, config: super_streams.create_in_cluster(
                    name, frame.partitions, frame.binding_keys, config)), respond)
        else:
            self.send(respond(_create(frame.name, frame.arguments, link.user, lambda config: (
                super_streams.create(frame.name, frame.partitions, frame.binding_keys,
                                     config)))))

    def on_delete_super_stream(self, frame: f.DeleteSuperStream) -> None:
        link = self.link
        super_streams = link.server.super_streams
        found = super_streams.find(frame.name)
        if found is None:
            code = ResponseCode.STREAM_DOES_NOT_EXIST
        elif not all(link.may(name, action, link.resolve(name))
                     for name, action in super_stream_rights(frame.name, found.partitions,
                                                           DELETE)):
            code = ResponseCode.ACCESS_REFUSED
        elif self.broker.placement.clustered:
            link.hold_for(_deleted(super_streams.delete_in_cluster(frame.name)),
                          partial(f.DeleteSuperStreamResponse, frame.correlation_id))
            return
        else:
            with link.notes_after():  # the response, then MetadataUpdate per partition
                super_streams.delete(frame.name)
                self.send(f.DeleteSuperStreamResponse(frame.correlation_id, OK))
            return
        self.send(f.DeleteSuperStreamResponse(frame.correlation_id, code))

    def _visible(self, super_stream: str) -> SuperStream | int:
        """The super stream ``super_stream`` when it exists and the user may publish to or
        consume from it (``SuperStream``), else the response code: 0x02 when it does not
        exist, 0x10 access refused when the user has neither right. RabbitMQ's reader answers
        Partitions and Route to any user of the virtual host; here they tell partition names
        only to users who may use them (issue 24: the names of a super stream one has no
        right on leaked)."""
        found = self.link.server.super_streams.find(super_stream)
        if found is None:
            return ResponseCode.STREAM_DOES_NOT_EXIST
        guard, user = self.link.guard, self.link.user
        if not (guard.allowed(user, super_stream, PUBLISH)
                or guard.allowed(user, super_stream, CONSUME)):
            return ResponseCode.ACCESS_REFUSED
        return found

    def on_partitions(self, frame: f.Partitions) -> None:
        """Partitions of a super stream; a stream with several partitions answers
        ``<stream>-0`` .. ``<stream>-<n-1>``. 0x10 for a user who may neither publish to
        nor consume from it (``_visible``)."""
        found = self._visible(frame.super_stream)
        if isinstance(found, int):
            self.send(f.PartitionsResponse(frame.correlation_id, found, ()))
        else:
            self.send(f.PartitionsResponse(frame.correlation_id, OK, found.partitions))

    def on_route(self, frame: f.Route) -> None:
        """Streams bound with the routing key; OK with none when nothing matches (partition
        i of a stream with several partitions is bound with key "i"). 0x10 as Partitions."""
        found = self._visible(frame.super_stream)
        if isinstance(found, int):
            self.send(f.RouteResponse(frame.correlation_id, found, ()))
        else:
            self.send(f.RouteResponse(frame.correlation_id, OK,
                                      tuple(found.route(frame.routing_key))))
