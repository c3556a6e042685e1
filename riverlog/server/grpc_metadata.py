# The metadata answers of the Liftbridge gRPC door: FetchMetadata (brokers, streams, groups)
# and one partition's PartitionMetadata. Rules: a FetchMetadata names at most
# MAX_METADATA_NAMES streams plus groups (more: RESOURCE_EXHAUSTED before any work), and its
# answer is built in slices of METADATA_SLICE names with a turn of the event loop between
# them, so one large request (or the list of every stream) cannot hold the loop for other
# clients; a name this server does not know is answered UNKNOWN_STREAM, as Liftbridge does.
# Wire facts: reference/liftbridge.md (FetchMetadataResponse fields); Liftbridge's
# server/metadata.go FetchMetadata (liftbridge-io/liftbridge 50ac358), which bounds a request
# only by grpc-go's 4 MiB receive limit and answers it on its own goroutine.
from __future__ import annotations

import asyncio

from ..broker import Partition
from ..broker.cursors import read_varint
from ..protocol.liftbridge import api_pb2 as pb
from ..vhost_names import hidden
from .liftbridge import Liftbridge, LiftbridgeError

MAX_METADATA_NAMES = 10_000
"""Stream and group names one FetchMetadata may name (an empty list asks for every stream
and is not counted)."""
METADATA_SLICE = 256
"""Names answered between two turns of the event loop (~1 ms of work)."""


def partition_metadata(service: Liftbridge, stream: str, partition: Partition
                       ) -> pb.PartitionMetadata:
    """The PartitionMetadata of a partition this server holds (offsets -1 when empty)."""
    placed = service.broker.placement.of(stream, partition.index)
    leader = "" if placed is None or placed.leader is None else placed.leader
    events = partition.events

    def stamps(kind: str) -> pb.PartitionEventTimestamps:
        first, latest = events.get(kind, (0, 0))
        return pb.PartitionEventTimestamps(firstTimestamp=first, latestTimestamp=latest)

    return pb.PartitionMetadata(
        id=partition.index, leader=leader, replicas=placed.replicas if placed else (),
        isr=placed.isr if placed else (), highWatermark=partition.committed_offset,
        newestOffset=partition.next_offset - 1,
        paused=partition.paused, readonly=partition.readonly,
        messagesReceivedTimestamps=stamps("received"), pauseTimestamps=stamps("pause"),
        readonlyTimestamps=stamps("readonly"))


def brokers(service: Liftbridge) -> list[pb.Broker]:
    """Every server that runs (Liftbridge's fetchBrokerInfo lists the servers answering
    its survey; here: this one and those its Raft member is connected to): id, advertised
    gRPC host and port, the partitions it holds and leads. go-liftbridge dials every
    broker listed when it connects and fails if one does not answer."""
    placement = service.broker.placement
    if not placement.clustered:
        total = sum(len(s.partitions) for s in service.broker.streams.values())
        host, port = service.advertised
        return [pb.Broker(id=service.server_id, host=host, port=port,
                          partitionCount=total, leaderCount=total)]
    held: dict[str, int] = {}
    led: dict[str, int] = {}
    for name, stream in service.broker.streams.items():
        for index in range(len(stream.partitions)):
            placed = placement.of(name, index)
            for replica in placed.replicas if placed else ():
                held[replica] = held.get(replica, 0) + 1
            if placed is not None and placed.leader is not None:
                led[placed.leader] = led.get(placed.leader, 0) + 1
    out = []
    for server_id in filter(placement.reachable, placement.servers()):
        host, port = placement.door(server_id, "grpc") or ("", 0)
        out.append(pb.Broker(id=server_id, host=host, port=port,
                             partitionCount=held.get(server_id, 0),
                             leaderCount=led.get(server_id, 0)))
    return out


