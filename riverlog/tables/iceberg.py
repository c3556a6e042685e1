# Streams as Apache Iceberg tables: the catalog, a stream's table (schema, partition spec,
# sort order) and what a snapshot says about the log. Shared by the writer
# (riverlog.tables.iceberg_writer) and the readers (Spark's read_table, pandas, DuckDB).
# Rules: everything Iceberg is pyiceberg's (no hand-written metadata); one table per
# stream, ``riverlog.<stream>`` in the catalog; format version 2; the schema is the riverlog
# source's (riverlog.spark.arrow.arrow_schema), partitioned by the stream partition
# (identity) and day(timestamp), sorted by offset. Every snapshot the writer commits carries
# in its summary, under OFFSETS_PROPERTY, the committed offset range ``[first, end)`` the
# table holds per stream partition (JSON ``{"<partition>": [first, end]}``): where the table
# ends and the log begins, and under EPOCHS_PROPERTY the leader epoch of the writer of each
# partition (a cluster's leaders share the table: riverlog.tables.iceberg_commit). The
# catalog's FileIO reaches a table folder on object storage with the folder URI's
# credentials (riverlog.tables.iceberg_io), and readers open data files on the folder's
# filesystem (riverlog.tables.storage.open_uri). pyiceberg and pyarrow are imported in the
# functions.
from __future__ import annotations

import functools
import json
import logging
import os
import time
import urllib.parse

from .iceberg_io import io_properties, warehouse

log = logging.getLogger("riverlog.tables")

NAMESPACE = "riverlog"
OFFSETS_PROPERTY = "riverlog.offsets"
"""Snapshot summary key: per partition, the committed offsets ``[first, end)`` held."""
SEGMENTS_PROPERTY = "riverlog.segments"
"""Snapshot summary key: per partition, ``{base offset: [inode, size]}`` of each sealed
segment written whole (so a segment compaction rewrote is noticed and written again)."""
EPOCHS_PROPERTY = "riverlog.epochs"
"""Snapshot summary key: per partition, the leader epoch of the server that writes it."""
CREATED_PROPERTY = "riverlog.created-ns"
"""Table property: the stream's creation time (a stream made again gets a new table)."""
NO_RETRIES = "commit.retry.num-retries"
"""Table property: pyiceberg's commit retries (0 on riverlog's tables)."""
CATALOG_FILE = "catalog.db"
"""The embedded SQL catalog's SQLite file in the table folder."""


class CatalogError(Exception):
    """The catalog cannot be reached or refused a request; the message says which."""


def catalog_uri(table_dir: str, catalog: str | None) -> str:
    """The catalog to use: ``catalog`` (``streams.table.catalog``: a REST catalog's
    ``http(s)://`` URI or a SQLAlchemy URL such as ``sqlite:////path/catalog.db`` or
    ``postgresql+psycopg2://...``), else the embedded SQLite catalog CATALOG_FILE in the
    local table folder ``table_dir``. Raises ValueError when there is neither (a table
    folder that is a URI needs an explicit catalog)."""
    if catalog:
        return catalog
    if "://" in table_dir and not table_dir.startswith("file://"):
        raise ValueError("streams.table.catalog: a table folder on object storage needs a "
                         "catalog every server reaches (a REST catalog or an SQL URL)")
    path = urllib.parse.urlsplit(table_dir).path if "://" in table_dir else table_dir
    return "sqlite:///" + os.path.join(os.path.abspath(path), CATALOG_FILE)


def embedded_catalog(table_dir: str) -> str | None:
    """The URI of the embedded SQLite catalog (CATALOG_FILE) of the local table folder
    ``table_dir`` when that file exists (a server wrote Iceberg tables there), else None."""
    try:
        uri = catalog_uri(table_dir, None)
    except ValueError:
        return None
    return uri if os.path.exists(uri[len("sqlite:///"):]) else None


def load_catalog(table_dir: str, catalog: str | None = None):
    """The pyiceberg catalog named by catalog_uri (REST for http(s), else SQL), whose
    FileIO reaches the table folder ``table_dir`` (io_properties: credentials, endpoint,
    region of an ``s3://`` URI). Raises CatalogError when it cannot be opened, ValueError
    for a table folder URI pyiceberg cannot be told (io_properties)."""
    uri = catalog_uri(table_dir, catalog)
    props = io_properties(table_dir)
    try:
        if uri.startswith(("http://", "https://")):
            from pyiceberg.catalog.rest import RestCatalog
            return RestCatalog(NAMESPACE, uri=uri, warehouse=warehouse(table_dir), **props)
        if uri.startswith("sqlite:///"):
            os.makedirs(os.path.dirname(uri[len("sqlite:///"):]), exist_ok=True)
        return _sql_catalog(uri, warehouse(table_dir), props)
    except Exception as exc:  # pyiceberg raises many types (sqlalchemy, requests, its own)
        raise CatalogError(f"catalog {redacted(uri)}: {exc}") from exc


