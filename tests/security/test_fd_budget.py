# Open files as a budget on a running server, with the real rstream client: the start raises
# the soft RLIMIT_NOFILE to the hard limit and logs both; with few descriptors to spare,
# more streams than descriptors are created and published to; when none can be had, the one
# Create fails (0x0f) and leaves no folder, the connection and every other stream keep
# working; /metrics shows open files against their limits.
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import resource
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rstream import Producer, exceptions

from _sec import PASSWORDS, security, server_config
from riverlog.server.app import App

BUDGET = 40
STREAMS = 150


async def scrape(app: App) -> dict[tuple[str, tuple], float]:
    def get() -> str:
        with urllib.request.urlopen(app.metrics.url, timeout=10) as resp:
            return resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(await asyncio.to_thread(get))
            for s in family.samples}


def highest_fd() -> int:
    return max(int(fd) for fd in os.listdir("/proc/self/fd"))


async def test_streams_beyond_descriptors_and_a_create_without_one(tmp_path, users, caplog):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(512, hard), hard))
    config = dataclasses.replace(server_config(tmp_path, security(users), liftbridge=False,
                                               metrics=True), log_open_files=BUDGET)
    app = App(config)
    hogs: list[int] = []
    try:
        with caplog.at_level(logging.INFO, "riverlog"):
            await app.start()
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
        assert f"open files: soft limit {hard}, hard limit {hard}" in caplog.text
        # from here on, 100 descriptors to spare for everything: fewer than the streams
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest_fd() + 100, hard))
        names = [f"s{i}" for i in range(STREAMS)]
        async with Producer("127.0.0.1", port=app.rabbitmq_stream.port, username="ops",
                            password=PASSWORDS["ops"]) as ops:
            for name in names:
                await ops.create_stream(name)
                await ops.send_wait(name, b"first")
            samples = await scrape(app)
            assert 0 < samples[("riverlog_open_files", (("scope", "log"),))] <= BUDGET
            assert samples[("riverlog_open_files_limit", (("scope", "log"),))] == BUDGET
            assert samples[("riverlog_open_files_limit", (("scope", "process"),))] == \
                resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            assert samples[("riverlog_open_files", (("scope", "process"),))] > 0
            # no descriptor left at all: the one Create fails, nothing of it stays
            with pytest.raises(OSError):
                while True:
                    hogs.append(os.open(os.devnull, os.O_RDONLY))
            with pytest.raises(exceptions.ServerError) as refused:
                await ops.create_stream("no-room")
            assert refused.value.code == 0x0F
            for fd in hogs:
                os.close(fd)
            hogs.clear()
            assert "no-room" not in app.broker.streams
            assert sorted(os.listdir(app.broker.root)) == sorted(names)
            for name in names:  # every stream still takes messages, on the same connection
                await ops.send_wait(name, b"second")
        assert all(app.broker.streams[n].partitions[0].next_offset == 2 for n in names)
    finally:
        for fd in hogs:
            os.close(fd)
        await app.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
