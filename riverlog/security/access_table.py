# Runtime users, permissions and virtual hosts (issue 30 items 1 and 2): the table the
# management API changes, as RabbitMQ's internal auth backend and rabbit_vhost keep them, and
# its changes as pure functions. Owns: what a runtime user, a permission (per virtual host)
# and a virtual host are, which names, tags, regular
# expressions and password hashes are valid, the JSON form the data folder keeps, and how a
# permission's configure/write/read expressions answer riverlog's actions on a stream.
# Rules: a change takes an AccessTable and returns a new one (never changing the old) or raises
# AccessError naming what is wrong, deterministically (no clock, no randomness, no I/O): in a
# cluster every Raft member applies it to its own copy. Only password hashes are kept, never a
# password (the API hashes before it changes anything). An expression applies as RabbitMQ's
# check_resource_access applies it: re:run on the stream name, unanchored (write `^...$` to
# anchor), the empty expression matching nothing; configure = declare and delete, write =
# publish, read = consume (subscribe, offsets).
from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import re
from types import MappingProxyType
from typing import Any, Mapping

from ..vhost_names import DEFAULT
from .authz import CONSUME, CREATE, DELETE, PUBLISH

VHOST = DEFAULT
"""The default virtual host, ``/`` (riverlog.vhost_names.DEFAULT)."""
BCRYPT = "riverlog_password_hashing_bcrypt"
"""The ``hashing_algorithm`` of a bcrypt hash (riverlog's own; riverlog.security.users)."""
SHA256 = "rabbit_password_hashing_sha256"
"""RabbitMQ's default: base64(4-byte salt + SHA-256(salt + UTF-8 password))
(rabbit_password_hashing_sha256, rabbit_password:salted_hash)."""
ALGORITHMS = (BCRYPT, SHA256)
BRIDGE_PREFIX = "riverlog-bridge-"
"""The NATS bridge's own user names (nats_auth.NatsAuth): no runtime user may take one."""
MAX_NAME_BYTES = 255
_TAG = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_BCRYPT = re.compile(r"\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}")
_ACTION_KIND = {CREATE: "configure", DELETE: "configure", PUBLISH: "write", CONSUME: "read"}


class AccessError(ValueError):
    """A change refused: a bad name, tag, expression or hash (the API answers 400)."""


class NoSuchUser(AccessError):
    """A change naming a user the table does not have (the API answers 404)."""


class NoSuchPermission(AccessError):
    """A permission to clear that is not there (the API answers 404)."""


class NoSuchVhost(AccessError):
    """A change naming a virtual host the table does not have (the API answers 404)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeUser:
    """``password_hash``: "" (no password login), a bcrypt hash or a RabbitMQ SHA-256 hash
    as ``algorithm`` says; ``tags``: RabbitMQ's user tags (``administrator`` may change
    users and permissions)."""

    name: str
    password_hash: str = ""
    algorithm: str = BCRYPT
    tags: tuple[str, ...] = ()

    def check(self, password: str) -> bool:
        """Whether ``password`` matches a SHA-256 hash (bcrypt is Users' to check: it
        remembers successes); False for any other."""
        if self.algorithm != SHA256 or not self.password_hash:
            return False
        raw = base64.b64decode(self.password_hash)
        digest = hashlib.sha256(raw[:4] + password.encode()).digest()
        return hmac.compare_digest(raw[4:], digest)


@dataclasses.dataclass(frozen=True, slots=True)
class Permission:
    """A user's configure, write and read expressions on one virtual host (Python ``re``, close to
    RabbitMQ's PCRE for the expressions people write)."""

    configure: str = ""
    write: str = ""
    read: str = ""

    def permits(self, stream: str, action: str) -> bool:
        """Whether ``action`` (riverlog.security.authz.ACTIONS) on ``stream`` is allowed:
        the action's expression searched in the name (re.search, as re:run); ``admin`` is
        never granted here (it is the ``administrator`` tag's)."""
        kind = _ACTION_KIND.get(action)
        pattern = getattr(self, kind) if kind else ""
        return bool(pattern) and re.search(pattern, stream) is not None  # re caches it


