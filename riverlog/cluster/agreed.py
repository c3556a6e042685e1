# What the servers of a cluster agree on through the Raft metadata besides where partitions
# live (docs/clustering.md): Liftbridge's partition flags (paused, read-only, the stream's
# resumeAll) and consumer groups. Owns the cluster side of Placement.flags / resumes_all /
# set_flags / consumer_groups and the step of the reconcile loop that follows them
# (``follow_agreed``). Rules (Liftbridge's metadata.go and groups.go):
# - any server takes a change and submits it through Raft;
# - flags: every server holding the partition applies them once Raft applied them there
#   (comparing with the local partition, so a restarted server converges too); a change
#   returns once, best effort, the partitions' leaders applied it too (so a publish right
#   after a resume or the end of read-only is not dropped by a leader that has not heard of
#   it yet); an internal stream outside the metadata (``__activity``, and ``__cursors``
#   until the Raft leader puts it there) is each server's own: its flags change on the
#   server asked only;
# - groups: membership, epochs, coordinator and assignments are the metadata's (state.py);
#   only the coordinator answers FetchConsumerGroupAssignments and keeps each member's
#   consumer timeout (armed when it becomes coordinator or a member joins), and removes a
#   silent member through Raft (Liftbridge's removeConsumerGroupMember).
from __future__ import annotations

import asyncio
import logging
import time
from types import MappingProxyType
from typing import TYPE_CHECKING, Awaitable, Callable, Mapping, Sequence

from ..broker import RESERVED_STREAMS
from ..broker.stream import MAX_NAME_BYTES
from ..broker.groups import (GROUP_NOT_FOUND, NOT_COORDINATOR, NOT_MEMBER, STREAM_NOT_FOUND,
                             WRONG_EPOCH, GroupError, consumer_left)
from ..broker.placement import PartitionFlags, set_local_flags
from ..errors import ClusterUnavailableError, StreamNotFoundError
from .state import (TRANSITIONS, ClusterState, ConsumerGroup, GroupNotFound, MetadataError,
                    NoSuchPartition, NoSuchStream)

if TYPE_CHECKING:
    from ..broker import Stream

log = logging.getLogger("riverlog.cluster")


class Agreed:
    """Mixed into ClusterPlacement, which provides ``server_id``, ``state`` (the applied
    metadata), ``submit`` (a command through Raft) and ``flags_changed`` (Placement's
    listeners)."""

    state: ClusterState
    local: Mapping[str, "Stream"] = MappingProxyType({})
    """This server's streams (the Broker's), set by ClusterNode: the internal streams' flags
    are theirs, and the reconcile loop compares the agreed flags with them."""
    settled: Callable[[str, Sequence[int]], Awaitable[None]] | None = None
    """Awaited with (stream, the partitions changed) after a flag change applied here
    (PartitionStatus.wait_for_leaders): best effort, those partitions' leaders applied it too
    and listen as it says (Liftbridge waits so after a resume, waitForPartitionLeader)."""
    groups: "ClusterGroups | None" = None

    def consumer_groups(self, data_dir: str, consumer_timeout_ms: int,
                        coordinator_timeout_ms: int, partitions_of: Callable[[str], int],
                        on_leave: Callable[[str, str, bool], None] | None = None):
        """ClusterGroups (the metadata's; ``data_dir`` and ``partitions_of`` are not used:
        the metadata has every stream's partitions)."""
        self.groups = ClusterGroups(self, consumer_timeout_ms, coordinator_timeout_ms,
                                    on_leave)
        return self.groups

    def _own(self, stream: str) -> bool:
        """Whether ``stream`` is this server's own: internal, and not in the metadata."""
        return stream in RESERVED_STREAMS and stream not in self.state.streams

    def flags(self, stream: str, index: int) -> PartitionFlags | None:
        if self._own(stream):
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
        found = self.local.get(stream) if self._own(stream) else self.state.streams.get(stream)
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
        if self._own(stream):  # outside the metadata
            set_local_flags(self, self.local.get(stream), stream, partitions, paused,
                            read_only, resume_all)
            return
        if not partitions:
            return  # "all of them" is the caller's to spell out
        try:
            await self.submit("set_partition_flags", stream=stream, partitions=partitions,
                              paused=paused, read_only=read_only, resume_all=resume_all)
        except (NoSuchStream, NoSuchPartition) as exc:
            raise StreamNotFoundError(str(exc)) from None
        if self.settled is not None:
            await self.settled(stream, partitions)

    def follow_agreed(self, state: ClusterState) -> None:
        """The reconcile loop's step: every local replica of a partition of ``state`` takes
        its agreed flags where they differ (Placement.flags_changed; the Broker applies
        them, then the doors hear it); the consumer timeouts of the groups coordinated here
        follow their members."""
        if self.groups is not None:
            self.groups.follow(state)
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


