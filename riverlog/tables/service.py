# The server side of streams as tables: which partitions have a table, feeding the writer
# process (riverlog.tables.writer) their state every tick, and what their tables hold and
# how far behind they are (for /metrics and `riverlog stream describe`).
# Rules: runs on the event loop but does no table work there: one small JSON request per
# tick, written to the worker's pipe, and one reply read; a tick starts only when the last
# reply is in, so nothing piles up and publishers are never waited on. The worker is started
# when the first table-enabled stream needs it and started again if it dies (the work it
# lost is redone from the manifest); it dies with the server (riverlog.tables.lifeline). A pass starts a third of ``streams.table.lag`` after the
# last one started; sooner (half that after it) when a partition's table is behind and its
# committed offset stood still for QUIET_S: the tail of a burst does not wait for the tick,
# while a steady stream still commits one snapshot per tick. In a cluster a partition's
# table is written by its leader only, under its leader epoch (the Iceberg writer fences
# former leaders: riverlog.tables.iceberg_commit), and the table statuses and lag of a
# partition are its leader's.
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import sys
import time

from ..broker import Broker
from ..broker.stream import Stream
from ..config import TableConfig
from .writer import EXIT_MISSING

log = logging.getLogger("riverlog.tables")

REPLY_LIMIT = 64 * 1024 * 1024
STOP_TIMEOUT_S = 10.0
POLL_S = 0.1
"""Seconds between looks at the partitions' committed offsets (on the event loop)."""
QUIET_S = 0.2
"""Seconds a partition's committed offset stands still before its table is written at once."""


@dataclasses.dataclass
class TableStatus:
    """A partition's table as the last pass left it: offsets ``[first, end)`` (None: empty),
    ``files``, ``bytes``, ``error`` (the last pass's, None when it went through) and
    ``synced_s``: the time.monotonic() of the newest request whose committed offset the
    table reached."""

    first: int | None = None
    end: int | None = None
    files: int = 0
    bytes: int = 0
    error: str | None = None
    synced_s: float | None = None


