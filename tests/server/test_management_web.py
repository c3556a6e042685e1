"""The web view at `/` of the management port, in headless Chromium (Debian's `chromium`
package, driven by Playwright): the page loads with the browser's basic-auth credentials and
shows a stream a test just created with rstream, the messages it just published, its
publisher and its consumer; its charts draw the server's and the stream's message rates and
consumer lag from the API's samples while rstream publishes and consumes; a resource alarm
raises the banner and shows on its node; an administrator closes a connection and creates
and deletes a stream (and a virtual host, where the API has them), a user who may only
consume gets no buttons (and the API refuses it their changes). No request of the page
leaves 127.0.0.1 (plotly.js is the server's). A screenshot of each page is kept in
$RIVERLOG_SCREENSHOTS, else in the test's tmp_path (the test prints where).
Skipped only where no chromium is installed."""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from urllib.parse import urlsplit

import pytest
from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer

from riverlog.config import (AlarmConfig, LogConfig, ManagementConfig, RabbitStreamConfig,
                             SecurityConfig, ServerConfig, Threshold)
from riverlog.security.users import hash_password
from riverlog.server.app import App
from server.test_management import basic, call

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed "
                                 "(apt-get install chromium)")]
OPS = basic("ops", "ops")
SAMPLE_MS = 200  # the server samples rates five times a second here, not every 5 s


async def _app(tmp_path, **kwargs) -> App:
    config = ServerConfig(data_dir=str(tmp_path / "data"), log=LogConfig(),
                          rabbitmq_stream=RabbitStreamConfig(port=0),
                          management=ManagementConfig(port=0, sample_interval_ms=SAMPLE_MS),
                          **kwargs)
    app = App(config)
    await app.start()
    return app


@contextlib.asynccontextmanager
async def _browser(app: App, user: str = "guest", password: str = "guest"):
    """A page of ``app``'s web view logged in as ``user``; fails the test if the page asks
    anything of a host other than 127.0.0.1."""
    from playwright.async_api import async_playwright
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                           args=["--no-sandbox"])
        context = await browser.new_context(
            http_credentials={"username": user, "password": password},
            viewport={"width": 1400, "height": 1000})
        page = await context.new_page()
        hosts: set[str] = set()
        page.on("request", lambda request: hosts.add(urlsplit(request.url).hostname))
        page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
        await page.goto(f"http://127.0.0.1:{app.management.port}/")
        try:
            yield page
        finally:
            await browser.close()
        assert hosts == {"127.0.0.1"}, hosts


async def _screenshot(page, tmp_path, name: str) -> None:
    folder = os.environ.get("RIVERLOG_SCREENSHOTS") or str(tmp_path / "screenshots")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.png")
    await page.screenshot(path=path, full_page=True)
    print(f"screenshot of the web view: {path}")


async def _chart(page, chart: str, trace: int) -> tuple[float, int]:
    """(the largest value, the number of points) the chart's trace draws (plotly keeps its
    data on the element); (-1, 0) before it draws any."""
    return tuple(await page.evaluate(
        "([id, i]) => { const d = document.getElementById(id).data;"
        " return d && d[i] && d[i].y.length ? [Math.max(...d[i].y), d[i].y.length]"
        " : [-1, 0]; }", [chart, trace]))


async def _wait_chart(page, chart: str, trace: int, above: float = 0.0,
                      points: int = 2) -> None:
    """Until the chart's trace draws a value above ``above`` among ``points`` or more."""
    for _ in range(300):
        top, count = await _chart(page, chart, trace)
        if top > above and count >= points:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{chart} trace {trace} never drew a value above {above}")


