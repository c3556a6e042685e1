"""How fast a resource alarm blocks publishers and releases them (riverlog.alarms,
docs/operations.md "Resource alarms"), on the RabbitMQ Stream door with rstream.

An rstream producer publishes batches of 100 messages without waiting; the memory alarm is
raised by lowering the watermark to 0 bytes, then cleared by raising it again (the alarm
itself, not the measure, is what is timed). Per round, from the alarm being set (the check
that sets it) to the server no longer reading the publishing connection ("block", every
connection with publishers held), how many messages were confirmed after that (those the
server had read before), and from the alarm clearing to the first confirm of a held message
("release"; and to its being stored). The check period (AlarmConfig.interval_ms, 1 s by default) adds up to one period
before the alarm is set: it is reported separately.

Run:
  .venv/bin/python benchmarks/alarms_bench.py [--rounds 20]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from rstream import Producer

from riverlog.config import AlarmConfig, RabbitStreamConfig, ServerConfig, Threshold
from riverlog.server.app import App
from riverlog.server.rabbitmq_stream.flow import ALARM

LOW = AlarmConfig(memory_high_watermark=Threshold(0), interval_ms=50)
HIGH = AlarmConfig(memory_high_watermark=Threshold(1.0, relative=True), interval_ms=50)


async def until(condition, timeout: float = 30.0) -> float:
    deadline = time.perf_counter() + timeout
    while not condition():
        if time.perf_counter() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0)
    return time.perf_counter()


async def run(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as data:
        app = App(ServerConfig(data_dir=data, rabbitmq_stream=RabbitStreamConfig(port=0),
                               alarms=HIGH))
        await app.start()
        alarms = app.broker.alarms
        marks: dict[str, float] = {}
        alarms.listeners.append(
            lambda blocked: marks.__setitem__("set" if blocked else "clear",
                                              time.perf_counter()))
        confirms: list[float] = []
        block_ms, release_ms, late, stored_ms = [], [], [], []
        try:
            async with Producer("127.0.0.1", app.rabbitmq_stream.port, username="guest",
                                password="guest") as producer:
                await producer.create_stream("alarms-bench")
                stop = asyncio.Event()

                async def publish() -> None:
                    while not stop.is_set():
                        await producer.send_batch(
                            "alarms-bench", [b"x" * 100] * 100,
                            on_publish_confirm=lambda s: confirms.append(time.perf_counter()))
                        await asyncio.sleep(0.001)

                task = asyncio.create_task(publish())
                await until(lambda: len(confirms) > 1000)
                for _ in range(rounds):
                    conns = [c for c in app.rabbitmq_stream.connections if c.publishers]
                    alarms.config = LOW
                    held = await until(lambda: all(c.flow.holds(ALARM) for c in conns))
                    block_ms.append((held - marks["set"]) * 1000)
                    await asyncio.sleep(0.3)
                    late.append(sum(1 for t in confirms if t > held))
                    before = len(confirms)
                    partition = app.broker.streams["alarms-bench"].partitions[0]
                    end = partition.committed_offset
                    alarms.config = HIGH
                    stored = await until(lambda: partition.committed_offset > end)
                    stored_ms.append((stored - marks["clear"]) * 1000)
                    await until(lambda: len(confirms) > before)
                    release_ms.append((confirms[before] - marks["clear"]) * 1000)
                    await asyncio.sleep(0.2)
                stop.set()
                await task
        finally:
            await app.stop()
    print(f"rounds: {rounds}, check period 50 ms (default 1000 ms adds up to one period)")
    print(f"block:   alarm set -> publishing connections not read: median "
          f"{statistics.median(block_ms):.3f} ms, max {max(block_ms):.3f} ms")
    print(f"         confirms after the hold (messages read before it): median "
          f"{statistics.median(late):.0f}, max {max(late)}")
    print(f"release: alarm cleared -> first held message stored: median "
          f"{statistics.median(stored_ms):.2f} ms, max {max(stored_ms):.2f} ms")
    print(f"         alarm cleared -> first held message confirmed: median "
          f"{statistics.median(release_ms):.2f} ms, max {max(release_ms):.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    asyncio.run(run(parser.parse_args().rounds))


if __name__ == "__main__":
    main()
