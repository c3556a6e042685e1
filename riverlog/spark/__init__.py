# riverlog on Spark: the PySpark data source "riverlog" (batch and streaming, read and write,
# Kafka-source semantics over the RabbitMQ Stream door) and the pipeline jobs built on it.
# read_table reads a stream through its Parquet table (riverlog.spark.table).
# Rules: importing this package needs neither pyspark nor pyarrow (the CLI imports it);
# register(), read_table() and the submodules do. Docs: docs/spark.md.
from __future__ import annotations

from .table import read_table

NAME = "riverlog"


def register(spark) -> None:
    """Register the ``riverlog`` format with a SparkSession (``spark.dataSource.register``),
    so ``spark.read.format("riverlog")`` and friends work in it. Idempotent."""
    from .source import RiverlogDataSource

    spark.dataSource.register(RiverlogDataSource)


__all__ = ["NAME", "read_table", "register"]
