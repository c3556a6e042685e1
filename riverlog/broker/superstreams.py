# Super streams (RabbitMQ Stream): a name for an ordered list of partitions, each an ordinary
# broker stream bound by one binding key (routing key). Owns the registry, its file
# DATA/superstreams.json and routing by binding key; the partitions' data is the broker's.
# Rules (as RabbitMQ, whose super stream is a direct exchange with one binding per
# partition): super stream names are a namespace of their own (a stream and a super stream
# may share a name); creation checks everything before it creates a partition and deletes
# the partitions it created when one fails; the file is written atomically after the
# partitions exist and before they are deleted, so a crash leaves at worst partitions
# without a super stream, never a super stream without partitions it names; a partition
# stream deleted on its own leaves its super stream (RabbitMQ drops the binding).
# In a cluster the registry is the cluster metadata's (``Placement.super_streams``, agreed
# through Raft), so every server answers the same; the file is a single server's. There,
# creating a super stream with its partitions, deleting it with them and binding a stream
# are each one Raft entry (cluster/state_super.py): all of it or none, whatever is killed.
# A broker stream with several partitions (made through Liftbridge) is a super stream too,
# derived, never stored: partition i is the stream `<name>-<i>` bound with key "i", as
# RabbitMQ names the partitions of a super stream made with a partition count; its name is
# no stream of its own on the RabbitMQ door. A real stream wins over a derived name.
from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Mapping

from ..errors import InvalidArgumentError, StreamExistsError, StreamNotFoundError
from .broker import Broker
from .partition import Partition
from .stream import MAX_NAME_BYTES, Stream, StreamConfig, SuperStream

log = logging.getLogger("riverlog.broker")

SUPER_STREAMS_FILE = "superstreams.json"


def member_name(stream: str, index: int) -> str:
    """The RabbitMQ Stream name of partition ``index`` of a broker stream with several
    partitions: ``<stream>-<index>``."""
    return f"{stream}-{index}"


def split_member_name(name: str) -> tuple[str, int] | None:
    """``(stream, index)`` when ``name`` has the form of ``member_name`` (``<stream>-<i>``, i
    written without leading zeros), else None."""
    base, _, index = name.rpartition("-")
    if not base or not (index.isascii() and index.isdigit() and str(int(index)) == index):
        return None
    return base, int(index)


def _check_name(what: str, name: str) -> None:
    if not name or len(name.encode()) > MAX_NAME_BYTES:
        raise InvalidArgumentError(f"a {what} name is 1 to {MAX_NAME_BYTES} bytes: {name!r}")


