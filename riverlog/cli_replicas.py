# The replica commands of `riverlog` (click): `stream add-replica` and `stream delete-replica`
# (cli.py attaches them to the `stream` group), and the Raft options they share with
# `cluster remove-server` (a member's Raft address and the Raft password). The work is
# riverlog.cluster.reassign's.
# Rules: flags and printing only; the Raft password comes from a file or
# LIFTBRIDGE_RIVERLOG_RAFT_PASSWORD, never from the command line; a failure is one line on
# stderr and exit code 1.
from __future__ import annotations

import functools
import os

import click

from .errors import RiverlogError

WAIT_S = 300.0
"""How long a command waits for new replicas to join the ISR, by default."""


def raft_password(password_file: str | None) -> str:
    """The Raft password: the first line of ``password_file``, else the environment's
    LIFTBRIDGE_RIVERLOG_RAFT_PASSWORD. Raises click.ClickException when neither gives one."""
    if password_file:
        with open(password_file) as f:
            password = f.read().strip()
    else:
        password = os.environ.get("LIFTBRIDGE_RIVERLOG_RAFT_PASSWORD", "")
    if not password:
        raise click.ClickException("the Raft password: give --password-file or set "
                                   "LIFTBRIDGE_RIVERLOG_RAFT_PASSWORD")
    return password


def raft_options(fn):
    """--member and --password-file, passed on as ``member`` and ``password``; a
    RiverlogError or ValueError (a refused metadata change) becomes one line, exit 1."""
    @click.option("--member", required=True, envvar="RIVERLOG_RAFT_MEMBER", metavar="HOST:PORT",
                  help="The Raft address of a running member of the cluster, which takes the "
                       "request (env RIVERLOG_RAFT_MEMBER).")
    @click.option("--password-file", type=click.Path(exists=True, dir_okay=False),
                  help="A file holding the Raft password (e.g. DIR/raft-password of `cluster "
                       "up`).  [default: LIFTBRIDGE_RIVERLOG_RAFT_PASSWORD]")
    @functools.wraps(fn)
    def wrapper(member: str, password_file: str | None, **kwargs):
        password = raft_password(password_file)
        try:
            return fn(member=member, password=password, **kwargs)
        except (RiverlogError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
    return wrapper


def _partition_option(fn):
    return click.option(
        "-p", "--partition", "partitions", type=click.IntRange(min=0), multiple=True,
        help="A partition of a Liftbridge stream (repeatable; default: every partition). A "
             "RabbitMQ super stream's partitions are streams of their own: name them as "
             "STREAM (e.g. invoices-0).")(fn)


@click.command("add-replica")
@click.argument("stream")
@click.argument("server")
@_partition_option
@click.option("--wait", "wait_s", type=float, default=WAIT_S, show_default=True,
              help="Seconds to wait for the new replicas to join the ISR.")
@raft_options
def add_replica_cmd(member: str, password: str, stream: str, server: str,
                    partitions: tuple[int, ...], wait_s: float) -> None:
    """Add a replica of STREAM on SERVER (a server id), as `rabbitmq-streams add_replica`:
    through the Raft metadata; the new replica copies the leader's log and joins the ISR once
    it holds everything committed, and the command returns then. Refused: an unknown stream,
    partition or server, a server that holds a replica already."""
    from .cluster.metadata import admin_at
    from .cluster.reassign import add_replicas, partitions_of
    indexes = partitions_of(admin_at(member, password, "state"), stream, partitions)
    add_replicas(member, password, [(stream, i, server) for i in indexes], wait_s, click.echo)


@click.command("delete-replica")
@click.argument("stream")
@click.argument("server")
@_partition_option
@raft_options
def delete_replica_cmd(member: str, password: str, stream: str, server: str,
                       partitions: tuple[int, ...]) -> None:
    """Delete SERVER's replica of STREAM, as `rabbitmq-streams delete_replica`: through the
    Raft metadata; the leader's replica hands leadership to another in-sync replica first, and
    SERVER removes the replica's files. Refused: an unknown stream, partition or replica, and
    a deletion leaving fewer in-sync replicas than the stream's minIsr (at least one)."""
    from .cluster.metadata import admin_at
    from .cluster.reassign import delete_replicas, partitions_of
    indexes = partitions_of(admin_at(member, password, "state"), stream, partitions)
    delete_replicas(member, password, [(stream, i, server) for i in indexes], click.echo)


REPLICA_COMMANDS = (add_replica_cmd, delete_replica_cmd)
