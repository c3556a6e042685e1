# Where tables live: a folder on any filesystem pyarrow supports, named by a local path or a
# URI (``file:///...``, ``s3://bucket/prefix``, ``gs://...``, ``hdfs://...``, ``abfs://...``;
# pyarrow.fs.FileSystem.from_uri, so a URI's query string carries its options, e.g.
# ``s3://bucket/tables?region=eu-west-1`` or ``?endpoint_override=host:9000&scheme=http``),
# and how a file appears on it in one step.
# Rules: everything the writer and the readers do to a table goes through Storage; paths
# inside it are the filesystem's ("/"-separated, no scheme). A file appears whole or not at
# all: on the local filesystem it is written under a ``.tmp`` name, fsynced, renamed and the
# folder fsynced; on HDFS written under the ``.tmp`` name and renamed; on object stores (S3,
# GCS, Azure), which have no rename, written under its final name by one upload (a
# multipart upload is visible only once complete). Data files get names never used before
# (riverlog.tables.manifest.file_name), so an upload never replaces what a reader may be
# reading; only manifest.json is replaced, by one put. pyarrow is imported on first use.
from __future__ import annotations

import functools
import os
import posixpath
import urllib.parse
from typing import Callable, TypeVar

T = TypeVar("T")

TMP_SUFFIX = ".tmp"
RENAMING = ("local", "hdfs")
"""pyarrow filesystem type names whose rename is atomic (write, then rename)."""
SPARK_SCHEMES = {"s3": "s3a"}
"""URI schemes Spark's Hadoop connectors name differently (hadoop-aws serves ``s3a://``)."""


def spark_uri(location: str, relative: str) -> str:
    """The URI Spark's Hadoop filesystems give the file ``relative`` to the folder named
    by the URI ``location``: its scheme (``s3`` as ``s3a``), authority (without
    ``user:secret@`` credentials) and path, without its query (pyarrow's options; Spark
    takes its own from its Hadoop configuration). E.g. ``s3://k:s@bucket/t?region=x``
    and ``a/0/f.parquet`` give ``s3a://bucket/t/a/0/f.parquet``."""
    parts = urllib.parse.urlsplit(location)
    user, _, host = parts.netloc.rpartition("@")
    netloc = host if ":" in user else parts.netloc
    scheme = SPARK_SCHEMES.get(parts.scheme.lower(), parts.scheme.lower())
    return f"{scheme}://{netloc}{parts.path.rstrip('/')}/{relative}"


def open_uri(uri: str, table_dir: str | None = None):
    """``(pyarrow filesystem, path)`` of the file ``uri`` (a pyiceberg data file location,
    ``file:///a/b`` or ``s3://bucket/key``): on the filesystem of the table folder
    ``table_dir`` (a URI: its credentials, endpoint and region) when ``uri`` is in its
    scheme and bucket/authority, else pyarrow's own for ``uri`` (for S3: credentials from
    the environment). Raises what pyarrow.fs.FileSystem.from_uri raises."""
    if table_dir is not None and "://" in table_dir:
        folder, parts = urllib.parse.urlsplit(table_dir), urllib.parse.urlsplit(uri)
        if (folder.scheme.lower(), folder.netloc.rpartition("@")[2]) == \
                (parts.scheme.lower(), parts.netloc.rpartition("@")[2]) \
                and folder.scheme.lower() != "file":
            return _filesystem(table_dir), f"{parts.netloc}{parts.path}"
    from pyarrow import fs
    return fs.FileSystem.from_uri(uri)


@functools.lru_cache(maxsize=8)
def _filesystem(location: str):
    """The pyarrow filesystem of the table folder URI ``location`` (made once per process:
    every data file of a read opens on it)."""
    return Storage(location).fs


class Storage:
    """The table folder ``location`` (a path, made absolute, or a URI). Raises ValueError
    (pyarrow.ArrowInvalid) for a URI pyarrow cannot open and OSError for an unreachable
    filesystem."""

    def __init__(self, location: str) -> None:
        from pyarrow import fs

        self.location = location
        if "://" not in location:
            location = os.path.abspath(location)
        self.fs, self.root = fs.FileSystem.from_uri(location)
        self.local = self.fs.type_name == "local"

    def spark_path(self, path: str) -> str:
        """``path`` (inside this folder) as Spark's Parquet reader names it: the path itself
        on the local filesystem, else spark_uri of it."""
        if self.local:
            return path
        return spark_uri(self.location, posixpath.relpath(path, self.root))

    # -- reading ------------------------------------------------------------------------
    def read_bytes(self, path: str) -> bytes | None:
        """The content of ``path``; None when it does not exist."""
        try:
            with self.fs.open_input_stream(path) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def size(self, path: str) -> int | None:
        """Bytes of the file ``path``; None when there is none."""
        from pyarrow import fs

        info = self.fs.get_file_info(path)
        return info.size if info.type == fs.FileType.File else None

    def names(self, directory: str) -> list[str]:
        """Names of the files in ``directory`` (none when it does not exist)."""
        from pyarrow import fs

        infos = self.fs.get_file_info(fs.FileSelector(directory, allow_not_found=True))
        return [posixpath.basename(i.path) for i in infos if i.type == fs.FileType.File]

    # -- writing ------------------------------------------------------------------------
    def make_dir(self, directory: str) -> None:
        self.fs.create_dir(directory, recursive=True)

    def delete_dir(self, directory: str) -> None:
        """Remove ``directory`` and everything in it; nothing when it does not exist."""
        try:
            self.fs.delete_dir(directory)
        except FileNotFoundError:
            pass

    def delete(self, path: str) -> None:
        """Remove the file ``path``; nothing when it does not exist."""
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            pass

    def put(self, path: str, write: Callable[[object], T]) -> T:
        """Make the file ``path`` appear whole, with what ``write(stream)`` writes to a
        pyarrow output stream (see the module's rules for how, per filesystem); returns
        what ``write`` returns. Raises OSError (a full disk, a lost connection: what was
        written is removed)."""
        renames = self.fs.type_name in RENAMING
        target = path + TMP_SUFFIX if renames else path
        try:
            with self.fs.open_output_stream(target) as out:
                result = write(out)
            if self.local:
                fd = os.open(target, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            if renames:
                self.fs.move(target, path)
        except BaseException:
            self.delete(target)
            raise
        if self.local:
            from ..log.segment import fsync_dir  # the log's import is not for Spark workers
            fsync_dir(posixpath.dirname(path))
        return result
