# The commands of `riverlog ctl` that change the server: users and permissions, virtual
# hosts, close_connection, add_super_stream, delete_super_stream and restart_stream, with
# rabbitmqctl's and rabbitmq-streams' arguments, banners, messages, validations and exit
# codes (rabbitmq_cli lib/rabbitmq/cli/ctl/commands/*.ex; rabbitmq_stream's
# AddSuperStreamCommand, DeleteSuperStreamCommand and RestartStreamCommand), through the
# management API in RabbitMQ's shapes:
#   /api/users/{name}, /api/permissions/{vhost}/{user}, /api/vhosts/{name},
#   DELETE /api/connections/{name}, PUT /api/stream/super-streams/{vhost}/{name},
#   DELETE /api/riverlog/stream/super-streams/{vhost}/{name} and
#   POST /api/riverlog/stream/queues/{vhost}/{name}/restart (riverlog's).
# Rules: a refusal prints the server's reason ("Error:" and the reason) and exits 70, but
# for rabbitmqctl's own cases: no such user 67, no such virtual host or connection 65, a bad
# argument 64/65 before anything is sent.
from __future__ import annotations

import re

import click

from .cli_ctl_base import Ctl, command
from .ctl_client import (EX_DATAERR, EX_NOUSER, EX_SOFTWARE, EX_USAGE, CtlError,
                         HTTPFailure, no_such_vhost, segment)

# rabbit_resource_monitor_misc:parse_information_unit: kB/MB/GB are powers of 1000,
# k/kiB/M/MiB/G/GiB powers of 1024 (any case of the letters but the `i`)
_UNIT = re.compile(r"^(\d+)(kb|mb|gb|kib|mib|gib|k|m|g)?$", re.IGNORECASE)
_UNITS = {"kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "k": 1024, "kib": 1024,
          "m": 1024 ** 2, "mib": 1024 ** 2, "g": 1024 ** 3, "gib": 1024 ** 3}
# ISO 8601 durations as rabbit_date_time:parse_duration reads them (integers only)
_DURATION = re.compile(r"^P(?:(\d+)Y)?(?:(\d+)M)?(?:(\d+)D)?"
                       r"(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$")


def information_unit(value: str) -> int | None:
    """Bytes of ``100gb``, ``50mb``, ``1024``...; None when unreadable."""
    found = _UNIT.match(value.strip())
    if found is None:
        return None
    return int(found.group(1)) * _UNITS.get((found.group(2) or "").lower(), 1)


def duration_seconds(value: str) -> int | None:
    """Seconds of an ISO 8601 duration (``PT10M30S``, ``P5DT8H``), a month 30 days and a year
    365 (AddSuperStreamCommand's duration_to_seconds); None when unreadable."""
    found = _DURATION.match(value.strip())
    if found is None or value.strip() in ("P", "PT") or value.strip().endswith("T"):
        return None
    y, mo, d, h, mi, s = (int(g or 0) for g in found.groups())
    return y * 365 * 86400 + mo * 30 * 86400 + d * 86400 + h * 3600 + mi * 60 + s


def _user_path(user: str) -> str:
    return f"/api/users/{segment(user)}"


def _no_such_user(user: str) -> CtlError:
    return CtlError(EX_NOUSER, f'Error:\n{{:no_such_user, "{user}"}}')


def _user(ctl: Ctl, user: str) -> dict | None:
    """The user's record from the API; None when there is none."""
    try:
        return ctl.api.get(_user_path(user)) or {}
    except HTTPFailure as exc:
        if exc.status == 404:
            return None
        raise


def _tags_text(tags) -> str:
    return tags if isinstance(tags, str) else ",".join(str(t) for t in tags or [])


@command("add_user")
@click.argument("username")
@click.argument("password", required=False)
def add_user(ctl: Ctl, username: str, password: str | None) -> None:
    """Creates a new user. This user will have no permissions for any virtual hosts by
    default. Without PASSWORD it is read from the first line of standard input."""
    if username == "":
        raise CtlError(EX_DATAERR, "Error: user cannot be an empty string")
    ctl.banner(f'Adding user "{username}" ...')
    if password is None:
        line = click.get_text_stream("stdin").readline()
        if not line:
            raise CtlError(EX_DATAERR, "Password is not provided via argument or stdin")
        password = line.rstrip("\r\n")
    if _user(ctl, username) is not None:
        raise CtlError(EX_SOFTWARE, f'User "{username}" already exists')
    ctl.api.request("PUT", _user_path(username), {"password": password, "tags": ""})
    done = ("Done. Don't forget to grant the user permissions to some virtual hosts! See "
            "'rabbitmqctl help set_permissions' to learn more.")
    if ctl.machine_readable:
        ctl.document({"status": "ok", "node": ctl.api.url, "message": done})
    elif not (ctl.quiet or ctl.silent):
        click.echo(done)