@dataclasses.dataclass(frozen=True, slots=True)
class VirtualHost:
    """A virtual host as RabbitMQ's management API describes it (rabbit_vhost: name,
    description, tags, default queue type)."""

    name: str
    description: str = ""
    tags: tuple[str, ...] = ()
    default_queue_type: str = "stream"


DEFAULT_VHOST = VirtualHost(DEFAULT, "Default virtual host")


@dataclasses.dataclass(frozen=True, slots=True)
class AccessTable:
    """Runtime users by name, their permissions on ``/`` by user name, the virtual hosts
    by name (``/`` always exists, stored only when described) and the permissions on the
    other virtual hosts by (vhost, user)."""

    users: Mapping[str, RuntimeUser] = dataclasses.field(default_factory=dict)
    permissions: Mapping[str, Permission] = dataclasses.field(default_factory=dict)
    vhosts: Mapping[str, VirtualHost] = dataclasses.field(default_factory=dict)
    vhost_permissions: Mapping[tuple[str, str], Permission] = dataclasses.field(
        default_factory=dict)

    def __setstate__(self, state: list | tuple) -> None:
        """Unpickle (Raft snapshots): a table pickled before virtual hosts existed has
        only the first two fields; the others take their defaults."""
        values = list(state)
        for i, field in enumerate(dataclasses.fields(self)):
            value = values[i] if i < len(values) else field.default_factory()
            object.__setattr__(self, field.name, value)

    def administrator(self, name: str) -> bool:
        found = self.users.get(name)
        return found is not None and "administrator" in found.tags

    def has_vhost(self, name: str) -> bool:
        return name == DEFAULT or name in self.vhosts

    def vhost(self, name: str) -> VirtualHost | None:
        """The virtual host ``name`` (``/`` as DEFAULT_VHOST unless described); None."""
        found = self.vhosts.get(name)
        return DEFAULT_VHOST if found is None and name == DEFAULT else found

    def every_vhost(self) -> list[VirtualHost]:
        """Every virtual host, ``/`` first, then by name."""
        return [self.vhost(DEFAULT)] + [self.vhosts[n] for n in sorted(self.vhosts)
                                        if n != DEFAULT]

    def permission(self, vhost: str, user: str) -> Permission | None:
        """``user``'s permission on ``vhost``; None when it has none."""
        if vhost == DEFAULT:
            return self.permissions.get(user)
        return self.vhost_permissions.get((vhost, user))

    def every_permission(self) -> list[tuple[str, str, Permission]]:
        """(vhost, user, permission) of every permission, ``/``'s first."""
        return [(DEFAULT, user, p) for user, p in self.permissions.items()] + \
            [(vhost, user, p) for (vhost, user), p in self.vhost_permissions.items()]


# -- validation ---------------------------------------------------------------------------
def _check_text(kind: str, name: Any) -> str:
    """``name`` when it is a non-empty string of at most 255 UTF-8 bytes with no control
    character; ``kind`` names it in the AccessError raised otherwise."""
    if not isinstance(name, str) or not name:
        raise AccessError(f"a {kind} name must be a non-empty string")
    if len(name.encode()) > MAX_NAME_BYTES:
        raise AccessError(f"a {kind} name has at most {MAX_NAME_BYTES} bytes")
    if any(ord(c) < 0x20 or ord(c) == 0x7f for c in name):
        raise AccessError(f"a {kind} name has no control characters")
    return name


def check_name(name: Any) -> str:
    """``name`` when it can be a user's: ``_check_text``'s rules, not a NATS bridge name.
    Raises AccessError."""
    _check_text("user", name)
    if name.startswith(BRIDGE_PREFIX):
        raise AccessError(f"user names starting {BRIDGE_PREFIX!r} are riverlog's own")
    return name


def check_vhost_name(name: Any) -> str:
    """``name`` when it can be a virtual host's: ``_check_text``'s rules (no control
    character: vhost_names.MARK is one). Raises AccessError."""
    return _check_text("virtual host", name)


def parse_tags(tags: Any) -> tuple[str, ...]:
    """RabbitMQ's ``tags``: a comma-separated string or a list of strings (absent: none);
    sorted, without repeats. Raises AccessError for another type or a tag that is not
    letters, digits, ``_ . -``."""
    if tags is None:
        return ()
    if isinstance(tags, str):
        tags = [t.strip() for t in tags.split(",")]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise AccessError("tags must be a comma-separated string or a list of strings")
    tags = [t.strip() for t in tags if t.strip()]
    for tag in tags:
        if not _TAG.fullmatch(tag):
            raise AccessError(f"bad tag {tag!r}")
    return tuple(sorted(set(tags)))