def _stream_metadata(service: Liftbridge, resp: pb.FetchMetadataResponse, name: str,
                     elsewhere: dict) -> None:
    """Add the StreamMetadata of ``name`` to ``resp``."""
    stream = service.broker.streams.get(name)
    placement = service.broker.placement
    if stream is None and name in elsewhere:  # no replica here: no offsets either
        subject, count = elsewhere[name]
        meta = resp.streamMetadata.add(name=name, subject=subject)
        for index in range(count):
            placed = placement.of(name, index)
            flags = placement.flags(name, index)
            meta.partitions[index].CopyFrom(pb.PartitionMetadata(
                id=index, leader=placed.leader or "", replicas=placed.replicas,
                isr=placed.isr, highWatermark=-1, newestOffset=-1,
                paused=flags.paused, readonly=flags.read_only))
        return
    if stream is None:
        resp.streamMetadata.add(name=name, error=pb.StreamMetadata.Error.UNKNOWN_STREAM)
        return
    meta = resp.streamMetadata.add(name=name, subject=stream.config.subject or "",
                                   creationTimestamp=stream.created_ns)
    for partition in stream.partitions:
        meta.partitions[partition.index].CopyFrom(partition_metadata(service, name, partition))


def check_names(raw: bytes) -> None:
    """Raise LiftbridgeError RESOURCE_EXHAUSTED when the FetchMetadataRequest ``raw`` has
    more than MAX_METADATA_NAMES length-delimited fields (streams, groups, unknown ones),
    counting at most one more than that before anything is parsed. Other fields are stepped
    over (varint, fixed64, fixed32), so none of them ends the count; a group or an invalid
    wire type raises LiftbridgeError INVALID_ARGUMENT (no field of this message is one).
    A request cut short is left to the parser (which refuses it)."""
    pos, end, count = 0, len(raw), 0
    try:
        while pos < end:
            tag, pos = read_varint(raw, pos)
            wire = tag & 7
            if wire == 0:
                _, pos = read_varint(raw, pos)
                continue
            if wire == 1:
                pos += 8
                continue
            if wire == 5:
                pos += 4
                continue
            if wire != 2:  # 3, 4 (groups), 6, 7
                raise LiftbridgeError("INVALID_ARGUMENT", (
                    f"malformed FetchMetadataRequest: field {tag >> 3} has wire type {wire} "
                    f"(groups and wire types 6, 7 are not accepted)"))
            count += 1
            if count > MAX_METADATA_NAMES:
                raise LiftbridgeError("RESOURCE_EXHAUSTED",
                                      f"FetchMetadata names more than {MAX_METADATA_NAMES} "
                                      f"streams and groups; at most {MAX_METADATA_NAMES} "
                                      f"per request")
            size, pos = read_varint(raw, pos)
            pos += size
    except IndexError:
        return


async def fetch_metadata(service: Liftbridge, req: pb.FetchMetadataRequest
                         ) -> pb.FetchMetadataResponse:
    """The answer to ``req``: the brokers, the named streams (every stream when none is
    named) and groups; ``req`` passed check_names. Yields to the event loop every
    METADATA_SLICE names."""
    streams = service.broker.streams
    elsewhere = service.broker.placement.streams() or {}  # a cluster's, held here or not
    names = list(req.streams) or [n for n in list(streams) + [
        n for n in elsewhere if n not in streams] if not hidden(n)]  # / only
    resp = pb.FetchMetadataResponse(brokers=brokers(service))
    for i, name in enumerate(names):
        if i and not i % METADATA_SLICE:
            await asyncio.sleep(0)
        if hidden(name):  # another virtual host's (riverlog.vhost_names): unknown here
            resp.streamMetadata.add(name=name, error=pb.StreamMetadata.Error.UNKNOWN_STREAM)
        else:
            _stream_metadata(service, resp, name, elsewhere)
    for i, group_id in enumerate(req.groups):
        if i and not i % METADATA_SLICE:
            await asyncio.sleep(0)
        found = service.groups.coordinator_of(group_id)
        if found is None:
            resp.groupMetadata.add(groupId=group_id,
                                   error=pb.ConsumerGroupMetadata.Error.UNKNOWN_GROUP)
        else:
            resp.groupMetadata.add(groupId=group_id, coordinator=found[0], epoch=found[1])
    return resp