@command("delete_user")
@click.argument("username")
def delete_user(ctl: Ctl, username: str) -> None:
    """Removes the specified user (its open connections are closed by the server)."""
    ctl.banner(f'Deleting user "{username}" ...')
    try:
        ctl.api.request("DELETE", _user_path(username))
    except HTTPFailure as exc:
        if exc.status == 404:
            raise _no_such_user(username) from None
        raise


@command("change_password")
@click.argument("username")
@click.argument("new_password")
def change_password(ctl: Ctl, username: str, new_password: str) -> None:
    """Changes the user password (its tags stay)."""
    ctl.banner(f'Changing password for user "{username}" ...')
    found = _user(ctl, username)
    if found is None:
        raise _no_such_user(username)
    ctl.api.request("PUT", _user_path(username),
                    {"password": new_password, "tags": _tags_text(found.get("tags"))})


def _permissions_path(ctl: Ctl, user: str) -> str:
    return f"/api/permissions/{segment(ctl.vhost)}/{segment(user)}"


@command("set_permissions")
@click.argument("username")
@click.argument("conf")
@click.argument("write")
@click.argument("read")
def set_permissions(ctl: Ctl, username: str, conf: str, write: str, read: str) -> None:
    """Sets user permissions for a vhost: CONF, WRITE and READ are regular expressions."""
    ctl.banner(f'Setting permissions for user "{username}" in vhost "{ctl.vhost}" ...')
    try:
        ctl.api.request("PUT", _permissions_path(ctl, username),
                        {"configure": conf, "write": write, "read": read})
    except HTTPFailure as exc:
        if exc.status not in (400, 404):
            raise
        if _user(ctl, username) is None:
            raise _no_such_user(username) from None
        if exc.status == 404:
            raise no_such_vhost(ctl.vhost) from None
        raise


@command("clear_permissions")
@click.argument("username")
def clear_permissions(ctl: Ctl, username: str) -> None:
    """Revokes user permissions for a vhost (none to revoke is no error)."""
    ctl.banner(f'Clearing permissions for user "{username}" in vhost "{ctl.vhost}" ...')
    try:
        ctl.api.request("DELETE", _permissions_path(ctl, username))
    except HTTPFailure as exc:
        if exc.status != 404:
            raise
        if _user(ctl, username) is None:
            raise _no_such_user(username) from None


@command("add_vhost")
@click.argument("vhost_name", metavar="VHOST")
@click.option("--description", default=None, help="Description of the virtual host.")
@click.option("--tags", default=None, help="Comma-separated tags.")
@click.option("--default-queue-type", default=None, help="Default queue type.")
def add_vhost(ctl: Ctl, vhost_name: str, description: str | None, tags: str | None,
              default_queue_type: str | None) -> None:
    """Creates a virtual host."""
    ctl.banner(f'Adding vhost "{vhost_name}" ...')
    body = {key: value for key, value in (("description", description), ("tags", tags),
            ("default_queue_type", default_queue_type)) if value is not None}
    ctl.api.request("PUT", f"/api/vhosts/{segment(vhost_name)}", body)


@command("delete_vhost")
@click.argument("vhost_name", metavar="VHOST")
def delete_vhost(ctl: Ctl, vhost_name: str) -> None:
    """Deletes a virtual host, its streams and connections."""
    ctl.banner(f'Deleting vhost "{vhost_name}" ...')
    try:
        ctl.api.request("DELETE", f"/api/vhosts/{segment(vhost_name)}")
    except HTTPFailure as exc:
        if exc.status == 404 and exc.word == "Object Not Found":
            raise no_such_vhost(vhost_name) from None
        raise


@command("close_connection")
@click.argument("connection")
@click.argument("explanation")
def close_connection(ctl: Ctl, connection: str, explanation: str) -> None:
    """Closes connection CONNECTION (its name, `conn_name` of list_stream_connections:
    riverlog has no Erlang pids), logging EXPLANATION as the reason."""
    ctl.banner(f"Closing connection {connection}, reason: {explanation}...")
    try:
        ctl.api.request("DELETE", f"/api/connections/{segment(connection)}",
                        headers={"X-Reason": explanation})
    except HTTPFailure as exc:
        if exc.status == 404:
            raise CtlError(EX_DATAERR, f'Error:\nno connection named "{connection}"') from None
        raise


