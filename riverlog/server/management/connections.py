# Connections, publishers and consumers of the RabbitMQ Stream door as the management API
# shows them: RabbitMQ's JSON shapes (rabbit_stream_reader ?CREATION_EVENT_KEYS and
# consumer_i/publisher_i; rabbit_stream_mgmt_db's `queue` and `connection_details`), for the
# connections of this server (per server, as RabbitMQ's connections are per node: a
# cluster's other servers list their own).
# Rules: read-only over the door's state on the event loop; a connection's name is
# RabbitMQ's "<peer host>:<peer port> -> <host>:<port>"; RabbitMQ's user-given
# `connection_name` client property is `user_provided_name`; each connection names the
# virtual host it opened, each publisher and consumer its stream as that virtual host's
# clients know it (riverlog.vhost_names).
from __future__ import annotations

from typing import Any, Iterable

from ...vhost_names import DEFAULT, external
from .access import Caller

VHOST = DEFAULT  # RabbitMQ's default virtual host, the Liftbridge doors' only one


def connection_name(conn) -> str:
    """RabbitMQ's connection name: ``"<peer host>:<peer port> -> <host>:<port>"``."""
    host, port = _local(conn)
    return f"{conn.peer} -> {host}:{port}"


def _local(conn) -> tuple[str, int]:
    transport = conn.transport
    address = transport.get_extra_info("sockname") if transport is not None else None
    return (address[0], address[1]) if address else ("?", 0)


def visible(connections: Iterable, caller: Caller) -> list:
    """The connections ``caller`` may see, oldest first: logged in, not closing (a closing
    one is gone for RabbitMQ once its reader stops; ours lingers a moment for the Close
    exchange)."""
    return sorted((c for c in connections if c.link.user is not None
                   and not c.state.closing and caller.sees_connection(c.link.user)),
                  key=lambda c: c.link.connected_at)


def find(connections: Iterable, name: str, caller: Caller):
    """The connection named ``name`` that ``caller`` may see, or None."""
    for conn in visible(connections, caller):
        if connection_name(conn) == name:
            return conn
    return None


def connection_json(conn, node: str) -> dict[str, Any]:
    """One connection as GET /api/connections lists it (protocol "stream")."""
    link = conn.link
    host, port = _local(conn)
    peer_host, _, peer_port = conn.peer.rpartition(":")
    properties = link.client_properties
    info: dict[str, Any] = {
        "name": connection_name(conn), "node": node, "type": "network",
        "protocol": "stream", "user": link.user, "vhost": link.vhost,
        "host": host, "port": port, "peer_host": peer_host,
        "peer_port": int(peer_port) if peer_port.isdigit() else 0,
        "ssl": conn.tls, "auth_mechanism": "PLAIN", "timeout": conn.session.heartbeat_s,
        "frame_max": conn.session.frame_max, "channel_max": 0, "channels": 0,
        "client_properties": properties, "connected_at": int(link.connected_at * 1000),
        "state": "blocked" if conn.reading_paused else "running",
        "user_who_performed_action": link.user,
    }
    if "connection_name" in properties:
        info["user_provided_name"] = properties["connection_name"]
    return info


def _details(conn, node: str) -> dict[str, Any]:
    """``connection_details`` of a publisher or consumer (rabbit_stream_mgmt_db)."""
    peer_host, _, peer_port = conn.peer.rpartition(":")
    return {"name": connection_name(conn), "user": conn.link.user, "node": node,
            "peer_host": peer_host, "peer_port": int(peer_port) if peer_port.isdigit() else 0}


def _queue(broker_name: str) -> dict[str, str]:
    """``{"name", "vhost"}`` of a stream's broker name."""
    vhost, name = external(broker_name)
    return {"name": name, "vhost": vhost}


def publisher_json(conn, pub, node: str) -> dict[str, Any]:
    """One publisher as GET /api/stream/publishers lists it."""
    return {"publisher_id": pub.id, "reference": pub.reference or "",
            "queue": _queue(pub.name),
            "connection_details": _details(conn, node),
            "messages_published": pub.published, "messages_confirmed": pub.confirmed,
            "messages_errored": pub.errored}


def consumer_json(conn, sub, node: str) -> dict[str, Any]:
    """One consumer (subscription) as GET /api/stream/consumers lists it: ``offset`` is the
    next offset it is sent, ``offset_lag`` the committed offset + 1 minus that."""
    partition = sub.partition
    active = sub.task is not None
    properties = dict(sub.properties)
    single = properties.get("single-active-consumer") == "true"
    return {"subscription_id": sub.id, "queue": _queue(sub.name),
            "connection_details": _details(conn, node), "credits": sub.credit,
            "messages_consumed": sub.consumed, "offset": sub.offset,
            "offset_lag": max(partition.committed_offset + 1 - sub.offset, 0),
            "properties": properties, "active": active,
            "activity_status": ("single_active" if active else "waiting") if single
            else "up"}


def _listed(connections: Iterable, caller: Caller, node: str, kind: str, stream: str | None,
            connection: str | None, vhost: str | None = None) -> list[dict]:
    """``kind`` "publishers" or "subscriptions" of the connections ``caller`` may see, as
    JSON, on ``stream`` (a broker name), ``connection`` or ``vhost`` when given."""
    to_json = publisher_json if kind == "publishers" else consumer_json
    return [to_json(conn, item, node)
            for conn in visible(connections, caller)
            if (connection is None or connection_name(conn) == connection)
            and (vhost is None or conn.link.vhost == vhost)
            for item in list(getattr(conn, kind).values())
            if stream is None or item.name == stream]


def publishers(connections: Iterable, caller: Caller, node: str, *,
               stream: str | None = None, connection: str | None = None,
               vhost: str | None = None) -> list[dict]:
    """The publishers ``caller`` may see, on ``stream`` (a broker name), ``connection`` or
    ``vhost`` when given."""
    return _listed(connections, caller, node, "publishers", stream, connection, vhost)


def consumers(connections: Iterable, caller: Caller, node: str, *,
              stream: str | None = None, connection: str | None = None,
              vhost: str | None = None) -> list[dict]:
    """The consumers ``caller`` may see, on ``stream`` (a broker name), ``connection`` or
    ``vhost`` when given."""
    return _listed(connections, caller, node, "subscriptions", stream, connection, vhost)
