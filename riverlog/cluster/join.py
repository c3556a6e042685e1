# Adding a server to a running cluster: Liftbridge's Raft join over NATS (docs/clustering.md,
# "Adding a server"). Owns: the join subject, the request and its answer with their
# authentication, asking to join (``ask``: a server started with neither bootstrap seed nor
# peers, before its Raft member first starts) and answering (``JoinAnswers``: every member
# listens, only the Raft leader answers, as in Liftbridge, which drops the request elsewhere).
# Rules: the leader answers once it holds the new member's addition (pysyncobj's
# addNodeToCluster, in effect on the leader from then on; a seed alone cannot commit it
# before the new member runs: a majority of two is both), or at once when the address is a
# member already (a join whose answer was lost, asked again: idempotent, as Liftbridge's
# AddVoter); joins are answered one at a time (Raft
# changes membership one server at a time); a request or answer that fails its
# authentication is dropped and logged, never acted on; asking gives up after JOIN_ATTEMPTS
# with RaftJoinError naming the last reason.
# Wire facts (liftbridge-io/liftbridge server/raft.go setupMetadataRaft,
# newClusterJoinRequestHandler): the subject is `<namespace>.raft.metadata.join`; the request
# is the envelope's RaftJoinRequest {nodeID: the server id, nodeAddr: its Raft address
# (Liftbridge's is the server id: its Raft runs over NATS)}; the answer is the envelope's
# RaftJoinResponse {error}, empty on success; Liftbridge asks 30 times. riverlog's additions,
# as NATS headers: the answer's `Riverlog-Raft-Members`, the members' Raft addresses but the
# joiner's, space-separated (pysyncobj's new member starts with them as partners: it accepts
# connections only from members it knows); on both, `Riverlog-Raft-Nonce` (the request's:
# its Unix time in seconds, ".", random hex; echoed in the answer; the leader drops a request
# whose time is more than JOIN_FRESH_S from its clock) and `Riverlog-Raft-Auth`, an
# HMAC-SHA256 under the Raft password of the direction, nonce, payload and members. The namespace's subjects are
# riverlog's own user's on an embedded nats-server (security/nats_auth.py), not on one given
# with --nats-servers, and a voter added by anyone could keep the cluster from a majority.
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time

from ..config_file import unspecified_host
from ..errors import ClusterUnavailableError
from ..protocol.liftbridge import api_pb2 as pb
from ..protocol.liftbridge.envelope import EnvelopeError, MsgType, decode_internal, encode_message
from .metadata import RaftMetadata, RaftUnavailable

log = logging.getLogger("riverlog.cluster.join")

JOIN_ATTEMPTS = 30  # Liftbridge's defaultRaftJoinAttempts
JOIN_TIMEOUT_S = 2.0  # per request; the leader answers once it holds the addition
JOIN_RETRY_S = 1.0  # Liftbridge waits a second between attempts
JOIN_FRESH_S = 60.0
"""A request whose nonce's time is further than this from the leader's clock is dropped (a
recorded request replayed later, e.g. after its server was removed, adds nothing)."""
MEMBERS_HEADER = "Riverlog-Raft-Members"
NONCE_HEADER = "Riverlog-Raft-Nonce"
AUTH_HEADER = "Riverlog-Raft-Auth"


class RaftJoinError(ClusterUnavailableError):
    """No Raft leader took this server in (the message says why)."""


def subject(namespace: str) -> str:
    """The join subject: Liftbridge's `<namespace>.raft.metadata.join`."""
    return f"{namespace}.raft.metadata.join"


def _mac(password: str, direction: bytes, nonce: str, payload: bytes,
         members: str = "") -> str:
    return hmac.new(password.encode(), b"\0".join((b"riverlog raft join", direction,
                                                   nonce.encode(), payload, members.encode())),
                    hashlib.sha256).hexdigest()


def request_headers(password: str, payload: bytes, now: float | None = None) -> dict:
    """The NATS headers authenticating join request ``payload``: a nonce of the time
    (``now``, default the clock's) and random bytes, and the HMAC."""
    nonce = f"{time.time() if now is None else now:.0f}.{secrets.token_hex(16)}"
    return {NONCE_HEADER: nonce, AUTH_HEADER: _mac(password, b"request", nonce, payload)}


def _stale(nonce: str) -> bool:
    """Whether the time in a request's ``nonce`` is not within JOIN_FRESH_S of the clock."""
    sent, _, _ = nonce.partition(".")
    return not sent.isdigit() or abs(time.time() - int(sent)) > JOIN_FRESH_S


def _authentic(headers: dict | None, password: str, direction: bytes, payload: bytes,
               nonce: str | None = None) -> bool:
    """Whether ``headers`` carry the right HMAC (and, given, the expected ``nonce``)."""
    headers = headers or {}
    got = headers.get(NONCE_HEADER, "")
    if nonce is not None and got != nonce:
        return False
    expected = _mac(password, direction, got, payload, headers.get(MEMBERS_HEADER, ""))
    return hmac.compare_digest(headers.get(AUTH_HEADER, ""), expected)


