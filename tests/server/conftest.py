# Fixtures of the in-process door tests: riverlog Apps in this process with the RabbitMQ
# Stream door on a free port and a data dir of their own (no other door).
from __future__ import annotations

import pytest

from riverlog.config import RabbitStreamConfig, ServerConfig
from riverlog.server.app import App


@pytest.fixture
async def app_factory(tmp_path):
    """``await make()`` -> a started App on its own data dir; every App is stopped at the end."""
    started: list[App] = []

    async def make() -> App:
        app = App(ServerConfig(data_dir=str(tmp_path / f"app{len(started)}"),
                               rabbitmq_stream=RabbitStreamConfig(port=0, silent_close_delay_ms=0)))
        await app.start()
        started.append(app)
        return app

    yield make
    for app in started:
        await app.stop()


@pytest.fixture
async def app(app_factory):
    return await app_factory()
