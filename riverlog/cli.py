# The `riverlog` command line: parse flags, build the configuration, hand over to the code
# that does the work. Rules: no business logic here; every command has --help; errors are
# printed as one clear line with a non-zero exit code, never as a traceback.
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import click

from . import __version__
from .config import Durability, LogConfig
from .errors import RiverlogError
from .log import CommitLog
from .log.recovery import verify_partition

log = logging.getLogger("riverlog")

STREAMS_DIR = "streams"
_DEFAULTS = LogConfig()


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _partition_dirs(data_dir: str) -> list[str]:
    """Partition folders under ``DATA/streams/<stream>/<partition>``."""
    root = os.path.join(data_dir, STREAMS_DIR)
    if not os.path.isdir(root):
        return []
    out = []
    for stream in sorted(os.listdir(root)):
        sdir = os.path.join(root, stream)
        if os.path.isdir(sdir):
            out.extend(os.path.join(sdir, p) for p in sorted(os.listdir(sdir), key=_num)
                       if p.isdigit())
    return out


def _num(name: str) -> int:
    return int(name) if name.isdigit() else -1


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="riverlog")
def main() -> None:
    """riverlog: a durable, log-based stream server (RabbitMQ Stream, Liftbridge, Spark)."""


@main.command()
@click.option("-d", "--data-dir", default="./data", show_default=True,
              type=click.Path(file_okay=False), help="Where streams are stored.")
@click.option("--durability", type=click.Choice([d.value for d in Durability]),
              default=_DEFAULTS.durability.value, show_default=True,
              help="When appends are fsynced (see docs/durability.md).")
@click.option("--fsync-interval-ms", type=int, default=_DEFAULTS.fsync_interval_ms,
              show_default=True, help="Fsync period for --durability interval.")
@click.option("--level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="Log level.")
def serve(data_dir: str, durability: str, fsync_interval_ms: int, level: str) -> None:
    """Run the server on DATA_DIR until SIGINT or SIGTERM.

    Today this opens and recovers every stored partition and keeps them open; the
    protocol doors (RabbitMQ Stream, NATS, gRPC) attach here as they land.
    """
    _setup_logging(level)
    config = LogConfig(durability=Durability(durability), fsync_interval_ms=fsync_interval_ms)
    try:
        asyncio.run(_serve(data_dir, config))
    except (RiverlogError, OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


async def _serve(data_dir: str, config: LogConfig) -> None:
    os.makedirs(os.path.join(data_dir, STREAMS_DIR), exist_ok=True)
    logs = []
    for path in _partition_dirs(data_dir):
        clog = CommitLog(path, config)
        logs.append(clog)
        log.info("partition %s: offsets %d..%d, %d bytes", path, clog.first_offset,
                 clog.last_offset, clog.size_bytes)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("riverlog %s serving %s (%d partitions, durability %s); press Ctrl-C to stop",
             __version__, os.path.abspath(data_dir), len(logs), config.durability.value)
    await stop.wait()
    log.info("shutting down: closing %d partitions", len(logs))
    for clog in logs:
        await clog.aclose()
    log.info("stopped")


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
