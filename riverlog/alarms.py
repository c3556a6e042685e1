# Resource alarms, as RabbitMQ's disk_free_limit and vm_memory_high_watermark
# (docs/operations.md "Resource alarms"): owns measuring the space available on the data
# folder's filesystem and this process' resident memory, the alarms those measures raise and
# clear, and telling the doors (``listeners``) when publishers must be blocked or may go on.
# Rules: an alarm is raised and cleared only here, by a check (every AlarmConfig.interval_ms
# while ``run`` runs, or ``check()``); listeners hear each change of ``blocked`` once, on the
# event loop; a failed measure (the folder gone) raises no alarm and is logged once; nothing
# here touches a door or a file of the log.
from __future__ import annotations

import asyncio
import logging
import shutil
from typing import Callable

import psutil

from .config import AlarmConfig

log = logging.getLogger("riverlog.alarms")

DISK, MEMORY = "disk", "memory"
RESOURCES = (DISK, MEMORY)


class ResourceAlarms:
    """The alarms of one server over the data folder ``path``.

    ``raised`` holds the resources in alarm (DISK, MEMORY); ``blocked`` is True while any
    is; ``listeners`` are called with ``blocked`` after it changes. The last measures, in
    bytes, are ``disk_free``/``disk_limit`` and ``memory_used``/``memory_limit`` (None
    before the first check)."""

    def __init__(self, path: str, config: AlarmConfig | None = None) -> None:
        self.path = path
        self.config = config or AlarmConfig()
        self.raised: set[str] = set()
        self.listeners: list[Callable[[bool], None]] = []
        self.disk_free: int | None = None
        self.disk_limit: int | None = None
        self.memory_used: int | None = None
        self.memory_limit: int | None = None
        self._process = psutil.Process()
        self._failed = False  # a measure failed (logged once until one works again)
        self._task: asyncio.Task | None = None

    @property
    def blocked(self) -> bool:
        """True while an alarm holds: publishers are blocked on every door."""
        return bool(self.raised)

    def describe(self) -> str:
        """Why publishers are blocked, for errors sent to clients ("" when they are not)."""
        parts = []
        if DISK in self.raised:
            parts.append(f"disk alarm: {self.disk_free} bytes free, below the "
                         f"disk_free_limit of {self.disk_limit}")
        if MEMORY in self.raised:
            parts.append(f"memory alarm: {self.memory_used} bytes used, above the "
                         f"memory_high_watermark of {self.memory_limit}")
        return "; ".join(parts)

    def refusal(self) -> str:
        """The error text a door sends a refused publisher while an alarm holds."""
        return f"publishers are blocked by a resource alarm ({self.describe()}); try again later"

    def check(self) -> None:
        """Measure both resources now and raise or clear their alarms."""
        try:
            usage = shutil.disk_usage(self.path)
            self.disk_free = usage.free  # what an unprivileged writer may still use
            self.disk_limit = self.config.disk_free_limit.of(usage.total)
            self.memory_used = self._process.memory_info().rss
            self.memory_limit = self.config.memory_high_watermark.of(
                psutil.virtual_memory().total)
        except OSError as exc:
            if not self._failed:
                log.error("cannot measure resources for the alarms (%s): %s", self.path, exc)
            self._failed = True
            return
        self._failed = False
        self._set(DISK, self.disk_free < self.disk_limit,
                  f"{self.disk_free} bytes free on {self.path}, disk_free_limit "
                  f"{self.disk_limit}")
        self._set(MEMORY, self.memory_used > self.memory_limit,
                  f"{self.memory_used} bytes resident, memory_high_watermark "
                  f"{self.memory_limit}")

    def _set(self, resource: str, on: bool, measure: str) -> None:
        if on == (resource in self.raised):
            return
        was = self.blocked
        if on:
            self.raised.add(resource)
            log.warning("%s alarm set (%s): publishers are blocked on every door until it "
                        "clears", resource, measure)
        else:
            self.raised.discard(resource)
            log.info("%s alarm cleared (%s)", resource, measure)
        if self.blocked != was:
            for listener in list(self.listeners):
                listener(self.blocked)

    def start(self) -> None:
        """Check now, then every interval, on the running loop, until ``stop``."""
        self.check()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        interval = self.config.interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self.check()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
