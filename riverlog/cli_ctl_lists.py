# The listing commands of `riverlog ctl` and `status`, with rabbitmqctl's and
# rabbitmq-streams' info keys, default columns and banners (rabbitmq_cli
# lib/rabbitmq/cli/ctl/commands/*.ex; rabbitmq_stream's Elixir.RabbitMQ.CLI.Ctl.Commands.*
# and rabbit_stream.hrl; the rabbitmq-streams(8) page), read from the management API.
# Rules: a column riverlog has no value for (an Erlang pid, TLS details it does not keep)
# is empty, never made up, except `connection_pid` and `pid`, which are the connection's
# name (riverlog has no processes: the name is what close_connection takes); `client_properties` is
# rabbitmqctl's list of [key, type, value].
from __future__ import annotations

from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import click

from .cli_ctl_base import Ctl, command
from .ctl_client import (EX_SOFTWARE, EX_USAGE, CtlError, HTTPFailure, no_such_vhost,
                         segment)
from .ctl_output import columns

CONNECTION_KEYS = (
    "conn_name", "pid", "port", "peer_port", "host", "peer_cert_issuer", "peer_cert_subject",
    "peer_cert_validity", "peer_host", "user", "vhost", "subscriptions", "ssl",
    "ssl_cipher", "ssl_hash", "ssl_key_exchange", "ssl_protocol", "connection_state",
    "auth_mechanism", "heartbeat", "frame_max", "client_properties", "connected_at")
PUBLISHER_KEYS = ("connection_pid", "node", "publisher_id", "stream", "reference",
                  "messages_published", "messages_confirmed", "messages_errored")
CONSUMER_KEYS = ("connection_pid", "node", "subscription_id", "stream", "messages_consumed",
                 "offset", "offset_lag", "credits", "active", "activity_status",
                 "properties")
GROUP_KEYS = ("stream", "reference", "partition_index", "consumers")
GROUP_CONSUMER_KEYS = ("subscription_id", "connection_name", "state")
QUEUE_KEYS = (
    "name", "durable", "auto_delete", "arguments", "policy", "pid", "owner_pid", "exclusive",
    "exclusive_consumer_pid", "exclusive_consumer_tag", "messages_ready",
    "messages_unacknowledged", "messages", "messages_ready_ram",
    "messages_unacknowledged_ram", "messages_ram", "messages_persistent", "message_bytes",
    "message_bytes_ready", "message_bytes_unacknowledged", "message_bytes_ram",
    "message_bytes_persistent", "head_message_timestamp", "disk_reads", "disk_writes",
    "consumers", "consumer_utilisation", "memory", "slave_pids", "synchronised_slave_pids",
    "state", "type", "leader", "members", "online")
VHOST_KEYS = ("name", "description", "tags", "default_queue_type", "tracing",
              "cluster_state", "metadata")
# the listener lines of rabbitmqctl status (the Java suite looks for `stream/ssl` there to
# know whether TLS is on)
PURPOSES = {"stream": "stream protocol", "stream/ssl": "stream protocol over TLS",
            "http": "HTTP API"}


def _rows(items: Sequence[dict], keys: Sequence[str], value: Callable[[dict, str], Any]
          ) -> list[dict[str, Any]]:
    return [{key: value(item, key) for key in keys} for item in items]


def _keys(arguments: Sequence[str], valid: Sequence[str], default: Sequence[str],
          verbose: bool = False) -> list[str]:
    if verbose:
        return list(valid)
    try:
        return columns(arguments, valid, default)
    except ValueError as exc:
        raise CtlError(EX_USAGE, f"Error: {exc}") from None


def _listing(ctl: Ctl, path: str) -> list[dict]:
    answer = ctl.api.get(path)
    return answer if isinstance(answer, list) else []


def _connection_value(item: dict, key: str, subscriptions: dict[str, int]) -> Any:
    if key in ("conn_name", "pid"):
        return item.get("name")
    if key == "subscriptions":
        return subscriptions.get(item.get("name"), 0)
    if key == "connection_state":
        return item.get("state")
    if key == "heartbeat":
        return item.get("timeout")
    if key == "client_properties":
        return [[k, "longstr", v] for k, v in (item.get("client_properties") or {}).items()]
    return item.get(key)


