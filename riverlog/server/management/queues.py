# Streams as RabbitMQ queues, and super streams as exchanges with bindings, for the
# management API: GET /api/queues[/{vhost}[/{name}]], PUT and DELETE of a stream queue,
# GET /api/exchanges/{vhost}/{name} and its bindings. Shapes: rabbit_mgmt_format:queue and
# rabbit_stream_queue's info items (type, arguments, leader, members, online, messages,
# segments) in RabbitMQ 3.13/4.x; a super stream's exchange is a durable direct exchange
# with `x-super-stream: true`, its bindings carry `x-stream-partition-order`
# (rabbit_stream_manager:add_super_stream).
# A queue names its virtual host and its name there (riverlog.vhost_names).
# Every partition of a stream is one queue under the name the RabbitMQ Stream door gives it
# (the stream itself, or `<stream>-<i>` for partition i of a stream with several), so
# Liftbridge streams appear too, each queue with its NATS `subject`. In a cluster the list
# is the cluster metadata's (every stream, wherever its replicas are; leader, members and
# ISR from the Raft placement); messages, offsets and segments are this server's replica's
# and left out for streams this server holds no replica of.
# Rules: read-only but for `create` and `delete`, which go the way the RabbitMQ door's Create
# and Delete go (the placement in a cluster); internal streams (`__*`) are not listed.
from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from typing import Any, Iterator

from ...broker import RESERVED_STREAMS, Stream, check_writable
from ...broker.superstreams import member_name, split_member_name
from ..rabbitmq_stream.arguments import stream_config_for
from .access import Caller
from ...vhost_names import external, in_vhost

YIELD_EVERY = 256  # partitions listed between turns given to the event loop


def node_name(app, server_id: str) -> str:
    """RabbitMQ's node name (``name@host``) of a server: ``rabbit@<host>`` on a single
    server, ``<server id>@<host>`` in a cluster, the host being where RabbitMQ Stream clients
    reach it (its advertised host, as a RabbitMQ node's host is the one it advertises; the
    machine's name when unknown). Clients compare the part after ``@`` with the host they
    are connected to (the Node client's address resolver tests do)."""
    placement = app.broker.placement
    door = app.rabbitmq_stream
    if server_id == placement.server_id and door is not None:
        host = door.advertised[0]
    else:
        where = placement.door(server_id, "rabbitmq-stream")
        host = where[0] if where else socket.gethostname()
    return f"{server_id if placement.clustered else 'rabbit'}@{host}"


def creation_arguments(stream: Stream | None) -> dict[str, Any]:
    """The queue arguments of a stream: ``x-queue-type`` and the RabbitMQ Create arguments it
    was made with, each as ``x-<key>`` with the value as given (integers as integers, as
    RabbitMQ keeps them); only ``x-queue-type`` for a stream made through Liftbridge."""
    arguments: dict[str, Any] = {"x-queue-type": "stream"}
    kept = stream.config.rabbitmq_arguments if stream is not None else None
    if kept:
        arguments.update({f"x-{key}": value for key, value in json.loads(kept).items()})
    return arguments


def _partitions(app) -> Iterator[tuple[str, int, int, str | None, Stream | None]]:
    """(stream, partition index, partition count, subject, local stream or None) of every
    user stream: the cluster's from its metadata, else this server's."""
    broker = app.broker
    shared = broker.placement.streams()
    if shared is None:
        shared = {name: (s.config.subject, len(s.partitions))
                  for name, s in broker.streams.items()}
    for name, (subject, count) in sorted(shared.items()):
        if name in RESERVED_STREAMS or name.startswith("__"):
            continue
        for index in range(count):
            yield name, index, count, subject, broker.streams.get(name)


def queue_json(app, name: str, index: int, count: int, subject: str | None,
               stream: Stream | None, consumers: int, nodes: dict[str, str],
               tabled: set[str]) -> dict[str, Any]:
    """One partition as a stream queue. ``nodes``: server id -> node name, filled as
    needed; ``tabled``: the names of the streams mirrored to tables."""
    placement = app.broker.placement

    def node(server: str) -> str:
        if server not in nodes:
            nodes[server] = node_name(app, server)
        return nodes[server]

    where = placement.of(name, index)
    local = node(placement.server_id)
    leader = node(where.leader) if where is not None and where.leader else None
    vhost, client = external(member_name(name, index) if count > 1 else name)
    queue: dict[str, Any] = {
        "name": client, "vhost": vhost,
        "type": "stream", "durable": True, "auto_delete": False, "exclusive": False,
        "arguments": creation_arguments(stream), "node": leader or local,
        "leader": leader,
        "members": [node(s) for s in where.replicas] if where is not None else [local],
        "online": [node(s) for s in where.isr] if where is not None else [local],
        "state": "running" if leader else "down", "consumers": consumers,
        "stream": external(name)[1], "partition": index, "subject": subject,
        **app.policies.describe(name),
    }
    if stream is not None:
        p = stream.partitions[index]
        committed = p.committed_offset
        messages = committed + 1 - p.first_offset if committed >= 0 else 0
        queue.update(messages=messages, messages_ready=messages,
                     messages_unacknowledged=0, segments=p.segment_count,
                     first_offset=p.first_offset, committed_offset=committed,
                     memory=0, disk_bytes=p.size_bytes)
        if name in tabled:
            queue["table_lag"] = app.tables.lag(stream, index)[0]
    return queue