def check_hash(password_hash: Any, algorithm: Any = None) -> tuple[str, str]:
    """(hash, algorithm) of an API ``password_hash``: "" (no password login), a bcrypt hash
    (``$2a$``/``$2b$``/``$2y$``, 60 characters) or a RabbitMQ SHA-256 hash (base64 of 36
    bytes); ``algorithm`` when given must name its kind (ALGORITHMS). Raises AccessError."""
    if not isinstance(password_hash, str):
        raise AccessError("password_hash must be a string")
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise AccessError(f"hashing_algorithm must be one of {', '.join(ALGORITHMS)}")
    if not password_hash:
        return "", algorithm or BCRYPT
    if _BCRYPT.fullmatch(password_hash) and algorithm in (None, BCRYPT):
        return password_hash, BCRYPT
    if algorithm in (None, SHA256):
        try:
            raw = base64.b64decode(password_hash, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) == 36:
            return password_hash, SHA256
    raise AccessError("password_hash must be a bcrypt hash or a RabbitMQ "
                      "rabbit_password_hashing_sha256 hash (base64 of salt and digest)")


def check_expression(kind: str, pattern: Any) -> str:
    """A permission's ``kind`` expression when it compiles. Raises AccessError."""
    if not isinstance(pattern, str):
        raise AccessError(f"{kind} must be a string (a regular expression)")
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise AccessError(f"{kind}: invalid regular expression {pattern!r}: {exc}") from None
    return pattern


# -- changes ------------------------------------------------------------------------------
def put_user(table: AccessTable, name: str, password_hash: str | None = None,
             algorithm: str = BCRYPT, tags: tuple[str, ...] = ()
             ) -> tuple[AccessTable, bool]:
    """Create or update user ``name`` (``password_hash`` None: keep the stored one, "" for a
    new user). Returns (table, True when created). Raises AccessError."""
    check_name(name)
    old = table.users.get(name)
    if password_hash is None:
        password_hash, algorithm = (old.password_hash, old.algorithm) if old else ("", BCRYPT)
    else:
        password_hash, algorithm = check_hash(password_hash, algorithm)
    user = RuntimeUser(name, password_hash, algorithm, parse_tags(list(tags)))
    return dataclasses.replace(table, users={**table.users, name: user}), old is None


def delete_user(table: AccessTable, name: str) -> tuple[AccessTable, None]:
    """Remove user ``name`` and its permissions. Raises NoSuchUser."""
    if name not in table.users:
        raise NoSuchUser(f"no user {name!r}")
    users = {k: v for k, v in table.users.items() if k != name}
    permissions = {k: v for k, v in table.permissions.items() if k != name}
    others = {k: v for k, v in table.vhost_permissions.items() if k[1] != name}
    return dataclasses.replace(table, users=users, permissions=permissions,
                               vhost_permissions=others), None


def _with_permission(table: AccessTable, vhost: str, user: str,
                     permission: Permission | None) -> AccessTable:
    """``table`` with ``user``'s permission on ``vhost`` set (None: removed)."""
    if vhost == DEFAULT:
        kept, key, field = table.permissions, user, "permissions"
    else:
        kept, key, field = table.vhost_permissions, (vhost, user), "vhost_permissions"
    changed = {k: v for k, v in kept.items() if k != key}
    if permission is not None:
        changed[key] = permission
    return dataclasses.replace(table, **{field: changed})


def set_permissions(table: AccessTable, user: str, configure: str, write: str, read: str,
                    runtime: bool = False, vhost: str = DEFAULT) -> tuple[AccessTable, bool]:
    """Set ``user``'s permission on ``vhost``; ``runtime``: the user must be in the table (a
    configuration-file user is not: the caller checks those). Returns (table, True when
    created). Raises AccessError (a bad name or expression; RabbitMQ's
    ``vhost_or_user_not_found`` for a runtime user or a vhost that is not there)."""
    check_name(user)
    if runtime and user not in table.users or not table.has_vhost(vhost):
        raise AccessError("vhost_or_user_not_found")
    permission = Permission(check_expression("configure", configure),
                            check_expression("write", write), check_expression("read", read))
    created = table.permission(vhost, user) is None
    return _with_permission(table, vhost, user, permission), created


