# The NATS subjects of partition replication (DESIGN.md "Scaling out"; Liftbridge's
# server/partition.go getReplicationRequestInbox, getLeaderOffsetRequestInbox and
# server/server.go getPartitionNotificationInbox): `<ns>.<stream>.<partition>.replicate`,
# `<ns>.<stream>.<partition>.offset` and `<ns>.notify.<server id>`.
# Rule: a stream name or server id may hold any character, so each becomes exactly one subject
# token, injectively: no name can reach another partition's (or server's) subjects.
from __future__ import annotations

import re

_PLAIN = re.compile(r"[A-Za-z0-9_-]")


def subject_token(text: str) -> str:
    """``text`` (a stream name or server id: any characters) as one NATS subject token:
    letters, digits, ``_`` and ``-`` kept, every other UTF-8 byte written ``%XX`` (``%``
    included), so distinct texts give distinct tokens and none holds ``.``, a wildcard or
    whitespace. A 255-byte name gives at most 765 characters."""
    return "".join(c if _PLAIN.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode())
                   for c in text)


def partition_subject(namespace: str, stream: str, index: int, kind: str) -> str:
    """``<ns>.<stream token>.<index>.<kind>``: ``kind`` "replicate" (ReplicationRequest) or
    "offset" (LeaderEpochOffsetRequest), answered by the partition's leader."""
    return f"{namespace}.{subject_token(stream)}.{index}.{kind}"


def notify_subject(namespace: str, server_id: str) -> str:
    """``<ns>.notify.<server id token>``: where a leader wakes this server's idle followers."""
    return f"{namespace}.notify.{subject_token(server_id)}"
