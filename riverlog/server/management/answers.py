# The management API's error answers and listings, shared by its route modules (server.py,
# users.py, super_streams.py). Rules: errors have RabbitMQ's body (rabbit_mgmt_util):
# ``{"error": ..., "reason": ...}``; a request the server cannot serve now is 503; a listing
# is sorted and paged as RabbitMQ's (paging.py).
from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ...errors import ClusterUnavailableError, ResourceExhaustedError
from .paging import PagingError, listing


def error(status: type[web.HTTPException], word: str, reason: str, **kwargs: Any
          ) -> web.HTTPException:
    """An HTTP error with RabbitMQ's body: ``{"error": word, "reason": reason}``."""
    return status(text=json.dumps({"error": word, "reason": reason}),
                  content_type="application/json", **kwargs)


def not_found() -> web.HTTPException:
    """404 ``{"error": "Object Not Found", "reason": "Not Found"}``."""
    return error(web.HTTPNotFound, "Object Not Found", "Not Found")


def bad_request(reason: str) -> web.HTTPException:
    """400 ``{"error": "bad_request", "reason": reason}`` (rabbit_mgmt_util:bad_request)."""
    return error(web.HTTPBadRequest, "bad_request", reason)


UNAVAILABLE = (ClusterUnavailableError, ResourceExhaustedError)
"""Errors of a request the server cannot serve now (no Raft leader, no file descriptor): 503."""


def unavailable(exc: Exception) -> web.HTTPException:
    """503 ``{"error": "service_unavailable", "reason": <why>}``: try again later."""
    return error(web.HTTPServiceUnavailable, "service_unavailable", str(exc))


def listed(request: web.Request, items: list[dict]) -> web.Response:
    """A listing's answer: sorted, and paged when the request asks (paging.listing); 400
    with RabbitMQ's error word for bad paging parameters."""
    try:
        return web.json_response(listing(items, request.query))
    except PagingError as exc:
        raise error(web.HTTPBadRequest, exc.error, exc.reason) from None
