# Fixtures of tests/cluster: `cluster`, three started Apps of one cluster (_apps.py), stopped
# after the test.
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
