# The leader side of one replicated partition: answers its followers' ReplicationRequests with
# the chunks they lack and LeaderEpochOffsetRequests with an epoch's end offset, tracks each
# follower's log end, advances the high watermark to the lowest log end across the ISR, wakes
# idle followers (PartitionNotification) when there is something new for them, and asks the
# metadata to shrink the ISR (a follower not caught up for replica_max_lag_time) or expand it
# (a follower outside it that holds everything committed). A leader whose log stopped taking
# writes (a storage fault, CommitLog.failure) refuses every fetch, so its followers report it
# silent and one of them takes over.
# Rules: a request that fails a check is answered with an error and changes nothing; the high
# watermark counts only the replicas in the metadata's ISR and, for the leader itself, what its
# durability policy counts as written (fsynced under Durability.ALWAYS), so it never passes
# what the ISR holds; chunks are sent as stored, bytes copied, never parsed per record.
# Sources: Liftbridge server/replicator.go (lastSeen/lastCaughtUp, shrink/expand, sendHW) and
# server/partition.go (handleReplicationRequest, handleLeaderEpochOffsetRequest); the
# caught-up rule for a follower that never quite reaches a busy log's end is Kafka's
# (Replica.updateFetchState: caught up when it reached the log end of its previous fetch).
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from ..errors import LogError
from ..protocol.liftbridge import api_pb2
from ..protocol.liftbridge.envelope import (EnvelopeError, MsgType, decode_internal,
                                            encode_message, encode_replication_response)
from .replication_context import ReplicationEngine
from .replication_subjects import notify_subject

if TYPE_CHECKING:
    from ..broker.partition import Partition
    from ..broker.placement import PartitionPlacement

log = logging.getLogger("riverlog.replication")

ERROR_HEADER = "Riverlog-Replication-Error"
"""NATS header of an error answer: ``<code>: <reason>``, with an empty payload. Codes:
``bad-request`` (not a ReplicationRequest / LeaderEpochOffsetRequest envelope), ``unknown-replica``
(the replica id is not a follower in the partition's replicas), ``stale-epoch`` (the request's
leader epoch is older than this leader's), ``offset-out-of-range`` (before the log start or
past the log end), ``read-failed`` (the leader could not read its log there). Liftbridge
drops such requests without an answer; an answer lets the follower tell a refusal from a
dead leader. Not answered at all: a request for a *newer* leader epoch, and any request once
this server stopped leading (until its subscriptions are gone): the partition's new leader
shares the subjects and NATS hands the requester the first answer, which must be that
leader's, not a refusal from a stale one."""
COMPACTION_HEADER = "Riverlog-Compaction-Point"
"""NATS header of a ReplicationResponse from the leader of a compacted partition once it has
compacted: ``<end> <upto>`` (``CompactionPoint``): its log holds no record below ``end``
whose key has a newer record at or below ``upto``. The follower applies the same point to
its own log once it has committed ``upto``, so every replica holds the same records."""
HEADERS_ROOM = 128
"""Bytes kept free in a ReplicationResponse for its NATS headers ("NATS/1.0" and
COMPACTION_HEADER with two 20-digit offsets take 82 at most): nats-server counts them in the max
payload and closes a connection that goes over it."""
EPOCH_HEADER = "Riverlog-Leader-Epoch"
"""NATS header of a LeaderEpochOffsetRequest: the leader epoch the follower follows (the
request's own field is the epoch asked about), checked as a ReplicationRequest's epoch is.
Without it (a Liftbridge follower) the request is answered by whoever leads."""


class _Follower:
    """What the leader knows of one follower (times from the loop's monotonic clock, s)."""

    __slots__ = ("log_end", "last_seen", "last_caught_up", "in_sync_since", "idle",
                 "told_hw", "answered_end", "answered_at", "asked")

    def __init__(self, now: float, in_sync: bool) -> None:
        self.log_end: int | None = None  # the next offset it asked for: it holds all before
        self.last_seen = now
        self.last_caught_up = now
        self.in_sync_since = time.time() if in_sync else None  # wall clock, for stats
        self.idle = False  # its last answer was empty: it waits for a notification
        self.told_hw = -1  # the high watermark its last answer carried
        self.answered_end = 0  # the leader's log end when its last fetch was answered
        self.answered_at = now
        self.asked = False  # an ISR change for it is submitted and not yet applied


