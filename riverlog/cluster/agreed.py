# What the servers of a cluster agree on through the Raft metadata besides where partitions
# live (docs/clustering.md): Liftbridge's partition flags (paused, read-only, the stream's
# resumeAll). Owns the cluster side of Placement.flags / resumes_all / set_flags and the step
# of the reconcile loop that applies the agreed flags to the local replicas. Rules (Liftbridge's
# metadata.go PauseStream / ResumeStream / SetStreamReadonly): any server takes a change and
# submits it through Raft; every server holding the partition applies it once Raft applied
# it there (``follow_flags``, comparing with the local partition, so a restarted server
# converges too); a change returns once, best effort, the partitions' leaders applied it too
# (so a publish right after a resume or the end of read-only is not dropped by a leader that
# has not heard of it yet).
# The internal streams (``__cursors``, ``__activity``) are each server's own: their flags
# change on the server asked only.
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Awaitable, Callable, Mapping, Sequence

from ..broker import RESERVED_STREAMS
from ..broker.placement import PartitionFlags
from ..errors import StreamNotFoundError
from .state import ClusterState, NoSuchPartition, NoSuchStream

if TYPE_CHECKING:
    from ..broker import Stream


class AgreedFlags:
    """Mixed into ClusterPlacement, which provides ``state`` (the applied metadata),
    ``submit`` (a command through Raft) and ``flags_changed`` (Placement's listeners)."""

    state: ClusterState
    local: Mapping[str, "Stream"] = {}
    """This server's streams (the Broker's), set by ClusterNode: the internal streams' flags
    are theirs, and the reconcile loop compares the agreed flags with them."""
    settled: Callable[[str], Awaitable[None]] | None = None
    """Awaited after a flag change applied here (ClusterNode.wait_for_leaders): best effort,
    the partitions' leaders applied it too and listen as it says (Liftbridge waits so after
    a resume, waitForPartitionLeader)."""

    def flags(self, stream: str, index: int) -> PartitionFlags | None:
        if stream in RESERVED_STREAMS:
            found = self.local.get(stream)
            if found is None or not 0 <= index < len(found.partitions):
                return None
            return PartitionFlags(found.partitions[index].paused,
                                  found.partitions[index].readonly)
        found = self.state.streams.get(stream)
        if found is None or not 0 <= index < len(found.partitions):
            return None
        return PartitionFlags(found.partitions[index].paused, found.partitions[index].read_only)

    def resumes_all(self, stream: str) -> bool:
        if stream in RESERVED_STREAMS:
            found = self.local.get(stream)
            return found is not None and found.resume_all
        found = self.state.streams.get(stream)
        return found is not None and found.resume_all

    def set_flags(self, stream: str, partitions: Sequence[int], *, paused: bool | None = None,
                  read_only: bool | None = None,
                  resume_all: bool | None = None) -> Awaitable[None]:
        """Through Raft (state.set_partition_flags), from any server. The awaitable raises
        StreamNotFoundError, RaftUnavailable."""
        return asyncio.ensure_future(self._set_flags(stream, tuple(partitions), paused,
                                                     read_only, resume_all))

    async def _set_flags(self, stream: str, partitions: tuple[int, ...], paused: bool | None,
                         read_only: bool | None, resume_all: bool | None) -> None:
        if stream in RESERVED_STREAMS:  # this server's own stream, outside the metadata
            self._set_local(stream, partitions, paused, read_only, resume_all)
            return
        if not partitions:
            return  # "all of them" is the caller's to spell out
        try:
            await self.submit("set_partition_flags", stream=stream, partitions=partitions,
                              paused=paused, read_only=read_only, resume_all=resume_all)
        except (NoSuchStream, NoSuchPartition) as exc:
            raise StreamNotFoundError(str(exc)) from None
        if self.settled is not None:
            await self.settled(stream)

    def _set_local(self, stream: str, partitions: tuple[int, ...], paused: bool | None,
                   read_only: bool | None, resume_all: bool | None) -> None:
        found = self.local.get(stream)
        if found is None or any(not 0 <= i < len(found.partitions) for i in partitions):
            raise StreamNotFoundError(f"stream {stream!r} or one of its partitions "
                                      f"{list(partitions)} is gone")
        if resume_all is not None:
            found.resume_all = resume_all
        for index in partitions:
            now = found.partitions[index]
            self.flags_changed(stream, index, PartitionFlags(
                now.paused if paused is None else paused,
                now.readonly if read_only is None else read_only))

    def follow_flags(self, state: ClusterState) -> None:
        """The reconcile loop's step: every local replica of a partition of ``state`` takes
        its agreed flags where they differ (Placement.flags_changed; the Broker applies
        them, then the doors hear it)."""
        for name, stream in state.streams.items():
            held = self.local.get(name)
            if held is None:
                continue
            for part in stream.partitions:
                if part.index >= len(held.partitions):
                    continue
                replica = held.partitions[part.index]
                if (replica.paused, replica.readonly) != (part.paused, part.read_only):
                    self.flags_changed(name, part.index,
                                       PartitionFlags(part.paused, part.read_only))
