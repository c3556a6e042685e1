# The `riverlog` command line: parse flags, build the configuration, hand over to the code
# that does the work. Rules: no business logic here; every command has --help; errors are
# printed as one clear line with a non-zero exit code, never as a traceback.
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time

import click

from . import __version__
from .cli_ctl import ctl_command
from .cli_ops import COMMANDS as OPS_COMMANDS
from .cli_ops import stream_group
from .cli_replicas import REPLICA_COMMANDS, WAIT_S, raft_options
from .cluster.workers import AUTO, WORKERS_ENV, worker_count
from .config import Durability, ServerConfig
from .errors import RiverlogError
from .log.recovery import verify_partition
from .security.users import DEFAULT_ROUNDS, hash_password
from .server import gc_tuning
from .server.app import App
from .spark.demo import demo

log = logging.getLogger("riverlog")



def _setup_logging(level: str, fmt: str = "text") -> None:
    """Log records to stderr at ``level``: ``text`` lines, or ``json`` one object per line
    (time, level, logger, message, and exc_info when there is one) by python-json-logger."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter
        handler.setFormatter(JsonFormatter(
            "{asctime}{levelname}{name}{message}", style="{",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"}))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="riverlog")
def main() -> None:
    """riverlog: a durable, log-based stream server (RabbitMQ Stream, Liftbridge, Spark)."""


@main.command()
@click.option("-c", "--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="Liftbridge-style YAML configuration FILE (LIFTBRIDGE_* variables override "
                   "it, flags override both).")
@click.option("-d", "--data-dir", default=None, type=click.Path(file_okay=False),
              help="Where streams are stored.  [default: ./data]")
@click.option("--host", default=None,
              help="Address the doors listen on.  [default: 127.0.0.1]")
@click.option("--stream-port", type=int, default=None,
              help="RabbitMQ Stream port (0 picks a free port).  [default: 5552]")
@click.option("--advertised-host", default=None,
              help="Host clients are told to connect to (default: --host).")
@click.option("--advertised-port", type=int, default=None,
              help="Port RabbitMQ Stream clients are told to connect to (default: the stream "
                   "port).")
@click.option("--tls-cert", default=None, type=click.Path(dir_okay=False),
              help="Server certificate (PEM): TLS on every door (docs/security.md).")
@click.option("--tls-key", default=None, type=click.Path(dir_okay=False),
              help="Private key (PEM) of --tls-cert.")
@click.option("--tls-ca", default=None, type=click.Path(dir_okay=False),
              help="CA (PEM) that verifies client certificates.")
@click.option("--tls-client-auth", is_flag=True, default=None,
              help="Require client certificates signed by --tls-ca.")
@click.option("--stream-tls-port", type=int, default=None,
              help="RabbitMQ Stream TLS port, with --tls-cert (0 picks a free port).  "
                   "[default: 5551]")
@click.option("--silent-close-delay", default=None, metavar="DURATION",
              help="How long a refused RabbitMQ Stream login or Open waits before it is "
                   "answered, as RabbitMQ 4 (0 answers at once; docs/security.md).  "
                   "[default: 3s]")
@click.option("--validate-sub-batches", is_flag=True, default=None,
              help="Read compressed sub-entry batches through on publish and refuse unreadable "
                   "ones (0x11) instead of storing them as sent (docs/security.md).")
@click.option("--sendfile", is_flag=True, default=None,
              help="Send large chunks to RabbitMQ Stream consumers on plain TCP from the "
                   "segment file with os.sendfile (docs/rabbitmq-stream.md).")
@click.option("-p", "--port", type=int, default=None,
              help="Liftbridge gRPC port (0 picks a free port).  [default: 9292]")
@click.option("-n", "--nats-servers", multiple=True,
              help="Use running NATS servers at ADDR[,ADDR] instead of the embedded one.")
@click.option("-e", "--embedded-nats", is_flag=True, default=False,
              help="Run an embedded nats-server (the default unless --nats-servers is given).")
@click.option("--nc", "--embedded-nats-config", "embedded_nats_config", default=None,
              type=click.Path(dir_okay=False), help="nats-server configuration FILE for the "
                                                    "embedded server.")
@click.option("--nats-port", type=int, default=None,
              help="Port of the embedded nats-server (0 picks a free port).  [default: 4222]")
@click.option("--nats-cluster-port", type=int, default=None,
              help="Route port of the embedded nats-server, for the other cluster members' "
                   "nats-servers (riverlog.nats.cluster.port; needs riverlog.raft.address, "
                   "docs/clustering.md).")
@click.option("--nats-routes", multiple=True,
              help="Route addresses HOST:PORT[,HOST:PORT] of the other members' embedded "
                   "nats-servers (riverlog.nats.routes).")
@click.option("--id", "--server-id", "server_id", default=None,
              help="ID of this server (default: generated once and kept in the data dir).")
@click.option("--ns", "--namespace", "namespace", default=None,
              help="Liftbridge cluster namespace.  [default: liftbridge-default]")
@click.option("--raft-bootstrap-seed", is_flag=True, default=False,
              help="Start the metadata Raft with this server alone (clustering.raft.bootstrap."
                   "seed; read with riverlog.raft.address, see docs/clustering.md). A cluster "
                   "member with neither this nor clustering.raft.bootstrap.peers joins a "
                   "running cluster. A single riverlog server always is its own metadata "
                   "leader.")
@click.option("--durability", type=click.Choice([d.value for d in Durability]), default=None,
              help="When appends are fsynced (see docs/durability.md).  [default: interval]")
@click.option("--fsync-interval-ms", type=int, default=None,
              help="Fsync period for --durability interval.  [default: 200]")
@click.option("-l", "--level", default=None,
              type=click.Choice(["debug", "info", "warn", "warning", "error"]),
              help="Log level.  [default: info]")
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None,
              help="Log lines as text or as JSON objects (one per line).  [default: text]")
@click.option("--metrics-host", default=None,
              help="Address of the Prometheus /metrics endpoint.  [default: 127.0.0.1]")
@click.option("--metrics-port", type=int, default=None,
              help="Port of the /metrics endpoint (0 picks a free port).  [default: 15692]")
@click.option("--no-metrics", is_flag=True, default=False,
              help="Serve no /metrics endpoint.")
@click.option("--management-host", default=None,
              help="Address of the management HTTP API and web view (RabbitMQ's management "
                   "API subset, docs/operations.md).  [default: 127.0.0.1]")
@click.option("--management-port", type=int, default=None,
              help="Port of the management HTTP API and web view (0 picks a free port, "
                   "logged).  [default: 15672]")
@click.option("--no-management", is_flag=True, default=False,
              help="Serve no management HTTP API nor web view.")
@click.option("--grpc-transport", type=click.Choice(["grpcio", "h2"]), default=None,
              help="gRPC server transport of the Liftbridge door: riverlog's own HTTP/2 or "
                   "grpc.aio (docs/liftbridge.md).  [default: h2]")
@click.option("--tables", is_flag=True, default=False,
              help="Mirror every stream to Parquet for Spark (streams.table.enabled; "
                   "docs/spark.md \"Streams as tables\").")
@click.option("--table-dir", default=None, metavar="DIR|URI",
              help="Where the Parquet tables of streams are written: a folder or a URI "
                   "pyarrow opens (file://, s3://, gs://, hdfs://).  [default: DATA/tables]")
@click.option("--disk-free-limit", default=None, metavar="BYTES|FRACTION",
              help="Block publishers on every door while the data folder's filesystem has "
                   "less space available: bytes (50MB, 2GiB) or a fraction of the disk's "
                   "size (0.05), as RabbitMQ's disk_free_limit (riverlog.disk.free.limit; "
                   "docs/operations.md).  [default: 50MB]")
@click.option("--memory-high-watermark", default=None, metavar="FRACTION|BYTES",
              help="Block publishers on every door while the server's resident memory is "
                   "above this: a fraction of RAM (0.4) or bytes (2GB), as RabbitMQ's "
                   "vm_memory_high_watermark (riverlog.memory.high.watermark).  "
                   "[default: 0.4]")
@click.option("--table-format", type=click.Choice(["parquet", "iceberg"]), default=None,
              help="Tables as Apache Iceberg v2 tables in a catalog, or as Parquet files "
                   "listed by riverlog's manifest (streams.table.format).  [default: iceberg]")
@click.option("--table-catalog", default=None, metavar="URI",
              help="The Iceberg catalog: a REST catalog's http(s):// URI or an SQLAlchemy URL "
                   "(streams.table.catalog).  [default: SQLite in the table folder, "
                   "sqlite:///TABLE_DIR/catalog.db]")
@click.option("--workers", default=AUTO, show_default=True, metavar="N|auto",
              envvar=WORKERS_ENV, show_envvar=True,
              help="Run N server processes on this machine as one cluster, one core each; "
                   "clients are sent to each stream's worker by the protocols' metadata, "
                   "and worker 0 takes the ports given here. 'auto': one per core, unless "
                   "the data folder holds one process's data or the settings are a "
                   "cluster member's, an external NATS or an advertised port (then 1, as "
                   "the log says). 1: one process (docs/operations.md \"Workers\").")
def serve(config_file: str | None, workers: str, **flags) -> None:
    """Run the server until SIGINT or SIGTERM.

    Serves the RabbitMQ Stream protocol (rstream, rbfly, the Java/Go/.NET/Node clients) on
    --host:--stream-port, user guest/guest from loopback; and Liftbridge: its gRPC API on
    --host:--port (gufo-liftbridge, go-liftbridge, ...) and its NATS door on an embedded
    nats-server (or on --nats-servers). Accepts Liftbridge's flags and configuration file,
    so `liftbridge -c cfg -d dir --embedded-nats --raft-bootstrap-seed` works as
    `riverlog serve -c cfg -d dir --embedded-nats --raft-bootstrap-seed`.
    """
    from .config_file import INITIAL_SIZE_KEY, build, load, log_format, log_ignored
    try:
        for name in ("nats_servers", "nats_routes"):
            if flags.get(name):
                flags[name] = [s for arg in flags[name] for s in arg.split(",")]
        settings = load(config_file, os.environ)
        config, level = build(settings, flags)
        _setup_logging(level, log_format(settings, flags.get("log_format")))
        log_ignored(settings)
        count = worker_count(workers, config)
        if count > 1:
            _serve_workers(config, count, settings.get(INITIAL_SIZE_KEY) or 1)
        else:
            _run(_serve(config))
    except (RiverlogError, OSError, ValueError, RuntimeError, TimeoutError) as exc:
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
    gc_tuning.tune()
    await app.start()
    gc_tuning.freeze()
    _announce(app)
    log.info("press Ctrl-C to stop")
    try:
        await stop.wait()
    finally:
        await app.stop()


def _serve_workers(config: ServerConfig, count: int, initial_size) -> None:
    """`serve --workers COUNT`: the workers of riverlog.cluster.workers until SIGINT or
    SIGTERM. Raises ValueError (settings workers cannot run with), RuntimeError (a worker
    exited while starting), TimeoutError."""
    from .cluster.local import table
    from .cluster.workers import Workers, run
    argv = sys.argv[sys.argv.index("serve") + 1:]
    workers = Workers(config, count, argv, int(initial_size))

    def announce(workers: Workers) -> None:
        first = workers.members[0]
        host = first.advertised
        lines = [f"RabbitMQ Stream: {host}:{first.ports['stream']}",
                 f"Liftbridge gRPC: {host}:{first.ports['grpc']}",
                 f"NATS: nats://{host}:{first.ports['nats']}"]
        if workers.metrics is not None:
            lines.append(f"metrics: http://{workers.metrics.host}:{workers.metrics_port}"
                         f"/metrics")
        if workers.management:
            lines.append(f"management: http://{host}:{first.ports['management']}/")
        click.echo(table(workers.members, [p.pid for p in workers.procs]))
        click.echo(f"riverlog serving  {'  '.join(lines)}  ({count} workers; logs in "
                   f"{workers.directory}/<worker>/riverlog.log)")
        sys.stdout.flush()
    log.info("starting %d workers in %s", count, workers.directory)
    run(workers, announce)


def _announce(app: App) -> None:
    """Print where clients connect (stdout, whatever the log level)."""
    lines = []
    if app.rabbitmq_stream is not None:
        host, port = app.rabbitmq_stream.advertised
        lines.append(f"RabbitMQ Stream: {host}:{port}")
        if app.config.security.tls is not None:
            host, port = app.rabbitmq_stream.advertised_for(tls=True)
            lines.append(f"RabbitMQ Stream TLS: {host}:{port}")
    if app.grpc is not None:
        host, port = app.liftbridge.advertised
        lines.append(f"Liftbridge gRPC: {host}:{port}")
    if app.nats is not None:
        lines.append(f"NATS: {app.nats.url}")
    if app.metrics is not None:
        lines.append(f"metrics: {app.metrics.url}")
    if app.management is not None:
        lines.append(f"management: {app.management.url}")
    click.echo("riverlog serving  " + "  ".join(lines), nl=True)
    sys.stdout.flush()


for _command in OPS_COMMANDS:  # stream, publish, tail, stats (riverlog/cli_ops.py)
    main.add_command(_command)
for _command in REPLICA_COMMANDS:
    stream_group.add_command(_command)
main.add_command(demo)  # riverlog demo ... (riverlog/spark/demo.py)
main.add_command(ctl_command)  # riverlog ctl ... (rabbitmqctl's commands: riverlog/cli_ctl.py)


@main.group("user")
def user_group() -> None:
    """Manage users of the configuration file (docs/security.md)."""


@user_group.command("hash")
@click.option("--rounds", type=click.IntRange(4, 31), default=DEFAULT_ROUNDS, show_default=True,
              help="bcrypt cost (log2 of the iterations).")
@click.option("--password", default=None, help="The password (default: prompted for twice "
                                                 "on a terminal, else the first line of stdin).")
def user_hash(rounds: int, password: str | None) -> None:
    """Print the bcrypt hash of a password for `riverlog.users` in the configuration file."""
    if password is None:
        if sys.stdin.isatty():
            password = click.prompt("Password", hide_input=True, confirmation_prompt=True,
                                    err=True)
        else:
            password = sys.stdin.readline().rstrip("\r\n")
    try:
        click.echo(hash_password(password, rounds))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@main.group("cluster")
def cluster_group() -> None:
    """Run a riverlog cluster on this machine (docs/clustering.md)."""


@cluster_group.command("up")
@click.option("-s", "--servers", type=click.IntRange(1, 99), default=3, show_default=True,
              help="How many `riverlog serve` processes.")
@click.option("-d", "--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="The cluster's folder: DIR/<id>/ holds each server's data and riverlog.log, "
                   "DIR/raft-password the generated Raft password (0600), DIR/cluster.json "
                   "the ports (reused next time while free).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address every door and the NATS routes listen on.")
@click.option("--advertise", default=None,
              help="Host the servers reach each other at (Raft listens there) and tell "
                   "clients to connect to; an address of --host unless that is 0.0.0.0 "
                   "or ::.  [default: --host; 127.0.0.1 for 0.0.0.0, ::1 for ::]")
def cluster_up(servers: int, directory: str, host: str, advertise: str | None) -> None:
    """Start a cluster of SERVERS servers on free ports, wait until each is registered in
    the cluster metadata, print where each door of each server listens (and its process
    id), and run until Ctrl-C or SIGTERM, which stops them all. A server that exits (e.g.
    killed to try a failover) is reported and the others keep running. Running it again on
    the same DIR starts the same servers with their data."""
    from .cluster.local import LocalCluster, table
    stop = []

    def on_signal(signum, frame) -> None:
        stop.append(signum)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        cluster = LocalCluster(directory, servers, host, advertise)
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    cluster.start()
    try:
        cluster.wait_registered(stopping=lambda: bool(stop))
        if not stop:
            click.echo(table(cluster.members, [p.pid for p in cluster.procs]))
            click.echo(f"{servers} servers up (logs in {cluster.directory}/<server>/"
                       f"riverlog.log); press Ctrl-C to stop them")
            sys.stdout.flush()
        told = set()
        while not stop:  # a server that exits (killed to try a failover) is told, once
            for server_id, code in cluster.exited():
                if server_id not in told:
                    told.add(server_id)
                    click.echo(f"server {server_id} exited with code {code}", err=True)
            time.sleep(0.2)
    except (RuntimeError, TimeoutError) as exc:
        raise click.ClickException(f"{exc}; stopping the cluster") from None
    finally:
        cluster.stop()


HAND_OVER_TRIES = 3
"""remove-server --move-replicas: hand-over-and-remove attempts (a server that handed the
Raft leadership over can be elected again before its removal, on a loaded machine)."""


@cluster_group.command("remove-server")
@click.argument("raft_address")
@click.option("--move-replicas", is_flag=True,
              help="First move every replica the server holds to the other servers (the "
                   "ones holding the fewest replicas), each deleted once its replacement is "
                   "in sync; then, if the server leads the Raft, it hands the leadership "
                   "over.")
@click.option("--wait", "wait_s", type=float, default=WAIT_S, show_default=True,
              help="With --move-replicas: seconds to wait for the new replicas to join the "
                   "ISR (nothing is deleted or removed if they do not).")
@raft_options
def cluster_remove_server(raft_address: str, member: str, password: str, move_replicas: bool,
                          wait_s: float) -> None:
    """Take the server whose Raft address is RAFT_ADDRESS out of a running cluster: out of
    the metadata Raft (pysyncobj's removeNodeFromCluster, over --member's Raft port with
    the Raft password), then, by the Raft leader, out of the cluster metadata (new streams
    no longer place replicas on it). Its replicas stay in the partitions' replica lists
    unless --move-replicas moves them first; then a server leading the Raft hands the
    leadership over before it is removed. Without --move-replicas the Raft leader cannot be
    removed: ask again once another member leads."""
    from .cluster.metadata import (RaftUnavailable, admin_at, hand_over_leadership,
                                   remove_member_at)
    from .cluster.reassign import move_replicas_off, server_with_raft_address, wait_applied_off
    if move_replicas:
        server = server_with_raft_address(admin_at(member, password, "state"), raft_address)
        moves = move_replicas_off(member, password, server, wait_s, click.echo)
        click.echo(f"moved {len(moves)} replicas off {server}")
        if not wait_applied_off(raft_address, password, server, wait_s):
            click.echo(f"{server} does not answer: it removes its replicas' files when it "
                       f"runs again")
    for attempt in range(HAND_OVER_TRIES if move_replicas else 1):
        if move_replicas and hand_over_leadership(raft_address, password):
            click.echo(f"{raft_address} handed the Raft leadership over")
        try:
            remove_member_at(member, raft_address, password)
            break
        except RaftUnavailable:  # e.g. elected again right after it handed over
            if attempt == HAND_OVER_TRIES - 1 or not move_replicas:
                raise
    click.echo(f"removed {raft_address} from the metadata Raft; the Raft leader removes its "
               f"server from the metadata within a second")


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

