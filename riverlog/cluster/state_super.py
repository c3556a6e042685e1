# RabbitMQ super streams in the cluster metadata (docs/clustering.md), as pure transitions
# beside state.py's: a super stream is a name for an ordered list of partition streams, each
# bound by one binding key. Owns the super stream commands and TRANSITIONS, every state
# command by name (state.py's and these). Rules: as state.py's (a transition returns a new
# ClusterState or raises a MetadataError and changes nothing; deterministic). Creating a super
# stream with its partition streams, deleting it with them, and binding a stream to it are
# each ONE command, so ONE Raft entry: a server killed at any point leaves the whole super
# stream or none of it. create_super_stream and delete_super_stream (the record alone, the
# partition streams made or deleted by commands of their own) are what riverlog wrote before
# those; they stay, for the Raft logs of older versions and for the management API's exchange
# declaration and deletion, which touch the record alone.
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

from ..broker.stream import SuperStream
from . import state as s
from .state import ClusterState, MetadataError, NoSuchStream


class SuperStreamExists(MetadataError):
    """A super stream name that is taken (create_super_stream*)."""


def _check_record(state: ClusterState, name: str, partitions: tuple[str, ...],
                  binding_keys: tuple[str, ...]) -> None:
    """What a new super stream record needs: a free name, as many distinct partitions as
    binding keys. Raises SuperStreamExists, MetadataError."""
    if not name:
        raise MetadataError("a super stream needs a name")
    if name in state.super_streams:
        raise SuperStreamExists(f"super stream {name!r} exists")
    if len(partitions) != len(binding_keys) or len(set(partitions)) != len(partitions):
        raise MetadataError(f"super stream {name!r}: as many distinct partitions as binding "
                            f"keys are needed, got {list(partitions)} and {list(binding_keys)}")


def _recorded(state: ClusterState, found: SuperStream) -> ClusterState:
    return dataclasses.replace(state, super_streams={**state.super_streams, found.name: found})


def create_super_stream(state: ClusterState, name: str, partitions: tuple[str, ...],
                        binding_keys: tuple[str, ...]) -> tuple[ClusterState, SuperStream]:
    """Record super stream ``name``: ``partitions[i]`` (streams that exist) bound with
    ``binding_keys[i]``, in that order (none: an exchange declared before its bindings).
    Raises SuperStreamExists, NoSuchStream (a partition that is no stream), MetadataError
    (counts differ, a partition named twice)."""
    _check_record(state, name, partitions, binding_keys)
    for partition in partitions:
        if partition not in state.streams:
            raise NoSuchStream(f"super stream {name!r}: no stream {partition!r}")
    created = SuperStream(name, tuple(partitions), tuple(binding_keys))
    return _recorded(state, created), created


def delete_super_stream(state: ClusterState, name: str) -> tuple[ClusterState, SuperStream]:
    """Forget super stream ``name``; its partition streams stay (RabbitMQ deleting the
    exchange keeps its queues). Raises NoSuchStream."""
    if name not in state.super_streams:
        raise NoSuchStream(f"no super stream {name!r}")
    supers = dict(state.super_streams)
    removed = supers.pop(name)
    return dataclasses.replace(state, super_streams=supers), removed


def create_super_stream_with_streams(
        state: ClusterState, name: str, partitions: tuple[str, ...],
        binding_keys: tuple[str, ...], subject: str = "", stream_partitions: int = 1,
        replication_factor: int = 1,
        config: Mapping[str, object] | None = None) -> tuple[ClusterState, SuperStream]:
    """Create each partition stream ``partitions[i]`` in order, exactly as
    ``state.create_stream(state, partitions[i], subject, stream_partitions,
    replication_factor, config)`` would one after the other (so replicas and leaders are
    placed as separate creates place them), and record super stream ``name`` binding them
    with ``binding_keys``: one change, all of it or nothing. Raises SuperStreamExists (checked
    first), MetadataError (counts differ, a partition named twice, bad counts), StreamExists
    (a partition name is a stream), NotEnoughServers."""
    _check_record(state, name, partitions, binding_keys)
    for partition in partitions:
        state, _ = s.create_stream(state, partition, subject, stream_partitions,
                                   replication_factor, config)
    created = SuperStream(name, tuple(partitions), tuple(binding_keys))
    return _recorded(state, created), created


def delete_super_stream_with_streams(state: ClusterState,
                                     name: str) -> tuple[ClusterState, SuperStream]:
    """Forget super stream ``name`` and delete its partition streams (those still there, each
    as ``state.delete_stream``: consumer groups reading it get a new epoch, other super
    streams binding it lose the binding): one change. Returns the super stream as it was.
    Raises NoSuchStream (no such super stream)."""
    state, removed = delete_super_stream(state, name)
    for partition in removed.partitions:
        if partition in state.streams:
            state, _ = s.delete_stream(state, partition)
    return state, removed


def bind_super_stream(state: ClusterState, name: str, partition: str, binding_key: str,
                      index: int) -> tuple[ClusterState, SuperStream]:
    """Bind stream ``partition`` to super stream ``name`` with ``binding_key`` at position
    ``index`` of its partitions (clamped to 0..len: the end when larger), one change (the
    record is never missing in between). Returns the new super stream. Raises NoSuchStream
    (no such super stream, ``partition`` is no stream), MetadataError (bound already)."""
    found = state.super_streams.get(name)
    if found is None:
        raise NoSuchStream(f"no super stream {name!r}")
    if partition not in state.streams:
        raise NoSuchStream(f"super stream {name!r}: no stream {partition!r}")
    if partition in found.partitions:
        raise MetadataError(f"{partition!r} is bound to {name!r} already")
    at = max(0, min(index, len(found.partitions)))
    bound = SuperStream(name, found.partitions[:at] + (partition,) + found.partitions[at:],
                        found.binding_keys[:at] + (binding_key,) + found.binding_keys[at:])
    return _recorded(state, bound), bound


TRANSITIONS: Mapping[str, Callable[..., tuple[ClusterState, object]]] = {
    **s.TRANSITIONS, **{f.__name__: f for f in (
        create_super_stream, delete_super_stream, create_super_stream_with_streams,
        delete_super_stream_with_streams, bind_super_stream)}}
"""state.py's commands and the super streams': ``TRANSITIONS[name](state, **arguments)``."""