async def test_page_shows_new_stream_and_its_messages(tmp_path):
    from playwright.async_api import expect
    app = await _app(tmp_path)
    port = app.rabbitmq_stream.port
    try:
        async with _browser(app) as page:
            await expect(page.locator("#status")).to_contain_text("updated", timeout=30_000)
            await expect(page.locator("#alarm-banner")).to_be_hidden()
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
                    # vhost, queue, stream, partition, subject, leader, replicas, ISR, first
                    # offset, committed offset, messages, rate, table lag, consumers
                    await expect(row.locator("td").nth(0)).to_have_text("/")
                    await expect(row.locator("td").nth(9)).to_have_text("11", timeout=30_000)
                    await expect(row.locator("td").nth(10)).to_have_text("12")
                    await expect(row.locator("td").nth(13)).to_have_text("1")
                    await expect(page.locator("#connections tbody")).to_contain_text(
                        "web-producer")
                    publisher = page.locator("#publishers tbody tr", has_text="web-stream")
                    await expect(publisher.locator("td").nth(5)).to_have_text("12")
                    consumer_row = page.locator("#consumers tbody tr", has_text="web-stream")
                    await expect(consumer_row.locator("td").nth(5)).to_have_text("0")
                    await expect(consumer_row.locator("td").nth(6)).to_have_text("12")
                finally:
                    await consumer.close()
    finally:
        await app.stop()


async def test_charts_draw_rates_and_lag_of_the_server_and_a_stream(tmp_path):
    from playwright.async_api import expect
    app = await _app(tmp_path)
    port = app.rabbitmq_stream.port
    try:
        async with _browser(app) as page, \
                Producer("127.0.0.1", port, username="guest", password="guest") as producer:
            await producer.create_stream("charted")
            consumer = Consumer("127.0.0.1", port, username="guest", password="guest")
            await consumer.start()
            await consumer.subscribe("charted", lambda msg, ctx: None,
                                     offset_specification=ConsumerOffsetSpecification(
                                         OffsetType.FIRST))
            stop = asyncio.Event()
            # a consumer that takes one chunk and then waits: its lag grows with the flow
            slow = Consumer("127.0.0.1", port, username="guest", password="guest")
            await slow.start()

            async def hold(msg, ctx):
                await stop.wait()
            await slow.subscribe("charted", hold, initial_credit=1,
                                 offset_specification=ConsumerOffsetSpecification(
                                     OffsetType.FIRST))

            async def publish():  # a steady flow for the charts: 100 confirmed each 100 ms
                i = 0
                while not stop.is_set():
                    for _ in range(100):
                        await producer.send("charted", b"c%d" % i)
                        i += 1
                    await asyncio.sleep(0.1)
            flow = asyncio.create_task(publish())
            try:
                # published, confirmed and delivered, each drawn above 0 msg/s
                for trace in range(3):
                    await _wait_chart(page, "chart-rates", trace, points=8)
                await _wait_chart(page, "chart-lag", 0, above=100)
                await expect(page.locator("#chart-rates .main-svg").first).to_be_visible()
                await _screenshot(page, tmp_path, "overview")
                await page.locator("#streams a", has_text="charted").click()
                await expect(page.locator("#stream-name")).to_have_text("charted")
                for trace in range(3):
                    await _wait_chart(page, "stream-chart-rates", trace, points=8)
                await _wait_chart(page, "stream-chart-lag", 0, above=100)
                await expect(page.locator("#stream-publishers tbody tr")).to_have_count(1)
                await expect(page.locator("#stream-consumers tbody tr")).to_have_count(2)
                await _screenshot(page, tmp_path, "stream")
            finally:
                stop.set()
                await flow
                await consumer.close()
                await slow.close()
    finally:
        await app.stop()


async def test_alarm_banner_and_nodes(tmp_path):
    from playwright.async_api import expect
    # more free space asked for than any disk has: the disk alarm holds from the start
    app = await _app(tmp_path, alarms=AlarmConfig(disk_free_limit=Threshold(2 ** 62),
                                                  interval_ms=100))
    try:
        async with _browser(app) as page:
            banner = page.locator("#alarm-banner")
            await expect(banner).to_be_visible(timeout=30_000)
            await expect(banner).to_contain_text("disk on rabbit@")
            node = page.locator("#nodes tbody tr").first
            await expect(node.locator("td").nth(2)).to_have_text("disk")
            await expect(node.locator("td").nth(4)).to_contain_text("EiB")  # 4 EiB asked for
            await expect(node.locator("td").nth(3)).to_contain_text("B")  # free disk
            await expect(node.locator("td").nth(5)).to_contain_text("B")  # memory used
            await _screenshot(page, tmp_path, "alarm")
    finally:
        await app.stop()


