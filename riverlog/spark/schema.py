# The schema of a riverlog stream as a Spark DataFrame, and of what the sink accepts. Owns
# the column names and types only (docs/spark.md documents them); the read path builds
# Arrow batches to exactly this schema (riverlog.spark.arrow) and the writer checks input
# against WRITE_COLUMNS. Rules: like Spark's Kafka source (key/value binary, one row per
# record), with `stream` for Kafka's `topic` and headers as a map; pyspark is imported
# inside functions so this module loads without it.
from __future__ import annotations

SCHEMA_DDL = ("key binary, value binary, stream string, partition int, offset long, "
              "timestamp timestamp, headers map<string,binary>")
"""The read schema, as DDL:

- ``key`` binary: the record key (Liftbridge key, ``x-opt-key``); null when it has none.
- ``value`` binary: the payload (the AMQP 1.0 body; raw bytes for non-AMQP records).
- ``stream`` string: the stream the record was read from.
- ``partition`` int: the partition within the stream (0 for RabbitMQ streams).
- ``offset`` long: the record's offset in its partition.
- ``timestamp`` timestamp: the record's timestamp (``x-opt-timestamp-ns``, truncated to
  microseconds), else the time the server stored its chunk.
- ``headers`` map<string,binary>: the headers (AMQP application-properties); empty map when
  none.
"""

WRITE_COLUMNS = {
    "value": "binary or string (required)",
    "key": "binary or string (optional, null = no key)",
    "headers": "map<string, binary or string> (optional)",
    "partition": "int (optional, default 0)",
    "timestamp": "timestamp (optional, default: the time of writing)",
    "stream": "ignored (the `stream` option names the target)",
    "offset": "ignored (the server assigns offsets)",
}
"""Columns the sink accepts, and what it does with them; any other column is an error."""


def spark_schema():
    """SCHEMA_DDL as a ``pyspark.sql.types.StructType`` (all columns nullable)."""
    from pyspark.sql import types as T

    return T.StructType([
        T.StructField("key", T.BinaryType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("stream", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("timestamp", T.TimestampType()),
        T.StructField("headers", T.MapType(T.StringType(), T.BinaryType())),
    ])


def projection(schema) -> tuple[str, ...]:
    """The column names a reader must produce for ``schema`` (the StructType Spark passes to
    ``reader(schema)``): SCHEMA_DDL's, or the subset a user named with
    ``.schema("value binary, offset long")``, in the user's order. Raises ValueError for a
    column riverlog does not have or a type that differs from SCHEMA_DDL's."""
    full = {f.name: f.dataType for f in spark_schema().fields}
    names = column_names([field.name for field in schema.fields])
    for name, field in zip(names, schema.fields):
        if field.dataType != full[name]:
            raise ValueError(f"riverlog source: column {name} is "
                             f"{full[name].simpleString()}, not {field.dataType.simpleString()}")
    return names


def column_names(names, who: str = "riverlog source") -> tuple[str, ...]:
    """``names`` (an iterable of str), lower-cased: each a column of SCHEMA_DDL, none
    twice, at least one. Raises ValueError starting with ``who`` otherwise."""
    names = tuple(name.lower() for name in names)
    columns = spark_schema().names
    for name in names:
        if name not in columns:
            raise ValueError(f"{who}: no column {name!r}; the columns are {SCHEMA_DDL}")
    if not names or len(set(names)) != len(names):
        raise ValueError(f"{who}: name each column once, at least one (got {list(names)})")
    return names


def projected_schema(columns: tuple[str, ...]):
    """The StructType with SCHEMA_DDL's fields named in ``columns``, in that order."""
    from pyspark.sql import types as T

    full = {f.name: f for f in spark_schema().fields}
    return T.StructType([full[name] for name in columns])
