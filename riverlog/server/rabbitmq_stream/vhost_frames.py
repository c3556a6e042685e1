# The stream names of one RabbitMQ Stream connection, in its virtual host (issue 30 item 1).
# Owns the translation of every stream, super stream and partition name a frame carries:
# inbound from the name the client uses to the broker's name (riverlog.vhost_names.internal),
# outbound back. The handlers then see only broker names, and a connection reaches only its
# virtual host's streams.
# Rules: a client name that starts with vhost_names.MARK is no name (it would spell another
# virtual host's stream): vhost_names.lookup makes it the empty name's, which Create refuses
# (0x11) and nothing else finds; in Metadata it is kept apart instead (``_unknown``: a name of
# the virtual host "", which cannot exist), so the answer names it as it was asked, not as the
# empty name (RabbitMQ answers each asked name); Subscribe's `super-stream` property is a
# name too; a frame without names passes as it is (the same object).
from __future__ import annotations

import dataclasses

from ...protocol.rabbitmq_stream import frames as f
from ...vhost_names import MARK, external, internal, lookup

# inbound frame type -> its fields that hold one name; Metadata's ``streams`` and
# CreateSuperStream's ``partitions`` hold several
_ONE = {f.Create: ("stream",), f.Delete: ("stream",), f.StreamStats: ("stream",),
        f.DeclarePublisher: ("stream",), f.QueryPublisherSequence: ("stream",),
        f.Subscribe: ("stream",), f.StoreOffset: ("stream",), f.QueryOffset: ("stream",),
        f.ResolveOffsetSpec: ("stream",), f.Partitions: ("super_stream",),
        f.Route: ("super_stream",), f.CreateSuperStream: ("name",),
        f.DeleteSuperStream: ("name",)}
NAMED = frozenset((*_ONE, f.Metadata))
"""The inbound frame types that carry names (the door translates only these)."""
NAMED_OUT = frozenset((f.MetadataResponse, f.MetadataUpdate, f.RouteResponse,
                       f.PartitionsResponse))
"""The outbound frame types that carry names."""
SUPER_STREAM_PROPERTY = "super-stream"  # Subscribe's single active consumer group key


def inbound(frame: f.Frame, vhost: str) -> f.Frame:
    """``frame`` with every client name replaced by its broker name on ``vhost``."""
    fields = _ONE.get(type(frame))
    if fields is None:
        if type(frame) is f.Metadata:
            return dataclasses.replace(frame, streams=tuple(
                _unknown(n) if n.startswith(MARK) else lookup(vhost, n)
                for n in frame.streams))
        return frame
    changes = {field: lookup(vhost, getattr(frame, field)) for field in fields}
    if type(frame) is f.CreateSuperStream:
        changes["partitions"] = tuple(lookup(vhost, n) for n in frame.partitions)
    elif type(frame) is f.Subscribe and frame.properties and \
            SUPER_STREAM_PROPERTY in frame.properties:
        properties = dict(frame.properties)
        properties[SUPER_STREAM_PROPERTY] = lookup(vhost, properties[SUPER_STREAM_PROPERTY])
        changes["properties"] = properties
    return dataclasses.replace(frame, **changes)


def _unknown(name: str) -> str:
    """Client name ``name`` (it starts with MARK) as a broker name of the virtual host "":
    no stream has it (a virtual host's name is never empty), and ``client_name`` gives
    ``name`` back."""
    return internal("", name)


def client_name(broker: str) -> str:
    """The name a client of the stream's virtual host knows broker name ``broker`` by."""
    return external(broker)[1]


def outbound(frame: f.Frame) -> f.Frame:
    """``frame`` with every broker name replaced by its client name."""
    kind = type(frame)
    if kind is f.MetadataResponse:
        return dataclasses.replace(frame, streams=tuple(
            dataclasses.replace(s, name=client_name(s.name)) for s in frame.streams))
    if kind is f.MetadataUpdate:
        return dataclasses.replace(frame, stream=client_name(frame.stream))
    if kind is f.RouteResponse or kind is f.PartitionsResponse:
        return dataclasses.replace(frame, streams=tuple(client_name(n) for n in frame.streams))
    return frame
