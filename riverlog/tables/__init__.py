# Streams as tables: committed chunks of a stream mirrored to Parquet files, listed per
# partition in a manifest of offset ranges, so Spark (riverlog.spark.read_table), DuckDB,
# pandas or Polars read a stream's history at columnar speed. Modules: manifest (the files
# of one partition's table and how they are published), writer (the worker process that
# writes them from the segment files), service (the server side: which streams, feeding
# the worker, status), read (the checked files of a table, for riverlog.spark.read_table,
# the source's tableDir option and other readers). Rules: the log is the source of truth, a
# table is derived and rebuildable; table writing never runs on the event loop and never
# blocks publishers. Docs: docs/spark.md "Streams as tables".
from __future__ import annotations

TABLE_ARGUMENT = "x-riverlog-table"
"""The RabbitMQ Stream Create argument that turns a stream's table on ("true") or off
("false") whatever the server's default."""
