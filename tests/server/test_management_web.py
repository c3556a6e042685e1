"""The web view at `/` of the management port, in headless Chromium (Debian's `chromium`
package, driven by Playwright): the page loads with the browser's basic-auth credentials and
shows a stream a test just created with rstream, the messages it just published, its
publisher and its consumer. Skipped only where no chromium is installed."""
from __future__ import annotations

import asyncio
import shutil

import pytest
from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer

from riverlog.config import LogConfig, ManagementConfig, RabbitStreamConfig, ServerConfig
from riverlog.server.app import App

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed "
                                 "(apt-get install chromium)")]


async def test_page_shows_new_stream_and_its_messages(tmp_path):
    from playwright.async_api import async_playwright, expect
    config = ServerConfig(data_dir=str(tmp_path / "data"), log=LogConfig(),
                          rabbitmq_stream=RabbitStreamConfig(port=0),
                          management=ManagementConfig(port=0))
    app = App(config)
    await app.start()
    port = app.rabbitmq_stream.port
    try:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                               args=["--no-sandbox"])
            context = await browser.new_context(
                http_credentials={"username": "guest", "password": "guest"})
            page = await context.new_page()
            await page.goto(f"http://127.0.0.1:{app.management.port}/")
            await expect(page.locator("#status")).to_contain_text("updated", timeout=30_000)

            async with Producer("127.0.0.1", port, username="guest", password="guest",
                                connection_name="web-producer") as producer:
                await producer.create_stream("web-stream")
                for i in range(12):
                    await producer.send_wait("web-stream", b"m%d" % i)
                consumer = Consumer("127.0.0.1", port, username="guest", password="guest")
                await consumer.start()
                seen = asyncio.Event()

                async def on_message(msg, ctx):
                    if ctx.offset == 11:
                        seen.set()
                await consumer.subscribe("web-stream", on_message,
                                         offset_specification=ConsumerOffsetSpecification(
                                             OffsetType.FIRST))
                await asyncio.wait_for(seen.wait(), 30)
                try:
                    row = page.locator("#streams tbody tr", has_text="web-stream")
                    # queue, stream, partition, subject, leader, replicas, ISR, first offset,
                    # committed offset, messages, rate, table lag, consumers
                    await expect(row.locator("td").nth(8)).to_have_text("11", timeout=30_000)
                    await expect(row.locator("td").nth(9)).to_have_text("12")
                    await expect(row.locator("td").nth(12)).to_have_text("1")
                    await expect(page.locator("#connections tbody")).to_contain_text(
                        "web-producer")
                    publisher = page.locator("#publishers tbody tr", has_text="web-stream")
                    await expect(publisher.locator("td").nth(4)).to_have_text("12")
                    consumer_row = page.locator("#consumers tbody tr", has_text="web-stream")
                    await expect(consumer_row.locator("td").nth(4)).to_have_text("0")
                    await expect(consumer_row.locator("td").nth(5)).to_have_text("12")
                finally:
                    await consumer.close()
            await browser.close()
    finally:
        await app.stop()
