# Users and their passwords. Owns the user table every door authenticates against and the
# loopback-only rule. Rules: only bcrypt hashes are stored (never a password), a hash is
# checked with the bcrypt library; a user whose hash is empty exists for certificate logins
# (SASL EXTERNAL, gRPC client certificates) only and never passes a password check.
# Successful checks are remembered in memory under an HMAC with a per-process key, so a
# client that reconnects does not pay bcrypt's cost (~65 ms at cost 10) on the event loop
# again; failures are never remembered. Runtime users (the management API's, access_table.py)
# join the configuration file's through ``set_runtime``; a name in the file is the file's
# (precedence: the API refuses to change it, and a runtime user of that name in a cluster's
# table is ignored on a server whose file has it). A runtime user's hash is bcrypt or
# RabbitMQ's salted SHA-256.
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from typing import Iterable, Mapping

import bcrypt

from .access_table import SHA256, RuntimeUser

DEFAULT_ROUNDS = 12
# bcrypt (cost 10) of "guest": RabbitMQ's default user, allowed from loopback only.
GUEST_HASH = "$2b$10$skoGrcbmwT1BqQ1jydYMq.o0KotBHokBz9b34UTZTV2sC1nMDE.ru"
_BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")


def hash_password(password: str, rounds: int = DEFAULT_ROUNDS) -> str:
    """The bcrypt hash (``$2b$<rounds>$...``, 60 characters) of ``password`` for the config
    file. ``rounds`` is bcrypt's log2 cost, 4 to 31; raises ``ValueError`` outside it or for a
    password longer than bcrypt's 72 bytes."""
    data = password.encode()
    if len(data) > 72:
        raise ValueError("bcrypt uses at most 72 bytes of a password")
    if not 4 <= rounds <= 31:
        raise ValueError("rounds must be between 4 and 31")
    return bcrypt.hashpw(data, bcrypt.gensalt(rounds)).decode()


def is_loopback(host: str | None) -> bool:
    """True for a loopback address (``127.0.0.0/8``, ``::1``, an IPv4-mapped loopback)."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def listens_on_loopback(host: str) -> bool:
    """True when a server bound to ``host`` is reachable from loopback only (a loopback
    address or ``localhost``; a wildcard such as 0.0.0.0 or any other address is not)."""
    return is_loopback(host) or host == "localhost"


class Users:
    """The user table: ``users`` (name, bcrypt hash or "" for certificate-only users) and the
    names in ``loopback_only``. Raises ``ValueError`` naming a user whose hash is not bcrypt."""

    def __init__(self, users: Iterable[tuple[str, str]],
                 loopback_only: Iterable[str] = ()) -> None:
        self._hashes: dict[str, bytes] = {}
        for name, hashed in users:
            if hashed and not hashed.startswith(_BCRYPT_PREFIXES):
                raise ValueError(f"user {name!r}: the password must be a bcrypt hash "
                                 f"(make one with `riverlog user hash`), not a password")
            self._hashes[name] = hashed.encode()
        self.loopback_only = frozenset(loopback_only)
        self._key = os.urandom(32)
        self._verified: set[bytes] = set()
        self._runtime: dict[str, RuntimeUser] = {}

    def set_runtime(self, users: Mapping[str, RuntimeUser]) -> None:
        """Take the runtime users (the management API's) as they are now: a user gone or
        with another hash logs in no more with what it logged in with before."""
        self._runtime = {name: user for name, user in users.items()
                         if name not in self._hashes}

    def in_file(self, name: str) -> bool:
        """Whether ``name`` is a user of the configuration file (not the API's to change)."""
        return name in self._hashes

    def runtime(self, name: str) -> RuntimeUser | None:
        """The runtime user ``name`` (None for a configuration-file user or none)."""
        return self._runtime.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._hashes or name in self._runtime

    def __iter__(self):
        return iter([*self._hashes, *self._runtime])

    def _hash(self, name: str) -> bytes | None:
        found = self._hashes.get(name)
        if found is None and name in self._runtime:
            found = self._runtime[name].password_hash.encode()
        return found

    def hash_of(self, name: str) -> str:
        """The stored hash ("" for a certificate-only user; a runtime user's may be
        RabbitMQ's SHA-256, ``bcrypt_hash_of`` tells); ``KeyError`` if unknown."""
        found = self._hash(name)
        if found is None:
            raise KeyError(name)
        return found.decode()

    def bcrypt_hash_of(self, name: str) -> str:
        """The stored hash when it is bcrypt (what nats-server can check), else ""."""
        found = self._runtime.get(name)
        if found is not None and found.algorithm == SHA256:
            return ""
        return self.hash_of(name)

    def token(self, name: str, password: str) -> bytes:
        """The pair ``name``/``password`` as this process remembers it: an HMAC-SHA256 under
        a per-process key (with the stored hash, so a changed hash is a new pair)."""
        return hmac.new(self._key, b"\0".join((name.encode(), self._hash(name) or b"",
                                                password.encode())), hashlib.sha256).digest()

    def remembered(self, name: str, password: str) -> bool:
        """True when this pair passed a check before (answering costs microseconds, while a
        first check runs bcrypt: tens to hundreds of ms, so doors run it off the event loop)."""
        return self.token(name, password) in self._verified

    def check_password(self, name: str, password: str) -> bool:
        """True when ``name`` exists with a hash that ``password`` matches. Thread-safe."""
        hashed = self._hash(name)
        if not hashed:
            return False
        token = self.token(name, password)
        if token in self._verified:
            return True
        runtime = self._runtime.get(name)
        if runtime is not None and runtime.algorithm == SHA256:
            return runtime.check(password)
        try:
            ok = bcrypt.checkpw(password.encode(), hashed)
        except ValueError:  # a malformed hash: nobody logs in with it
            return False
        if ok:
            self._verified.add(token)
        return ok

    def allowed_from(self, name: str, peer_host: str | None) -> bool:
        """False when ``name`` may connect only from loopback and ``peer_host`` is not."""
        return name not in self.loopback_only or is_loopback(peer_host)