async def queues(app, caller: Caller, consumer_counts: dict[str, int],
                 vhost: str | None = None) -> list[dict[str, Any]]:
    """Every stream queue ``caller`` may see (``consumer_counts``: broker queue name ->
    consumers), of ``vhost`` when given.
    Gives the loop a turn every YIELD_EVERY partitions, so a long listing does not hold
    the other connections up."""
    found: list[dict[str, Any]] = []
    nodes: dict[str, str] = {}
    tabled = {s.name for s in app.tables.streams()}
    everything = caller.administrator  # else one (quiet) check per stream
    for seen, (name, index, count, subject, stream) in enumerate(_partitions(app), 1):
        if seen % YIELD_EVERY == 0:
            await asyncio.sleep(0)
        if (vhost is None or in_vhost(name, vhost)) and (everything or
                                                         caller.sees_stream(name)):
            queue_name = member_name(name, index) if count > 1 else name
            found.append(queue_json(app, name, index, count, subject, stream,
                                    consumer_counts.get(queue_name, 0), nodes, tabled))
    return found


def one_queue(app, caller: Caller, name: str, consumers: int) -> dict[str, Any] | None:
    """The stream queue ``name`` as ``queues`` lists it (``consumers``: its consumer count),
    found without listing the others: the stream ``name`` when it has one partition, else
    partition i of ``<stream>-<i>``; None when there is none or ``caller`` may not see it."""
    broker = app.broker
    shared = broker.placement.streams()
    member = split_member_name(name)
    for stream_name, index in ((name, 0), *((member,) if member else ())):
        if stream_name in RESERVED_STREAMS or stream_name.startswith("__"):
            continue
        local = broker.streams.get(stream_name)
        if shared is not None:
            known = shared.get(stream_name)
        else:
            known = (local.config.subject, len(local.partitions)) if local else None
        if known is None:
            continue
        subject, count = known
        if (count == 1 and stream_name == name) or (
                count > 1 and stream_name != name and index < count):
            if not (caller.administrator or caller.sees_stream(stream_name)):
                return None
            tabled = {s.name for s in app.tables.streams()}
            return queue_json(app, stream_name, index, count, subject, local, consumers,
                              {}, tabled)
    return None


def stream_arguments(arguments: dict[str, Any]) -> dict[str, str]:
    """RabbitMQ queue arguments (``x-max-age``...) as RabbitMQ Stream Create arguments
    (``max-age``...). Raises ``ValueError`` for a queue type other than ``stream``."""
    queue_type = arguments.get("x-queue-type", "stream")
    if queue_type != "stream":
        raise ValueError(f"riverlog has stream queues only, not x-queue-type {queue_type!r}")
    return {key[2:] if key.startswith("x-") else key: str(value)
            for key, value in arguments.items() if key != "x-queue-type"}


async def create(app, name: str, arguments: dict[str, str], owner: str | None) -> None:
    """Create stream ``name`` with RabbitMQ Stream Create ``arguments``, owned by ``owner``
    (the caller; counted by ``Broker.check_quota`` as the doors count theirs), through the
    placement in a cluster. Raises ``StreamExistsError``, ``InvalidArgumentError`` (bad
    arguments, a reserved name), ``LimitExceededError`` (``owner`` at its stream limit),
    ``ResourceExhaustedError``, ``ClusterUnavailableError``."""
    broker = app.broker
    placement = broker.placement
    check_writable(name)  # __cursors, __activity: the server's own
    config = dataclasses.replace(stream_config_for(arguments, placement), owner=owner)
    broker.check_quota(owner, config.partitions)
    if placement.clustered:
        await placement.create_stream(name, config)
    else:
        broker.create(name, config)


async def delete(app, name: str) -> None:
    """Delete stream ``name`` (through the placement in a cluster). Raises
    ``StreamNotFoundError``, ``ReservedStreamError`` (``__cursors``, ``__activity``),
    ``ClusterUnavailableError``."""
    check_writable(name)
    placement = app.broker.placement
    if placement.clustered:
        await placement.delete_stream(name)
    else:
        app.broker.delete(name)


def exchange_json(name: str) -> dict[str, Any]:
    """A super stream (``name``: its broker name) as its direct exchange."""
    vhost, name = external(name)
    return {"name": name, "vhost": vhost, "type": "direct", "durable": True,
            "auto_delete": False, "internal": False, "arguments": {"x-super-stream": True},
            "user_who_performed_action": "rmq-internal"}


def bindings_json(super_stream) -> list[dict[str, Any]]:
    """The bindings of a super stream's exchange, in partition order."""
    vhost, source = external(super_stream.name)
    return [{"source": source, "vhost": vhost, "destination": external(partition)[1],
             "destination_type": "queue", "routing_key": key,
             "arguments": {"x-stream-partition-order": order}, "properties_key": key}
            for order, (partition, key) in enumerate(zip(super_stream.partitions,
                                                         super_stream.binding_keys))]
