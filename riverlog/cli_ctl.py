# `riverlog ctl COMMAND`: rabbitmqctl's and rabbitmq-streams' commands, names, arguments,
# banners, output and exit codes, against a running server's management API (docs/
# operations.md "riverlog ctl"), so operators' scripts and the Java stream client's suite
# (-Drabbitmqctl.bin=scripts/rabbitmqctl) run unchanged.
# Owns the two ways in: `riverlog ctl ARGS` (cli.py attaches ctl_command) and
# `python -m riverlog.cli_ctl ARGS` (main: without loading the rest of riverlog's command
# line, what scripts/rabbitmqctl runs). The frame is cli_ctl_base.py; the commands are
# cli_ctl_lists.py (listings, status), cli_ctl_admin.py (changes) and cli_ctl_policies.py
# (policies).
from __future__ import annotations

import sys

import click

from . import cli_ctl_admin, cli_ctl_lists, cli_ctl_policies  # noqa: F401 (they register)
from .cli_ctl_base import run


@click.command("ctl", context_settings={"ignore_unknown_options": True,
                                        "allow_extra_args": True},
               add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def ctl_command(args: tuple[str, ...]) -> None:
    """rabbitmqctl's and rabbitmq-streams' commands (list_stream_connections, add_user,
    ...) against a running server's management API; `riverlog ctl --help` lists them."""
    sys.exit(run(args))


def main() -> None:
    """``python -m riverlog.cli_ctl ARGS``: exits with the command's exit code."""
    sys.exit(run(sys.argv[1:], prog="rabbitmqctl"))


if __name__ == "__main__":
    main()
