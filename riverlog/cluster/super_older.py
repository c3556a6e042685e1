# Super streams in a cluster that still has a server of riverlog before the one-entry super
# stream commands (features.SUPER_STREAM_COMMANDS inactive): the older commands, as riverlog
# used them before (commit 5ba1251). Owns: the three fallbacks of ClusterPlacement's
# create_super_stream_with_streams, delete_super_stream_with_streams and bind_super_stream.
# Rules: only commands every version applies (create_stream, delete_stream,
# create_super_stream, delete_super_stream); they are several Raft entries, so a server killed
# between them can leave part of the change (the older guarantee: the reason the feature
# exists); a creation that fails deletes the partitions it made, best effort.
from __future__ import annotations

import logging

from ..broker.stream import StreamConfig
from ..errors import InvalidArgumentError, StreamNotFoundError

log = logging.getLogger("riverlog.cluster")


async def create(placement, name: str, partitions: tuple[str, ...],
                 binding_keys: tuple[str, ...], config: StreamConfig) -> None:
    """Each partition stream through ``placement.create_stream``, then the record through
    ``placement.create_super_stream``; the partitions made are deleted again when a step
    fails. Raises as those (StreamExistsError, InvalidArgumentError, RaftUnavailable)."""
    created: list[str] = []
    try:
        for partition in partitions:
            await placement.create_stream(partition, config)
            created.append(partition)
        await placement.create_super_stream(name, tuple(partitions), tuple(binding_keys))
    except BaseException:
        for partition in created:
            try:
                await placement.delete_stream(partition)
            except Exception as exc:
                log.error("super stream %r: partition %r made, not deleted again: %s",
                          name, partition, exc)
        raise


async def delete(placement, name: str) -> None:
    """The record through ``placement.delete_super_stream``, then each partition stream
    through ``placement.delete_stream`` (one gone already is skipped). Raises
    StreamNotFoundError (no such super stream), RaftUnavailable."""
    found = placement.super_streams().get(name)
    await placement.delete_super_stream(name)
    for partition in () if found is None else found.partitions:
        try:
            await placement.delete_stream(partition)
        except StreamNotFoundError:
            pass


async def bind(placement, name: str, partition: str, binding_key: str, index: int) -> None:
    """The record deleted and created again with ``partition`` inserted at ``index``
    (clamped to 0..len), two Raft entries: the super stream is missing between them.
    Raises StreamNotFoundError (no such super stream), InvalidArgumentError (bound
    already, ``partition`` is no stream), RaftUnavailable."""
    found = placement.super_streams().get(name)
    if found is None:
        raise StreamNotFoundError(f"no super stream {name!r}")
    if partition in found.partitions:
        raise InvalidArgumentError(f"{partition!r} is bound to {name!r} already")
    at = max(0, min(index, len(found.partitions)))
    await placement.delete_super_stream(name)
    await placement.create_super_stream(
        name, found.partitions[:at] + (partition,) + found.partitions[at:],
        found.binding_keys[:at] + (binding_key,) + found.binding_keys[at:])