class TableService:
    """Tables of ``broker``'s streams under ``table_dir``. ``start()`` on the event loop,
    ``await stop()``. ``status`` maps (stream, partition) to TableStatus."""

    def __init__(self, broker: Broker, config: TableConfig, table_dir: str) -> None:
        self.broker = broker
        self.config = config
        self.table_dir = table_dir
        self.status: dict[tuple[str, int], TableStatus] = {}
        self._task: asyncio.Task | None = None
        self._worker: asyncio.subprocess.Process | None = None
        self._dropped: list[tuple[str, int]] = []  # (stream, its table's created_ns)
        self._created: dict[str, int] = {}  # stream -> created_ns its table was last sent
        self._failure: str | None = None
        self._started_s = time.monotonic()
        self._last_pass_s = -math.inf  # time.monotonic() the last pass started
        self._moved: dict[tuple[str, int], tuple[int, float]] = {}  # committed, since when
        self._flushed: dict[tuple[str, int], int] = {}  # committed offset a pass was due for

    @property
    def worker_pid(self) -> int | None:
        """The writer process's pid; None while there is none."""
        worker = self._worker
        return worker.pid if worker is not None and worker.returncode is None else None

    def streams(self) -> list[Stream]:
        """The streams with a table now: each one's ``table`` setting, else the server's
        (never the server's own ``__`` streams)."""
        return [s for s in list(self.broker.streams.values()) if not s.name.startswith("__")
                and (self.config.enabled if s.config.table is None else s.config.table)]

    def catalog_uri(self) -> str | None:
        """The Iceberg catalog of this server's tables, as readers are told it (the
        catalog's password left out); None when tables are not Iceberg or the table folder
        has no catalog (riverlog.tables.iceberg.catalog_uri)."""
        if self.config.format != "iceberg":
            return None
        from .iceberg import catalog_uri, redacted
        try:
            return redacted(catalog_uri(self.table_dir, self.config.catalog))
        except ValueError:
            return None

    def catalog(self, stream: str) -> tuple[str, str] | None:
        """``(catalog URI, table name)`` of ``stream``'s Iceberg table for readers
        (``catalog_uri``); None when there is no catalog."""
        from .iceberg import NAMESPACE
        uri = self.catalog_uri()
        return None if uri is None else (uri, f"{NAMESPACE}.{stream}")

    def lag(self, stream: Stream, partition: int) -> tuple[int, float]:
        """``(messages, seconds)`` the table of ``partition`` is behind: committed records it
        does not hold yet, and how long it has not held them all (since the service started,
        when it never did); ``(0, 0.0)`` when up to date."""
        p = stream.partitions[partition]
        if not self.broker.placement.leads(stream.name, partition):
            return 0, 0.0  # its leader writes its table and tells its lag
        status = self.status.get((stream.name, partition))
        end = p.first_offset
        if status is not None and status.end is not None:
            end = max(end, status.end)
        behind = max(p.committed_offset + 1 - end, 0)
        if not behind:
            return 0, 0.0
        since = self._started_s if status is None or status.synced_s is None else status.synced_s
        return behind, time.monotonic() - since

    def start(self) -> None:
        self._started_s = time.monotonic()
        self.broker.deletion_listeners.append(self._deleted)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop ticking and let the worker finish its pass (killed after STOP_TIMEOUT_S:
        what it had not published is redone on the next start)."""
        if self._deleted in self.broker.deletion_listeners:
            self.broker.deletion_listeners.remove(self._deleted)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stdin.close()
            try:
                await asyncio.wait_for(worker.wait(), STOP_TIMEOUT_S)
            except asyncio.TimeoutError:
                worker.kill()
                await worker.wait()

    def _deleted(self, stream: Stream) -> None:
        for table in (self.status, self._moved, self._flushed):
            for key in [k for k in table if k[0] == stream.name]:
                del table[key]
        # in a cluster the table's identity is the metadata's creation time, gone from the
        # metadata by now: the one last sent (a late drop must not take a newer stream's)
        self._dropped.append((stream.name, self._created.pop(stream.name, stream.created_ns)))

    async def _run(self) -> None:
        interval = self.config.lag_ms / 3000
        while True:
            await asyncio.sleep(min(POLL_S, interval))
            sent = time.monotonic()
            if not self._due(sent):
                continue
            request = self._request()
            if not request["partitions"] and not request["drop"]:
                continue
            self._dropped = []
            try:
                reply = await self._call(request)
            except ModuleNotFoundError as exc:
                log.error("%s: no table is written until the server is restarted", exc)
                return
            except (OSError, ValueError, EOFError) as exc:
                if str(exc) != self._failure:  # once, not every tick
                    log.error("table writer failed (%s); starting it again", exc)
                self._failure = str(exc)
                await self._kill()
                continue
            self._failure = None
            for p, s in zip(request["partitions"], reply["statuses"]):
                status = self.status.setdefault((s["stream"], s["partition"]), TableStatus())
                status.first, status.end = s["first"], s["end"]
                status.files, status.bytes, status.error = s["files"], s["bytes"], s["error"]
                if (s["end"] or p["first"]) >= p["committed"] + 1:
                    status.synced_s = sent

    def _due(self, now: float) -> bool:
        """Whether a pass starts at ``now`` (time.monotonic() seconds): a third of the lag
        after the last one started, or half that when a partition's table is behind and its
        committed offset stood still for QUIET_S (once per committed offset, so a pass that
        cannot bring it up is not started again and again for it)."""
        interval = self.config.lag_ms / 3000
        settled = self._settled(now)
        since = now - self._last_pass_s
        if since < interval and not (settled and since >= interval / 2):
            return False
        self._last_pass_s = now
        self._flushed.update(settled)
        return True

    def _settled(self, now: float) -> dict[tuple[str, int], int]:
        """The partitions whose table is behind (and not failing) and whose committed offset
        has stood still for QUIET_S, once per committed offset: ``{(stream, partition):
        committed offset}``."""
        due = {}
        for stream in self.streams():
            for p in stream.partitions:
                key, committed = (stream.name, p.index), p.committed_offset
                moved = self._moved.get(key)
                if moved is None or moved[0] != committed:
                    self._moved[key] = (committed, now)
                elif (now - moved[1] >= QUIET_S and self._flushed.get(key) != committed
                      and getattr(self.status.get(key), "error", None) is None
                      and self.lag(stream, p.index)[0]):
                    due[key] = committed
        return due

    def _request(self) -> dict:
        partitions = []
        placement = self.broker.placement
        for stream in self.streams():
            created = placement.created_ns(stream.name)
            created = stream.created_ns if created is None else created
            self._created[stream.name] = created
            for p in stream.partitions:
                placed = placement.of(stream.name, p.index)
                if placed is None or placed.leader != placement.server_id:
                    self.status.pop((stream.name, p.index), None)
                    continue
                segments = p.log.segments
                partitions.append({
                    "stream": stream.name, "partition": p.index,
                    "created_ns": created,
                    "log_dir": p.log.directory,
                    "segments": [(s.base_offset, s.next_offset) for s in segments],
                    "first": p.first_offset, "committed": p.committed_offset,
                    "leader_epoch": placed.leader_epoch})
        return {"table_dir": self.table_dir, "archive": self.config.archive,
                "compression": self.config.compression, "format": self.config.format,
                "catalog": self.config.catalog, "expiry_ms": self.config.expiry_ms,
                "partitions": partitions,
                "drop": list(self._dropped)}

    async def _call(self, request: dict) -> dict:
        if self._worker is None or self._worker.returncode is not None:
            self._worker = await asyncio.create_subprocess_exec(
                # started from the event loop's thread, which lives as long as the server:
                # the worker dies with that thread (riverlog.tables.lifeline)
                sys.executable, "-m", "riverlog.tables.writer", str(os.getpid()),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, limit=REPLY_LIMIT)
        worker = self._worker
        worker.stdin.write(json.dumps(request).encode() + b"\n")
        await worker.stdin.drain()
        line = await worker.stdout.readline()
        if not line:
            code = await worker.wait()
            if code == EXIT_MISSING:
                raise ModuleNotFoundError("the table writer cannot import pyarrow or pyspark")
            raise EOFError(f"the worker exited with code {code}")
        return json.loads(line)

    async def _kill(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None and worker.returncode is None:
            worker.kill()
            await worker.wait()
