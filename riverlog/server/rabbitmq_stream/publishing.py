# Publishing on the RabbitMQ Stream door: DeclarePublisher, Publish (v1 and v2),
# QueryPublisherSequence, DeletePublisher, and the confirms (PublishConfirm, PublishError).
# Owns a connection's publishers, the entries staged for writing and the count of unconfirmed
# publishing ids.
# Rules: writes to the log happen in arrival order on the event loop, across the publishers of
# a connection too, in chunks of at most CHUNK_MAX_ENTRIES entries and CHUNK_MAX_BYTES bytes;
# a confirm goes out only when ``Partition.when_committed`` says the chunk is committed (the
# one commit pipeline: broker/partition.py), duplicates in a PublishConfirm of their own
# before the written ids' one, and no PublishConfirm names an id twice; a connection with more than max_unconfirmed ids
# unconfirmed is not read until they drop to resume_unconfirmed; in a cluster nothing is
# written unless this server leads the partition.
from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import Collection

from ...broker import Partition, Stream, check_writable
from ...errors import LogClosedError, LogError, ReservedStreamError
from ...log.chunk import ChunkFormatError, check_entry
from ...metrics import CONFIRM_RABBITMQ, RABBITMQ_STREAM, counters, error as count_error
from ...protocol.rabbitmq_stream import ResponseCode
from ...protocol.rabbitmq_stream import frames as f
from ...security.authz import CONSUME, PUBLISH
from .flow import UNCONFIRMED
from .link import Link

log = logging.getLogger("riverlog.rabbitmq_stream")

OK = ResponseCode.OK
# At most this much goes into one chunk: a chunk built from several Publish frames stays below
# what a client with the default frame_max (1 MiB) can receive in one Deliver, and holds no
# more entries than one of RabbitMQ's (osiris_writer writes one gen_batch_server batch per
# chunk, at most 8,192 messages), so `last` replays a short slice. 4,096 was measured the
# cheapest per published message among 2,048..16,384 (benchmarks/README.md).
CHUNK_MAX_BYTES = 1024 * 1024 - 64 * 1024
CHUNK_MAX_ENTRIES = 4096


class Publisher:
    """A declared publisher: ``name`` is the stream name the client declared it on,
    ``partition`` the partition of ``stream`` that name serves. ``published``,
    ``confirmed`` and ``errored`` count its messages (publishing ids) as RabbitMQ's
    publisher counters do (rabbit_stream_reader: messages_published, _confirmed, _errored)
    for the management API."""

    __slots__ = ("id", "reference", "stream", "partition", "name", "published", "confirmed",
                 "errored")

    def __init__(self, publisher_id: int, reference: str | None, stream: Stream,
                 partition: Partition, name: str) -> None:
        self.id = publisher_id
        self.reference = reference or None
        self.stream = stream
        self.partition = partition
        self.name = name
        self.published = self.confirmed = self.errored = 0


class _Staged:
    """Entries for one partition received in this batch of frames, in arrival order (whatever
    the publisher), not written yet: at most one chunk (``CHUNK_MAX_ENTRIES``,
    ``CHUNK_MAX_BYTES``), and the publishing ids to confirm once it is written."""

    __slots__ = ("entries", "size", "filters", "writers", "confirms", "duplicates",
                 "received")

    def __init__(self) -> None:
        self.received = time.monotonic()  # for the confirm latency metric
        self.entries: list[bytes] = []
        self.size = 0
        self.filters: set[str | None] = set()  # filter values (None: an entry without one)
        self.writers: dict[str, int] = {}  # reference -> highest publishing id held here
        self.confirms: dict[int, list[int]] = {}  # publisher id -> ids written here
        self.duplicates: dict[int, list[int]] = {}  # publisher id -> ids not written

    def full(self) -> bool:
        return len(self.entries) >= CHUNK_MAX_ENTRIES or self.size >= CHUNK_MAX_BYTES


def _split(ids: list[int], new: list[tuple[int, bytes]]) -> tuple[list[int], list[int]]:
    """``ids`` (a frame's publishing ids, in order) cut into those of the entries ``new``
    keeps (a subsequence of them, ids rising: ``Partition.new_entries``) and the
    duplicates. An id kept is the first one equal to the next kept id: an earlier equal id
    after the previous kept one would have been kept itself."""
    written, duplicates = [], []
    kept = iter(new)
    following = next(kept, None)
    for publishing_id in ids:
        if following is not None and publishing_id == following[0]:
            written.append(publishing_id)
            following = next(kept, None)
        else:
            duplicates.append(publishing_id)
    return written, duplicates


