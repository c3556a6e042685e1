# The riverlog Spark sink: df.write.format("riverlog") and writeStream.format("riverlog").
# Owns turning rows (value, optional key, headers, partition, timestamp) into records and
# publishing them with one named publisher per task, with publishing ids that make replays
# harmless.
# Rules: each task publishes under the reference ``<prefix>-<task partition>``; the id of
# the i-th row (from 0) of a task is ``i + 1`` for a batch write and ``((batchId + 1) << 32)
# + i`` for micro-batch ``batchId``, so a retried task or a re-run micro-batch sends the same
# ids and the server's deduplication (ids at or below the highest stored one for the
# reference are confirmed and dropped) stores each row once. That needs the same rows in the
# same task in the same order on a retry: true for a deterministic plan; after a shuffle set
# rowOrder=sorted (rows sorted by key and value inside each task). ``<prefix>`` is the
# ``publisherPrefix`` option, else the streaming query's id (stable across restarts from one
# checkpoint), else a per-job random id for a batch write. write() returns only once every
# record is confirmed; records become visible to readers as they are stored (no
# transactions: a reader may see part of a micro-batch before Spark commits it).
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Iterator

from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)

from . import offsets as plan
from .options import WriteOptions
from .schema import WRITE_COLUMNS

log = logging.getLogger("riverlog.spark")

BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
_ROWS_PER_SEND = 10_000


@dataclass
class RiverlogCommitMessage(WriterCommitMessage):
    """What one task did: its publisher ``reference``, rows ``written`` (sent and
    confirmed) and ``skipped`` (already stored by an earlier attempt)."""

    reference: str
    written: int
    skipped: int


def check_schema(schema) -> None:
    """Raise ValueError unless ``schema`` (a StructType) fits WRITE_COLUMNS."""
    from pyspark.sql import types as T

    names = {f.name.lower(): f.dataType for f in schema.fields}
    unknown = sorted(set(names) - set(WRITE_COLUMNS))
    if unknown:
        raise ValueError(f"riverlog sink: unknown column(s) {', '.join(unknown)}; it takes "
                         + "; ".join(f"{k}: {v}" for k, v in WRITE_COLUMNS.items()))
    text = (T.BinaryType, T.StringType)
    if "value" not in names:
        raise ValueError("riverlog sink: a value column (binary or string) is required")
    for col in ("value", "key"):
        if col in names and not isinstance(names[col], text):
            raise ValueError(f"riverlog sink: column {col} must be binary or string, "
                             f"not {names[col].simpleString()}")
    if "headers" in names:
        t = names["headers"]
        if not (isinstance(t, T.MapType) and isinstance(t.keyType, T.StringType)
                and isinstance(t.valueType, text)):
            raise ValueError("riverlog sink: column headers must be map<string, binary or "
                             f"string>, not {t.simpleString()}")
    if "partition" in names and not isinstance(names["partition"], (T.IntegerType, T.LongType,
                                                                    T.ShortType, T.ByteType)):
        raise ValueError("riverlog sink: column partition must be an integer")
    if "timestamp" in names and not isinstance(names["timestamp"], (T.TimestampType,
                                                                    T.TimestampNTZType)):
        raise ValueError("riverlog sink: column timestamp must be a timestamp")