def _super_stream_body(partitions: int | None, binding_keys: str | None,
                       routing_keys: str | None, max_length_bytes: str | None,
                       max_age: str | None, segment_size: str | None,
                       leader_locator: str | None, initial_cluster_size: str | None) -> dict:
    """The PUT body of add_super_stream's options, validated as AddSuperStreamCommand does
    (its messages; CtlError EX_USAGE)."""
    def refuse(message: str) -> CtlError:
        return CtlError(EX_USAGE, f"Error: {message}")
    if routing_keys is not None and binding_keys is not None:
        raise refuse("Specify --binding-keys only.")
    keys = binding_keys if binding_keys is not None else routing_keys
    if partitions is not None and keys is not None:
        raise refuse("Specify --partitions or --binding-keys, not both.")
    if partitions is not None and partitions < 1:
        raise refuse("The partition number must be greater than 0")
    arguments: dict[str, str] = {}
    for option, key, value in (("--max-length-bytes", "max-length-bytes", max_length_bytes),
                               ("--stream-max-segment-size-bytes",
                                "stream-max-segment-size-bytes", segment_size)):
        if value is not None:
            size = information_unit(value)
            if size is None:
                raise refuse(f"Invalid value for {option}, valid example values: 100gb, 50mb")
            arguments[key] = str(size)
    if max_age is not None:
        seconds = duration_seconds(max_age)
        if seconds is None:
            raise refuse("Invalid value for --max-age, the value must a ISO 8601 duration, "
                         "e.g. e.g. PT10M30S for 10 minutes 30 seconds, P5DT8H for 5 days "
                         "8 hours.")
        arguments["max-age"] = f"{seconds}s"
    if leader_locator is not None:
        if leader_locator not in ("client-local", "balanced", "random", "least-leaders"):
            raise refuse("Invalid value for --leader-locator, valid values are "
                         "client-local, balanced.")
        arguments["queue-leader-locator"] = leader_locator
    if initial_cluster_size is not None:
        if not initial_cluster_size.isdigit() or int(initial_cluster_size) < 1:
            raise refuse("Invalid value for --initial-cluster-size, the value must be a "
                         "positive integer.")
        arguments["initial-cluster-size"] = initial_cluster_size
    body: dict = {"binding-keys": keys} if keys is not None else {
        "partitions": 3 if partitions is None else partitions}
    body["arguments"] = arguments
    return body


@command("add_super_stream")
@click.argument("name")
@click.option("--partitions", type=int, default=None,
              help="The number of partitions, default is 3. Mutually exclusive with "
                   "--binding-keys.")
@click.option("--binding-keys", default=None,
              help="Comma-separated list of binding keys. Mutually exclusive with "
                   "--partitions.")
@click.option("--routing-keys", default=None, help="Former name of --binding-keys.")
@click.option("--max-length-bytes", default=None,
              help="The maximum size of partition streams, example values: 20gb, 500mb.")
@click.option("--max-age", default=None,
              help="The maximum age of partition stream segments, an ISO 8601 duration, "
                   "e.g. PT10M30S, P5DT8H.")
@click.option("--stream-max-segment-size-bytes", "segment_size", default=None,
              help="The maximum size of partition stream segments, e.g. 500mb, 1gb.")
@click.option("--leader-locator", default=None,
              help="Leader locator strategy for partition streams: client-local, balanced.")
@click.option("--initial-cluster-size", default=None,
              help="The initial cluster size of partition streams.")
def add_super_stream(ctl: Ctl, name: str, **options) -> None:
    """Add a super stream: partitions NAME-0.. NAME-<n-1> with binding keys 0..n-1, or
    NAME-<key> per binding key."""
    body = _super_stream_body(**options)
    ctl.banner("Adding a super stream...")
    ctl.api.request("PUT", f"/api/stream/super-streams/{segment(ctl.vhost)}/{segment(name)}",
                    body)
    ctl.message(f"Super stream {name} has been created")


@command("delete_super_stream")
@click.argument("name")
def delete_super_stream(ctl: Ctl, name: str) -> None:
    """Delete a super stream and its partition streams."""
    ctl.banner("Deleting a super stream...")
    ctl.api.request("DELETE",
                    f"/api/riverlog/stream/super-streams/{segment(ctl.vhost)}/{segment(name)}")
    ctl.message(f"Super stream {name} has been deleted")


@command("restart_stream")
@click.argument("name")
@click.option("--preferred-leader-node", default=None,
              help="Accepted for rabbitmq-streams' scripts; riverlog's server answers for "
                   "its own connections.")
def restart_stream(ctl: Ctl, name: str, preferred_leader_node: str | None) -> None:
    """Restarts a stream: the publishers and consumers on it end with a metadata update
    and come back (the data stays). Prints the leader node."""
    ctl.banner(f"Restarting stream {name}...")
    try:
        answer = ctl.api.request(
            "POST", f"/api/riverlog/stream/queues/{segment(ctl.vhost)}/{segment(name)}/restart")
    except HTTPFailure as exc:
        if exc.status == 404:
            raise CtlError(EX_SOFTWARE, "Error:\n:not_found") from None
        raise
    leader = answer["leader"]
    click.echo(f'"{leader}"' if ctl.machine_readable else leader)