def address_problem(address: str) -> str | None:
    """Why ``address`` cannot be a Raft member's ("host:port", a reachable host), or None."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        return f"Raft address {address!r} is not host:port"
    if unspecified_host(host):
        return f"Raft address {address!r} is a wildcard, not an address to reach"
    return None


async def ask(nc, namespace: str, server_id: str, address: str, password: str,
              attempts: int = JOIN_ATTEMPTS) -> tuple[str, ...]:
    """Ask the Raft leader, over NATS connection ``nc``, to add this server (``server_id``,
    Raft ``address``) to the metadata Raft; returns the other members' Raft addresses once
    it is a member (start its Raft member with them as partners). Raises RaftJoinError after
    ``attempts`` requests without a successful answer."""
    request = encode_message(pb.RaftJoinRequest(nodeID=server_id, nodeAddr=address))
    reason = "no answer"
    for attempt in range(attempts):
        if attempt:
            await asyncio.sleep(JOIN_RETRY_S)
        headers = request_headers(password, request)
        nonce = headers[NONCE_HEADER]
        try:
            reply = await nc.request(subject(namespace), request, timeout=JOIN_TIMEOUT_S,
                                     headers=headers)
        except Exception as exc:  # no responders (no leader yet), timeout, connection
            reason = f"no Raft leader answered ({type(exc).__name__})"
            log.info("asking to join the cluster: %s; asking again", reason)
            continue
        if not _authentic(reply.headers, password, b"response", reply.data, nonce):
            reason = "an answer failed its authentication (a different riverlog.raft.password?)"
            log.warning("asking to join the cluster: %s", reason)
            continue
        try:
            error = decode_internal(reply.data, MsgType.RaftJoinResponse).error
        except EnvelopeError as exc:
            reason = f"an unreadable answer ({exc})"
            continue
        if error:
            reason = f"the Raft leader refused: {error}"
            log.info("asking to join the cluster: %s; asking again", reason)
            continue
        members = tuple(reply.headers.get(MEMBERS_HEADER, "").split())
        log.info("joined the metadata Raft of %s", ", ".join(members))
        return members
    raise RaftJoinError(
        f"could not join the cluster on {subject(namespace)} after {attempts} attempts: "
        f"{reason}. Is a member running on the same NATS cluster (riverlog.nats.routes) with "
        f"the same riverlog.raft.password and clustering.namespace? The first server of a "
        f"cluster bootstraps it (--raft-bootstrap-seed or clustering.raft.bootstrap.peers)")


class JoinAnswers:
    """Answers join requests on ``metadata``'s member while it leads the Raft. ``await
    listen(nc)`` subscribes on NATS connection ``nc`` (again after a reconnect)."""

    def __init__(self, metadata: RaftMetadata, namespace: str, password: str) -> None:
        self.metadata = metadata
        self.namespace = namespace
        self.password = password
        self._one_at_a_time = asyncio.Lock()

    async def listen(self, nc) -> None:
        async def answer(msg) -> None:
            if not self.metadata.is_leader:
                return
            async with self._one_at_a_time:
                await self._answer(nc, msg)
        await nc.subscribe(subject(self.namespace), cb=answer)

    async def _answer(self, nc, msg) -> None:
        if not _authentic(msg.headers, self.password, b"request", msg.data):
            log.warning("a Raft join request failed its authentication (a server with a "
                        "different riverlog.raft.password?): dropped")
            return
        if _stale(msg.headers[NONCE_HEADER]):
            log.warning("a Raft join request sent more than %.0f s from this server's clock "
                        "(a replayed request, or clocks apart): dropped", JOIN_FRESH_S)
            return
        try:
            request = decode_internal(msg.data, MsgType.RaftJoinRequest)
        except EnvelopeError as exc:
            log.warning("an unreadable Raft join request: %s", exc)
            return
        address, metadata = request.nodeAddr, self.metadata
        error = address_problem(address) or ("" if request.nodeID else "no server id")
        if not error and address == metadata.address:
            error = f"Raft address {address} is the Raft leader's own"
        if not error and address not in metadata.members():
            log.info("adding server %s (Raft %s) to the metadata Raft", request.nodeID,
                     address)
            try:
                await metadata.add_member(address, timeout=JOIN_TIMEOUT_S)
            except RaftUnavailable as exc:
                error = str(exc)
        if error:
            log.warning("Raft join of server %s (%s) refused: %s", request.nodeID, address,
                        error)
        if not msg.reply:
            return
        nonce = (msg.headers or {}).get(NONCE_HEADER, "")
        members = " ".join(m for m in metadata.members() if m != address)
        payload = encode_message(pb.RaftJoinResponse(error=error))
        await nc.publish(msg.reply, payload, headers={
            NONCE_HEADER: nonce, MEMBERS_HEADER: members,
            AUTH_HEADER: _mac(self.password, b"response", nonce, payload, members)})
