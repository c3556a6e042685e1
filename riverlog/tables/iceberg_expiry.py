# Snapshot expiry of a stream's Iceberg table and the removal of the files it frees: the
# manifest list of each expired snapshot, the manifests and the data files that only expired
# snapshots referenced (what Iceberg's own ExpireSnapshots action deletes, its
# ReachableFileCleanup). Used by riverlog.tables.iceberg_writer.
# Rules: pyiceberg expires (table.maintenance.expire_snapshots, a commit the catalog swaps in
# atomically or refuses); the files deleted are those reachable from the snapshots before the
# expiry and not from those of the table read again after its commit (so every snapshot a
# writer committed meanwhile is kept whole). Nothing is deleted by its absence from the
# table: a file no snapshot references (another writer's commit in flight, a manifest written
# moments ago) is never one an expired snapshot referenced, so it is left alone; a commit in
# flight can only land on the current snapshot, which never expires. Manifest lists and
# manifests never change, so each is read once (Listings keeps what it read).
from __future__ import annotations

import logging

from . import iceberg as ice
from . import lifeline

log = logging.getLogger("riverlog.tables")


class Listings:
    """What the snapshots of one table reference, read once per manifest list and manifest.
    ``reachable(table)`` gives the files (pyarrow.fs paths) of ``table``'s snapshots."""

    def __init__(self) -> None:
        self._lists: dict[str, tuple] = {}  # manifest list location -> its ManifestFiles
        self._manifests: dict[str, frozenset] = {}  # manifest location -> its data files

    def reachable(self, table) -> tuple[set[str], set[str], set[str]]:
        """``(manifest lists, manifests, data files)`` the snapshots of ``table`` reference
        (pyarrow.fs paths). What no snapshot references any more is forgotten. Raises
        OSError and pyiceberg's errors when a manifest cannot be read."""
        lists, manifests, data = {}, {}, set()
        for snapshot in table.snapshots():
            found = self._lists.get(snapshot.manifest_list)
            if found is None:
                found = tuple(snapshot.manifests(table.io))
            lists[snapshot.manifest_list] = found
            for manifest in found:
                path = manifest.manifest_path
                if path not in manifests:
                    files = self._manifests.get(path)
                    if files is None:
                        files = frozenset(ice.fs_path(e.data_file.file_path)
                                          for e in manifest.fetch_manifest_entry(table.io))
                    manifests[path] = files
                    data |= files
        self._lists, self._manifests = lists, manifests
        return ({ice.fs_path(p) for p in lists}, {ice.fs_path(p) for p in manifests}, data)


def expirable(table, cutoff_ms: int) -> bool:
    """Whether ``table`` has a snapshot older than ``cutoff_ms`` (ms since the epoch) that is
    not the current one (the only kind that expires)."""
    current = table.current_snapshot()
    return any(s.timestamp_ms < cutoff_ms for s in table.snapshots()
               if current is None or s.snapshot_id != current.snapshot_id)


def expire(table, cutoff_ms: int, listings: Listings, storage, stream: str):
    """Expire ``table``'s snapshots older than ``cutoff_ms`` (ms since the epoch; never the
    current one) and delete, through ``storage`` (riverlog.tables.storage.Storage), the
    manifest lists, manifests and data files only they referenced. Returns the table read
    again. Raises pyiceberg's CommitFailedException (another writer committed first: nothing
    expired or deleted), OSError, the catalog's errors."""
    import datetime

    cutoff = datetime.datetime.fromtimestamp(cutoff_ms / 1000, datetime.timezone.utc)
    before = listings.reachable(table)
    lifeline.check()  # a worker whose server is gone never commits
    table.maintenance.expire_snapshots().older_than(cutoff).commit()
    table = table.refresh()
    after = listings.reachable(table)
    lists, manifests, data = (b - a for b, a in zip(before, after))
    log.info("table of %r: snapshots expired; deleting %d manifest lists, %d manifests and "
             "%d data files no remaining snapshot references", stream, len(lists),
             len(manifests), len(data))
    for path in sorted(manifests) + sorted(lists) + sorted(data):
        storage.delete(path)
    return table
