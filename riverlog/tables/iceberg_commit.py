# A writer pass's snapshot committed to a stream's Iceberg table that several writers share:
# in a cluster each partition's leader writes its partitions' files into the stream's one
# table (riverlog.tables.iceberg_writer makes the pass; this module commits it).
# Rules: Iceberg's optimistic concurrency: a commit asserts that the table's current snapshot
# is the one it was made on (pyiceberg's AssertRefSnapshotId; the catalog swaps the metadata
# pointer atomically); on CommitFailedException the table is read again and the commit made
# again on top of the new snapshot with the summary merged: the other partitions' entries from
# the new snapshot, this writer's partitions' from its pass (pyiceberg's own retry would
# commit the stale summary again, so riverlog's tables have it off: iceberg.NO_RETRIES).
# Fencing: every snapshot's summary holds each partition's leader epoch (EPOCHS_PROPERTY); a
# writer never commits for a partition whose epoch in the table is newer than its own
# (Fenced), and a new leader claims its partitions (claim: a snapshot without files) before
# it writes any, so a former leader's commit made after that is refused. A retry finding
# this writer's partitions changed in the table since the pass read it gives up (Conflict):
# the next pass plans again. A table worker whose server is gone commits nothing
# (riverlog.tables.lifeline, checked right before each commit).
from __future__ import annotations

import json
import logging
import random
import time

from . import iceberg as ice
from . import lifeline

log = logging.getLogger("riverlog.tables")

COMMIT_TRIES = 20
"""Commits tried per pass (the first and the retries after conflicts); then the pass fails
and the next one plans again."""
RETRY_WAIT_S = (0.02, 1.0)
"""The most a retry waits: the first value, doubled each retry up to the second; the wait
is a random part of it (full jitter, so writers that collided spread out)."""


class Fenced(Exception):
    """A partition's leader epoch in the table is newer than this writer's: another server
    leads it now and this one never commits for it again."""


class Conflict(Exception):
    """Another writer committed for this writer's partitions since the pass read the table
    (e.g. a leader that is being replaced, with the same epoch): the pass is planned again."""


def fenced(snapshot, epochs: dict[int, int]) -> dict[int, str]:
    """Partition -> the reason, for each partition of ``epochs`` (partition -> this writer's
    leader epoch) whose epoch in ``snapshot`` is newer."""
    held = ice.snapshot_epochs(snapshot)
    return {p: f"partition {p}: this server's leader epoch {e} is older than the table's "
               f"{held[p]} (another server leads it now; this one no longer writes it)"
            for p, e in epochs.items() if held.get(p, 0) > e}


def claim(table, stream: str, epochs: dict[int, int]):
    """Record ``epochs`` in ``table`` (a snapshot without files) when one is newer than the
    table's, before this writer writes files for it; returns the table. Raises Fenced,
    Conflict, the catalog's errors."""
    snapshot = table.current_snapshot()
    held = ice.snapshot_epochs(snapshot)
    if all(held.get(p, 0) == e for p, e in epochs.items()):
        return table
    return commit(table, stream, snapshot, epochs, ice.snapshot_offsets(snapshot),
                  ice.snapshot_segments(snapshot), [], [])[0]


def commit(table, stream: str, base, epochs: dict[int, int], offsets: dict, segments: dict,
           removed: list, added: list) -> tuple[object, int]:
    """Commit one snapshot on ``table`` made on its snapshot ``base``: the data files
    ``added`` (pyiceberg DataFiles, written), ``removed`` deleted, the summary recording, for
    this writer's partitions (those of ``epochs``), ``offsets`` (partition -> [first, end)),
    ``segments`` (partition -> {base: [inode, size]}) and ``epochs``. Returns the table after
    the commit and how many conflicts were retried. Raises Fenced, Conflict (the added files
    are then this writer's to delete), CommitFailedException (still conflicting after
    COMMIT_TRIES), the catalog's errors."""
    from pyiceberg.exceptions import CommitFailedException

    mine = set(epochs)
    want = (_part(offsets, mine), _part(segments, mine))
    was = (_part(ice.snapshot_offsets(base), mine), _part(ice.snapshot_segments(base), mine),
           _part(ice.snapshot_epochs(base), mine))
    for attempt in range(COMMIT_TRIES):
        snapshot = table.current_snapshot()
        refused = fenced(snapshot, epochs)
        if refused:
            raise Fenced("; ".join(refused.values()))
        if _id(snapshot) != _id(base) and (
                _part(ice.snapshot_offsets(snapshot), mine),
                _part(ice.snapshot_segments(snapshot), mine),
                _part(ice.snapshot_epochs(snapshot), mine)) != was:
            raise Conflict(f"partitions {sorted(mine)} changed in the table since this pass "
                           f"read it (another writer of them); planned again")
        props = {ice.OFFSETS_PROPERTY: _merged(ice.snapshot_offsets(snapshot), want[0], mine),
                 ice.SEGMENTS_PROPERTY: _merged(ice.snapshot_segments(snapshot), want[1], mine,
                                                lambda segs: {b: list(v)
                                                              for b, v in segs.items()}),
                 ice.EPOCHS_PROPERTY: _merged(ice.snapshot_epochs(snapshot), epochs, mine)}
        tx = ice.transaction(table)  # its staged metadata built once per change
        update = tx.update_snapshot(snapshot_properties=props)
        with (update.overwrite() if removed else update.merge_append()) as producer:
            for f in removed:
                producer.delete_data_file(f)
            for f in added:
                producer.append_data_file(f)
        lifeline.check()  # a worker whose server is gone never commits
        try:
            return tx.commit_transaction(), attempt
        except CommitFailedException as exc:
            if attempt + 1 == COMMIT_TRIES:
                raise
            wait = min(RETRY_WAIT_S[0] * 2 ** attempt, RETRY_WAIT_S[1])
            log.info("table of %r: another writer committed first (%s); committing again on "
                     "its snapshot", stream, exc)
            time.sleep(random.uniform(0, wait))
            table = table.refresh()
    raise AssertionError("unreachable")


def _id(snapshot) -> int | None:
    return None if snapshot is None else snapshot.snapshot_id


def _part(values: dict, mine: set) -> dict:
    return {p: v for p, v in values.items() if p in mine}


def _merged(theirs: dict, ours: dict, mine: set, shape=lambda v: v) -> str:
    """The summary value: ``theirs`` for partitions not in ``mine``, ``ours`` for those."""
    merged = {p: shape(v) for p, v in theirs.items() if p not in mine}
    merged.update({p: shape(v) for p, v in ours.items() if p in mine})
    return json.dumps({str(k): v for k, v in sorted(merged.items())}, separators=(",", ":"))
