# What the source's ``stream`` option names: streams, or RabbitMQ super streams standing for
# their partition streams (the server's Partitions answer, in order). Rules: the server is
# asked once per planned query, on the driver; a name the server refuses to expand stays as
# given, so the source's own read of it reports why; offsets of a super stream are given
# per partition stream (startingOffsets {"orders-0": {"0": 42}}).
from __future__ import annotations

from collections.abc import Mapping

from .options import connection, streams

_STREAM_KEYS = ("stream", "streams")


def partition_streams(client, names) -> list[str]:
    """The streams of ``names`` (stream names, in order) as ``client`` (a connected
    riverlog.client.Client) sees them: a name that is no stream but a super stream stands
    for its partition streams, in order; duplicates dropped."""
    from ..client import ClientError

    out: list[str] = []
    for name in names:
        try:
            members = [] if client.stream_exists(name) else client.partitions(name)
        except ClientError:  # refused: the source's own read says why
            members = []
        out += members or [name]
    return list(dict.fromkeys(out))


def expanded(options: Mapping[str, str], client=None) -> dict[str, str]:
    """``options`` (the source's read options) with ``stream`` naming each super stream's
    partition streams instead of it, asked through ``client`` or a connection made from
    the options. Raises ValueError (bad ``servers``, no ``stream``) and
    riverlog.client.ClientError (no server answers)."""
    names = streams(options)
    if client is None:
        with connection(options).connect("riverlog-spark-plan") as client:
            return expanded(options, client)
    out = {k: v for k, v in options.items() if k.lower() not in _STREAM_KEYS}
    out["stream"] = ",".join(partition_streams(client, names))
    return out
