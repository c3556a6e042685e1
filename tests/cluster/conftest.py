# Fixtures of tests/cluster: `cluster`, three started Apps of one cluster (_apps.py), stopped
# after the test. Modules testing a part of the cluster on its own (Raft members as processes,
# replication engines) define a `cluster` fixture of their own, which pytest prefers there.
from __future__ import annotations

import pytest

from _apps import started, stopped


@pytest.fixture
async def cluster(tmp_path):
    apps = await started(tmp_path)
    try:
        yield apps
    finally:
        await stopped(apps)