async def test_administrator_buttons_and_a_consumer_only_user_without_them(tmp_path):
    from playwright.async_api import expect
    # authorization on: ops may do anything (an administrator), watcher only consume
    users = tuple((name, hash_password(name, rounds=4)) for name in ("ops", "watcher"))
    rules = (("p", "ops", "*", "*"), ("p", "watcher", "*", "consume"))
    app = await _app(tmp_path, security=SecurityConfig(users=users, loopback_users=(),
                                                       authz=True, authz_rules=rules))
    port = app.rabbitmq_stream.port
    try:
        async with _browser(app, "ops", "ops") as page, \
                Producer("127.0.0.1", port, username="ops", password="ops",
                         connection_name="doomed") as producer:
            await producer.create_stream("keep")
            await producer.send_wait("keep", b"k")  # rstream keeps a publisher's connection
            await expect(page.locator("#user")).to_have_text("ops (administrator)")
            # create a stream, then delete it with its button
            form = page.locator("#create-stream")
            await form.locator("input[name=name]").fill("made-in-browser")
            await form.locator("input[name=max_age]").fill("1D")
            await form.locator("button").click()
            await expect(form.locator(".message")).to_contain_text("HTTP 201")
            row = page.locator("#streams tbody tr", has_text="made-in-browser")
            await expect(row).to_have_count(1)
            await expect(row.locator("td")).to_have_count(15)  # and the Delete button's
            assert "made-in-browser" in app.broker.streams
            await row.locator("button", has_text="Delete").click()
            await expect(row).to_have_count(0)
            assert "made-in-browser" not in app.broker.streams
            # close rstream's connection with its button
            conn = page.locator("#connections tbody tr", has_text="doomed")
            await expect(conn).to_have_count(1)
            await _screenshot(page, tmp_path, "administrator")
            await conn.locator("button", has_text="Close").click()
            await expect(conn).to_have_count(0)
            assert not [c for c in app.rabbitmq_stream.connections if not c.state.closing]
            # a virtual host: created and deleted where the API has PUT/DELETE /api/vhosts,
            # else the page says the API refused it
            vhosts = page.locator("#create-vhost")
            await vhosts.locator("input[name=name]").fill("web-vhost")
            await vhosts.locator("button").click()
            message = vhosts.locator(".message")
            await expect(message).to_contain_text("create virtual host web-vhost: ")
            status, _ = await call(app, "GET", "/api/vhosts/web-vhost", auth=OPS)
            if status == 200:
                vrow = page.locator("#vhosts tbody tr", has_text="web-vhost")
                await expect(vrow).to_have_count(1)
                await vrow.locator("button", has_text="Delete").click()
                await expect(vrow).to_have_count(0)
            else:
                await expect(message).to_contain_text("refused: HTTP 4")
        # a user who may only consume sees the streams but no button, and the API refuses
        # it what the buttons do
        async with _browser(app, "watcher", "watcher") as page:
            await expect(page.locator("#user")).to_have_text("watcher")
            await expect(page.locator("#status")).to_contain_text("updated", timeout=30_000)
            await expect(page.locator("#streams tbody")).to_contain_text("keep")
            # no administrator's column either: 14 cells as 14 headers
            await expect(page.locator("#streams tbody tr").first.locator("td")).to_have_count(14)
            assert await page.locator("button:visible").count() == 0
            assert await page.locator("form:visible").count() == 0
            await _screenshot(page, tmp_path, "consumer-only")
        watcher = basic("watcher", "watcher")
        assert (await call(app, "DELETE", "/api/queues/%2F/keep", auth=watcher))[0] == 401
        assert (await call(app, "PUT", "/api/queues/%2F/other", auth=watcher,
                           json={"arguments": {}}))[0] == 401
        assert "keep" in app.broker.streams and "other" not in app.broker.streams
    finally:
        await app.stop()
