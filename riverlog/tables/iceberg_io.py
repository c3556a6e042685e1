# A table folder (riverlog.tables.storage's path or URI, the syntax pyarrow reads) as
# pyiceberg takes it: the warehouse URI tables are created under, and the FileIO properties
# (``s3.*``) that carry the URI's credentials, endpoint and region.
# Rules: the properties are given to the catalog (pyiceberg keeps them in memory and hands
# them to every FileIO it makes), never to a table (a table's properties are written in its
# metadata, in the bucket), and they are never logged; an option pyiceberg has no property
# for is refused, not dropped. Imports nothing of riverlog (riverlog.config checks a table
# folder with it at start).
from __future__ import annotations

import os
import urllib.parse

S3_OPTIONS = {"region": "s3.region"}
"""Options of an ``s3://`` table folder URI (pyarrow's query string) and the pyiceberg
FileIO properties they become (``endpoint_override`` and ``scheme``: ``s3.endpoint``)."""
S3_IGNORED = ("allow_bucket_creation", "allow_bucket_deletion")
"""Options of an ``s3://`` URI that mean nothing to pyiceberg (it creates no bucket)."""


def warehouse(table_dir: str) -> str:
    """The warehouse URI tables are created under: ``table_dir`` as a URI, without its
    credentials (``user:secret@``; all of an s3:// URI's ``KEY@``) and options (they are
    FileIO properties: io_properties), e.g.
    ``s3://bucket/prefix`` for ``s3://KEY:SECRET@bucket/prefix?region=eu-west-1``."""
    if "://" not in table_dir:
        return "file://" + os.path.abspath(table_dir)
    parts = urllib.parse.urlsplit(table_dir)
    user, _, host = parts.netloc.rpartition("@")  # abfs://box@account: box is no user
    netloc = host if parts.scheme.lower() == "s3" or ":" in user else parts.netloc
    return f"{parts.scheme}://{netloc}{parts.path}".rstrip("/")


def io_properties(table_dir: str) -> dict[str, str]:
    """pyiceberg's FileIO properties for the table folder ``table_dir``: for an ``s3://`` URI
    its ``KEY:SECRET@`` as ``s3.access-key-id``/``s3.secret-access-key``, ``region`` as
    ``s3.region`` and ``endpoint_override`` (with ``scheme``, default https) as
    ``s3.endpoint`` (riverlog.tables.storage's URI syntax, the one pyarrow reads); none for
    a local folder. Given to the catalog, never to a table (pyiceberg keeps a catalog's
    properties in memory; a table's are written in its metadata). Raises ValueError for an
    option pyiceberg has no property for, and for credentials or options in the URI of
    another object store (pyiceberg's gcs.*/adls.* properties are not translated)."""
    if "://" not in table_dir or table_dir.startswith("file://"):
        return {}
    parts = urllib.parse.urlsplit(table_dir)
    if parts.scheme.lower() != "s3":
        if parts.query or parts.password is not None:  # abfs://box@account: no secret
            raise ValueError(f"streams.table.dir {warehouse(table_dir)}: credentials and "
                             f"options are translated for pyiceberg's FileIO only in s3:// "
                             f"URIs; give them through the environment")
        return {}
    props = {}
    if parts.username:
        props["s3.access-key-id"] = urllib.parse.unquote(parts.username)
    if parts.password is not None:
        props["s3.secret-access-key"] = urllib.parse.unquote(parts.password)
    options = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(options) - set(S3_OPTIONS) - set(S3_IGNORED)
                     - {"endpoint_override", "scheme"})
    if unknown:
        raise ValueError(f"streams.table.dir {warehouse(table_dir)}: pyiceberg's FileIO has "
                         f"no property for the option(s) {', '.join(unknown)}")
    props.update({S3_OPTIONS[k]: v for k, v in options.items() if k in S3_OPTIONS})
    if "endpoint_override" in options:
        scheme = options.get("scheme", "https")
        props["s3.endpoint"] = f"{scheme}://{options['endpoint_override']}"
    elif "scheme" in options:
        raise ValueError(f"streams.table.dir {warehouse(table_dir)}: scheme= without "
                         f"endpoint_override= has no pyiceberg property")
    return props
