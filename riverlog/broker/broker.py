# The broker core: the registry of streams on disk, their creation and deletion, and the
# periodic housekeeping (stored offsets, retention, compaction). Front doors call this; it
# speaks the domain (streams, partitions, offsets), never a wire format.
# Rules: one event loop owns the broker; a stream folder that cannot be opened is reported
# and skipped, never fatal; deletion wakes every reader of the stream (LogClosedError) and
# tells listeners so doors can notify their clients, and so does a partition's leader change
# (``leader_listeners``, whichever placement is installed); a partition's flags (paused,
# read-only) change only as the placement agreed them, here, then ``flag_listeners`` hear it;
# the internal streams (RESERVED_STREAMS,
# Liftbridge's) are created by the server only and never deleted, and the doors refuse
# publishers on them (``check_writable``).
from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import os
import shutil
import time
from collections import Counter
from typing import Callable
from urllib.parse import quote

from ..alarms import ResourceAlarms
from ..config import LogConfig
from ..errors import (InvalidArgumentError, LimitExceededError, NoSuchVhostError,
                      ReservedStreamError, ResourceExhaustedError, StreamExistsError,
                      StreamNotFoundError)
from ..log.files import OPEN_FILES, OUT_OF_FILES
from ..record import decode_record
from ..vhost_names import hidden, vhost_of
from . import clean_stop
from .partition import Partition
from .placement import LeaderListener, LocalPlacement, PartitionFlags, Placement
from .stream import MAX_NAME_BYTES, METADATA_FILE, Stream, StreamConfig

log = logging.getLogger("riverlog.broker")

STREAMS_DIR = "streams"
HOUSEKEEPING_INTERVAL_S = 1.0
CURSORS_STREAM = "__cursors"
ACTIVITY_STREAM = "__activity"
RESERVED_STREAMS = frozenset((ACTIVITY_STREAM, CURSORS_STREAM))
"""Liftbridge's internal streams (liftbridge server/server.go reservedStreams): the stored
cursors, read back at every start, and the activity events."""


def check_writable(name: str) -> None:
    """Raise ``ReservedStreamError`` when clients may not publish to stream ``name``."""
    if name in RESERVED_STREAMS:
        raise ReservedStreamError(f"stream {name!r} is reserved")


def folder_name(name: str) -> str:
    """The folder name of stream ``name``: percent-quoted (dots too), or ``h-<sha256>``
    when that is longer than 120 characters (the tables use the same names)."""
    quoted = quote(name, safe="").replace(".", "%2E")
    if len(quoted) <= 120:
        return quoted
    return "h-" + hashlib.sha256(name.encode()).hexdigest()


def _remove_half_made(path: str) -> None:
    """Remove the folder of a stream whose creation failed, and drop the log files the
    open-file budget still holds open there; the budget's spare descriptors are given back
    for it, so the removal has some even when their lack made the creation fail. A folder
    that still cannot be removed is logged; having no metadata file, it is no stream at the
    next start, and the next creation of the name removes it."""
    OPEN_FILES.close_under(path)
    with OPEN_FILES.spare():
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("cannot remove the half-made stream folder %s: %s", path, exc)


def record_key(record: bytes) -> bytes | None:
    """Compaction key of a stored record: its Liftbridge key (None when it has none)."""
    return decode_record(record).key