class ClusterGroups:
    """The consumer groups of the metadata, as Placement.consumer_groups describes them, for
    ``placement`` (a ClusterPlacement). Timeouts in ms, as the Liftbridge settings."""

    def __init__(self, placement, consumer_timeout_ms: int, coordinator_timeout_ms: int,
                 on_leave: Callable[[str, str, bool], None] | None = None) -> None:
        self.placement = placement
        self.consumer_timeout_s = consumer_timeout_ms / 1000
        self.coordinator_timeout_s = coordinator_timeout_ms / 1000
        self.on_leave = on_leave
        self._timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._removals: set[asyncio.Task] = set()  # held until done (the loop keeps weak refs)
        self._running = False

    def _group(self, group_id: str) -> ConsumerGroup | None:
        return self.placement.state.groups.get(group_id)

    async def _submit(self, command: str, *, here: bool = False, **arguments) -> object:
        """A group command through Raft (``here``: applied to this server's metadata only,
        for a command refused wherever it is applied); its refusals as GroupError
        (Liftbridge's codes)."""
        try:
            if here:
                return TRANSITIONS[command](self.placement.state, **arguments)[1]
            return await self.placement.submit(command, **arguments)
        except GroupNotFound as exc:
            raise GroupError("not_found", str(exc)) from None
        except MetadataError as exc:
            raise GroupError("precondition", str(exc)) from None

    # -- the doors' requests ---------------------------------------------------------------
    async def join(self, group_id: str, consumer_id: str,
                   streams: list[str]) -> tuple[str, int]:
        """Raises GroupError, ClusterUnavailableError. A stream name no stream can have
        (over MAX_NAME_BYTES) is refused here, and the names go to Raft once each: the
        command is in every server's journal."""
        streams = tuple(dict.fromkeys(streams))
        if any(len(name.encode()) > MAX_NAME_BYTES for name in streams):
            raise GroupError("precondition", STREAM_NOT_FOUND)
        group = await self._submit("join_group", group=group_id, consumer=consumer_id,
                                   streams=streams)
        return group.coordinator, group.epoch

    async def leave(self, group_id: str, consumer_id: str) -> None:
        """Raises GroupError, ClusterUnavailableError."""
        await self._left(group_id, consumer_id, expired=False)

    async def _left(self, group_id: str, consumer_id: str, expired: bool) -> None:
        await self._submit("leave_group", group=group_id, consumer=consumer_id)
        consumer_left(self.on_leave, group_id, consumer_id, expired)

    def assignments(self, group_id: str, consumer_id: str,
                    epoch: int) -> tuple[dict[str, list[int]], int]:
        """On the coordinator only (Liftbridge's GetAssignments); the consumer's heartbeat.
        Raises GroupError (not_found; precondition: not the coordinator, another epoch, not
        a member)."""
        group = self._group(group_id)
        if group is None:
            raise GroupError("not_found", GROUP_NOT_FOUND)
        if group.coordinator != self.placement.server_id:
            raise GroupError("precondition", NOT_COORDINATOR)
        if epoch != group.epoch:
            raise GroupError("precondition", WRONG_EPOCH)
        if consumer_id not in group.members:
            raise GroupError("precondition", NOT_MEMBER)
        self._arm(group_id, consumer_id)
        return {s: list(p) for s, p in group.assignments.get(consumer_id, {}).items()}, \
            group.epoch

    async def report_coordinator(self, group_id: str, consumer_id: str, coordinator: str,
                                 epoch: int) -> None:
        """Raises GroupError (precondition, Liftbridge's messages), ClusterUnavailableError.
        A ``coordinator`` that is no server of the cluster is the group's coordinator
        nowhere: refused here, not sent to every server's journal."""
        await self._submit("report_group_coordinator", group=group_id, consumer=consumer_id,
                           coordinator=coordinator, epoch=epoch, now=time.time(),
                           window=self.coordinator_timeout_s,
                           here=coordinator not in self.placement.state.servers)

    def coordinator_of(self, group_id: str) -> tuple[str, int] | None:
        group = self._group(group_id)
        return None if group is None else (group.coordinator, group.epoch)

    def is_member(self, group_id: str, consumer_id: str) -> bool:
        group = self._group(group_id)
        return group is not None and consumer_id in group.members

    def member_streams(self, group_id: str, consumer_id: str) -> tuple[str, ...] | None:
        """The streams the member consumes; None when it is no member."""
        group = self._group(group_id)
        return None if group is None else group.members.get(consumer_id)

    def stream_deleted(self, name: str) -> None:
        """Nothing to do: the metadata's delete_stream takes the stream out of the groups."""

    # -- consumer timeouts, on the coordinator ---------------------------------------------
    def start(self) -> None:
        self._running = True
        self.follow(self.placement.state)

    def close(self) -> None:
        self._running = False
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def follow(self, state: ClusterState) -> None:
        """Every member of a group coordinated here has a consumer timer; no other has."""
        if not self._running:
            return
        me = self.placement.server_id
        wanted = {(g.id, c) for g in state.groups.values() if g.coordinator == me
                  for c in g.members}
        for key in set(self._timers) - wanted:
            self._timers.pop(key).cancel()
        for group_id, consumer_id in wanted - set(self._timers):
            self._arm(group_id, consumer_id)

    def _arm(self, group_id: str, consumer_id: str) -> None:
        old = self._timers.pop((group_id, consumer_id), None)
        if old is not None:
            old.cancel()
        if self._running:
            self._timers[(group_id, consumer_id)] = asyncio.get_running_loop().call_later(
                self.consumer_timeout_s, self._expired, group_id, consumer_id)

    def _expired(self, group_id: str, consumer_id: str) -> None:
        self._timers.pop((group_id, consumer_id), None)
        task = asyncio.get_running_loop().create_task(self._remove(group_id, consumer_id))
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    async def _remove(self, group_id: str, consumer_id: str) -> None:
        """A member silent for the consumer timeout leaves, through Raft; when Raft cannot
        tell, its timer starts again (Liftbridge's consumerExpired)."""
        try:
            await self._left(group_id, consumer_id, expired=True)
        except GroupError:
            pass  # it left meanwhile
        except ClusterUnavailableError as exc:
            log.error("cannot remove consumer %s from consumer group %s: %s", consumer_id,
                      group_id, exc)
            group = self._group(group_id)
            if group is not None and consumer_id in group.members:
                self._arm(group_id, consumer_id)
