# The frame of `riverlog ctl` (cli_ctl.py): the command group, the options every command
# takes (rabbitmqctl's -n, -q, -s, -t, -p/--vhost, --formatter, --no-table-headers, and
# riverlog's --url, --username, --password), what prints a command's banner, rows and
# message (Ctl), and the run loop that turns every failure into one message on stderr and
# rabbitmqctl's exit code (ctl_client.py) instead of click's. The commands themselves are in
# cli_ctl_lists.py and cli_ctl_admin.py.
# Rules: options may come before or after the command name, as rabbitmqctl takes them;
# nothing here talks HTTP or formats rows itself.
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Callable, Sequence

import click

from .ctl_client import DEFAULT_URL, EX_SOFTWARE, EX_USAGE, CtlError, Management, node_url
from .ctl_output import FORMATTERS, render


@dataclasses.dataclass
class Ctl:
    """The options of one `riverlog ctl` run and what prints its answers."""

    url: str = DEFAULT_URL
    username: str = "guest"
    password: str = "guest"
    timeout: float = 60.0
    quiet: bool = False
    silent: bool = False
    formatter: str = "table"
    table_headers: bool = True
    vhost: str = "/"
    _api: Management | None = None

    @property
    def api(self) -> Management:
        if self._api is None:
            self._api = Management(self.url, self.username, self.password, self.timeout)
        return self._api

    @property
    def machine_readable(self) -> bool:
        return self.formatter == "json"

    def banner(self, *lines: str) -> None:
        """rabbitmqctl's info lines before the answer: none with -q, -s or --formatter
        json."""
        if not (self.quiet or self.silent or self.machine_readable):
            for line in lines:
                click.echo(line)

    def listing(self, rows: Sequence[dict[str, Any]]) -> None:
        """Print a listing's rows (dicts with the asked keys in order) in the formatter."""
        header = self.table_headers and not self.silent
        for line in render(rows, self.formatter, header):
            click.echo(line)

    def message(self, text: str) -> None:
        """A command's closing message (rabbitmqctl's ``{ok, Message}``): as
        ``{"message": ...}`` for json (rabbitmqctl's Json formatter of a string)."""
        if self.machine_readable:
            self.document({"message": text})
        else:
            click.echo(text)

    @staticmethod
    def document(value: dict[str, Any]) -> None:
        """One JSON object on one line (a non-listing answer in --formatter json)."""
        click.echo(json.dumps(value, separators=(",", ":")))


_SHARED = (
    click.option("--url", default=None, help="Management API of the server "
                 "(env RIVERLOG_MANAGEMENT_URL).  [default: http://127.0.0.1:15672]"),
    click.option("-n", "--node", default=None,
                 help="rabbitmqctl's node: rabbit@HOST or HOST[:PORT] means the management "
                      "API at http://HOST:15672 (or PORT); --url wins."),
    click.option("--username", "api_username", default=None,
                 help="Management API user (env RIVERLOG_MANAGEMENT_USER).  [default: guest]"),
    click.option("--password", "api_password", default=None,
                 help="Its password (env RIVERLOG_MANAGEMENT_PASSWORD).  [default: guest]"),
    click.option("-t", "--timeout", type=float, default=None,
                 help="Seconds to wait for each answer.  [default: 60]"),
    click.option("-q", "--quiet", is_flag=True, default=None,
                 help="No info lines (\"Listing ... \")."),
    click.option("-s", "--silent", is_flag=True, default=None,
                 help="No info lines and no table header."),
    click.option("--formatter", type=click.Choice(FORMATTERS), default=None,
                 help="table (tab-separated, the default), json or pretty_table."),
    click.option("--no-table-headers", "no_table_headers", is_flag=True, default=None,
                 help="No header line in table output."),
    click.option("-p", "--vhost", default=None, help="Virtual host.  [default: /]"),
)
_SHARED_KEYS = ("url", "node", "api_username", "api_password", "timeout", "quiet", "silent",
                "formatter", "no_table_headers", "vhost")


def _shared_options(fn: Callable) -> Callable:
    for option in reversed(_SHARED):
        fn = option(fn)
    return fn


def _ctl(group_options: dict[str, Any], own: dict[str, Any]) -> Ctl:
    """The Ctl of a command's options over the group's (given after the command name wins)
    over the environment over the defaults."""
    given = {k: own.get(k) if own.get(k) is not None else group_options.get(k)
             for k in _SHARED_KEYS}
    env = os.environ
    url = (given["url"] or node_url(given["node"]) or env.get("RIVERLOG_MANAGEMENT_URL")
           or DEFAULT_URL)
    timeout = given["timeout"] if given["timeout"] is not None else 60.0
    if timeout <= 0:
        raise click.BadParameter("must be more than 0", param_hint="'-t' / '--timeout'")
    return Ctl(url=url,
               username=given["api_username"] or env.get("RIVERLOG_MANAGEMENT_USER") or "guest",
               password=(given["api_password"] if given["api_password"] is not None
                         else env.get("RIVERLOG_MANAGEMENT_PASSWORD", "guest")),
               timeout=timeout, quiet=bool(given["quiet"]), silent=bool(given["silent"]),
               formatter=given["formatter"] or "table",
               table_headers=not given["no_table_headers"], vhost=given["vhost"] or "/")


@click.group("ctl", context_settings={"help_option_names": ["-h", "--help"]})
@_shared_options
@click.pass_context
def ctl_group(ctx: click.Context, **options) -> None:
    """rabbitmqctl's and rabbitmq-streams' commands against a running server's management
    API. Options may also follow the command name. Exit codes are rabbitmqctl's: 64 usage,
    65 bad data, 67 no such user, 69 server unreachable, 70 refused or failed, 75 timeout
    (77: credentials refused)."""
    ctx.obj = options


def command(name: str, **kwargs) -> Callable[[Callable], click.Command]:
    """A `riverlog ctl` command: ``fn(ctl, **its own parameters)`` with the shared options
    added (the decorator goes above the function's own click decorators)."""
    def decorate(fn: Callable) -> click.Command:
        @functools.wraps(fn)
        def wrapper(**params):
            own = {k: params.pop(k) for k in _SHARED_KEYS}
            return fn(_ctl(click.get_current_context().obj or {}, own), **params)
        own = list(getattr(wrapper, "__click_params__", []))
        wrapper.__click_params__ = []
        _shared_options(wrapper)
        wrapper.__click_params__ += own  # click lists them reversed: the command's own first
        return ctl_group.command(name, **kwargs)(wrapper)
    return decorate


def run(args: Sequence[str], prog: str = "riverlog ctl") -> int:
    """Run one `riverlog ctl` command line; its exit code. A failure prints one message on
    stderr: a usage error (unknown command, bad or missing arguments) exits 64, a
    command's own failure with its CtlError code."""
    if not args:
        click.echo(ctl_group.get_help(click.Context(ctl_group, info_name=prog)))
        return EX_USAGE
    try:
        result = ctl_group.main(args=list(args), prog_name=prog, standalone_mode=False)
    except CtlError as exc:
        click.echo(exc.message, err=True)
        return exc.code
    except click.UsageError as exc:
        exc.show()
        return EX_USAGE
    except click.ClickException as exc:
        exc.show()
        return EX_USAGE
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 1
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug or an answer of an unexpected shape: one line, no traceback
        click.echo(f"Error: {type(exc).__name__}: {exc}", err=True)
        return EX_SOFTWARE
    return result if isinstance(result, int) else 0