def _records(table, now_ns: int) -> tuple[list[bytes], list[int]]:
    """Encode the rows of a pyarrow Table as records; also return their partitions."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from ..record import Record, encode_record

    table = table.rename_columns([c.lower() for c in table.column_names])

    def column(name):
        if name not in table.column_names:
            return None
        col = table.column(name)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            col = pc.cast(col, pa.binary())
        return col.to_pylist()

    n = table.num_rows
    values = column("value")
    keys = column("key") or [None] * n
    headers = table.column("headers").to_pylist() if "headers" in table.column_names else None
    parts = table.column("partition").to_pylist() if "partition" in table.column_names else None
    stamps = None
    if "timestamp" in table.column_names:
        stamps = pc.cast(table.column("timestamp"), pa.timestamp("us")).cast(pa.int64()).to_pylist()
    out = []
    for i in range(n):
        hdrs = {}
        if headers is not None and headers[i]:
            hdrs = {k: (v.encode() if isinstance(v, str) else (v if v is not None else b""))
                    for k, v in headers[i]}
        ts = stamps[i] * 1000 if stamps is not None and stamps[i] is not None else now_ns
        out.append(encode_record(Record(value=values[i] if values[i] is not None else b"",
                                        key=keys[i], headers=hdrs, timestamp_ns=ts)))
    partitions = [0 if p is None else p for p in parts] if parts is not None else [0] * n
    return out, partitions


def publish_task(opts: WriteOptions, reference: str, batches: Iterator, base_id: int,
                 sort_rows: bool) -> RiverlogCommitMessage:
    """Publish the rows of ``batches`` (pyarrow RecordBatches) under ``reference``; the
    i-th row gets publishing id ``base_id + i``. Rows whose id the server already stored
    are not sent. Returns when all are confirmed; raises ClientError on failure."""
    import itertools

    import pyarrow as pa

    batches = iter(batches)
    head = next((b for b in batches if b.num_rows), None)
    if head is None:  # nothing to write in this task: no connection either
        return RiverlogCommitMessage(reference, 0, 0)
    batches = itertools.chain([head], batches)
    target = plan.address(opts.stream, 0)
    written = skipped = 0
    with opts.connection.connect_for(target, write=True, name="riverlog-spark-write") as client:
        stored = client.query_publisher_sequence(reference, target)
        publisher = client.publisher(target, reference)
        row = 0

        def send(table) -> None:
            nonlocal row, written, skipped
            records, partitions = _records(table, time.time_ns())
            bad = next((p for p in partitions if p != 0), None)
            if bad is not None:
                raise ValueError(f"riverlog sink: partition {bad} does not exist in stream "
                                 f"{opts.stream!r} (it has partition 0 only)")
            ids = range(base_id + row, base_id + row + len(records))
            row += len(records)
            first_new = max(0, min(len(records), stored - ids.start + 1)) if len(records) else 0
            skipped += first_new
            if first_new < len(records):
                publisher.publish(records[first_new:], ids[first_new:])
                written += len(records) - first_new

        if sort_rows:
            table = pa.Table.from_batches(list(batches))
            keys = [(c, "ascending") for c in table.column_names
                    if c.lower() in ("partition", "key", "value")]
            keys.sort(key=lambda k: ("partition", "key", "value").index(k[0].lower()))
            table = table.sort_by(keys)
            for offset in range(0, table.num_rows, _ROWS_PER_SEND):
                send(table.slice(offset, _ROWS_PER_SEND))
        else:
            for batch in batches:
                for offset in range(0, batch.num_rows, _ROWS_PER_SEND):
                    send(pa.Table.from_batches([batch.slice(offset, _ROWS_PER_SEND)]))
        publisher.close()
    return RiverlogCommitMessage(reference, written, skipped)


def _task_partition() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


def _local_property(name: str) -> str | None:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.getLocalProperty(name) if ctx is not None else None


def _prepare(opts: WriteOptions, schema, overwrite: bool) -> None:
    if overwrite:
        raise ValueError("riverlog sink: streams are append-only; use mode append")
    check_schema(schema)
    with opts.connection.connect("riverlog-spark-plan") as client:
        # an existing stream is taken as it is: a Create with other arguments than its own
        # is refused (0x11), as RabbitMQ refuses it
        if opts.create and not client.stream_exists(opts.stream):
            client.create_stream(opts.stream, opts.arguments, exist_ok=True)
        plan.partitions_of(client, opts.stream)  # raises when the stream is missing


def _summary(messages) -> tuple[int, int]:
    done = [m for m in messages if isinstance(m, RiverlogCommitMessage)]
    return sum(m.written for m in done), sum(m.skipped for m in done)


class RiverlogWriter(DataSourceArrowWriter):
    """``df.write.format("riverlog")``: append the rows to ``stream``. Retried tasks of one
    job do not duplicate rows (one publisher reference per task, fixed for the job)."""

    def __init__(self, opts: WriteOptions, schema, overwrite: bool) -> None:
        _prepare(opts, schema, overwrite)
        self.opts = opts
        self.prefix = opts.prefix or f"spark-write-{uuid.uuid4().hex[:16]}"

    def write(self, iterator: Iterator) -> RiverlogCommitMessage:
        reference = f"{self.prefix}-{_task_partition()}"
        return publish_task(self.opts, reference, iterator, 1, self.opts.row_order == "sorted")

    def commit(self, messages) -> None:
        written, skipped = _summary(messages)
        log.info("riverlog sink: %d records written to %r (%d replayed rows skipped)",
                 written, self.opts.stream, skipped)

    def abort(self, messages) -> None:
        written, _ = _summary(messages)
        log.warning("riverlog sink: job aborted; %d records were already stored in %r "
                    "(streams are append-only)", written, self.opts.stream)


class RiverlogStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("riverlog")``: exactly-once across task retries and query
    restarts (see the module comment for the conditions)."""

    def __init__(self, opts: WriteOptions, schema, overwrite: bool) -> None:
        _prepare(opts, schema, False)
        self.opts = opts

    def write(self, iterator: Iterator) -> RiverlogCommitMessage:
        batch_id = _local_property(BATCH_ID_PROPERTY)
        if batch_id is None:
            raise RuntimeError("riverlog sink: Spark did not pass the micro-batch id "
                               f"({BATCH_ID_PROPERTY}) to the task")
        prefix = self.opts.prefix or f"spark-{_local_property(QUERY_ID_PROPERTY) or 'query'}"
        reference = f"{prefix}-{_task_partition()}"
        base = ((int(batch_id) + 1) << 32)
        return publish_task(self.opts, reference, iterator, base, self.opts.row_order == "sorted")

    def commit(self, messages, batchId: int) -> None:
        written, skipped = _summary(messages)
        log.info("riverlog sink: batch %d: %d records written to %r (%d replayed rows "
                 "skipped)", batchId, written, self.opts.stream, skipped)

    def abort(self, messages, batchId: int) -> None:
        log.warning("riverlog sink: batch %d aborted; a retry will not duplicate what was "
                    "stored", batchId)