def _sql_catalog(uri: str, location: str, props: dict[str, str], tries: int = 5):
    """pyiceberg's SqlCatalog on ``uri`` (``props``: its FileIO properties). Opening one creates its tables when they are
    missing, and processes opening a new catalog at once (a cluster's servers, a reader
    beside the writer) race between its check and its CREATE TABLE: "table iceberg_tables
    already exists" (or SQLite's "database is locked"). Such an error is tried again, up to
    ``tries`` times; the last one is raised (sqlalchemy.exc.OperationalError; PostgreSQL
    raises ProgrammingError or IntegrityError for the same race)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    for attempt in range(tries):
        try:
            return SqlCatalog(NAMESPACE, uri=uri, warehouse=location, **props)
        except (OperationalError, ProgrammingError, IntegrityError):
            if attempt == tries - 1:
                raise
            time.sleep(0.05 * (attempt + 1))


def identifier(stream: str) -> tuple[str, str]:
    """The table of ``stream`` in the catalog: ``("riverlog", stream)``."""
    return (NAMESPACE, stream)


def create_table(catalog, table_dir: str, stream: str, created_ns: int,
                 compression: str = "zstd"):
    """Create ``stream``'s table (format v2, riverlog's schema, partitioned by partition and
    day(timestamp), sorted by offset, Parquet data files with the codec ``compression``;
    metadata files beyond Iceberg's write.metadata.previous-versions-max, 100, deleted at
    each commit: a commit per pass writes one, as large as all the snapshots kept) at
    ``<warehouse>/riverlog/<stream folder>``; the table another writer created meanwhile
    when it exists (the SQL catalog refuses the creation with TableAlreadyExistsError, or
    CommitFailedException when the other table was there as it looked). pyiceberg's own commit retries are off (``commit.retry.num-retries``
    0): they would commit the stale summary again (riverlog.tables.iceberg_commit retries)."""
    from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError
    from pyiceberg.transforms import DayTransform, IdentityTransform

    from ..broker.broker import folder_name  # the broker's import is not for Spark workers
    from ..spark.arrow import arrow_schema

    catalog.create_namespace_if_not_exists(NAMESPACE)
    location = f"{warehouse(table_dir).rstrip('/')}/{NAMESPACE}/{folder_name(stream)}"
    tx = catalog.create_table_transaction(
        identifier(stream), schema=arrow_schema(), location=location,
        properties={"format-version": "2", CREATED_PROPERTY: str(created_ns),
                    "write.parquet.compression-codec": compression, NO_RETRIES: "0",
                    "write.metadata.delete-after-commit.enabled": "true"})
    with tx.update_spec() as spec:
        spec.add_identity("partition")
        spec.add_field("timestamp", DayTransform(), "timestamp_day")
    with tx.update_sort_order() as order:
        order.asc("offset", IdentityTransform())
    try:
        tx.commit_transaction()
    except (TableAlreadyExistsError, CommitFailedException):
        pass  # another server's writer made it first (before or after the catalog looked)
    return catalog.load_table(identifier(stream))


def without_retries(table):
    """``table`` with pyiceberg's commit retries off (NO_RETRIES "0"; riverlog's writer
    retries, riverlog.tables.iceberg_commit): set now on a table made before riverlog set
    it at creation."""
    if table.properties.get(NO_RETRIES) == "0":
        return table
    with table.transaction() as tx:
        tx.set_properties({NO_RETRIES: "0"})
    return table.refresh()


def transaction(table):
    """``table.transaction()`` (a pyiceberg Transaction) whose staged metadata is built once
    per change, not on every read: pyiceberg's Transaction.table_metadata deep-copies the
    whole metadata, every snapshot kept until expiry, on each of the 20-odd reads one commit
    makes (most of a writer pass once a table has a few hundred snapshots). The metadata is
    pydantic-frozen; a new staged update or a refresh of the table (a commit retry) builds
    it again."""
    return _cached_transaction()(table)


@functools.cache
def _cached_transaction():
    from pyiceberg.table import Transaction
    from pyiceberg.table.update import update_table_metadata

    class CachedTransaction(Transaction):
        _built: tuple = (None, None, None)  # (base metadata, staged updates, result)

        @property
        def table_metadata(self):
            base, updates, built = self._built
            if base is not self._table.metadata or updates is not self._updates:
                built = (update_table_metadata(self._table.metadata, self._updates)
                         if self._updates else self._table.metadata)
                self._built = (self._table.metadata, self._updates, built)
            return built

    return CachedTransaction


def load_table(catalog, stream: str):
    """``stream``'s table; None when the catalog has none. Raises ValueError when its
    current metadata file cannot be read (damaged), naming the table."""
    from pyiceberg.exceptions import NoSuchTableError, ValidationError

    try:
        return catalog.load_table(identifier(stream))
    except NoSuchTableError:
        return None
    except ValidationError as exc:
        raise ValueError(f"table {NAMESPACE}.{stream}: damaged metadata: {exc}") from None


def snapshot_offsets(snapshot) -> dict[int, tuple[int, int]]:
    """Per stream partition, the committed offsets ``[first, end)`` ``snapshot`` holds
    (its summary's OFFSETS_PROPERTY); empty for None or a snapshot riverlog did not write."""
    return {int(p): (int(r[0]), int(r[1])) for p, r in
            _summary_json(snapshot, OFFSETS_PROPERTY).items()}


def snapshot_segments(snapshot) -> dict[int, dict[int, tuple[int, int]]]:
    """Per stream partition, ``{segment base: (inode, size)}`` of the sealed segments the
    snapshot holds whole (SEGMENTS_PROPERTY)."""
    return {int(p): {int(b): (int(v[0]), int(v[1])) for b, v in segs.items()}
            for p, segs in _summary_json(snapshot, SEGMENTS_PROPERTY).items()}


def snapshot_epochs(snapshot) -> dict[int, int]:
    """Per stream partition, the leader epoch of its writer (EPOCHS_PROPERTY; 0: none)."""
    return {int(p): int(e) for p, e in _summary_json(snapshot, EPOCHS_PROPERTY).items()}


def data_files(table) -> dict[int, list]:
    """The current snapshot's data files per stream partition: ``(DataFile, lowest offset,
    highest offset)`` (from the files' column bounds), in offset order."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import LongType

    if table.current_snapshot() is None:
        return {}
    field = table.schema().find_field("offset").field_id
    out: dict[int, list] = {}
    for task in table.scan().plan_files():
        f = task.file
        lo = from_bytes(LongType(), f.lower_bounds[field])
        hi = from_bytes(LongType(), f.upper_bounds[field])
        out.setdefault(f.partition[0], []).append((f, lo, hi))
    for files in out.values():
        files.sort(key=lambda x: x[1])
    return out


def _summary_json(snapshot, key: str) -> dict:
    if snapshot is None or snapshot.summary is None:
        return {}
    raw = snapshot.summary.additional_properties.get(key)
    return json.loads(raw) if raw else {}


SECRET_WORDS = ("password", "passwd", "secret", "token", "credential", "key")
"""Query parameters whose name holds one of these are secrets (``?password=``, a REST
catalog's ``?token=``, ``s3.secret-access-key``...)."""


def redacted(uri: str) -> str:
    """``uri`` with its secrets shown as ``***``: the password of ``user:secret@`` and the
    value of every query parameter named like one (SECRET_WORDS). What clients are told
    (the Open answer's ``riverlog_table_catalog``) and what errors say."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password:
        uri = uri.replace(f":{parts.password}@", ":***@", 1)
    if parts.query:
        query = "&".join(
            f"{name}=***" if any(w in name.lower() for w in SECRET_WORDS) else
            (f"{name}={value}" if sep else name)
            for name, sep, value in (item.partition("=") for item in parts.query.split("&")))
        uri = uri.replace(f"?{parts.query}", f"?{query}", 1)
    return uri


def fs_path(location: str) -> str:
    """A pyiceberg location (``file:///a/b``, ``s3://bucket/k``) as pyarrow.fs names it."""
    if location.startswith("file://"):
        return location[len("file://"):]
    return location.split("://", 1)[1] if "://" in location else location


class TableSnapshot:
    """What the current snapshot of ``stream``'s table (in the catalog ``catalog``, with data
    under ``table_dir``) holds, for a reader: ``held(partition, start, end)`` and
    ``first(partition, log_first)``. A stream without a table holds nothing, and so does an
    embedded SQLite catalog whose file does not exist (a reader never creates one)."""

    def __init__(self, table_dir: str, catalog: str | None, stream: str) -> None:
        uri = catalog_uri(table_dir, catalog)
        missing = uri.startswith("sqlite:///") and not os.path.exists(uri[len("sqlite:///"):])
        self.table = None if missing else load_table(load_catalog(table_dir, uri), stream)
        snapshot = self.table.current_snapshot() if self.table is not None else None
        self.offsets = snapshot_offsets(snapshot)
        self._planned: dict[int, list] | None = None if snapshot is not None else {}
        self.stream, self.table_dir = stream, table_dir or None

    @property
    def _files(self) -> dict[int, list]:
        if self._planned is None:  # planned when asked: ``first`` needs only the summary
            self._planned = data_files(self.table)
        return self._planned

    def file_count(self) -> int:
        """How many data files the snapshot lists."""
        return sum(len(files) for files in self._files.values())

    def first(self, partition: int, log_first: int) -> int:
        """``log_first``, or the table's first offset when the table holds, without a gap,
        offsets older than the log's (``streams.table.archive``)."""
        first, end = self.offsets.get(partition, (log_first, log_first))
        return first if first < log_first <= end else log_first

    def held(self, partition: int, start: int, end: int) -> tuple[int, int, list]:
        """``(lo, hi, files)``: the part ``[lo, hi)`` of ``[start, end)`` the snapshot holds
        (``lo == hi``: none) and its data files ``(location, lowest offset, highest offset)``
        holding any of it. A data file that is missing or not the size the snapshot lists
        is reported (warning, with its path) and the partition's offsets are read from the
        log instead. Files are opened on the table folder's filesystem (its credentials:
        riverlog.tables.storage.open_uri)."""
        from pyarrow import fs

        from .storage import open_uri

        first, stop = self.offsets.get(partition, (start, start))
        lo, hi = max(start, first), min(end, stop)
        if hi <= lo:
            return start, start, []
        files = [(f, a, b) for f, a, b in self._files.get(partition, []) if b >= lo and a < hi]
        if not files:
            return lo, hi, []
        # one table, one store: opened once (with the table folder's credentials), one call
        filesystem, _ = open_uri(files[0][0].file_path, self.table_dir)
        infos = filesystem.get_file_info([fs_path(f.file_path) for f, _, _ in files])
        for (f, _, _), info in zip(files, infos):
            problem = ("is missing" if info.type != fs.FileType.File else
                       f"is {info.size} bytes, the snapshot says {f.file_size_in_bytes}"
                       if info.size != f.file_size_in_bytes else None)
            if problem is not None:
                log.warning("table of %r partition %d: %s %s; offsets %d..%d read from the "
                            "log", self.stream, partition, f.file_path, problem, lo, hi - 1)
                return start, start, []
        return lo, hi, [(f.file_path, a, b) for f, a, b in files]


def snapshot_batches(files, start: int, end: int, schema, batch_rows: int,
                     table_dir: str | None = None):
    """Yield the records ``[start, end)`` held by the Iceberg data ``files`` (``(location,
    lowest offset, highest offset)``, as TableSnapshot.held gives them) as
    ``pyarrow.RecordBatch``es of ``schema`` (riverlog.spark.arrow.arrow_schema, or a
    projection of it) of at most ``batch_rows`` rows, in offset order (files whose offsets
    overlap, such as the two day partitions of one write, are read together and sorted).
    For the riverlog source's executors (pyarrow, no Spark, no catalog): the files are
    opened on the filesystem of the table folder ``table_dir`` (its credentials, endpoint,
    region: riverlog.tables.storage.open_uri) when given. Raises OSError or pyarrow's
    errors when a file cannot be read."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from .storage import open_uri

    columns = list(dict.fromkeys(schema.names + ["offset"]))
    groups: list[list] = []
    for location, lo, hi in sorted(files, key=lambda f: f[1]):
        if hi < start or lo >= end:
            continue
        if groups and lo <= groups[-1][0]:
            groups[-1][0] = max(groups[-1][0], hi)
            groups[-1][1].append(location)
        else:
            groups.append([hi, [location]])
    for _, locations in groups:
        tables = []
        for location in locations:
            filesystem, path = open_uri(location, table_dir)
            tables.append(pq.read_table(  # row groups outside skipped by their statistics
                path, columns=columns, filesystem=filesystem,
                filters=(pc.field("offset") >= start) & (pc.field("offset") < end)))
        rows = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        if len(tables) > 1:
            rows = rows.sort_by("offset")
        rows = rows.select(schema.names).cast(schema)
        for batch in rows.to_batches(max_chunksize=batch_rows):
            yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)
