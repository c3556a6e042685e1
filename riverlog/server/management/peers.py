# The other workers of `riverlog serve --workers N` as this management API sees them
# (ManagementConfig.peers; riverlog.cluster.workers): connections, publishers and consumers
# live in the worker a client is connected to, so their listings ask every peer too and
# answer the union, and a route naming one connection goes to the peer that has it. The
# streams, queues and nodes need no peers: any cluster member answers those for all.
# Rules: a peer is asked the same path with the caller's own Authorization (each worker
# checks it) and the LOCAL header, which a worker answers from itself alone (so no request
# goes round); listings ask every peer at once; a peer that does not answer within
# PEER_TIMEOUT_S is left out, never fails the request; with no peers (one process) nothing
# here runs.
from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
from aiohttp import web

log = logging.getLogger("riverlog.management")

LOCAL = "X-Riverlog-Local"
"""Request header: answer from this worker alone (what a peer is asked with)."""
PEER_TIMEOUT_S = 5.0


class Peers:
    """The management APIs of the other workers (``urls``: base URLs, e.g.
    ``http://127.0.0.1:41234``)."""

    def __init__(self, urls: tuple[str, ...]) -> None:
        self.urls = tuple(u.rstrip("/") for u in urls)
        self._session: aiohttp.ClientSession | None = None

    def asked(self, request: web.Request) -> bool:
        """Whether ``request`` is to be answered with the peers' part too."""
        return bool(self.urls) and LOCAL not in request.headers

    async def _ask(self, url: str, request: web.Request,
                   method: str = "GET") -> tuple[int, bytes, str] | None:
        """(status, body, content type) of ``method`` on the peer at ``url`` for the path
        of ``request``, or None when it does not answer."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S))
        headers = {LOCAL: "1"}
        for name in ("Authorization", "X-Reason"):
            if name in request.headers:
                headers[name] = request.headers[name]
        try:
            async with self._session.request(method, url + request.rel_url.raw_path,
                                             headers=headers) as answer:
                return answer.status, await answer.read(), answer.content_type
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("management peer %s did not answer %s %s: %s", url, method,
                        request.rel_url.raw_path, exc)
            return None

    async def listings(self, request: web.Request) -> list:
        """The peers' unpaged listings of ``request``'s path, joined (a peer answering
        anything but a JSON list is left out)."""
        if not self.asked(request):
            return []
        items: list = []
        answers = await asyncio.gather(*(self._ask(url, request) for url in self.urls))
        for got in answers:  # all peers at once, joined in the peers' order
            if got is not None and got[0] == 200 and got[2] == "application/json":
                body = json.loads(got[1])
                if isinstance(body, list):
                    items.extend(body)
        return items

    async def one(self, request: web.Request) -> web.Response | None:
        """The answer of the first peer that has what ``request`` names (anything but 404),
        as that peer gave it; None when none has it."""
        if not self.asked(request):
            return None
        for url in self.urls:
            got = await self._ask(url, request, request.method)
            if got is not None and got[0] != 404:
                return web.Response(status=got[0], body=got[1] or None,
                                    content_type=got[2] if got[1] else None)
        return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