class SuperStreams:
    """The super streams of one broker, loaded from ``DATA/superstreams.json``."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.path = os.path.join(broker.data_dir, SUPER_STREAMS_FILE)
        self.super_streams: dict[str, SuperStream] = {}
        self._orders: dict[str, dict[str, int]] = {}  # bind(): partition orders given
        self._load()
        broker.deletion_listeners.append(self._stream_deleted)

    def get(self, name: str) -> SuperStream:
        """The super stream ``name``: a stored one, else the one derived from a broker
        stream with several partitions. Raises ``StreamNotFoundError`` when neither."""
        found = self._registry().get(name)
        stream = self.broker.streams.get(name) if found is None else None
        if stream is not None and len(stream.partitions) > 1:
            found = SuperStream(name, tuple(self.door_names(stream)),
                                tuple(map(str, range(len(stream.partitions)))))
        if found is None:
            raise StreamNotFoundError(f"super stream {name!r} does not exist")
        return found

    def _registry(self) -> Mapping[str, SuperStream]:
        """The stored super streams: the cluster's, else this server's own."""
        shared = self.broker.placement.super_streams()
        return self.super_streams if shared is None else shared

    def every(self) -> list[SuperStream]:
        """Every super stream, stored and derived, by name."""
        names = set(self._registry()) | {
            s.name for s in self.broker.streams.values() if len(s.partitions) > 1}
        return [self.get(name) for name in sorted(names)]

    def find(self, name: str) -> SuperStream | None:
        """``get``, None instead of the error."""
        try:
            return self.get(name)
        except StreamNotFoundError:
            return None

    def resolve(self, name: str) -> tuple[Stream, Partition] | None:
        """The stream and partition the RabbitMQ Stream name ``name`` serves: a broker
        stream of one partition, or partition i of a broker stream with several
        (``<stream>-<i>``); None otherwise, a stream with several partitions included."""
        stream = self.broker.streams.get(name)
        if stream is not None:
            return (stream, stream.partitions[0]) if len(stream.partitions) == 1 else None
        member = split_member_name(name)
        stream = self.broker.streams.get(member[0]) if member else None
        if stream is None or len(stream.partitions) < 2 or member[1] >= len(stream.partitions):
            return None
        return stream, stream.partitions[member[1]]

    def door_names(self, stream: Stream) -> list[str]:
        """The RabbitMQ Stream names of ``stream``'s partitions (``resolve``'s inverse)."""
        if len(stream.partitions) == 1:
            return [stream.name]
        return [member_name(stream.name, i) for i in range(len(stream.partitions))]

    def create(self, name: str, partitions: list[str] | tuple[str, ...],
               binding_keys: list[str] | tuple[str, ...],
               config: StreamConfig | None = None) -> SuperStream:
        """Create the partition streams (each with ``config``) and record the super stream.

        Raises ``InvalidArgumentError`` (RabbitMQ: precondition failed) when the counts of
        partitions and binding keys differ, a partition is named twice or a name is empty
        or too long; ``StreamExistsError`` when the super stream or a partition stream
        already exists."""
        self._check_new(name, partitions, binding_keys)
        created: list[str] = []
        try:
            for partition in partitions:
                self.broker.create(partition, config)
                created.append(partition)
            return self._record(name, partitions, binding_keys)
        except BaseException:
            for partition in created:
                self.broker.delete(partition)
            raise

    async def create_in_cluster(self, name: str, partitions: list[str] | tuple[str, ...],
                                binding_keys: list[str] | tuple[str, ...],
                                config: StreamConfig) -> SuperStream:
        """``create`` in a cluster: the partition streams (each placed as
        ``Placement.create_stream`` places one) and the super stream in one metadata change
        (``Placement.create_super_stream_with_streams``, one Raft entry): a server killed at
        any point leaves all of it or none. Raises as ``create`` and as
        ``Placement.create_stream``."""
        self._check_new(name, partitions, binding_keys)
        await self.broker.placement.create_super_stream_with_streams(
            name, tuple(partitions), tuple(binding_keys), config)
        log.info("created super stream %r with %d partition(s)", name, len(partitions))
        return self.get(name)

    # -- declared piece by piece (the management API: an exchange, then bindings) ----------
    async def declare(self, name: str) -> bool:
        """Record super stream ``name`` with no partition yet, as RabbitMQ's exchange
        declaration before its bindings; False when it exists (a derived one too). In a
        cluster through the placement (one Raft entry). Raises ``InvalidArgumentError`` for a
        bad name."""
        _check_name("super stream", name)
        if self.find(name) is not None:
            return False
        placement = self.broker.placement
        if placement.clustered:
            try:
                await placement.create_super_stream(name, (), ())
            except StreamExistsError:  # declared through another server meanwhile
                return False
        else:
            self.super_streams[name] = SuperStream(name, (), ())
            self._save()
        return True

    async def bind(self, name: str, partition: str, binding_key: str,
                   order: int | None = None) -> None:
        """Bind stream ``partition`` to super stream ``name`` with ``binding_key``; the
        partitions stay sorted by ``order`` (RabbitMQ's ``x-stream-partition-order``,
        whatever order the bindings come in; None: after the others). The orders given are
        kept in memory; partitions bound otherwise, or before a restart, count by their
        position. In a cluster one Raft entry inserts the binding at its position
        (``Placement.bind_super_stream``): the super stream is never missing meanwhile.
        Raises ``StreamNotFoundError`` (no such super stream, or a derived one: its
        partitions are fixed), ``InvalidArgumentError`` when ``partition`` is no stream here
        or bound already."""
        found = self._registry().get(name)
        if found is None:
            raise StreamNotFoundError(f"super stream {name!r} does not exist or is fixed")
        if self.resolve(partition) is None and self.broker.placement.of(partition, 0) is None:
            raise InvalidArgumentError(f"no stream {partition!r} to bind")
        if partition in found.partitions:
            raise InvalidArgumentError(f"{partition!r} is bound to {name!r} already")
        orders = self._orders.setdefault(name, {})
        ranked = [(orders.get(p, i), i, p, k) for i, (p, k) in
                  enumerate(zip(found.partitions, found.binding_keys))]
        rank = order if order is not None else max((r[0] for r in ranked), default=-1) + 1
        ranked.append((rank, len(ranked), partition, binding_key))
        ranked.sort()
        placement = self.broker.placement
        if placement.clustered:
            index = [r[2] for r in ranked].index(partition)
            await placement.bind_super_stream(name, partition, binding_key, index)
        else:
            self.super_streams[name] = SuperStream(name, tuple(r[2] for r in ranked),
                                                   tuple(r[3] for r in ranked))
            self._save()
        orders[partition] = rank

    async def forget(self, name: str) -> None:
        """Forget super stream ``name``, keeping its partition streams (RabbitMQ deleting
        the exchange keeps its queues). Raises ``StreamNotFoundError``."""
        if name not in self._registry():
            raise StreamNotFoundError(f"super stream {name!r} does not exist")
        self._orders.pop(name, None)
        if self.broker.placement.clustered:
            await self.broker.placement.delete_super_stream(name)
        else:
            self._forget(name)

    def _check_new(self, name: str, partitions: list[str] | tuple[str, ...],
                   binding_keys: list[str] | tuple[str, ...]) -> None:
        """What ``create`` checks before it makes anything (its errors)."""
        _check_name("super stream", name)
        if len(partitions) != len(binding_keys):
            raise InvalidArgumentError("there must be as many partitions as binding keys")
        if len(set(partitions)) != len(partitions):
            raise InvalidArgumentError(f"duplicate partition names in {list(partitions)}")
        for partition in partitions:
            _check_name("partition", partition)
        if self.find(name) is not None:
            raise StreamExistsError(f"super stream {name!r} already exists")
        for partition in partitions:
            if partition in self.broker.streams or self.resolve(partition) is not None:
                raise StreamExistsError(f"stream {partition!r} already exists")

    def _record(self, name: str, partitions: list[str] | tuple[str, ...],
                binding_keys: list[str] | tuple[str, ...]) -> SuperStream:
        """Remember a super stream whose partitions exist, in memory and in the file."""
        super_stream = SuperStream(name, tuple(partitions), tuple(binding_keys))
        self.super_streams[name] = super_stream
        try:
            self._save()
        except BaseException:
            del self.super_streams[name]
            raise
        log.info("created super stream %r with %d partition(s)", name, len(partitions))
        return super_stream

    def delete(self, name: str) -> None:
        """Forget the super stream, then delete its partition streams (those still there);
        a derived one is its broker stream, deleted. Raises ``StreamNotFoundError``."""
        for stream in self._forget(name):
            if stream in self.broker.streams:
                self.broker.delete(stream)

    async def delete_in_cluster(self, name: str) -> None:
        """``delete`` in a cluster: a stored super stream and its partition streams go in one
        metadata change (``Placement.delete_super_stream_with_streams``, one Raft entry); a
        derived one is its broker stream, deleted (``Placement.delete_stream``). Raises
        ``StreamNotFoundError``."""
        self.get(name)  # StreamNotFoundError
        if name in self._registry():
            await self.broker.placement.delete_super_stream_with_streams(name)
            self._orders.pop(name, None)
            log.info("deleted super stream %r with its partitions", name)
            return
        try:
            await self.broker.placement.delete_stream(name)
        except StreamNotFoundError:  # deleted meanwhile
            pass

    def _forget(self, name: str) -> list[str]:
        """Forget super stream ``name`` (in the file too); the streams to delete: a derived
        one's broker stream, a stored one's partitions. Raises ``StreamNotFoundError``."""
        super_stream = self.get(name)
        if name not in self.super_streams:
            return [name]
        del self.super_streams[name]
        self._save()
        log.info("deleted super stream %r", name)
        return list(super_stream.partitions)

    def partition_index(self, super_stream: str, stream: str) -> int:
        """Position of ``stream`` in ``super_stream``; -1 when either is unknown."""
        found = self.find(super_stream)
        return found.partition_index(stream) if found else -1

    # -- persistence --------------------------------------------------------------------
    def _stream_deleted(self, stream: Stream) -> None:
        changed = False
        for name, s in list(self.super_streams.items()):
            if stream.name in s.partitions:
                self.super_streams[name] = s.without(stream.name)
                changed = True
        if changed:
            self._save()

    def _save(self) -> None:
        data = {"super_streams": [dataclasses.asdict(s) for s in self.super_streams.values()]}
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def _load(self) -> None:
        """Read the file; a damaged one is reported and set aside (``.bad``), never fatal."""
        try:
            with open(self.path) as f:
                data = json.load(f)
            for item in data["super_streams"]:
                s = SuperStream(str(item["name"]), tuple(map(str, item["partitions"])),
                                tuple(map(str, item["binding_keys"])))
                if len(s.partitions) != len(s.binding_keys):
                    raise ValueError(f"super stream {s.name!r}: partitions and keys differ")
                self.super_streams[s.name] = s
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.error("cannot read %s (set aside as .bad, super streams forgotten): %s",
                      self.path, exc)
            self.super_streams.clear()
            os.replace(self.path, self.path + ".bad")
