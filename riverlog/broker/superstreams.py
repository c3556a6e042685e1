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
from __future__ import annotations

import dataclasses
import json
import logging
import os

from ..errors import InvalidArgumentError, StreamExistsError, StreamNotFoundError
from .broker import MAX_NAME_BYTES, Broker
from .stream import Stream, StreamConfig

log = logging.getLogger("riverlog.broker")

SUPER_STREAMS_FILE = "superstreams.json"


@dataclasses.dataclass(frozen=True, slots=True)
class SuperStream:
    """``partitions[i]`` is bound with ``binding_keys[i]``; the order is the partition order."""

    name: str
    partitions: tuple[str, ...]
    binding_keys: tuple[str, ...]

    def route(self, routing_key: str) -> list[str]:
        """The partitions whose binding key equals ``routing_key`` (exact match, as a
        direct exchange), in partition order; empty when none matches."""
        return [p for p, k in zip(self.partitions, self.binding_keys) if k == routing_key]

    def partition_index(self, stream: str) -> int:
        """Position of ``stream`` among the partitions, -1 when it is not one."""
        try:
            return self.partitions.index(stream)
        except ValueError:
            return -1


def _check_name(what: str, name: str) -> None:
    if not name or len(name.encode()) > MAX_NAME_BYTES:
        raise InvalidArgumentError(f"a {what} name is 1 to {MAX_NAME_BYTES} bytes: {name!r}")


class SuperStreams:
    """The super streams of one broker, loaded from ``DATA/superstreams.json``."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.path = os.path.join(broker.data_dir, SUPER_STREAMS_FILE)
        self.super_streams: dict[str, SuperStream] = {}
        self._load()
        broker.deletion_listeners.append(self._stream_deleted)

    def get(self, name: str) -> SuperStream:
        """Raises ``StreamNotFoundError`` when there is no super stream ``name``."""
        try:
            return self.super_streams[name]
        except KeyError:
            raise StreamNotFoundError(f"super stream {name!r} does not exist") from None

    def create(self, name: str, partitions: list[str] | tuple[str, ...],
               binding_keys: list[str] | tuple[str, ...],
               config: StreamConfig | None = None) -> SuperStream:
        """Create the partition streams (each with ``config``) and record the super stream.

        Raises ``InvalidArgumentError`` (RabbitMQ: precondition failed) when the counts of
        partitions and binding keys differ, a partition is named twice or a name is empty
        or too long; ``StreamExistsError`` when the super stream or a partition stream
        already exists."""
        _check_name("super stream", name)
        if len(partitions) != len(binding_keys):
            raise InvalidArgumentError("there must be as many partitions as binding keys")
        if len(set(partitions)) != len(partitions):
            raise InvalidArgumentError(f"duplicate partition names in {list(partitions)}")
        for partition in partitions:
            _check_name("partition", partition)
        if name in self.super_streams:
            raise StreamExistsError(f"super stream {name!r} already exists")
        for partition in partitions:
            if partition in self.broker.streams:
                raise StreamExistsError(f"stream {partition!r} already exists")
        created: list[str] = []
        try:
            for partition in partitions:
                self.broker.create(partition, config)
                created.append(partition)
            super_stream = SuperStream(name, tuple(partitions), tuple(binding_keys))
            self.super_streams[name] = super_stream
            self._save()
        except BaseException:
            self.super_streams.pop(name, None)
            for partition in created:
                self.broker.delete(partition)
            raise
        log.info("created super stream %r with %d partition(s)", name, len(partitions))
        return super_stream

    def delete(self, name: str) -> None:
        """Forget the super stream, then delete its partition streams (those still there).
        Raises ``StreamNotFoundError``."""
        super_stream = self.get(name)
        del self.super_streams[name]
        self._save()
        for partition in super_stream.partitions:
            if partition in self.broker.streams:
                self.broker.delete(partition)
        log.info("deleted super stream %r", name)

    def partition_index(self, super_stream: str, stream: str) -> int:
        """Position of ``stream`` in ``super_stream``; -1 when either is unknown."""
        found = self.super_streams.get(super_stream)
        return found.partition_index(stream) if found else -1

    # -- persistence --------------------------------------------------------------------
    def _stream_deleted(self, stream: Stream) -> None:
        changed = False
        for name, s in list(self.super_streams.items()):
            if stream.name in s.partitions:
                kept = [(p, k) for p, k in zip(s.partitions, s.binding_keys) if p != stream.name]
                self.super_streams[name] = SuperStream(
                    name, tuple(p for p, _ in kept), tuple(k for _, k in kept))
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
