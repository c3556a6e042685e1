# The embedded nats-server's share of riverlog's security: its TLS block and its users with
# their permissions, written in nats-server's configuration format and derived from riverlog's
# users, its authorization policy and the streams attached to subjects. Rules: nats-server has
# users when authorization is on or when it listens beyond loopback (it cannot serve anonymous
# clients from loopback only, so then every client logs in); every riverlog user with a
# password becomes a NATS user with the same bcrypt hash (nats-server checks bcrypt itself),
# except loopback-only users when nats-server listens beyond loopback; runtime users (the
# management API's) join and leave with each change (``access_changed``, then a reload), one
# with RabbitMQ's SHA-256 hash never (nats-server checks bcrypt only). With authorization on,
# a user may publish on the subjects (`subject` for partition 0, `subject.N` for partition N:
# plain and enveloped publishes alike) of the streams it may publish to, and subscribe to its
# own inboxes (`_INBOX.<user>.>`, ``own_inboxes``) and to the subjects of the streams it may
# consume, nothing else; a stream counts only when the user holds that right on its subject
# too (the policy's patterns match subjects as they match stream names), so a stream never
# widens anyone's NATS rights. No user may join a queue group on a stream's subject: those are
# the bridge's (nats-server's `"subject queue"` deny entries, `>` matching every queue name).
# The namespace's subjects (`<namespace>.>`: replication, notifications, server acks) are
# riverlog's own: every user is denied publishing and subscribing them. In a cluster
# nats-server always has users (routes join it to the others' nats-servers), and on loopback
# without authorization a client without credentials is a restricted user (nats-server's
# `no_auth_user`), so such clients keep working and still never reach the namespace. That user
# is an nkey user (a random public key whose seed nobody holds: nats-server asks the
# no_auth_user for no signature), not a password user: nats-server matches the no_auth_user's
# stored password against itself, which fails for a bcrypt hash, and warns "Plaintext passwords
# detected" for any password that is not one (auth.go checkAuthforWarnings), so no password in
# the file is in clear. The bridge itself is one more user, allowed everything, whose random
# password exists only in riverlog's memory (the file holds its bcrypt hash).
# Sender identity (authorization on): the users live in account USERS and the bridge alone in
# account RIVERLOG. USERS imports RIVERLOG's service `>` with `share: true`, so every message a
# user publishes reaches USERS' own subscribers as usual and RIVERLOG (the bridge) with
# nats-server's `Nats-Request-Info` header naming the user (nats-server sets it, replacing any
# header of that name the client sent: client.go processServiceImport/setHeader), which
# ``sender_of`` reads; USERS imports RIVERLOG's stream `>`, so acks and riverlog's own publishes
# reach users. nats-server does not pass a message that came in through the service import
# on to the stream export (client.go processMsgResults, pmrMsgImportedFromService): users'
# messages are delivered once. The accounts are the same whatever streams exist, on every
# server of a cluster (routes carry both accounts; the namespace, where the cluster's servers
# talk, stays in RIVERLOG: every user's deny entries keep it out of the imports).
# Permissions are kept per stream (``add``/``remove``: a few policy checks per user when a
# stream comes or goes, never users x streams), and ``settings`` only assembles them, so it can
# run off the event loop on a ``snapshot``.
# Format: nats-server's configuration file (docs.nats.io "Configuration", "Authorization",
# "Accounts"; queue permissions: nats-server client.go canSubscribe/queueMatches).
from __future__ import annotations

import base64
import binascii
import json
import logging
import secrets
import ssl

from ..protocol.nats_subject import subject_problem
from .authz import CONSUME, PUBLISH
from .guard import Guard
from .tls import client_context
from .users import hash_password, listens_on_loopback

log = logging.getLogger("riverlog.security")

_NKEY_USER_PREFIX = 20 << 3
"""The first byte of a user's public nkey (nats-io/nkeys, PREFIX_BYTE_USER: base32 'U')."""


def anonymous_nkey() -> str:
    """A new random public user nkey, the identity of clients without credentials on a
    clustered loopback nats-server: the prefix byte, 32 key bytes and their CRC-16/XMODEM
    (little-endian), base32 without padding (nats-io/nkeys, the encoding nats-server checks
    with IsValidPublicUserKey)."""
    raw = bytes([_NKEY_USER_PREFIX]) + secrets.token_bytes(32)
    return base64.b32encode(raw + binascii.crc_hqx(raw, 0).to_bytes(2, "little")).decode()


