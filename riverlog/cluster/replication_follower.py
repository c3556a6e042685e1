# The follower side of one replicated partition: one task that first truncates the log's
# divergent tail (asking the leader where this log's latest leader epoch ends), then fetches the
# leader's chunks and appends them as they are, one fetch in flight at a time.
# Rules: a follower commits only up to min(the leader's high watermark, its own log end) and
# never serves beyond it; chunks that fail their checks (CRC, offsets, epoch) are refused whole
# and fetched again; an idle follower waits for a PartitionNotification (or
# replica_max_idle_wait) instead of polling; a leader silent for replica_max_leader_timeout is
# reported (ReplicationEvents.report_leader), again every timeout while it stays silent; under
# Durability.ALWAYS a fetch reports only fsynced data as held (it flushes before asking again).
# Truncation: Kafka's KIP-279 rule, one round: the leader answers the end offset of the newest
# epoch it has that is not above this log's latest; the log is cut at the lower of that and its
# own end of that epoch. Liftbridge falls back to truncating to the high watermark when the
# leader does not answer (data loss if the leader then fails); here the follower keeps asking
# while the leader is silent, and reports it.
# Compacted partitions: the leader answers a fetch from an offset its compaction removed with the
# next chunk that exists and the follower appends it leaving the same gap (Kafka and Liftbridge
# do the same); a follower never compacts on its own (Kafka's and Liftbridge's replicas each
# clean their own logs, which then hold different records): it applies its leader's compaction
# point (COMPACTION_HEADER) once it has committed that far, so every replica holds the records
# the leader holds, the newest of each key among them.
# Sources: Liftbridge server/partition.go (replicationRequestLoop, truncateUncommitted,
# handleReplicationResponse); Kafka KIP-101 / KIP-279 (leader-epoch truncation).
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import nats.errors

from ..broker.broker import record_key
from ..errors import ChunkRefusedError, LogClosedError
from ..log import CompactionPoint
from ..protocol.liftbridge import api_pb2
from ..protocol.liftbridge.envelope import (EnvelopeError, MsgType, decode_internal,
                                            encode_message)
from .replication_asks import NO_RESPONDERS, Asks
from .replication_context import ReplicationEngine
from .replication_leader import COMPACTION_HEADER, EPOCH_HEADER, ERROR_HEADER

if TYPE_CHECKING:
    import nats.aio.msg

    from ..broker.partition import Partition
    from ..broker.placement import PartitionPlacement

log = logging.getLogger("riverlog.replication")

RETRY_S = 0.05
"""Pause after a fetch that got no answer (no responders comes back at once), in seconds."""