class Broker:
    """All streams under ``DATA/streams``. Use ``open()`` then ``await close()``."""

    def __init__(self, data_dir: str, log_defaults: LogConfig | None = None) -> None:
        self.data_dir = data_dir
        self.root = os.path.join(data_dir, STREAMS_DIR)
        self.log_defaults = log_defaults or LogConfig()
        self.streams: dict[str, Stream] = {}
        self.deletion_listeners: list[Callable[[Stream], None]] = []
        self.leader_listeners: list[LeaderListener] = []
        """Called with (stream, partition index) after a partition's leader changed."""
        self.flag_listeners: list[Callable[[Stream, Partition], None]] = []
        """Called with (stream, partition) after the partition's flags were applied."""
        self._placement: Placement = LocalPlacement(stream_of=self.streams.get)
        self._stop_listening = self._listen(self._placement)
        self._housekeeper: asyncio.Task | None = None
        self._compacting: set[str] = set()
        self.max_streams_per_user = 0
        """Streams one owner may hold (``check_quota``; 0: no limit). The server sets it from
        SecurityConfig.max_streams_per_user."""
        self._owned: Counter[str] = Counter()  # owner -> partitions of the streams held here
        self.alarms = ResourceAlarms(data_dir)
        """The resource alarms doors block publishers by (the server installs its own)."""
        self.vhost_exists: Callable[[str], bool] = lambda vhost: True
        """Whether a virtual host exists: ``create`` asks it for a stream of one other than
        ``/`` in the same step that creates it, so no stream outlives the deletion of its
        virtual host (a single server installs its access table's; a cluster checks in the
        Raft transition, cluster.state.create_stream)."""
        self.policy_overrides: Callable[[str], dict] = lambda name: {}
        """The LogConfig fields the RabbitMQ policy of a stream (by broker name) sets
        (riverlog.server.runtime_policies); applied to every stream added."""

    @property
    def placement(self) -> Placement:
        """Who leads each partition (doors ask here). The cluster runtime installs its own by
        assignment; ``leader_listeners`` then hear that placement's leader changes."""
        return self._placement

    @placement.setter
    def placement(self, placement: Placement) -> None:
        self._stop_listening()
        self._stop_listening = self._listen(placement)
        self._placement = placement

    def _listen(self, placement: Placement) -> Callable[[], None]:
        stops = (placement.add_leader_listener(self._leader_changed),
                 placement.add_flag_listener(self._flags_changed))
        return lambda: [stop() for stop in stops]

    def _flags_changed(self, name: str, index: int, flags: PartitionFlags) -> None:
        """Apply agreed flags to the local partition (its "pause" / "readonly" event times
        noted when a flag changes, saved with the stream), then tell ``flag_listeners``."""
        stream = self.streams.get(name)
        if stream is None or not 0 <= index < len(stream.partitions):
            return
        partition = stream.partitions[index]
        now = time.time_ns()
        if partition.paused != flags.paused:
            partition.paused = flags.paused
            partition.note_event("pause", now)
        if partition.readonly != flags.read_only:
            partition.readonly = flags.read_only
            partition.note_event("readonly", now)
        stream.save_metadata()
        for listener in list(self.flag_listeners):
            try:
                listener(stream, partition)
            except Exception:  # a door's bug must not keep the news from the other doors
                log.exception("flag change listener failed")

    def _leader_changed(self, stream: str, index: int) -> None:
        for listener in list(self.leader_listeners):
            try:
                listener(stream, index)
            except Exception:  # a door's bug must not keep the news from the other doors
                log.exception("leader change listener failed")

    # -- lifecycle ----------------------------------------------------------------------
    def open(self) -> None:
        """Register every stream folder; their partitions open lazily (partition.py). After
        a clean stop the streams' metadata comes from the clean-stop marker (clean_stop.py)
        and nothing else is read; after a crash each partition without a valid clean-close
        marker (one written since its last clean close) is checked now. A folder that
        cannot be read is logged and left alone."""
        os.makedirs(self.root, exist_ok=True)
        OPEN_FILES.keep_spares()  # for the cleanup of a creation that finds no descriptor
        stopped = clean_stop.take(self.root)
        collecting = gc.isenabled()
        gc.disable()  # the load makes only live objects (a fifth of 10,000 streams' load)
        try:
            self._load_streams(stopped or {})
        finally:
            if collecting:
                gc.enable()
        if stopped is None:
            self._check_partitions()

    def _check_partitions(self) -> None:
        began, checked = time.monotonic(), 0
        for stream in self.streams.values():
            for partition in stream.partitions:
                try:
                    checked += partition.check()
                except OSError as exc:  # it is checked again when it opens
                    log.error("cannot check %r: %s", partition, exc)
        log.info("start after a crash: %d partition(s) written since their clean close "
                 "checked in %.2f s", checked, time.monotonic() - began)

    def _load_streams(self, stopped: dict[str, dict]) -> None:
        root = self.root
        for folder in sorted(os.listdir(root)):
            path = f"{root}/{folder}"
            kept = clean_stop.metadata_of(stopped, folder, path, METADATA_FILE) if stopped \
                else None
            if kept is None and not os.path.isfile(f"{path}/{METADATA_FILE}"):
                continue
            try:
                stream = (Stream.load(path, self.log_defaults) if kept is None
                          else Stream.from_metadata(path, kept[0], self.log_defaults))
            except (OSError, ValueError, TypeError, KeyError) as exc:
                log.error("cannot open stream folder %s (skipped): %s", path, exc)
                continue
            for partition, summary in zip(stream.partitions, kept[1] if kept else ()):
                partition.preset_summary(summary)
            self._add(stream)
        log.debug("%d stream(s) registered", len(self.streams))

    def start(self) -> None:
        """Start the periodic housekeeping task (needs a running event loop)."""
        self._housekeeper = asyncio.get_running_loop().create_task(self._housekeeping())

    async def close(self) -> None:
        if self._housekeeper is not None:
            self._housekeeper.cancel()
            try:
                await self._housekeeper
            except asyncio.CancelledError:
                pass
        streams = list(self.streams.values())
        for stream in streams:
            await stream.close()
        self.streams.clear()
        if not os.path.isdir(self.root):
            return
        try:  # every partition's log closed and marked
            clean_stop.write(self.root, [(s.directory, s.metadata(defaults_too=False),
                                          [p.summary_at_stop() for p in s.partitions])
                                         for s in streams], METADATA_FILE)
        except OSError as exc:  # the next start checks the partitions, as after a crash
            log.warning("no clean-stop marker written: %s", exc)

    # -- streams ------------------------------------------------------------------------
    def get(self, name: str) -> Stream:
        """The stream called ``name``; raises ``StreamNotFoundError``."""
        try:
            return self.streams[name]
        except KeyError:
            raise StreamNotFoundError(f"stream {name!r} does not exist") from None

    def create(self, name: str, config: StreamConfig | None = None, *,
               internal: bool = False) -> Stream:
        """Create a stream. Raises ``StreamExistsError`` when the name is taken (also by a
        stream folder ``open`` could not read: its data is never replaced),
        ``ReservedStreamError`` for a reserved name unless ``internal`` (the server's own
        streams), ``InvalidArgumentError`` for an empty or too long name or bad settings,
        ``NoSuchVhostError`` for a stream of a virtual host that does not exist
        (``vhost_exists``), ``ResourceExhaustedError`` when no file descriptor can be had
        and ``OSError`` for other I/O failures; on any failure nothing of the stream is left
        on disk."""
        if not name or len(name.encode()) > MAX_NAME_BYTES:
            raise InvalidArgumentError(f"a stream name is 1 to {MAX_NAME_BYTES} bytes")
        if not internal:
            check_writable(name)
        if name in self.streams:
            raise StreamExistsError(f"stream {name!r} already exists")
        if hidden(name) and not self.vhost_exists(vhost_of(name)):
            raise NoSuchVhostError(f"no virtual host {vhost_of(name)!r} (deleted?)")
        path = os.path.join(self.root, folder_name(name))
        if os.path.isfile(os.path.join(path, METADATA_FILE)):  # ``open`` could not read it
            raise StreamExistsError(f"stream {name!r} exists on disk but could not be opened "
                                    f"(see the log); fix the disk and restart the server")
        if os.path.exists(path):  # a leftover of an interrupted delete (metadata file gone)
            shutil.rmtree(path)
        try:
            os.makedirs(path)
            stream = Stream(name, path, config or StreamConfig(), self.log_defaults)
            stream.save_metadata()
        except ValueError as exc:
            _remove_half_made(path)
            raise InvalidArgumentError(str(exc)) from None
        except OSError as exc:  # no descriptor, a full disk: nothing of the stream stays
            _remove_half_made(path)
            if isinstance(exc, ResourceExhaustedError) or exc.errno in OUT_OF_FILES:
                log.warning("creating stream %r failed: %s", name, exc)
                raise ResourceExhaustedError(
                    f"cannot create stream {name!r} now: the server has no file descriptor "
                    f"left ({exc.strerror or exc})") from None
            raise
        self._add(stream)
        log.info("created stream %r (%d partition(s))", name, len(stream.partitions))
        return stream

    def _add(self, stream: Stream) -> None:
        self.streams[stream.name] = stream
        overrides = self.policy_overrides(stream.name)
        if overrides:
            stream.apply_policy(overrides)
        if stream.config.owner is not None:
            self._owned[stream.config.owner] += len(stream.partitions)

    def owned(self, owner: str) -> int:
        """Partitions of the streams held here whose StreamConfig.owner is ``owner`` (each
        partition counts as one stream against ``max_streams_per_user``)."""
        return self._owned[owner]

    def check_quota(self, owner: str | None, streams: int = 1) -> None:
        """Raise ``LimitExceededError`` when ``owner`` may not own ``streams`` more streams
        (``max_streams_per_user``; RabbitMQ's per-user ``max-queues``); each partition counts
        as one stream (``owned``), so ``streams`` is the partitions to be created. None (the
        server, an anonymous client) is not limited. In a cluster each server counts the
        streams it holds a replica of (the doors check on the server they are on)."""
        limit = self.max_streams_per_user
        if owner is None or not limit:
            return
        held = self._owned[owner]
        if held + streams > limit:
            raise LimitExceededError(
                f"user {owner!r} owns {held} stream(s) (each partition counts); {streams} more "
                f"would pass the limit of {limit} per user (riverlog.limits.streams.per.user)")

    def delete(self, name: str, internal: bool = False) -> None:
        """Delete a stream and its data. Readers waiting on it get ``LogClosedError``;
        deletion listeners are told. Raises ``StreamNotFoundError``, or
        ``ReservedStreamError`` for an internal stream unless ``internal`` (a cluster
        member whose replica of ``__cursors`` was deleted)."""
        if not internal:
            check_writable(name)
        stream = self.get(name)
        del self.streams[name]
        if stream.config.owner is not None:
            self._owned[stream.config.owner] -= len(stream.partitions)
        os.unlink(os.path.join(stream.directory, METADATA_FILE))
        for partition in stream.partitions:
            partition.delete()
        shutil.rmtree(stream.directory, ignore_errors=True)
        log.info("deleted stream %r", name)
        for listener in list(self.deletion_listeners):
            try:
                listener(stream)
            except Exception:  # a door's bug must not stop the deletion or other doors
                log.exception("stream deletion listener failed")

    # -- housekeeping -------------------------------------------------------------------
    async def _housekeeping(self) -> None:
        loop = asyncio.get_running_loop()
        last_compaction: dict[str, float] = {}
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL_S)
            for stream in list(self.streams.values()):
                for partition in stream.partitions:
                    try:
                        partition.housekeeping()
                    except OSError as exc:
                        log.error("housekeeping of %r: %s", partition, exc)
                interval = (stream.config.cleaner_interval_ms or 300_000) / 1000
                if (stream.partitions[0].config.compact and stream.name not in self._compacting
                        and loop.time() - last_compaction.get(stream.name, 0) >= interval):
                    last_compaction[stream.name] = loop.time()
                    loop.create_task(self._compact(stream))

    async def _compact(self, stream: Stream) -> None:
        self._compacting.add(stream.name)
        try:
            for partition in stream.partitions:
                if self.streams.get(stream.name) is not stream:
                    return
                if not partition.is_open:  # unchanged since it was open; compacted once open
                    continue
                # a follower's log applies its leader's compaction; one still compacting (a
                # new leader's, applying its former leader's point) is done next time
                if partition.log.follows_compaction or partition.log.compacting:
                    continue
                result = await partition.log.compact(record_key)
                if result.rewritten:
                    log.info("compacted %r: %d -> %d records", partition,
                             result.records_before, result.records_after)
        except Exception:
            log.exception("compaction of stream %r failed", stream.name)
        finally:
            self._compacting.discard(stream.name)