INBOX_PREFIX = "_INBOX."
"""With authorization on, riverlog sends acks only to subjects under this prefix: each user's
own inboxes (``own_inboxes``) when it knows who asked, else any."""
SENDER_HEADER = "Nats-Request-Info"
"""The header nats-server puts on a message crossing a service import with `share: true`: a
JSON object whose "user" is the publishing user (nats-server server/events.go ClientInfo)."""
RESPONSE_THRESHOLD = "100ms"
"""How long nats-server keeps the stand-in reply subject (`_R_...`) it makes for a message with
a reply subject crossing the service import (2 minutes by default: 200,000 such publishes grew
it by 165 MB). riverlog never replies, so it only bounds that memory."""
USERS_ACCOUNT = "USERS"
BRIDGE_ACCOUNT = "RIVERLOG"


def own_inboxes(user: str) -> str | None:
    """The prefix of ``user``'s own ack inboxes with authorization on (`_INBOX.<user>.`: it
    may subscribe to `_INBOX.<user>.>`, as nats-py's ``inbox_prefix="_INBOX.<user>"`` makes
    them); None when the name is no single NATS subject token (e.g. it has a `.`): such a user
    has no inbox, so it never receives another's acks."""
    if "." in user or subject_problem(user) is not None:
        return None
    return f"{INBOX_PREFIX}{user}."


def sender_of(header: str) -> str:
    """The user named by a SENDER_HEADER value; "" when it names none."""
    try:
        user = json.loads(header).get("user")
    except (ValueError, AttributeError):
        return ""
    return user if isinstance(user, str) else ""


def _subjects(stream) -> list[str]:
    base = stream.config.subject
    return [base if p.index == 0 else f"{base}.{p.index}" for p in stream.partitions]


def _permission(allow: list[str]) -> dict:
    return {"allow": allow} if allow else {"deny": [">"]}