class Leader:
    """This server leads ``partition`` in ``placement.leader_epoch``. Creating it starts the
    role at once (the log writes chunks of this epoch; ``await subscribe()`` then takes
    requests); ``deactivate()`` stops it at once, ``await unsubscribe()`` after."""

    def __init__(self, engine: ReplicationEngine, partition: "Partition",
                 placement: "PartitionPlacement", replicate_subject: str,
                 offset_subject: str) -> None:
        self.engine = engine
        self.partition = partition
        self.placement = placement
        self.epoch = placement.leader_epoch
        self.subjects = (replicate_subject, offset_subject)
        self.active = True
        self._subs: list = []
        self._loop = asyncio.get_running_loop()
        settings = engine.settings
        self._max_lag = settings.replica_max_lag_time_ms / 1000
        # an answer is one NATS message: its NATS headers, 24 bytes of envelope, the chunks
        self._max_bytes = min(settings.replication_max_bytes,
                              engine.nc.max_payload - 64 - HEADERS_ROOM)
        log_ = partition.log
        if self.epoch > log_.epochs.latest_epoch:
            log_.epochs.assign(self.epoch, log_.next_offset)
        log_.epoch = max(log_.epoch, self.epoch)
        self._epoch_start = log_.epochs.entries[-1].start_offset
        now = self._loop.time()
        self._followers = {r: _Follower(now, r in placement.isr)
                           for r in placement.replicas if r != engine.server_id}
        self._wake_pending = False
        self._newest_told = self.epoch  # the newest epoch a request told this leader of
        self._flusher: asyncio.Task | None = None
        log_.on_written = self._written
        log_.on_synced = self._advance
        self._ticker = self._loop.create_task(self._check_isr())
        self._advance()
        log.info("%r: leading in epoch %d (ISR %s)", partition, self.epoch, list(placement.isr))

    # -- lifecycle ----------------------------------------------------------------------
    async def subscribe(self) -> None:
        nc = self.engine.nc
        if self.active:
            self._subs = [await nc.subscribe(self.subjects[0], cb=self._on_replicate),
                          await nc.subscribe(self.subjects[1], cb=self._on_offset)]
        if not self.active:  # deactivated while subscribing
            await self.unsubscribe()

    def deactivate(self) -> None:
        self.active = False
        log_ = self.partition.log
        if log_.on_written == self._written:
            log_.on_written = None
        if log_.on_synced == self._advance:
            log_.on_synced = None
        self._ticker.cancel()

    async def unsubscribe(self) -> None:
        subs, self._subs = self._subs, []
        for sub in subs:
            await sub.unsubscribe()

    def update(self, placement: "PartitionPlacement") -> None:
        """The same leader and epoch with another ISR (a shrink or expand applied) or other
        replicas (state.add_replica, delete_replica): a new replica is a follower out of
        sync until it catches up, a deleted one is forgotten."""
        now = self._loop.time()
        self._followers = {r: self._followers.get(r) or _Follower(now, False)
                           for r in placement.replicas if r != self.engine.server_id}
        for replica, f in self._followers.items():
            f.asked = False
            in_sync = replica in placement.isr
            if in_sync and f.in_sync_since is None:
                f.in_sync_since = time.time()
            elif not in_sync:
                f.in_sync_since = None
        self.placement = placement
        self._advance()

    # -- requests -----------------------------------------------------------------------
    async def _on_replicate(self, msg) -> None:
        """Answer a ReplicationRequest {replicaID, offset (the follower's next offset),
        leaderEpoch}: ReplicationResponse (this epoch, the high watermark, the chunks from
        ``offset`` on, up to replication_max_bytes; none when the follower is caught up; from
        an offset compaction removed, the next chunk that exists, as Kafka's and Liftbridge's
        leaders answer), with COMPACTION_HEADER once this log compacted, or an error
        (ERROR_HEADER) that changes nothing. ``offset`` must be within the log start
        (``CommitLog.start_offset``, which compaction does not move) .. the log end."""
        req = await self._request(msg, MsgType.ReplicationRequest)
        if req is None:
            return
        f = self._followers.get(req.replicaID)
        log_ = self.partition.log
        end = log_.next_offset
        if f is None:
            return await self._refuse(msg, "unknown-replica",
                                      f"{req.replicaID!r} is not a follower of {self.partition!r}")
        if req.leaderEpoch != self.epoch:
            return await self._refuse_epoch(msg, req.leaderEpoch)
        if log_.failure is not None:  # the followers report this leader; one takes over
            return await self._refuse(msg, "log-failed", str(log_.failure))
        if not log_.start_offset <= req.offset <= end:
            return await self._refuse(msg, "offset-out-of-range", f"offset {req.offset} is "
                                      f"outside {log_.start_offset}..{end}")
        chunks = []
        if req.offset < end:
            try:
                chunks = log_.read_chunks(req.offset, self._max_bytes, committed_only=False)
            except LogError as exc:
                log.error("%r: cannot read offset %d for %s: %s", self.partition, req.offset,
                          req.replicaID, exc)
                return await self._refuse(msg, "read-failed", str(exc))
        now = self._loop.time()
        f.last_seen = now
        if req.offset >= end:
            f.last_caught_up = now
        elif req.offset >= f.answered_end:
            f.last_caught_up = max(f.last_caught_up, f.answered_at)
        f.log_end = req.offset
        f.answered_end, f.answered_at = end, now
        if req.replicaID in self.placement.isr:
            self._advance()
        elif (not f.asked and req.offset > log_.committed_offset
              and req.offset >= self._epoch_start):
            self._ask("expand_isr", req.replicaID)
        hw = log_.committed_offset
        f.idle, f.told_hw = not chunks, hw
        # the chunks are copied once, into the answer
        answer = b"".join([encode_replication_response(self.epoch, hw), *[c.raw for c in chunks]])
        point = log_.compaction_point
        headers = None if point is None else {COMPACTION_HEADER: f"{point.end} {point.upto}"}
        if not msg.reply:
            return
        if len(answer) + (HEADERS_ROOM if headers else 0) > self.engine.nc.max_payload:
            # one chunk above the NATS max payload (nats-server counts the headers in it)
            log.error("%r: the chunk at offset %d (%d bytes) exceeds the NATS max payload; "
                      "%s cannot replicate it", self.partition, req.offset, len(answer),
                      req.replicaID)
            return
        await self.engine.nc.publish(msg.reply, answer, headers=headers)

    async def _on_offset(self, msg) -> None:
        """Answer a LeaderEpochOffsetRequest {leaderEpoch}: LeaderEpochOffsetResponse
        {endOffset: the offset after the last one of the newest epoch not above it,
        leaderEpoch: that epoch} (``LeaderEpochCache.epoch_and_end_offset_for``); -1 and 0
        when the log knows no such epoch."""
        req = await self._request(msg, MsgType.LeaderEpochOffsetRequest)
        if req is None:
            return
        followed = (msg.headers or {}).get(EPOCH_HEADER)
        if followed is not None and followed != str(self.epoch):
            # an epoch in decimal, no more than 20 digits ("²" is a digit, int() refuses it)
            known = followed.isascii() and followed.isdigit() and len(followed) <= 20
            return await self._refuse_epoch(msg, int(followed) if known else -1)
        log_ = self.partition.log
        found, end = log_.epochs.epoch_and_end_offset_for(req.leaderEpoch, log_.next_offset)
        await msg.respond(encode_message(api_pb2.LeaderEpochOffsetResponse(
            endOffset=end, leaderEpoch=max(found, 0))))

    async def _request(self, msg, msg_type: MsgType):
        """The request ``msg`` carries, decoded as ``msg_type``; None when this server no
        longer leads (not answered, see ERROR_HEADER) or the bytes are not such an envelope
        (answered ``bad-request``)."""
        if not self.active:
            return None
        try:
            return decode_internal(msg.data, msg_type)
        except EnvelopeError as exc:
            await self._refuse(msg, "bad-request", str(exc))
            return None

    async def _refuse_epoch(self, msg, epoch: int) -> None:
        if epoch > self.epoch:  # a newer leader answers it (see ERROR_HEADER)
            # followers ask several times a second until this server hears of the change:
            # the news once per newer epoch, the repeats at DEBUG
            level = logging.INFO if epoch > self._newest_told else logging.DEBUG
            self._newest_told = max(self._newest_told, epoch)
            log.log(level, "%r: a request for leader epoch %d: this leader's %d is over",
                    self.partition, epoch, self.epoch)
            return
        await self._refuse(msg, "stale-epoch",
                           f"leader epoch {epoch}, this leader's is {self.epoch}")

    async def _refuse(self, msg, code: str, reason: str) -> None:
        log.warning("%r: refused a replication request: %s: %s", self.partition, code, reason)
        if msg.reply:
            await self.engine.nc.publish(msg.reply, b"",
                                         headers={ERROR_HEADER: f"{code}: {reason}"})

    # -- high watermark and notifications -----------------------------------------------
    def _advance(self) -> None:
        """Commit up to the lowest log end across the ISR (the leader's own: what its
        durability policy counts as written); an ISR member not heard from yet holds it, and
        an ISR smaller than the stream's minimum ISR commits nothing (Liftbridge's minIsr:
        "ISR size below minimum"), so a record is never committed on fewer replicas."""
        if not self.active or self.placement.under_min_isr:
            return
        log_ = self.partition.log
        low = log_.durable_next_offset
        for replica in self.placement.isr:
            f = self._followers.get(replica)
            if f is not None:
                if f.log_end is None:
                    return
                low = min(low, f.log_end)
        if low - 1 > log_.committed_offset:
            log_.commit(low - 1)
            self._wake()

    def _written(self) -> None:
        self._advance()
        self._wake()
        log_ = self.partition.log
        if log_.needs_flush and (self._flusher is None or self._flusher.done()):
            self._flusher = self._loop.create_task(self._flush())

    async def _flush(self) -> None:
        """Under Durability.ALWAYS, fsync what this leader writes (group commit) even when
        no writer waits for it (LEADER acks): its log end counts for the high watermark only
        once fsynced (``on_synced`` advances it)."""
        log_ = self.partition.log
        try:
            while self.active and log_.durable_next_offset < log_.next_offset:
                await log_.flush()
        except (OSError, LogError) as exc:
            log.error("%r: fsync failed: %s", self.partition, exc)

    def _wake(self) -> None:
        """Notify, once per loop iteration, the idle followers that lack data or the
        latest high watermark."""
        if not self._wake_pending and any(f.idle for f in self._followers.values()):
            self._wake_pending = True
            self._loop.call_soon(self._send_wakes)

    def _send_wakes(self) -> None:
        self._wake_pending = False
        if not self.active:
            return
        log_ = self.partition.log
        end, hw = log_.next_offset, log_.committed_offset
        note = None
        for replica, f in self._followers.items():
            if f.idle and (f.log_end is None or f.log_end < end or f.told_hw < hw):
                f.idle = False
                if note is None:
                    note = encode_message(api_pb2.PartitionNotification(
                        stream=self.partition.stream, partition=self.partition.index))
                self._loop.create_task(self._publish(replica, note))

    async def _publish(self, replica: str, note: bytes) -> None:
        await self.engine.nc.publish(notify_subject(self.engine.namespace, replica), note)

    # -- ISR ----------------------------------------------------------------------------
    async def _check_isr(self) -> None:
        """Every quarter of replica_max_lag_time: an ISR follower not seen, or not caught
        up, for that long is asked out of the ISR (Liftbridge's replicator tick)."""
        while True:
            await asyncio.sleep(self._max_lag / 4)
            now = self._loop.time()
            for replica, f in self._followers.items():
                if (replica in self.placement.isr and not f.asked
                        and (now - f.last_seen > self._max_lag
                             or now - f.last_caught_up > self._max_lag)):
                    log.warning("%r: follower %s is %.1f s behind, leaving the ISR",
                                self.partition, replica, now - f.last_caught_up)
                    self._ask("shrink_isr", replica)

    def _ask(self, change: str, replica: str) -> None:
        self._followers[replica].asked = True
        self._loop.create_task(self._submit(change, replica))

    async def _submit(self, change: str, replica: str) -> None:
        try:
            await getattr(self.engine.events, change)(self.partition.stream,
                                                       self.partition.index, replica, self.epoch)
        except Exception as exc:  # the metadata refused (stale epoch...) or Raft is down
            log.warning("%r: %s of %s not applied: %s", self.partition, change, replica, exc)
            f = self._followers.get(replica)
            if f is not None and self.active:
                f.asked = False

    def stats(self) -> dict:
        log_ = self.partition.log
        end, now = log_.next_offset, self._loop.time()
        return {"role": "leader", "followers": {
            replica: {"log_end": f.log_end,
                      "lag_messages": None if f.log_end is None else end - f.log_end,
                      "lag_bytes": None if f.log_end is None else log_.bytes_from(f.log_end),
                      "in_sync": replica in self.placement.isr,
                      "in_sync_since": None if f.in_sync_since is None
                      else int(f.in_sync_since * 1000),
                      "last_seen_ms": int((now - f.last_seen) * 1000)}
            for replica, f in self._followers.items()}}
