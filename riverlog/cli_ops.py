# The operations commands of `riverlog` (click): `stream list|create|delete|describe`,
# `publish`, `tail` and `stats`, all against a running server. cli.py attaches them to the
# main group (COMMANDS); the work is done in riverlog.ops.
# Rules: flags and printing only; where the server is comes from shared options (flags or
# RIVERLOG_* environment variables); a failure is one line on stderr and exit code 1.
from __future__ import annotations

import functools
import sys

import click

from .errors import RiverlogError
from .ops import (START_POSITIONS, Target, format_record, format_table, publish, scrape,
                  stats_tables, stream_create, stream_delete, stream_describe, stream_list,
                  tail)
from .security.tls import ClientTLS
from .tables import TABLE_ARGUMENT


def _target_options(fn):
    """--server, --user, --password, --grpc, --metrics-url, --timeout and the --tls options
    -> ``target``."""
    @click.option("--server", envvar="RIVERLOG_SERVER", default=Target.server,
                  show_default=True, help="RabbitMQ Stream address of the server "
                                          "(env RIVERLOG_SERVER).")
    @click.option("--user", envvar="RIVERLOG_USER", default=Target.user, show_default=True,
                  help="User (env RIVERLOG_USER).")
    @click.option("--password", envvar="RIVERLOG_PASSWORD", default=Target.password,
                  help="Password (env RIVERLOG_PASSWORD).  [default: guest]")
    @click.option("--grpc", envvar="RIVERLOG_GRPC", default=Target.grpc, show_default=True,
                  help="Liftbridge gRPC address, used to list streams (env RIVERLOG_GRPC).")
    @click.option("--metrics-url", envvar="RIVERLOG_METRICS_URL", default=Target.metrics,
                  show_default=True, help="Prometheus endpoint of the server, used by `stats` "
                                          "(env RIVERLOG_METRICS_URL).")
    @click.option("--timeout", type=float, default=Target.timeout, show_default=True,
                  help="Seconds to wait for the server.")
    @click.option("--tls", "use_tls", is_flag=True, envvar="RIVERLOG_TLS",
                  help="Speak TLS to the RabbitMQ Stream door (then --server names its TLS "
                       "port, 5551 by default) and to the gRPC door; implied by any --tls-* "
                       "option (env RIVERLOG_TLS).")
    @click.option("--tls-ca", envvar="RIVERLOG_TLS_CA", type=click.Path(exists=True, dir_okay=False),
                  help="CA certificate (PEM) that signed the server's certificate; default: "
                       "the system's trust store (env RIVERLOG_TLS_CA).")
    @click.option("--tls-cert", envvar="RIVERLOG_TLS_CERT", type=click.Path(exists=True, dir_okay=False),
                  help="Client certificate (PEM), for servers that ask for one; with "
                       "--tls-key (env RIVERLOG_TLS_CERT).")
    @click.option("--tls-key", envvar="RIVERLOG_TLS_KEY", type=click.Path(exists=True, dir_okay=False),
                  help="Private key (PEM) of --tls-cert (env RIVERLOG_TLS_KEY).")
    @click.option("--tls-server-name", envvar="RIVERLOG_TLS_SERVER_NAME",
                  help="Name the server certificate must carry (and the SNI sent); "
                       "default: the host of --server / --grpc (env RIVERLOG_TLS_SERVER_NAME).")
    @click.option("--sasl-mechanism", envvar="RIVERLOG_SASL_MECHANISM",
                  type=click.Choice(["PLAIN", "EXTERNAL"]), default=Target.mechanism,
                  show_default=True,
                  help="PLAIN: log in with --user/--password; EXTERNAL: as the user the "
                       "--tls-cert certificate names (its CN) (env RIVERLOG_SASL_MECHANISM).")
    @functools.wraps(fn)
    def wrapper(server, user, password, grpc, metrics_url, timeout, use_tls, tls_ca,
                tls_cert, tls_key, tls_server_name, sasl_mechanism, **kwargs):
        try:
            tls = (ClientTLS(tls_ca, tls_cert, tls_key, tls_server_name)
                   if use_tls or tls_ca or tls_cert or tls_key or tls_server_name else None)
            target = Target(server=server, user=user, password=password, grpc=grpc,
                            metrics=metrics_url, timeout=timeout, tls=tls,
                            mechanism=sasl_mechanism)
            return fn(target=target, **kwargs)
        except (RiverlogError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
    return wrapper


@click.group("stream")
def stream_group() -> None:
    """List, create, delete and describe streams on a running server."""


@stream_group.command("list")
@click.option("-a", "--all", "internal", is_flag=True,
              help="Include internal streams (__cursors, __activity).")
@_target_options
def stream_list_cmd(target: Target, internal: bool) -> None:
    """List streams (through the Liftbridge gRPC API: the RabbitMQ Stream protocol has no
    listing)."""
    rows = stream_list(target, internal)
    click.echo(format_table(["stream", "partitions", "subject"],
                            [[name, str(n), subject] for name, n, subject in rows]))


@stream_group.command("create")
@click.argument("name")
@click.option("--max-length-bytes", type=int, default=None,
              help="Retention: keep at most this many bytes (RabbitMQ max-length-bytes).")
@click.option("--max-age", default=None,
              help="Retention: drop segments older than this, e.g. 7D, 12h, 30m (RabbitMQ "
                   "max-age; units Y M D h m s).")
@click.option("--max-segment-size-bytes", type=int, default=None,
              help="Segment size (RabbitMQ stream-max-segment-size-bytes).")
@click.option("--table/--no-table", default=None,
              help="Mirror the stream to Parquet for Spark, or not, whatever the server's "
                   "default (x-riverlog-table; docs/spark.md \"Streams as tables\").")
@click.option("--exists-ok", is_flag=True, help="Succeed when the stream already exists.")
@_target_options
def stream_create_cmd(target: Target, name: str, max_length_bytes: int | None,
                      max_age: str | None, max_segment_size_bytes: int | None,
                      table: bool | None, exists_ok: bool) -> None:
    """Create stream NAME."""
    arguments = {key: str(value) for key, value in (
        ("max-length-bytes", max_length_bytes), ("max-age", max_age),
        ("stream-max-segment-size-bytes", max_segment_size_bytes)) if value is not None}
    if table is not None:
        arguments[TABLE_ARGUMENT] = "true" if table else "false"
    created = stream_create(target, name, arguments, exists_ok)
    click.echo(f"created stream {name}" if created else f"stream {name} already exists")


@stream_group.command("delete")
@click.argument("name")
@click.option("--missing-ok", is_flag=True, help="Succeed when the stream does not exist.")
@_target_options
def stream_delete_cmd(target: Target, name: str, missing_ok: bool) -> None:
    """Delete stream NAME and all its messages."""
    deleted = stream_delete(target, name, missing_ok)
    click.echo(f"deleted stream {name}" if deleted else f"stream {name} does not exist")


@stream_group.command("describe")
@click.argument("name")
@click.option("-c", "--consumer", "consumers", multiple=True,
              help="Also show the offset stored by this consumer name, and its lag "
                   "(repeatable).")
@_target_options
def stream_describe_cmd(target: Target, name: str, consumers: tuple[str, ...]) -> None:
    """Show stream NAME: leader, offsets, chunk ids, stored consumer offsets, and its Parquet
    table (the offsets it holds and its lag, from the server's metrics: --metrics-url); on a
    cluster member also its replicas, ISR, leader epoch, high watermark and, from the
    leader's metrics, each follower's lag."""
    rows = stream_describe(target, name, consumers)
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key.ljust(width)}  {value}")