class NatsAuth:
    """The nats-server settings for ``guard`` on ``host``. ``bridge_user``/
    ``bridge_password``: what the bridge connects with (None when nats-server needs no
    users). Tell it the streams attached to subjects with ``add``/``remove``."""

    def __init__(self, guard: Guard, host: str, namespace: str = "liftbridge-default",
                 clustered: bool = False) -> None:
        self.guard = guard
        self.on_loopback = listens_on_loopback(host)
        self.authz = guard.config.authz
        self.users_on = self.authz or not self.on_loopback or clustered
        self.anonymous = clustered and self.on_loopback and not self.authz
        self.reserved = [f"{namespace}.>"]  # riverlog's own subjects
        self.users: list[tuple[str, str]] = []  # (name, bcrypt hash) of the NATS users
        self._inboxes: dict[str, str] = {}  # with authorization on: user -> its inbox prefix
        self._refresh_users()
        # stream name -> (its partition subjects, users who may publish, users who may consume)
        self._grants: dict[str, tuple[list[str], list[str], list[str]]] = {}
        self.bridge_user: str | None = None
        self.bridge_password: str | None = None
        self._bridge_hash = ""
        self.anonymous_nkey = anonymous_nkey() if self.anonymous else None
        """The public nkey clients without credentials are (None unless ``anonymous``)."""
        if self.users_on:
            self.bridge_user = f"riverlog-bridge-{secrets.token_hex(4)}"
            self.bridge_password = secrets.token_urlsafe(24)
            self._bridge_hash = hash_password(self.bridge_password, rounds=4)

    def _refresh_users(self) -> None:
        """Take the guard's users as they are now: those with a bcrypt hash (nats-server
        checks nothing else: a runtime user with RabbitMQ's SHA-256 hash is no NATS user),
        and with authorization on their own inboxes (users without any left out)."""
        users = self.guard.users
        self.users = [(name, users.bcrypt_hash_of(name)) for name in users
                      if users.bcrypt_hash_of(name)
                      and (name not in users.loopback_only or self.on_loopback)]
        self._inboxes = {}
        if not self.authz:
            return
        for name, _ in self.users:
            prefix = own_inboxes(name)
            if prefix is None:
                log.warning("NATS user %r has no ack inbox: its name is no single NATS "
                            "subject token, so no `_INBOX.<user>.>` can be its own", name)
            else:
                self._inboxes[name] = prefix

    def access_changed(self, streams) -> None:
        """The users or permissions changed at runtime (the management API): take the
        users again and note anew who may use the subjects of ``streams`` (those added);
        the caller reloads nats-server."""
        self._refresh_users()
        for stream in streams:
            self.add(stream)

    @property
    def names_senders(self) -> bool:
        """True when nats-server tells the bridge who published each message (authorization
        on: the accounts of ``settings``, SENDER_HEADER)."""
        return self.authz

    @property
    def needed(self) -> bool:
        """True when nats-server needs a configuration of ours (TLS or users)."""
        return self.users_on or self.guard.config.tls is not None

    def may(self, user: str, stream, action: str) -> bool:
        """Whether ``user`` holds ``action`` on ``stream``'s NATS subjects: on the stream and
        on its subject."""
        allowed = self.guard.allowed
        return allowed(user, stream.name, action) and allowed(user, stream.config.subject,
                                                               action)

    def add(self, stream) -> None:
        """``stream`` is attached to its subject: note who may use its subjects (two policy
        checks per user and right, on the event loop; nothing to do without users)."""
        if not self.users_on:
            return
        names = [name for name, _ in self.users] if self.authz else []
        self._grants[stream.name] = (
            _subjects(stream), [name for name in names if self.may(name, stream, PUBLISH)],
            [name for name in names if self.may(name, stream, CONSUME)])

    def remove(self, stream) -> None:
        """``stream`` left its subject (deleted)."""
        self._grants.pop(stream.name, None)

    def snapshot(self) -> list:
        """What ``settings`` needs of the streams now, safe to hand to another thread."""
        return list(self._grants.values())

    def settings(self, grants: list | None = None) -> dict:
        """nats-server settings (``tls``; ``authorization``, or with authorization on the
        ``accounts`` USERS and RIVERLOG) for the streams added (or a ``snapshot`` of them), as
        a map in the shape of its configuration file. Only assembles lists: no policy check,
        so it may run in a worker thread."""
        config: dict = {}
        tls = self.guard.config.tls
        if tls is not None:
            config["tls"] = {"cert_file": tls.cert, "key_file": tls.key}
            if tls.ca:
                config["tls"]["ca_file"] = tls.ca
        if not self.users_on:
            return config
        if grants is None:
            grants = self.snapshot()
        publish: dict[str, list[str]] = {name: [] for name, _ in self.users}
        consume: dict[str, list[str]] = {name: [] for name, _ in self.users}
        for name, inboxes in self._inboxes.items():
            consume[name].append(inboxes + ">")
        queues = []
        for subjects, publishers, consumers in grants:
            queues += [f"{subject} >" for subject in subjects]
            for name in publishers:
                publish[name] += subjects
            for name in consumers:
                consume[name] += subjects
        users = [{"user": self.bridge_user, "password": self._bridge_hash}]
        identities = [{"user": name, "password": hashed} for name, hashed in self.users]
        if self.anonymous_nkey is not None:
            identities.append({"nkey": self.anonymous_nkey})
            config["no_auth_user"] = self.anonymous_nkey
        for identity in identities:
            name = identity.get("user")
            permissions: dict = {"publish": {}, "subscribe": {}}
            if self.authz:
                permissions = {"publish": _permission(publish[name]),
                               "subscribe": _permission(consume[name])}
            for kind, denied in (("publish", self.reserved), ("subscribe", self.reserved + queues)):
                permissions[kind]["deny"] = permissions[kind].get("deny", []) + denied
            users.append({**identity, "permissions": permissions})
        if not self.authz:
            config["authorization"] = {"users": users}
            return config
        imports = {"account": BRIDGE_ACCOUNT, "subject": ">"}
        config["accounts"] = {
            BRIDGE_ACCOUNT: {"users": users[:1], "exports": [
                {"service": ">", "response_threshold": RESPONSE_THRESHOLD}, {"stream": ">"}]},
            USERS_ACCOUNT: {"users": users[1:], "imports": [
                {"service": imports, "share": True}, {"stream": imports}]}}
        return config


def connect_options(config, guard: Guard, auth: NatsAuth | None) -> dict:
    """nats.connect() keyword arguments for the bridge (``config``: NatsConfig). To the
    embedded server (``auth`` given): its own user, and TLS verified against the server's
    own certificate (pinned: OpenSSL's partial-chain flag lets it anchor trust) besides
    ``nats.tls.ca`` or the client CA; the host name is not checked (the bridge dials its own
    child on loopback). To external servers: ``config.user``/
    ``password`` and TLS when a CA or client certificate is configured."""
    options: dict = {}
    tls = guard.config.tls
    if auth is not None:
        if auth.bridge_user:
            options.update(user=auth.bridge_user, password=auth.bridge_password)
        if tls is not None:
            context = client_context(config.tls_ca or tls.ca)
            context.load_verify_locations(tls.cert)  # the server's own certificate...
            context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # ...is trusted as it is
            context.check_hostname = False
            options["tls"] = context
        return options
    if config.user:
        options.update(user=config.user, password=config.password or "")
    if config.tls_ca or config.tls_cert:
        options["tls"] = client_context(config.tls_ca, config.tls_cert, config.tls_key)
    return options