def clear_permissions(table: AccessTable, user: str, vhost: str = DEFAULT
                      ) -> tuple[AccessTable, None]:
    """Remove ``user``'s permission on ``vhost``. Raises NoSuchPermission."""
    if table.permission(vhost, user) is None:
        raise NoSuchPermission(f"no permission of {user!r} on vhost {vhost!r}")
    return _with_permission(table, vhost, user, None), None


def put_vhost(table: AccessTable, name: str, description: str = "",
              tags: tuple[str, ...] = (), default_queue_type: str = "stream"
              ) -> tuple[AccessTable, bool]:
    """Create or describe virtual host ``name`` (RabbitMQ's PUT /api/vhosts/{name}).
    Returns (table, True when created). Raises AccessError (a bad name, description or
    tag)."""
    check_vhost_name(name)
    if not isinstance(description, str) or not isinstance(default_queue_type, str):
        raise AccessError("description and default_queue_type must be strings")
    created = not table.has_vhost(name)
    vhost = VirtualHost(name, description, parse_tags(list(tags)), default_queue_type)
    return dataclasses.replace(table, vhosts={**table.vhosts, name: vhost}), created


def delete_vhost(table: AccessTable, name: str) -> tuple[AccessTable, None]:
    """Remove virtual host ``name`` and every permission on it (its streams and connections
    are the server's to end). Raises NoSuchVhost, AccessError for ``/`` (the Liftbridge
    doors' virtual host stays)."""
    if name == DEFAULT:
        raise AccessError("the default virtual host '/' cannot be deleted (the Liftbridge "
                          "doors are on it)")
    if name not in table.vhosts:
        raise NoSuchVhost(f"no virtual host {name!r}")
    vhosts = {k: v for k, v in table.vhosts.items() if k != name}
    others = {k: v for k, v in table.vhost_permissions.items() if k[0] != name}
    return dataclasses.replace(table, vhosts=vhosts, vhost_permissions=others), None


CHANGES = MappingProxyType({f.__name__: f for f in (put_user, delete_user, set_permissions,
                                                    clear_permissions, put_vhost,
                                                    delete_vhost)})
"""The changes by name: ``CHANGES[name](table, **arguments)`` (what Raft replicates)."""


# -- the data folder's form ---------------------------------------------------------------
def to_json(table: AccessTable) -> dict:
    """``{"users": [{"name", "password_hash", "hashing_algorithm", "tags"}], "vhosts":
    [{"name", "description", "tags", "default_queue_type"}], "permissions": [{"user",
    "vhost", "configure", "write", "read"}]}``."""
    return {"users": [{"name": u.name, "password_hash": u.password_hash,
                       "hashing_algorithm": u.algorithm, "tags": list(u.tags)}
                      for u in table.users.values()],
            "vhosts": [{**dataclasses.asdict(v), "tags": list(v.tags)}
                       for v in table.vhosts.values()],
            "permissions": [{"user": user, "vhost": vhost, **dataclasses.asdict(p)}
                            for vhost, user, p in table.every_permission()]}


def from_json(data: Any) -> AccessTable:
    """The table ``to_json`` gave. Raises AccessError (KeyError/TypeError as AccessError)."""
    try:
        table = AccessTable()
        for user in data["users"]:
            table, _ = put_user(table, user["name"], user["password_hash"],
                                user["hashing_algorithm"], tuple(user["tags"]))
        for vhost in data.get("vhosts", ()):  # absent in files written before vhosts
            table, _ = put_vhost(table, vhost["name"], vhost["description"],
                                 tuple(vhost["tags"]), vhost["default_queue_type"])
        for p in data["permissions"]:
            table, _ = set_permissions(table, p["user"], p["configure"], p["write"], p["read"],
                                       vhost=p.get("vhost", VHOST))
    except (KeyError, TypeError) as exc:
        raise AccessError(f"malformed access table: {exc!r}") from None
    return table
