# The streaming reader of the riverlog Spark source (micro-batch). Owns the driver side of a
# streaming query: the initial offsets, the latest offsets under a read limit
# (maxOffsetsPerTrigger) or an AvailableNow target, and the per-batch task ranges; the
# executor side is riverlog.spark.reader.read_partition.
# Rules: progress lives only in Spark's checkpoint (offsets are {stream: {"partition": n}},
# the end offset exclusive), so a restarted query reads exactly the batches it had not
# committed: no record lost or repeated; one driver connection, reopened after an error and
# never pickled; data loss is checked every time offsets are planned.
from __future__ import annotations

import logging

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

from . import offsets as plan
from .options import ReadOptions
from .reader import RangePartition, read_partition, table_held, to_partitions

log = logging.getLogger("riverlog.spark")


class RiverlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``readStream.format("riverlog")``: starts at ``startingOffsets`` (default latest) or
    ``startingTimestamp`` for a new query, at the checkpoint otherwise."""

    def __init__(self, opts: ReadOptions, columns: tuple[str, ...] | None = None) -> None:
        self.opts = opts
        self.columns = columns
        self._client = None
        self._target: plan.Offsets | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    def _available(self) -> tuple[plan.Offsets, plan.Offsets]:
        from ..client import ClientError
        for attempt in (1, 2):
            if self._client is None:
                self._client = self.opts.connection.connect("riverlog-spark-stream")
            try:
                return plan.available(self._client, self.opts.streams, table_held(self.opts))
            except ClientError:
                self._close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # the connection may already be gone
                pass

    def initialOffset(self) -> dict:
        first, end = self._available()
        start = plan.resolve(self._client, self.opts.starting, "latest", first, end,
                             self.opts.starting_timestamp)
        return plan.check_loss(start, first, end, self.opts.fail_on_data_loss)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._available()[1]

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        first, end = self._available()
        start = plan.check_loss(start, first, end, self.opts.fail_on_data_loss)
        latest = end
        if self._target is not None:  # AvailableNow: never past what existed at the start
            latest = {s: {p: min(o, self._target.get(s, {}).get(p, o)) for p, o in parts.items()}
                      for s, parts in end.items()}
        latest = {s: {p: max(o, start.get(s, {}).get(p, o)) for p, o in parts.items()}
                  for s, parts in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = plan.limit(start, latest, limit.max_rows)
        return latest

    def reportLatestOffset(self) -> dict | None:
        try:
            return self._available()[1]
        except Exception:  # only for progress reports: never fail the query for it
            return None

    def partitions(self, start: dict, end: dict) -> list[RangePartition]:
        rs = plan.split(plan.ranges(start, end), self.opts.min_partitions)
        return to_partitions(rs, self.opts, self.columns)

    def read(self, partition: RangePartition):
        return read_partition(partition)

    def commit(self, end: dict) -> None:
        pass  # progress is Spark's checkpoint; nothing is acknowledged to the server

    def stop(self) -> None:
        self._close()
