# Single active consumer groups of the RabbitMQ Stream door for the management API, the data
# of rabbitmq-streams' list_stream_consumer_groups and list_stream_group_consumers
# (rabbit_stream_sac_coordinator:consumer_groups/group_consumers). RabbitMQ's management API
# has no such listing, so the routes are riverlog's own:
#   GET /api/riverlog/stream/consumer-groups[/{vhost}]
#     -> [{"vhost", "stream", "reference", "partition_index", "consumers"}]
#   GET /api/riverlog/stream/consumer-groups/{vhost}/{stream}/{reference}
#     -> {"vhost", "stream", "reference", "partition_index",
#         "consumers": [{"subscription_id", "connection_name", "state"}]}, 404 for no group
# Rules: read-only over the door's groups (broker/sac.py) on the event loop; a caller sees
# the groups of the streams it sees (access.py), and a member's connection name only when it
# sees that connection (`consumers` counts every member, as the coordinator does); a member
# stepping down is "inactive", as RabbitMQ 3.x marks it at once.
from __future__ import annotations

from typing import Any

from ...broker.sac import ACTIVE
from ...vhost_names import external, in_vhost
from .access import Caller
from .connections import connection_name, visible


def _groups(app, caller: Caller) -> list[tuple[tuple[str, str], Any]]:
    """((stream, reference), Group) of the groups ``caller`` may see, sorted by key."""
    door = app.rabbitmq_stream
    if door is None:
        return []
    return sorted(((key, group) for key, group in list(door.sac.groups.items())
                   if caller.sees_stream(key[0])), key=lambda item: item[0])


def group_json(stream: str, reference: str, group) -> dict[str, Any]:
    """One group (``stream``: a broker name) as list_stream_consumer_groups shows it
    (``partition_index``: -1 for a plain stream, else the stream's position in its super
    stream), with its virtual host and its stream's name there."""
    vhost, name = external(stream)
    return {"vhost": vhost, "stream": name, "reference": reference,
            "partition_index": group.partition_index, "consumers": len(group.members)}


def consumer_groups(app, caller: Caller, vhost: str | None = None) -> list[dict[str, Any]]:
    """Every group ``caller`` may see (of ``vhost`` when given), sorted by (stream,
    reference)."""
    return [group_json(stream, reference, group)
            for (stream, reference), group in _groups(app, caller)
            if vhost is None or in_vhost(stream, vhost)]


def group_consumers(app, caller: Caller, stream: str, reference: str
                    ) -> dict[str, Any] | None:
    """Group (``stream``: a broker name, ``reference``) with its members in subscription order, each
    ``{"subscription_id", "connection_name", "state": "active"|"inactive"}`` (the connection
    name "" when ``caller`` may not see that connection); None when there is no such group
    or ``caller`` may not see ``stream``."""
    found = dict(_groups(app, caller)).get((stream, reference))
    if found is None:
        return None
    names = {id(conn.link): connection_name(conn)
             for conn in visible(app.rabbitmq_stream.connections, caller)}
    answer = group_json(stream, reference, found)
    answer["consumers"] = [
        {"subscription_id": member.subscription_id,
         "connection_name": names.get(id(getattr(member.owner, "link", None)), ""),
         "state": "active" if member.state == ACTIVE else "inactive"}
        for member in list(found.members)]
    return answer
