# Converting a table of the Parquet mirror (riverlog.tables.manifest's layout) into the
# stream's Iceberg table (riverlog.tables.iceberg_writer): what only the old table holds is
# carried over, the rest is written from the log, then the old folder goes.
# Rules: only what the log no longer has is read from the old files (an archived table:
# ``streams.table.archive``): the run of checked files that reaches the log's first offset
# without a gap (riverlog.tables.read.TableFiles), filtered to the offsets below it; a
# damaged or missing old file is reported and left out (read.py's rules), never guessed.
# The old folder is removed only after the Iceberg table holds the partition.
from __future__ import annotations

import posixpath

from . import manifest as mf
from .read import TableFiles
from .storage import Storage


def archived_rows(table_dir: str, stream: str, partition: int, log_first: int):
    """``(first, [pyarrow.Table])``: the offsets ``[first, log_first)`` the old table of
    ``stream``'s ``partition`` under ``table_dir`` holds that the log does not, as rows of
    the source's schema; ``(log_first, [])`` when it holds none (or there is no old table)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    files = TableFiles(table_dir)
    first = files.first(stream, partition, log_first)
    if first >= log_first:
        return log_first, []
    out = []
    for f, path, meta in files.usable(stream, partition, first, log_first):
        rows = pq.ParquetFile(path, metadata=meta, filesystem=files.storage.fs).read()
        out.append(rows.filter(pc.less(rows.column("offset"), log_first)))
    return first, out


def remove_old(table_dir: str, stream: str, partition: int) -> bool:
    """Remove the old table folder of ``stream``'s ``partition`` (and the stream's folder
    once empty); True when there was one."""
    storage = Storage(table_dir)
    directory = mf.partition_dir(storage.root, stream, partition)
    if storage.read_bytes(posixpath.join(directory, mf.MANIFEST)) is None \
            and not storage.names(directory):
        return False
    storage.delete_dir(directory)
    parent = mf.stream_dir(storage.root, stream)
    if not storage.names(parent) and not _subdirs(storage, parent):
        storage.delete_dir(parent)
    return True


def _subdirs(storage: Storage, directory: str) -> list[str]:
    from pyarrow import fs

    infos = storage.fs.get_file_info(fs.FileSelector(directory, allow_not_found=True))
    return [i.path for i in infos if i.type == fs.FileType.Directory]