def _distinct_runs(ids: list[int]) -> list[tuple[int, ...]]:
    """``ids`` in order, cut into as few runs as possible with no id twice in one (a
    publisher without a reference may send an id again; a client that takes each confirmed
    id out of a map fails on meeting one twice in a frame)."""
    if len(set(ids)) == len(ids):
        return [tuple(ids)]
    runs, run, seen = [], [], set()
    for publishing_id in ids:
        if publishing_id in seen:
            runs.append(tuple(run))
            run, seen = [], set()
        run.append(publishing_id)
        seen.add(publishing_id)
    runs.append(tuple(run))
    return runs


def _fitting(entries: list[bytes], room: int) -> int:
    """How many of ``entries``, from the first, fit in ``room`` bytes."""
    for i, entry in enumerate(entries):
        room -= len(entry)
        if room < 0:
            return i
    return len(entries)


class Publishing:
    """The publishing commands of one connection (``link``). ``staged`` is non-empty while
    publishes wait to be written: the connection calls ``flush`` before any other command,
    so later commands see every earlier publish written, and ``after_frames`` after each
    batch of frames read."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.broker = link.broker
        self.config = link.config
        self.send = link.send
        self.publishers: dict[int, Publisher] = {}
        self.unconfirmed = 0
        self.staged: dict[Partition, _Staged] = {}  # publishes not written yet
        self._flush_scheduled = False

    def on_declare_publisher(self, frame: f.DeclarePublisher) -> None:
        code = self.declare_publisher(frame.publisher_id, frame.reference, frame.stream)
        self.send(f.DeclarePublisherResponse(frame.correlation_id, code))

    def declare_publisher(self, publisher_id: int, reference: str | None, name: str) -> int:
        """Add a publisher to this connection (also for the draft dialect's Publish); returns
        the response code: OK, STREAM_DOES_NOT_EXIST, ACCESS_REFUSED, PRECONDITION_FAILED
        (the id, or the reference on that stream, is taken; a reserved stream, as RabbitMQ
        answers Create for its reserved amq.* names; a resource alarm holds, as
        rabbit_stream_reader answers declare_publisher on a connection it blocked) or
        STREAM_NOT_AVAILABLE when another
        server leads the partition (RabbitMQ's code when the leader cannot be reached:
        clients ask Metadata again and connect to the leader)."""
        try:
            check_writable(name)
        except ReservedStreamError:
            return ResponseCode.PRECONDITION_FAILED
        link = self.link
        found = link.resolve(name)
        if found is None:
            return link.missing(name)
        stream, partition = found
        taken = publisher_id in self.publishers or (reference and any(
            p.reference == reference and p.partition is partition
            for p in self.publishers.values()))
        if not link.may(name, PUBLISH, found):
            return ResponseCode.ACCESS_REFUSED
        if taken:
            return ResponseCode.PRECONDITION_FAILED
        if self.broker.alarms.blocked:
            log.info("cannot create publisher %d on stream %s: publishers are blocked (%s)",
                     publisher_id, name, self.broker.alarms.describe())
            return ResponseCode.PRECONDITION_FAILED
        if not self.broker.placement.leads(stream.name, partition.index):
            return ResponseCode.STREAM_NOT_AVAILABLE
        self.publishers[publisher_id] = Publisher(publisher_id, reference, stream, partition,
                                                  name)
        return OK

    def on_publish(self, frame: f.Publish | f.PublishV2) -> None:
        """Stage the new entries after those already staged for the partition, whatever
        their publisher, so the log keeps the order the frames arrived in. The staged
        entries are written as one chunk once the frames at hand are handled (RabbitMQ too
        merges queued publish frames into one chunk), or as soon as the chunk is full: a
        frame of more entries than a chunk holds becomes several chunks. What is staged is
        written first when this frame's set of filter values (None for an entry without
        one; a Publish v1 frame has only None) is not the staged one, so frames with other
        filter values never share a chunk. The frame's ids are confirmed with the chunk
        holding its last entry: its duplicates (``Partition.new_entries``) in a PublishConfirm
        of their own, then the written ids (``_confirm``)."""
        entries = frame.entries
        if not entries:
            return
        pub = self.publishers.get(frame.publisher_id)
        ids = [e[0] for e in entries]
        if pub is None or self.broker.streams.get(pub.stream.name) is not pub.stream:
            code = (ResponseCode.PUBLISHER_DOES_NOT_EXIST if pub is None
                    else ResponseCode.STREAM_DOES_NOT_EXIST)
            self.publish_error(frame.publisher_id, ids, code)
            return
        partition = pub.partition
        if partition.readonly:  # set through Liftbridge's SetStreamReadonly
            self.publish_error(frame.publisher_id, ids, ResponseCode.ACCESS_REFUSED)
            return
        if self.config.validate_sub_batches:
            entries = self._readable(frame.publisher_id, entries)
            if not entries:
                return
            ids = [e[0] for e in entries]
        self.unconfirmed += len(ids)
        pub.published += len(ids)
        flow = self.link.flow
        if self.unconfirmed > self.config.max_unconfirmed and not flow.holds(UNCONFIRMED):
            flow.hold(UNCONFIRMED)
        if type(frame) is f.Publish:
            pairs, values = entries, {None}
        else:  # each chunk gets the values of the whole frame: a superset is fine
            pairs, values = [(e[0], e[2]) for e in entries], {e[1] for e in entries}
        staged = self._stage(partition)
        if staged.entries and staged.filters != values:
            # a chunk's bloom filter then names only one frame's values (issue 20 item 6):
            # a filtered consumer skips the chunks of the frames it does not want
            staged = self._restage(partition)
        new = partition.new_entries(pub.reference, pairs, staged.writers)
        written, duplicates = (ids, ()) if len(new) == len(ids) else _split(ids, new)
        start, n = 0, len(new)
        while start < n:
            if staged.full():
                staged = self._restage(partition)
            piece = new[start:start + CHUNK_MAX_ENTRIES - len(staged.entries)]
            data = [entry for _, entry in piece]
            size = sum(map(len, data))
            if staged.size + size > CHUNK_MAX_BYTES:
                cut = _fitting(data, CHUNK_MAX_BYTES - staged.size)
                if not cut and staged.entries:
                    staged = self._restage(partition)
                    continue
                cut = cut or 1  # an entry larger than a chunk's bytes: a chunk of its own
                piece, data = piece[:cut], data[:cut]
                size = sum(map(len, data))
            staged.entries += data
            staged.size += size
            staged.filters.update(values)
            if pub.reference:
                staged.writers[pub.reference] = piece[-1][0]
            start += len(piece)
        staged.confirms.setdefault(frame.publisher_id, []).extend(written)
        if duplicates:
            staged.duplicates.setdefault(frame.publisher_id, []).extend(duplicates)
        if staged.full():
            self._write_staged(partition)

    def _readable(self, publisher_id: int, entries: tuple) -> tuple:
        """The entries (publishing id first, entry bytes last) that can be read to their last
        record; the others are refused with 0x11 (riverlog.stream.validate.sub.batches)."""
        readable, refused = [], []
        for entry in entries:
            try:
                check_entry(entry[-1])
                readable.append(entry)
            except ChunkFormatError as exc:
                log.warning("publisher %d: entry %d refused: %s", publisher_id, entry[0], exc)
                refused.append(entry[0])
        if refused:
            self.publish_error(publisher_id, refused, ResponseCode.PRECONDITION_FAILED)
        return tuple(readable)

    def after_frames(self) -> None:
        """After a batch of frames: write the staged publishes once this turn's reads are
        done (the event loop may hand the connection more of the socket's bytes first: libuv
        reads up to 32 times per readiness), making bigger chunks."""
        if self.staged and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write everything staged, one chunk per partition."""
        self._flush_scheduled = False
        for partition in list(self.staged):
            self._write_staged(partition)

    def _stage(self, partition: Partition) -> _Staged:
        """What is staged for ``partition`` (a new, empty stage when nothing is)."""
        staged = self.staged.get(partition)
        if staged is None:
            staged = self.staged[partition] = _Staged()
        return staged

    def _restage(self, partition: Partition) -> _Staged:
        """Write the full stage of ``partition``; returns its next, empty one."""
        self._write_staged(partition)
        return self._stage(partition)

    def _write_staged(self, partition: Partition) -> None:
        """Write what is staged for ``partition`` as one chunk, then confirm once it is
        committed (``Partition.when_committed``). Duplicates are confirmed once everything
        written before them is committed, their originals included. In a cluster, nothing
        is written unless this server leads the partition (PublishError 0x06: the leader
        moved, the MetadataUpdate of the change follows or came)."""
        staged = self.staged.pop(partition)
        placement = self.broker.placement
        if placement.clustered and not placement.leads(partition.stream, partition.index):
            self._fail_confirms(staged, ResponseCode.STREAM_NOT_AVAILABLE)
            return
        if staged.entries:
            try:
                offsets = partition.write_entries(staged.entries, writers=staged.writers,
                                                  filter_values=staged.filters)
            except (OSError, LogError) as exc:
                log.error("publish to %r failed: %s", partition.stream, exc)
                code = (ResponseCode.STREAM_DOES_NOT_EXIST if isinstance(exc, LogClosedError)
                        else ResponseCode.INTERNAL_ERROR)
                self._fail_confirms(staged, code)
                return
            counters(partition.stream, RABBITMQ_STREAM).published(len(offsets), staged.size)
        last = offsets[-1] if staged.entries else partition.next_offset - 1
        if staged.confirms or staged.duplicates:
            partition.when_committed(
                last, partial(self._confirm, staged),
                lambda _: self._fail_confirms(staged, ResponseCode.INTERNAL_ERROR),
                self.link.pending)

    def _confirm(self, staged: _Staged) -> None:
        """Confirm what ``staged`` held, as RabbitMQ frames it (osiris_writer: the
        duplicates of a batch are sent as written events before its written ids, each
        event one PublishConfirm per publisher, ids in arrival order): for each publisher
        its duplicates' PublishConfirm, then for each its written ids'; an id that would
        appear twice in one frame starts the next frame (``_distinct_runs``)."""
        n = 0
        latency = time.monotonic() - staged.received
        publishers = self.publishers
        for confirms in (staged.duplicates, staged.confirms):
            for publisher_id, ids in confirms.items():
                for run in _distinct_runs(ids):
                    self.send(f.PublishConfirm(publisher_id, run))
                    CONFIRM_RABBITMQ.observe(latency)  # one per frame (docs/operations.md)
                pub = publishers.get(publisher_id)
                if pub is not None:
                    pub.confirmed += len(ids)
                n += len(ids)
        self._unconfirmed_done(n)

    def _fail_confirms(self, staged: _Staged, code: int) -> None:
        """PublishError with ``code`` for every id ``staged`` was to confirm."""
        for confirms in (staged.duplicates, staged.confirms):
            for publisher_id, ids in confirms.items():
                self.publish_error(publisher_id, ids, code)
                self._unconfirmed_done(len(ids))

    def publish_error(self, publisher_id: int, ids: list[int], code: int) -> None:
        """PublishError (0x04) with ``code`` for every id, counted as one error."""
        self.send(f.PublishError(publisher_id, tuple((i, code) for i in ids)))
        count_error(RABBITMQ_STREAM, code)
        pub = self.publishers.get(publisher_id)
        if pub is not None:
            pub.errored += len(ids)

    def _unconfirmed_done(self, n: int) -> None:
        self.unconfirmed -= n
        flow = self.link.flow
        if self.unconfirmed <= self.config.resume_unconfirmed and flow.holds(UNCONFIRMED):
            flow.release(UNCONFIRMED)

    def on_query_publisher_sequence(self, frame: f.QueryPublisherSequence) -> None:
        """Needs the read (consume) permission, as rabbit_stream_reader checks it
        (check_read_permitted), not write: a publish-only user cannot name its publisher."""
        link = self.link
        found = link.resolve(frame.stream)
        if not link.may(frame.stream, CONSUME, found):
            self.send(f.QueryPublisherSequenceResponse(
                frame.correlation_id, ResponseCode.ACCESS_REFUSED, 0))
            return
        if found is None:
            self.send(f.QueryPublisherSequenceResponse(
                frame.correlation_id, link.missing(frame.stream), 0))
            return
        sequence = found[1].publishers.get(frame.reference)
        self.send(f.QueryPublisherSequenceResponse(
            frame.correlation_id, OK, 0 if sequence is None else sequence))

    def on_delete_publisher(self, frame: f.DeletePublisher) -> None:
        code = OK if self.publishers.pop(frame.publisher_id, None) else \
            ResponseCode.PUBLISHER_DOES_NOT_EXIST
        self.send(f.DeletePublisherResponse(frame.correlation_id, code))

    def drop(self, partitions: Collection[Partition]) -> list[str]:
        """Drop the publishers on ``partitions``; the stream names they were declared on."""
        touched = []
        for pub_id, pub in list(self.publishers.items()):
            if pub.partition in partitions:
                del self.publishers[pub_id]
                touched.append(pub.name)
        return touched
