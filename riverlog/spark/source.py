# The riverlog PySpark data source: the class Spark registers under the name "riverlog" and
# the factory of its readers and writers. Rules: parse options here, once, so a bad option
# fails when the query is defined; everything else lives in one module per concept
# (reader, stream_reader, writer, schema, offsets, arrow).
from __future__ import annotations

from pyspark.sql.datasource import DataSource

from .options import read_options, write_options
from .schema import projection, spark_schema
from .super_streams import expanded

NAME = "riverlog"


def _columns(schema) -> tuple[str, ...] | None:
    """None for the full schema, else the projection a user schema asks for."""
    columns = projection(schema)
    full = tuple(f.name for f in spark_schema().fields)
    return None if columns == full else columns


class RiverlogDataSource(DataSource):
    """``spark.read/readStream.format("riverlog")`` and ``df.write/writeStream.format(
    "riverlog")``; options and schema in docs/spark.md. Register with
    ``riverlog.spark.register(spark)``. The schema is SCHEMA_DDL; a user schema naming a
    subset of its columns (same types) makes the reader build only those. A read's
    ``stream`` may name super streams: each reads as its partition streams."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        return spark_schema()

    def reader(self, schema):
        from .reader import RiverlogReader
        return RiverlogReader(read_options(expanded(self.options)), _columns(schema))

    def streamReader(self, schema):
        from .stream_reader import RiverlogStreamReader
        return RiverlogStreamReader(read_options(expanded(self.options)), _columns(schema))

    def writer(self, schema, overwrite: bool):
        from .writer import RiverlogWriter
        return RiverlogWriter(write_options(self.options), schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        from .writer import RiverlogStreamWriter
        return RiverlogStreamWriter(write_options(self.options), schema, overwrite)
