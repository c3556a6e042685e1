# `riverlog demo ...`: runnable demonstrations. Owns only their command line (flags -> the
# job's arguments); the work lives in the job modules (riverlog.spark.flights). Rules: pyspark,
# pandas and friends are imported when a command runs, never when the CLI starts; errors are
# one line and a non-zero exit. The `demo` group knows nothing of the main command: riverlog/
# cli.py attaches it (main.add_command).
from __future__ import annotations

import click


@click.group()
def demo() -> None:
    """Demonstrations that run against a riverlog server (start one with `riverlog serve`)."""


@demo.command("flights")
@click.option("--servers", default="127.0.0.1:5552", show_default=True,
              help="riverlog RabbitMQ Stream address(es), host:port[,host:port].")
@click.option("--out", default="./flights-out", show_default=True,
              type=click.Path(file_okay=False), help="Parquet output and checkpoint folder.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master.")
@click.option("--limit", type=int, default=None, help="Publish only the first N flights.")
@click.option("--skip-load", is_flag=True, help="Do not publish the flights (already loaded).")
@click.option("--max-offsets-per-trigger", type=int, default=100_000, show_default=True,
              help="Events per micro-batch.")
@click.option("--in-stream", default="nycflights13", show_default=True)
@click.option("--out-stream", default="nycflights13-delays", show_default=True)
@click.option("--table-dir", default=None, metavar="DIR|URI",
              help="The server's table folder (serve --table-dir): read the history from "
                   "IN_STREAM's table there when it has one (docs/spark.md).")
@click.option("--table-catalog", default=None, metavar="URI",
              help="The Iceberg catalog of IN_STREAM's table.  [default: the one the server "
                   "names]")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def flights(servers: str, out: str, master: str, limit: int | None, skip_load: bool,
            max_offsets_per_trigger: int, in_stream: str, out_stream: str,
            table_dir: str | None, table_catalog: str | None, no_progress: bool) -> None:
    """The NYC 2013 flights pipeline: publish all 336,776 flights as JSON events, then a
    Spark Structured Streaming job computes per origin and carrier, in 1-hour event-time
    windows, flight count, mean and p90 departure delay and cancellation rate, writes them to
    Parquet (OUT/windows) and to OUT_STREAM, and prints the worst windows.

    The same job runs under spark-submit (docs/spark.md)."""
    try:
        from . import flights as job
    except ImportError as exc:
        raise click.ClickException(f"{exc}: install the Spark extra: pip install "
                                   "'riverlog[spark]'") from None
    argv = ["--servers", servers, "--out", out, "--master", master, "--in-stream", in_stream,
            "--out-stream", out_stream, "--max-offsets-per-trigger", str(max_offsets_per_trigger)]
    if limit:
        argv += ["--limit", str(limit)]
    if skip_load:
        argv.append("--skip-load")
    if table_dir:
        argv += ["--table-dir", table_dir]
    if table_catalog:
        argv += ["--table-catalog", table_catalog]
    if no_progress:
        argv.append("--no-progress")
    try:
        code = job.main(argv)
    except ImportError as exc:
        raise click.ClickException(f"{exc}: install the Spark extra: pip install "
                                   "'riverlog[spark]'") from None
    except Exception as exc:  # a server that does not answer, Spark failing to start, ...
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    if code:
        raise SystemExit(code)
