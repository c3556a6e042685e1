# Per-stream authorization with casbin (pycasbin). Owns the casbin model, the policy loaded from
# the configuration, and the one question every door asks: may USER do ACTION on STREAM?
# Rules: off unless enabled (then every authenticated user may do everything, as before);
# once enabled, deny by default: only a policy line grants. Actions are ACTIONS below; a
# policy line's stream is a glob pattern (casbin's globMatch: `*`, `?`, `[a-z]`), its action
# an action or `*`; `g, USER, ROLE` lines give a user a role's lines. Answers are cached per
# (user, stream, action): the doors ask on declare/subscribe, not per message, and are
# forgotten when the runtime permissions change (``set_runtime``). Runtime permissions (the
# management API's, access_table.Permission) join the policy when it is enabled: a user with
# one is answered by its expressions instead of policy lines (one store decides, as in
# RabbitMQ), a runtime user without one may do nothing; `admin` is a runtime user's
# `administrator` tag, and a configuration-file user's policy lines. A stream of a virtual
# host other than `/` (riverlog.vhost_names: a hidden broker name) is decided only by the
# user's runtime permission on that virtual host (the policy lines are `/`'s), on the name
# its clients use.
from __future__ import annotations

import csv
import functools
import logging
from typing import Iterable, Mapping, Protocol, Sequence

import casbin
from casbin.model import Model

from ..vhost_names import DEFAULT, external, hidden

log = logging.getLogger("riverlog.security")

PUBLISH, CONSUME, CREATE, DELETE, ADMIN = "publish", "consume", "create", "delete", "admin"
ACTIONS = (PUBLISH, CONSUME, CREATE, DELETE, ADMIN)


def super_stream_rights(name: str, partitions: Sequence[str],
                        configure: str) -> list[tuple[str, str]]:
    """The (stream, action) pairs that creating (``configure`` CREATE) or deleting (DELETE)
    super stream ``name`` of ``partitions`` needs, as RabbitMQ asks them for both
    (rabbit_stream_utils:check_super_stream_management_permitted): configure on the super
    stream and every partition, read (CONSUME) on the super stream, write (PUBLISH) on every
    partition."""
    return [*((n, configure) for n in (name, *partitions)), (name, CONSUME),
            *((n, PUBLISH) for n in partitions)]

# sub = user, obj = stream name, act = one of ACTIONS. Policy lines: p, SUBJECT, PATTERN, ACTION.
MODEL = """
[request_definition]
r = sub, obj, act

[policy_definition]
p = sub, obj, act

[role_definition]
g = _, _

[policy_effect]
e = some(where (p.eft == allow))

[matchers]
m = g(r.sub, p.sub) && globMatch(r.obj, p.obj) && (p.act == r.act || p.act == "*")
"""


class Grant(Protocol):
    """A runtime permission (access_table.Permission)."""

    def permits(self, stream: str, action: str) -> bool: ...


def read_policy_file(path: str) -> list[tuple[str, ...]]:
    """Lines of a casbin CSV policy file (``p, alice, orders.*, publish`` / ``g, bob, ops``);
    blank lines and ``#`` comments skipped. Raises ``OSError``, ``ValueError`` naming the line."""
    rows = []
    with open(path, newline="") as f:
        for number, row in enumerate(csv.reader(f, skipinitialspace=True), 1):
            row = [c.strip() for c in row]
            if not row or not row[0] or row[0].startswith("#"):
                continue
            if row[0] not in ("p", "g") or len(row) != (4 if row[0] == "p" else 3):
                raise ValueError(f"{path}:{number}: expected `p, user, stream, action` or "
                                 f"`g, user, role`")
            rows.append(tuple(row))
    return rows


class Authorizer:
    """``allowed(user, stream, action)``. ``rules``: ("p", user, pattern, action) and
    ("g", user, role) tuples; ``model_path``: a casbin model file replacing MODEL (it must keep
    the request ``r = sub, obj, act``). Raises ``ValueError`` for an unknown action in a rule."""

    def __init__(self, enabled: bool = False, rules: Iterable[Sequence[str]] = (),
                 model_path: str | None = None) -> None:
        self.enabled = enabled
        self._enforcer: casbin.Enforcer | None = None
        self._permissions: Mapping[str, Grant] = {}
        self._runtime_users: frozenset[str] = frozenset()
        self._administrators: frozenset[str] = frozenset()
        self._vhost_permissions: dict[tuple[str, str], Grant] = {}
        if not enabled:
            return
        if model_path:
            model = casbin.Enforcer(model_path).get_model()
        else:
            model = Model()
            model.load_model_from_text(MODEL)
        enforcer = casbin.Enforcer(model)
        for rule in rules:
            kind, *fields = rule
            if kind == "p":
                if model_path is None and fields[2] not in ACTIONS + ("*",):
                    raise ValueError(f"authorization rule {list(rule)}: unknown action "
                                     f"{fields[2]!r} (one of {', '.join(ACTIONS)} or *)")
                enforcer.add_policy(*fields)
            elif kind == "g":
                enforcer.add_grouping_policy(*fields)
            else:
                raise ValueError(f"authorization rule {list(rule)}: expected p or g first")
        self._enforcer = enforcer

    def set_runtime(self, permissions: Mapping[str, Grant], runtime_users: Iterable[str],
                    administrators: Iterable[str],
                    vhost_permissions: Mapping[tuple[str, str], Grant] | None = None) -> None:
        """Take the runtime permissions on ``/`` by user name, the runtime users' names
        (those not in the configuration file), the administrators among them and the
        permissions on other virtual hosts by (vhost, user); every cached answer is
        forgotten (the doors' next checks see the change)."""
        self._permissions = dict(permissions)
        self._vhost_permissions = dict(vhost_permissions or {})
        self._runtime_users = frozenset(runtime_users)
        self._administrators = frozenset(administrators)
        Authorizer.allowed.cache_clear()
        Authorizer.permits.cache_clear()

    def vhost_access(self, user: str | None, vhost: str) -> bool:
        """Whether ``user`` may open ``vhost`` (RabbitMQ's check_vhost_access: a permission
        on it); always when not enabled, and on ``/`` (its policy lines decide per stream)."""
        if self._enforcer is None or vhost == DEFAULT:
            return True
        return (vhost, user) in self._vhost_permissions

    @functools.lru_cache(maxsize=4096)
    def allowed(self, user: str | None, stream: str, action: str) -> bool:
        """True when ``user`` may do ``action`` on ``stream`` (always when not enabled;
        never for an anonymous ``user`` None when enabled); a denial is logged (INFO)."""
        ok = self.permits(user, stream, action)
        if not ok:
            log.info("denied: %s may not %s stream %r", user, action, stream)
        return ok

    @functools.lru_cache(maxsize=16384)
    def permits(self, user: str | None, stream: str, action: str) -> bool:
        """``allowed`` without logging a denial: for listings (the management API), which
        ask about every stream and show only those allowed; nothing is refused there."""
        if self._enforcer is None:
            return True
        if user is None:
            return False
        if hidden(stream):  # another virtual host's stream: its permission alone decides
            vhost, name = external(stream)
            grant = self._vhost_permissions.get((vhost, user))
            return grant is not None and action != ADMIN and grant.permits(name, action)
        runtime = user in self._runtime_users
        if action == ADMIN and runtime:
            return user in self._administrators
        permission = self._permissions.get(user)
        if permission is not None and action != ADMIN:
            return permission.permits(stream, action)
        if runtime:
            return False
        return bool(self._enforcer.enforce(user, stream, action))