@command("list_stream_connections")
@click.option("-V", "--verbose", is_flag=True, help="Every column.")
@click.argument("column", nargs=-1)
def list_stream_connections(ctl: Ctl, column: tuple[str, ...], verbose: bool) -> None:
    """Lists stream connections (default column: conn_name)."""
    keys = _keys(column, CONNECTION_KEYS, ("conn_name",), verbose)
    ctl.banner("Listing stream connections ...")
    items = _listing(ctl, f"/api/stream/connections/{segment(ctl.vhost)}")
    counts: dict[str, int] = {}
    if "subscriptions" in keys:
        for consumer in _listing(ctl, f"/api/stream/consumers/{segment(ctl.vhost)}"):
            name = (consumer.get("connection_details") or {}).get("name")
            counts[name] = counts.get(name, 0) + 1
    ctl.listing(_rows(items, keys, lambda i, k: _connection_value(i, k, counts)))


def _client_value(item: dict, key: str) -> Any:
    """A publisher's or consumer's column from /api/stream/publishers or consumers."""
    details = item.get("connection_details") or {}
    if key == "connection_pid":
        return details.get("name")
    if key == "node":
        return details.get("node")
    if key == "stream":
        return (item.get("queue") or {}).get("name")
    return item.get(key)


def _clients(ctl: Ctl, kind: str, valid: Sequence[str], column: Sequence[str],
             verbose: bool) -> None:
    """list_stream_publishers or list_stream_consumers (``kind``): every key but
    connection_pid and node by default, as rabbit_stream's commands."""
    keys = _keys(column, valid, valid[2:], verbose)
    ctl.banner(f"Listing stream {kind} ...")
    items = _listing(ctl, f"/api/stream/{kind}/{segment(ctl.vhost)}")
    ctl.listing(_rows(items, keys, _client_value))


@command("list_stream_publishers")
@click.option("-V", "--verbose", is_flag=True, help="Every column.")
@click.argument("column", nargs=-1)
def list_stream_publishers(ctl: Ctl, column: tuple[str, ...], verbose: bool) -> None:
    """Lists all stream publishers for a vhost."""
    _clients(ctl, "publishers", PUBLISHER_KEYS, column, verbose)


@command("list_stream_consumers")
@click.option("-V", "--verbose", is_flag=True, help="Every column.")
@click.argument("column", nargs=-1)
def list_stream_consumers(ctl: Ctl, column: tuple[str, ...], verbose: bool) -> None:
    """Lists all stream consumers for a vhost."""
    _clients(ctl, "consumers", CONSUMER_KEYS, column, verbose)


@command("list_stream_consumer_groups")
@click.option("-V", "--verbose", is_flag=True, help="Every column.")
@click.argument("column", nargs=-1)
def list_stream_consumer_groups(ctl: Ctl, column: tuple[str, ...], verbose: bool) -> None:
    """Lists groups of stream single active consumers for a vhost."""
    keys = _keys(column, GROUP_KEYS, GROUP_KEYS, verbose)
    ctl.banner("Listing stream consumer groups ...")
    items = _listing(ctl, f"/api/riverlog/stream/consumer-groups/{segment(ctl.vhost)}")
    ctl.listing(_rows(items, keys, lambda i, k: i.get(k)))


@command("list_stream_group_consumers")
@click.option("--stream", required=True, help="The stream the consumers are attached to.")
@click.option("--reference", required=True, help="The group reference (name).")
@click.option("-V", "--verbose", is_flag=True, help="Every column.")
@click.argument("column", nargs=-1)
def list_stream_group_consumers(ctl: Ctl, column: tuple[str, ...], stream: str,
                                reference: str, verbose: bool) -> None:
    """Lists consumers of a stream consumer group in a vhost."""
    keys = _keys(column, GROUP_CONSUMER_KEYS, GROUP_CONSUMER_KEYS, verbose)
    ctl.banner("Listing group consumers ...")
    try:
        group = ctl.api.get(f"/api/riverlog/stream/consumer-groups/{segment(ctl.vhost)}/"
                            f"{segment(stream)}/{segment(reference)}")
    except HTTPFailure as exc:
        if exc.status == 404:
            raise CtlError(EX_SOFTWARE, "The group does not exist") from None
        raise
    ctl.listing(_rows(group.get("consumers") or [], keys, lambda i, k: i.get(k)))