@click.command("publish")
@click.argument("stream")
@click.argument("messages", nargs=-1)
@click.option("-k", "--key", default=None, help="Message key of every message (UTF-8).")
@click.option("--publisher-name", default=None,
              help="Publisher reference: the server deduplicates by it (RabbitMQ "
                   "publisher name).")
@_target_options
def publish_cmd(target: Target, stream: str, messages: tuple[str, ...], key: str | None,
                publisher_name: str | None) -> None:
    """Publish MESSAGES to STREAM and wait for the confirms. Without MESSAGES, every line
    of standard input is one message (without its line ending)."""
    values = ((m.encode() for m in messages) if messages else
              (line.rstrip(b"\r\n") for line in sys.stdin.buffer))
    sent = publish(target, stream, values, key=key.encode() if key is not None else None,
                   publisher_name=publisher_name)
    click.echo(f"published {sent} message(s) to {stream}", err=True)


@click.command("tail")
@click.argument("stream")
@click.option("--from", "start", default="earliest", show_default=True,
              help=f"Where to start: {', '.join(START_POSITIONS)} or an offset.")
@click.option("-f", "--follow", is_flag=True,
              help="Keep waiting for new messages (stop with Ctrl-C).")
@click.option("-n", "--max-messages", type=int, default=0,
              help="Stop after this many messages (0: no limit).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="text: the value; json: offset, timestamp_ns, key, "
                                      "value, headers.")
@_target_options
def tail_cmd(target: Target, stream: str, start: str, follow: bool, max_messages: int,
             fmt: str) -> None:
    """Print the messages of STREAM, one per line."""
    for offset, record in tail(target, stream, start, follow=follow, limit=max_messages):
        click.echo(format_record(offset, record, fmt))


@click.command("stats")
@_target_options
def stats_cmd(target: Target) -> None:
    """Print a running server's metrics as tables (scraped from its Prometheus endpoint,
    --metrics-url): streams, doors, consumer lag, errors, the NATS link; on a cluster
    member also Raft, partitions (leader, ISR, high watermark) and followers (lag)."""
    samples = scrape(target.metrics, target.timeout)
    for title, header, rows in stats_tables(samples):
        click.echo(f"{title}:")
        click.echo(format_table(header, rows) if rows else "  (none)")
        click.echo()


COMMANDS = (stream_group, publish_cmd, tail_cmd, stats_cmd)
