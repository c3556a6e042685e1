# The management API's policies: RabbitMQ's /api/policies routes (rabbit_mgmt_wm_policies,
# rabbit_mgmt_wm_policy) over the server's policies (riverlog.server.runtime_policies).
# Rules:
# - every route is an administrator's or a `policymaker`'s (rabbit_mgmt_util:
#   is_authorized_policies), a policymaker's on the virtual hosts it may open only; another
#   authenticated caller gets 403 `not_authorized` "Not policymaker" (RabbitMQ answers 401;
#   403 tells a client its credentials were right, as users.py), no credentials 401;
# - codes are RabbitMQ's: 201 created, 204 replaced or deleted, 404 `Object Not Found` for a
#   policy or virtual host that is not there, 400 `bad_request` with RabbitMQ's validation
#   reason ("Validation failed\n\n...\n", policy_table.check), 503 in a cluster (policies
#   are not agreed through Raft yet: runtime_policies.CLUSTER_REFUSAL);
# - each change is logged with the caller who made it.
from __future__ import annotations

import logging
from typing import Callable

from aiohttp import web

from ..policy_table import PolicyError, check
from .access import Caller
from .answers import UNAVAILABLE, bad_request, error, listed, not_found, unavailable
from .users import body_of, register

log = logging.getLogger("riverlog.management")


def add_routes(router: web.UrlDispatcher, guarded: Callable, app) -> None:
    """Add the policy routes to ``router``, each behind ``guarded`` (basic auth) and the
    policymaker check; ``app`` is the running App."""
    routes = PolicyRoutes(app)
    for method, path, handler in (
            ("GET", "/api/policies", routes.list_policies),
            ("GET", "/api/policies/{vhost}", routes.list_policies),
            ("GET", "/api/policies/{vhost}/{name}", routes.get_policy),
            ("PUT", "/api/policies/{vhost}/{name}", routes.put_policy),
            ("DELETE", "/api/policies/{vhost}/{name}", routes.delete_policy)):
        register(router, method, path, guarded(policymaker(handler)))


def policymaker(handler: Callable) -> Callable:
    """``handler(request, caller)`` for an administrator or a user tagged ``policymaker``:
    403 for any other caller."""
    async def checked(request: web.Request, caller: Caller) -> web.StreamResponse:
        if not (caller.administrator or "policymaker" in caller.tags):
            raise error(web.HTTPForbidden, "not_authorized", "Not policymaker")
        return await handler(request, caller)
    return checked


class PolicyRoutes:
    """The handlers, each ``(request, caller) -> response``."""

    def __init__(self, app) -> None:
        self.app = app

    def _reaches(self, caller: Caller, vhost: str) -> bool:
        return caller.administrator or self.app.guard.authorizer.vhost_access(caller.user,
                                                                              vhost)

    def _vhost(self, request: web.Request, caller: Caller) -> str:
        """The route's ``{vhost}``: 404 when it does not exist, 403 when a policymaker may
        not open it."""
        vhost = request.match_info["vhost"]
        if not self.app.guard.runtime.has_vhost(vhost):
            raise not_found()
        if not self._reaches(caller, vhost):
            raise error(web.HTTPForbidden, "not_authorized", "Access refused.")
        return vhost

    async def list_policies(self, request: web.Request, caller: Caller) -> web.Response:
        vhost = self._vhost(request, caller) if "vhost" in request.match_info else None
        return listed(request, [p.to_json() for p in self.app.policies.every(vhost)
                                if self._reaches(caller, p.vhost)])

    async def get_policy(self, request: web.Request, caller: Caller) -> web.Response:
        policy = self.app.policies.get(self._vhost(request, caller),
                                       request.match_info["name"])
        if policy is None:
            raise not_found()
        return web.json_response(policy.to_json())

    async def put_policy(self, request: web.Request, caller: Caller) -> web.Response:
        """Set a policy: body ``pattern``, ``definition`` (both required), ``priority``
        (default 0), ``apply-to`` (default "all"). 201 created, 204 replaced; 400 with
        RabbitMQ's validation reason."""
        vhost = self._vhost(request, caller)
        name = request.match_info["name"]
        body = await body_of(request)
        for key in ("pattern", "definition"):
            if key not in body:
                raise bad_request(f"Validation failed\n\nKey \"{key}\" not found in "
                                  f"{name}\n")
        try:
            policy = check(vhost, name, body["pattern"], body["definition"],
                           body.get("priority", 0), body.get("apply-to", "all"))
        except PolicyError as exc:
            raise bad_request(str(exc)) from None
        try:
            created = await self.app.policies.put(policy)
        except UNAVAILABLE as exc:
            raise unavailable(exc) from None
        log.info("policy %r of virtual host %r %s by %r: %s", name, vhost,
                 "set" if created else "replaced", caller.user, policy.to_json())
        return web.Response(status=201 if created else 204)

    async def delete_policy(self, request: web.Request, caller: Caller) -> web.Response:
        vhost = self._vhost(request, caller)
        name = request.match_info["name"]
        try:
            deleted = await self.app.policies.delete(vhost, name)
        except UNAVAILABLE as exc:
            raise unavailable(exc) from None
        if not deleted:
            raise not_found()
        log.info("policy %r of virtual host %r cleared by %r", name, vhost, caller.user)
        return web.Response(status=204)