@command("list_queues")
@click.argument("column", nargs=-1)
def list_queues(ctl: Ctl, column: tuple[str, ...]) -> None:
    """Lists queues (riverlog's streams and their partitions) and their properties
    (default columns: name messages)."""
    keys = _keys(column, QUEUE_KEYS, ("name", "messages"))
    ctl.banner(f"Timeout: {ctl.timeout} seconds ...", f"Listing queues for vhost {ctl.vhost} ...")
    items = _listing(ctl, f"/api/queues/{segment(ctl.vhost)}")
    ctl.listing(_rows(items, keys, lambda i, k: i.get(k)))


@command("list_vhosts")
@click.argument("column", nargs=-1)
def list_vhosts(ctl: Ctl, column: tuple[str, ...]) -> None:
    """Lists virtual hosts (default column: name)."""
    keys = _keys(column, VHOST_KEYS, ("name",))
    ctl.banner("Listing vhosts ...")
    ctl.listing(_rows(_listing(ctl, "/api/vhosts"), keys, lambda i, k: i.get(k)))


def _tags(tags: Any) -> list[str]:
    """User tags as a list: RabbitMQ 4.x answers a list, 3.x a comma-separated string."""
    if isinstance(tags, str):
        return [t for t in (s.strip() for s in tags.split(",")) if t]
    return [str(t) for t in tags or []]


@command("list_users")
def list_users(ctl: Ctl) -> None:
    """List user names and tags."""
    ctl.banner("Listing users ...")
    ctl.listing([{"user": u.get("name"), "tags": _tags(u.get("tags"))}
                 for u in _listing(ctl, "/api/users")])


@command("list_permissions")
def list_permissions(ctl: Ctl) -> None:
    """Lists user permissions in a virtual host."""
    ctl.banner(f'Listing permissions for vhost "{ctl.vhost}" ...')
    try:
        found = _listing(ctl, f"/api/vhosts/{segment(ctl.vhost)}/permissions")
    except HTTPFailure as exc:
        if exc.status == 404:
            raise no_such_vhost(ctl.vhost) from None
        raise
    ctl.listing([{"user": p.get("user"), "configure": p.get("configure"),
                  "write": p.get("write"), "read": p.get("read")} for p in found])


@command("status")
def status(ctl: Ctl) -> None:
    """Displays status of the server (from /api/overview and /api/nodes/NODE)."""
    overview = ctl.api.get("/api/overview") or {}
    node = overview.get("node", "?")
    ctl.banner(f"Status of node {node} ...")
    info = ctl.api.get(f"/api/nodes/{segment(node)}") or {}
    listeners = list(overview.get("listeners") or []) + [
        {"node": c.get("node"), "protocol": "http", "port": c.get("port"),
         "ip_address": urlsplit(ctl.api.url).hostname} for c in overview.get("contexts") or []]
    if ctl.machine_readable:
        ctl.document({
            "node": node, "pid": info.get("os_pid"), "uptime": info.get("uptime"),
            "rabbitmq_version": overview.get("rabbitmq_version"),
            "product_name": overview.get("product_name"),
            "product_version": overview.get("product_version"),
            "alarms": overview.get("alarms") or [], "listeners": listeners,
            "disk_free": info.get("disk_free"), "mem_used": info.get("mem_used"),
            "running": info.get("running")})
        return
    alarms = overview.get("alarms") or []
    lines = [
        "Runtime", "", f"OS PID: {info.get('os_pid', '')}",
        f"Uptime (seconds): {int(info.get('uptime', 0)) // 1000}",
        f"RabbitMQ version: {overview.get('rabbitmq_version', '')}",
        f"Node name: {node}", f"Product name: {overview.get('product_name', '')}",
        f"Product version: {overview.get('product_version', '')}", "", "Alarms", "",
        *([f"{a.get('resource')} alarm on node {a.get('node')}" for a in alarms]
          or ["(none)"]), "", "Listeners", "",
        *(f"Interface: {l.get('ip_address')}, port: {l.get('port')}, protocol: "
          f"{l.get('protocol')}, purpose: {PURPOSES.get(l.get('protocol'), '')}"
          for l in listeners), "", "Totals", "",
        *(f"{k}: {v}" for k, v in (overview.get("object_totals") or {}).items()), "",
        "Disk", "", f"Free bytes: {info.get('disk_free', '')}", "", "Memory", "",
        f"Used bytes: {info.get('mem_used', '')}"]
    for line in lines:
        click.echo(line)