class Follower:
    """This server follows ``placement.leader`` for ``partition`` in its leader epoch.
    Creating it starts the task; ``stop()`` cancels it at once (nothing is appended after);
    ``wake`` is set by a PartitionNotification."""

    def __init__(self, engine: ReplicationEngine, partition: "Partition",
                 placement: "PartitionPlacement", replicate_subject: str,
                 offset_subject: str) -> None:
        self.engine = engine
        self.partition = partition
        self.leader = placement.leader
        self.epoch = placement.leader_epoch
        self.subjects = (replicate_subject, offset_subject)
        self.wake = asyncio.Event()
        self.refused_chunks = 0
        self._stopped = False
        self._refusal: str | None = None  # the code of the leader's last error answer
        settings = engine.settings
        self._fetch_timeout = settings.replica_fetch_timeout_ms / 1000
        self._idle_wait = settings.replica_max_idle_wait_ms / 1000
        self._leader_timeout = settings.replica_max_leader_timeout_ms / 1000
        self._loop = asyncio.get_running_loop()
        self._leader_seen = self._reported = self._loop.time()
        self._asks = Asks(engine, self._heard)
        self._compaction: asyncio.Task | None = None
        self._bad_point: str | None = None  # the last bad COMPACTION_HEADER logged
        self._task = self._loop.create_task(self._run())

    def stop(self) -> None:
        self._stopped = True
        self._task.cancel()

    async def finished(self) -> None:
        """Wait until the task stopped (after ``stop``)."""
        await asyncio.gather(self._task, return_exceptions=True)

    def _check_stopped(self) -> None:
        """Raise CancelledError once stopped: nats-py can swallow the cancellation of a
        request in flight (its connection closing), and a follower that went on could append
        an old leader's chunks to a log this server now leads."""
        if self._stopped:
            raise asyncio.CancelledError

    def stats(self) -> dict:
        return {"role": "follower", "refused_chunks": self.refused_chunks,
                "leader_last_seen_ms": int((self._loop.time() - self._leader_seen) * 1000)}

    async def _run(self) -> None:
        try:
            await self._truncate()
            await self._fetch_loop()
        except asyncio.CancelledError:
            raise
        except LogClosedError:  # the partition closed or was deleted under us
            log.info("%r: closed, replication from %s stopped", self.partition, self.leader)
        except Exception:  # a bug or a broken log: say so, never die silently
            log.exception("%r: replication from %s stopped", self.partition, self.leader)
        finally:
            await self._asks.close()

    # -- the two phases -----------------------------------------------------------------
    async def _truncate(self) -> None:
        log_ = self.partition.log
        latest = log_.epochs.latest_epoch
        if latest == 0 or log_.next_offset == log_.first_offset:
            return
        request = encode_message(api_pb2.LeaderEpochOffsetRequest(leaderEpoch=latest))
        while True:
            answered = await self._answer(self.subjects[1], request,
                                          MsgType.LeaderEpochOffsetResponse,
                                          headers={EPOCH_HEADER: str(self.epoch)})
            if answered is None:
                continue
            answer, _ = answered
            if answer.endOffset >= 0:
                break
            # the leader knows no epoch this old: it cannot be this epoch's leader yet (it
            # records its epoch on taking over); ask again rather than guess
            log.warning("%r: leader %s knows no epoch <= %d yet", self.partition, self.leader,
                        latest)
            await self._idle()
        found = answer.leaderEpoch or latest  # a Liftbridge leader does not send field 2
        own = log_.end_offset_for(found)
        end = answer.endOffset
        target = min(end, own if own >= 0 else log_.next_offset)
        if target < log_.next_offset:
            await log_.compaction_finished()
            log.warning("%r: truncating the divergent tail %d..%d (epoch %d ends at %d on "
                        "leader %s)", self.partition, target, log_.next_offset - 1, found, end,
                        self.leader)
            self.partition.truncate(target)

    async def _fetch_loop(self) -> None:
        log_ = self.partition.log
        refusals = 0
        while True:
            self.wake.clear()
            request = encode_message(api_pb2.ReplicationRequest(
                replicaID=self.engine.server_id, offset=log_.next_offset, leaderEpoch=self.epoch))
            answered = await self._answer(self.subjects[0], request,
                                          MsgType.ReplicationResponse)
            if answered is None:
                if self._refusal == "offset-out-of-range":
                    await self._catch_up_with_log_start()
                continue
            answer, reply = answered
            if answer.leader_epoch != self.epoch:
                await self._idle()
                continue
            if answer.entries:
                try:
                    self.partition.append_replicated(answer.entries)
                except ChunkRefusedError as exc:
                    self.refused_chunks += 1
                    refusals += 1
                    log.warning("%s; fetching again", exc)
                    if refusals > 1:  # the same bad bytes again: do not spin
                        await asyncio.sleep(min(RETRY_S * refusals, self._idle_wait))
                    continue
                refusals = 0
                if log_.needs_flush:
                    await log_.flush()
            log_.commit(min(answer.high_watermark, log_.last_offset))
            self._follow_compaction(reply.headers)
            if not answer.entries:
                await self._idle()

    def _follow_compaction(self, headers: dict[str, str] | None) -> None:
        """Apply the leader's compaction point (COMPACTION_HEADER) in the background once
        this log has committed its ``upto`` and does not cover it yet."""
        value = (headers or {}).get(COMPACTION_HEADER)
        log_ = self.partition.log
        if value is None or (self._compaction is not None and not self._compaction.done()):
            return
        point = CompactionPoint.parse(value)
        if point is None:  # no compaction makes it: applied, it could remove newer records
            if value != self._bad_point:  # every answer carries it: logged once in a row
                log.warning("%r: bad %s from %s: %r", self.partition, COMPACTION_HEADER,
                            self.leader, value)
            self._bad_point = value
            return
        if (log_.committed_offset < point.upto or log_.compacting
                or (log_.compaction_point is not None and log_.compaction_point.covers(point))):
            return
        self._compaction = self._loop.create_task(self._compact(point))

    async def _compact(self, point: CompactionPoint) -> None:
        """Not cancelled with the follower: ``truncate`` and ``reset`` wait for it."""
        log_ = self.partition.log
        try:
            result = await log_.compact(record_key, point)
        except LogClosedError:
            return
        except Exception:  # a broken log: say so; the next answer tries again
            log.exception("%r: applying leader %s's compaction point %s failed",
                          self.partition, self.leader, point)
            return
        if result.point is not None:
            log.info("%r: applied leader %s's compaction (records below %d, newest up to "
                     "%d): %d -> %d records", self.partition, self.leader, point.end,
                     point.upto, result.records_before, result.records_after)

    async def _catch_up_with_log_start(self) -> None:
        """The leader no longer holds this log's next offset: when its log now starts after
        it (retention), start this log afresh where the leader's starts (the end offset of
        epoch 0, older than every epoch, is the start of the leader's first entry, which
        retention moves with the log start)."""
        reply = await self._ask(self.subjects[1], encode_message(
            api_pb2.LeaderEpochOffsetRequest(leaderEpoch=0)),
            headers={EPOCH_HEADER: str(self.epoch)})
        if reply is None:
            return
        try:
            start = decode_internal(reply.data, MsgType.LeaderEpochOffsetResponse).endOffset
        except EnvelopeError:
            return
        log_ = self.partition.log
        if log_.next_offset < start:
            await log_.compaction_finished()
            log.warning("%r: leader %s starts at offset %d, after this log's end %d "
                        "(retention): starting again from there", self.partition, self.leader,
                        start, log_.next_offset)
            log_.reset(start)

    # -- helpers ------------------------------------------------------------------------
    async def _answer(self, subject: str, request: bytes, msg_type: MsgType,
                      headers: dict[str, str] | None = None
                      ) -> tuple[Any, nats.aio.msg.Msg] | None:
        """The leader's answer decoded as ``msg_type``, with its NATS message (for its
        headers), or None: no answer, or an error answer (see ``_ask``; ``_refusal`` then
        holds its code), or bytes that are not such an envelope (logged, after waiting as
        an idle follower does)."""
        reply = await self._ask(subject, request, headers)
        if reply is None:
            return None
        try:
            return decode_internal(reply.data, msg_type), reply
        except EnvelopeError as exc:
            log.warning("%r: bad %s from %s: %s", self.partition, msg_type.name, self.leader,
                        exc)
            await self._idle()
            return None

    async def _ask(self, subject: str, request: bytes,
                   headers: dict[str, str] | None = None) -> nats.aio.msg.Msg | None:
        """The leader's answer (the NATS message), or None (no answer in time, no responder,
        or an error answer: after a pause, and reporting the leader once it is silent for too
        long). A late answer to an earlier ask of the same request counts (replication_asks)."""
        self._check_stopped()
        try:
            reply = await self._asks.ask(subject, request, headers, self._fetch_timeout)
        except nats.errors.Error as exc:  # not sent: the connection is closed or closing
            reply = None
            log.debug("%r: cannot ask leader %s: %r", self.partition, self.leader, exc)
        self._check_stopped()
        if reply is None or reply is NO_RESPONDERS:
            self._refusal = None
            log.debug("%r: no answer from leader %s", self.partition, self.leader)
            self._check_leader()
            await asyncio.sleep(RETRY_S)
            return None
        error = reply.headers.get(ERROR_HEADER) if reply.headers else None
        self._refusal = None if error is None else error.split(":", 1)[0]
        if error is not None:
            log.warning("%r: leader %s refused: %s", self.partition, self.leader, error)
            self._check_leader()
            await self._idle()
            return None
        return reply

    def _heard(self, msg: nats.aio.msg.Msg) -> None:
        """An answer came, maybe late: unless it is a refusal, the leader lives."""
        if not (msg.headers and ERROR_HEADER in msg.headers):
            self._leader_seen = self._loop.time()

    def _check_leader(self) -> None:
        now = self._loop.time()
        if (now - self._leader_seen > self._leader_timeout
                and now - self._reported > self._leader_timeout):
            self._reported = now
            log.warning("%r: leader %s silent for %.1f s, reporting it", self.partition,
                        self.leader, now - self._leader_seen)
            self._loop.create_task(self._report())

    async def _report(self) -> None:
        try:
            await self.engine.events.report_leader(self.partition.stream, self.partition.index,
                                                   self.leader, self.epoch)
        except Exception as exc:  # stale epoch (already replaced) or Raft unavailable
            log.warning("%r: report of leader %s not applied: %s", self.partition,
                        self.leader, exc)

    async def _idle(self) -> None:
        """Wait for a PartitionNotification, at most replica_max_idle_wait."""
        try:
            await asyncio.wait_for(self.wake.wait(), self._idle_wait)
        except asyncio.TimeoutError:
            pass
