# The `riverlog` command line: parse flags, build the configuration, hand over to the code
# that does the work. Rules: no business logic here; every command has --help; errors are
# printed as one clear line with a non-zero exit code, never as a traceback.
from __future__ import annotations

import asyncio
import logging
import signal
import sys

import click

from . import __version__
from .config import Durability, LogConfig, RabbitStreamConfig, ServerConfig
from .errors import RiverlogError
from .log.recovery import verify_partition
from .server.app import App

log = logging.getLogger("riverlog")

_DEFAULTS = LogConfig()
_DEFAULT_STREAM = RabbitStreamConfig()


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="riverlog")
def main() -> None:
    """riverlog: a durable, log-based stream server (RabbitMQ Stream, Liftbridge, Spark)."""


@main.command()
@click.option("-d", "--data-dir", default="./data", show_default=True,
              type=click.Path(file_okay=False), help="Where streams are stored.")
@click.option("--host", default=_DEFAULT_STREAM.host, show_default=True,
              help="Address the doors listen on (loopback by default).")
@click.option("--stream-port", type=int, default=_DEFAULT_STREAM.port, show_default=True,
              help="RabbitMQ Stream port (0 picks a free port).")
@click.option("--advertised-host", default=None,
              help="Host clients are told to connect to (default: --host).")
@click.option("--advertised-port", type=int, default=None,
              help="Port clients are told to connect to (default: the stream port).")
@click.option("--durability", type=click.Choice([d.value for d in Durability]),
              default=_DEFAULTS.durability.value, show_default=True,
              help="When appends are fsynced (see docs/durability.md).")
@click.option("--fsync-interval-ms", type=int, default=_DEFAULTS.fsync_interval_ms,
              show_default=True, help="Fsync period for --durability interval.")
@click.option("--level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="Log level.")
def serve(data_dir: str, host: str, stream_port: int, advertised_host: str | None,
          advertised_port: int | None, durability: str, fsync_interval_ms: int,
          level: str) -> None:
    """Run the server on DATA_DIR until SIGINT or SIGTERM.

    Serves the RabbitMQ Stream protocol (rstream, rbfly, the Java/Go/.NET/Node clients) on
    --host:--stream-port, user guest/guest from loopback.
    """
    _setup_logging(level)
    try:
        config = ServerConfig(
            data_dir=data_dir,
            log=LogConfig(durability=Durability(durability), fsync_interval_ms=fsync_interval_ms),
            rabbitmq_stream=RabbitStreamConfig(host=host, port=stream_port,
                                               advertised_host=advertised_host,
                                               advertised_port=advertised_port))
        _run(_serve(config))
    except (RiverlogError, OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


def _run(main_coro) -> None:
    """Run on uvloop when it is installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main_coro)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main_coro)


async def _serve(config: ServerConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    app = App(config)
    await app.start()
    log.info("press Ctrl-C to stop")
    try:
        await stop.wait()
    finally:
        await app.stop()


@main.group("log")
def log_group() -> None:
    """Inspect commit-log folders on disk."""


@log_group.command("verify")
@click.argument("partition_dir", type=click.Path(exists=True, file_okay=False))
def verify(partition_dir: str) -> None:
    """Check every chunk of a partition folder (read-only) and report damage.

    Exits 0 when every chunk passes, 1 when something would be cut on the next open.
    """
    report = verify_partition(partition_dir)
    for problem in report.problems:
        click.echo(problem)
    if report.clean:
        click.echo(f"{partition_dir}: every chunk checks")
        return
    click.echo(f"{partition_dir}: {report.truncated_bytes} bytes would be cut on open")
    sys.exit(1)
