# The security of one running server, shared by its doors: the user table, the authorizer and
# the TLS material, built once from SecurityConfig. Rules: a door asks `login` for passwords,
# `certificate_user` for client certificates and `allowed` for each stream operation; refusals
# are answered by the door with its protocol's own error. The runtime users and permissions
# (the management API's AccessTable) are taken whole by ``set_runtime``.
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .access_table import AccessTable
from .authz import Authorizer
from .tls import common_name, server_context
from .users import Users

if TYPE_CHECKING:
    import ssl

    from ..config import SecurityConfig


class Guard:
    """``users``, ``authorizer`` and ``config`` (SecurityConfig) of one server.
    Raises ``ValueError`` for a non-bcrypt hash or a bad rule, ``OSError`` for TLS files."""

    def __init__(self, config: "SecurityConfig") -> None:
        self.config = config
        self.users = Users(config.users, config.loopback_users)
        self.authorizer = Authorizer(config.authz, config.authz_rules, config.authz_model)
        self.allowed = self.authorizer.allowed
        self.permits = self.authorizer.permits  # ``allowed`` without logging denials
        self.require_auth = config.liftbridge_auth
        self.runtime = AccessTable()
        self._checking: dict[bytes, asyncio.Future] = {}  # bcrypt runs under way, by Users.token

    def set_runtime(self, table: AccessTable) -> None:
        """Take ``table``'s users and permissions (a configuration-file user of the same
        name stays the file's); the next login and the next permission check see them."""
        self.runtime = table
        users = self.users
        users.set_runtime(table.users)
        runtime = [name for name in table.users if not users.in_file(name)]
        self.authorizer.set_runtime(table.permissions, runtime,
                                    [name for name in runtime if table.administrator(name)],
                                    table.vhost_permissions)

    def administrator(self, user: str) -> bool:
        """RabbitMQ's administrator: a runtime user tagged ``administrator``; a
        configuration-file user that may ``admin`` every stream (everyone while
        authorization is off)."""
        if self.users.runtime(user) is not None:
            return self.runtime.administrator(user)
        return self.permits(user, "*", "admin")

    def ssl_context(self) -> "ssl.SSLContext | None":
        """The server ssl context for a TLS listener, None when TLS is off."""
        tls = self.config.tls
        if tls is None:
            return None
        return server_context(tls.cert, tls.key, tls.ca, tls.client_auth)

    def login(self, user: str, password: str, peer_host: str | None) -> str | None:
        """None when ``user``/``password`` may connect from ``peer_host``; else why not:
        "password" (unknown user or wrong password) or "loopback" (loopback-only user)."""
        if not self.users.check_password(user, password):
            return "password"
        if not self.users.allowed_from(user, peer_host):
            return "loopback"
        return None

    async def login_async(self, user: str, password: str, peer_host: str | None) -> str | None:
        """``login`` for the event loop: a pair not checked before runs bcrypt (tens to
        hundreds of ms) in the default executor, so other connections go on meanwhile; checks
        of one pair made while its bcrypt runs (the h2 transport checks a call's headers and
        its handler checks again; clients opening several connections at once) wait for
        that run instead of starting another."""
        users = self.users
        if not users.remembered(user, password):
            token = users.token(user, password)
            check = self._checking.get(token)
            if check is None:
                check = asyncio.get_running_loop().run_in_executor(
                    None, users.check_password, user, password)
                self._checking[token] = check
                check.add_done_callback(lambda _: self._checking.pop(token, None))
            if not await asyncio.shield(check):  # a cancelled waiter leaves it to the others
                return "password"
        return self.login(user, password, peer_host)

    def remote_users(self, certificates: bool) -> list[str]:
        """The users who may log in from beyond loopback: those with a password that are not
        loopback-only, and with ``certificates`` (a door that takes client certificates,
        when TLS has a client CA) every user that is not loopback-only."""
        users = self.users
        tls = self.config.tls
        by_certificate = certificates and tls is not None and tls.ca is not None
        return [name for name in users if name not in users.loopback_only
                and (by_certificate or users.hash_of(name))]

    def certificate_user(self, peercert: dict | None) -> str | None:
        """The configured user named by a verified client certificate's CN, else None."""
        name = common_name(peercert)
        return name if name is not None and name in self.users else None
