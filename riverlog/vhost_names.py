# How a stream of a virtual host other than `/` is named inside riverlog (issue 30 item 1).
# Owns the one encoding from (virtual host, stream name) to the broker's stream name and back.
# Rules: `/` keeps the names (and data folders) it always had, so the Liftbridge doors, which
# are on `/`, see exactly today's streams; a stream of virtual host V named N is kept as
# MARK + V + MARK + N. MARK is a control character no virtual host name may contain, so the
# encoding is one-to-one, and every broker name that starts with MARK is *hidden*: no client
# of any door may name one (the stream door translates its connection's names through
# ``internal``/``external``; the Liftbridge doors and the management API refuse hidden names
# as streams that do not exist). This is a security boundary: a door that looks a stream up
# by a client's name must check ``hidden`` first.
from __future__ import annotations

DEFAULT = "/"
"""RabbitMQ's default virtual host: the only one of the Liftbridge doors."""
MARK = "\x1f"
"""The first character of a hidden broker name (ASCII unit separator)."""


def hidden(name: str) -> bool:
    """Whether broker name ``name`` belongs to a virtual host other than ``/`` (no client
    may spell it)."""
    return name.startswith(MARK)


def internal(vhost: str, name: str) -> str:
    """The broker name of stream ``name`` in ``vhost``: ``name`` itself on ``/``."""
    return name if vhost == DEFAULT else f"{MARK}{vhost}{MARK}{name}"


def lookup(vhost: str, name: str) -> str:
    """The broker name a client of ``vhost`` reaches by ``name``: ``internal``, but a name
    that starts with MARK (it would spell another virtual host's stream) becomes the empty
    name's, which no stream has and no door creates."""
    return internal(vhost, "" if name.startswith(MARK) else name)


def external(broker_name: str) -> tuple[str, str]:
    """(virtual host, stream name) of broker name ``broker_name``: ("/", name) for a name
    that is not hidden."""
    if not broker_name.startswith(MARK):
        return DEFAULT, broker_name
    vhost, _, name = broker_name[1:].partition(MARK)
    return vhost, name


def vhost_of(broker_name: str) -> str:
    """The virtual host of broker name ``broker_name``."""
    return external(broker_name)[0]


def in_vhost(broker_name: str, vhost: str) -> bool:
    """Whether broker name ``broker_name`` is a stream of ``vhost``."""
    if vhost == DEFAULT:
        return not broker_name.startswith(MARK)
    return broker_name.startswith(f"{MARK}{vhost}{MARK}")
