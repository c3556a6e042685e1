# Super streams made and deleted whole through the management API, as rabbitmq-streams'
# add_super_stream and delete_super_stream make and delete them (rabbit_stream_manager:
# create_super_stream, delete_super_stream):
#   PUT /api/stream/super-streams/{vhost}/{name}  RabbitMQ's (rabbitmq_stream_management
#     rabbit_stream_super_stream_mgmt): body {"partitions": N} or {"binding-keys": "a,b"},
#     with optional "arguments" (the partitions' Create arguments: max-length-bytes, max-age,
#     stream-max-segment-size-bytes, initial-cluster-size, queue-leader-locator); partition i
#     is `<name>-<i>` with binding key "i", or `<name>-<key>` per binding key. 201 when made.
#   DELETE /api/riverlog/stream/super-streams/{vhost}/{name}  riverlog's (RabbitMQ's API has
#     none): the super stream and its partition streams. 204.
# Errors are RabbitMQ's words: 400 bad_request (bad body, a name taken, a bad argument, over
# the caller's stream limit), 401 not_authorized (the caller may not create, or delete, the
# super stream or one of its partitions), 404 (no such super stream or virtual host), 503.
# Rules: the same steps as the RabbitMQ Stream door's CreateSuperStream and DeleteSuperStream
# (streams.py there): through the placement in a cluster, partitions owned by the caller and
# counted against its stream limit.
from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp import web

from ...errors import (InvalidArgumentError, LimitExceededError, StreamExistsError,
                       StreamNotFoundError)
from ...security.authz import CREATE, DELETE, super_stream_rights
from ...vhost_names import external
from ..rabbitmq_stream.arguments import stream_config_for
from .access import Caller
from .answers import UNAVAILABLE, bad_request, error, not_found, unavailable

MAX_PARTITIONS = 4096  # one request must not make that many folders (as the gRPC door's)


def partitions_of(name: str, body: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(partition streams, binding keys) of a PUT body, as rabbit_stream_super_stream_mgmt
    derives them. Raises ``ValueError`` with RabbitMQ's reason for a bad body."""
    count, keys = body.get("partitions"), body.get("binding-keys")
    if count is None and keys is None:
        raise ValueError("Must specify partitions or binding keys")
    if count is not None and keys is not None:
        raise ValueError("Specify partitions or binding keys, not both")
    if count is not None:
        try:
            number = int(count)
        except (TypeError, ValueError, OverflowError):
            raise ValueError("The partitions must be a number") from None
        if number < 1:
            raise ValueError("The partition number must be greater than 0")
        if number > MAX_PARTITIONS:
            raise ValueError(f"The partition number must not exceed {MAX_PARTITIONS}")
        return [f"{name}-{i}" for i in range(number)], [str(i) for i in range(number)]
    if not isinstance(keys, str):
        raise ValueError("binding-keys must be a comma-separated string")
    stripped = [k.strip() for k in keys.split(",", MAX_PARTITIONS)]
    if len(stripped) > MAX_PARTITIONS:
        raise ValueError(f"The number of binding keys must not exceed {MAX_PARTITIONS}")
    binding_keys = [k for k in stripped if k]
    if not binding_keys:
        raise ValueError("The number of binding keys must be greater than 0")
    return [f"{name}-{k}" for k in binding_keys], binding_keys


def _refused(caller: Caller, vhost: str, name: str) -> web.HTTPException:
    return error(web.HTTPUnauthorized, "not_authorized",
                 f"access to super stream '{external(name)[1]}' in vhost '{vhost}' refused "
                 f"for user '{caller.user}'")


async def put_super_stream(app, request: web.Request, caller: Caller, vhost: str,
                           name: str) -> web.Response:
    """PUT /api/stream/super-streams/{vhost}/{name}: make the super stream ``name`` (its
    broker name, riverlog.vhost_names) of ``vhost`` and its partitions (module comment:
    body, answers)."""
    if not external(name)[1]:  # a name no client may use (vhost_names.lookup)
        raise bad_request("invalid super stream name")
    door = app.rabbitmq_stream
    try:
        body = await request.json() if request.can_read_body else {}
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        partitions, keys = partitions_of(name, body)
        arguments = {str(k): str(v) for k, v in dict(body.get("arguments") or {}).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise bad_request(str(exc)) from None
    if door is None:
        raise not_found()
    if not all(caller.may(n, action)
               for n, action in super_stream_rights(name, partitions, CREATE)):
        raise _refused(caller, vhost, name)
    broker = app.broker
    placement = broker.placement
    try:
        broker.check_quota(caller.user, len(partitions))
        config = dataclasses.replace(stream_config_for(arguments, placement),
                                     owner=caller.user)
        if placement.clustered:
            await door.super_streams.create_in_cluster(name, partitions, keys, config)
        else:
            door.super_streams.create(name, partitions, keys, config)
    except (StreamExistsError, InvalidArgumentError, LimitExceededError) as exc:
        raise bad_request(str(exc)) from None
    except UNAVAILABLE as exc:
        raise unavailable(exc) from None
    return web.Response(status=201)


async def delete_super_stream(app, caller: Caller, vhost: str, name: str) -> web.Response:
    """DELETE /api/riverlog/stream/super-streams/{vhost}/{name}: the super stream ``name``
    (its broker name) and its partition streams; 204, 404 when there is none (or the
    caller sees none of it)."""
    door = app.rabbitmq_stream
    found = door.super_streams.find(name) if door is not None else None
    if found is None or not caller.sees_stream(name):
        raise not_found()
    if not all(caller.may(n, action)
               for n, action in super_stream_rights(name, found.partitions, DELETE)):
        raise _refused(caller, vhost, name)
    try:
        if app.broker.placement.clustered:
            await door.super_streams.delete_in_cluster(name)
        else:
            door.super_streams.delete(name)
    except StreamNotFoundError:
        raise not_found() from None
    except UNAVAILABLE as exc:
        raise unavailable(exc) from None
    return web.Response(status=204)
