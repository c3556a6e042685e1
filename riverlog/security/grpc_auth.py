# Authentication and per-stream authorization on the Liftbridge gRPC door, as one grpc.aio
# server interceptor (installed when the door requires credentials or listens beyond
# loopback); ``wrap`` applies the same checks to a method handler for the h2 transport. Owns
# how a gRPC client proves who it is and which stream each RPC touches. Rules: credentials come
# from the `authorization` metadata (`Basic base64(user:password)`, RFC 7617) or, when TLS
# client authentication is on, from the verified client certificate's CN; wrong ones end the
# call with UNAUTHENTICATED, and so do none unless the door needs no credentials and the
# client is on loopback (the one rule of every door: anonymous clients are served from
# loopback only); a stream the user may not touch ends it with PERMISSION_DENIED (the gRPC
# status codes, grpc/doc/statuscodes.md). CreateStream also needs `publish` and `consume` on
# the subject (the policy's patterns match subjects as they match stream names), and
# PublishToSubject `publish` on the subject of every stream it reaches, so no stream gives a
# user NATS subjects the policy does not; with authorization on, the ack inbox of Publish and
# PublishToSubject must be one of the caller's own (nats_auth.own_inboxes), so no user sends
# acks to another's inbox. FetchMetadata needs a user but no stream permission. The consumer
# group calls of a member (LeaveConsumerGroup, FetchConsumerGroupAssignments,
# ReportConsumerGroupCoordinator) need `consume` on the member's streams, and a member that
# joined through this door may be acted for only by the user who joined it (no one leaves on
# another's behalf). A request that does not parse is left to the handler, which answers
# INVALID_ARGUMENT. A streaming call (Subscribe, PublishAsync) of a user deleted at runtime
# ends with UNAUTHENTICATED (``end_calls_of``), as the other doors close such a user's
# connections.
from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from contextvars import ContextVar
from typing import Callable, Iterable

import grpc
from google.protobuf.message import DecodeError

from ..protocol.liftbridge import api_pb2 as pb
from ..protocol.nats_subject import matches
from .authz import ADMIN, CONSUME, CREATE, DELETE, PUBLISH
from .guard import Guard
from .nats_auth import own_inboxes
from .users import is_loopback

log = logging.getLogger("riverlog.security")

# RPC -> (request type, action, the stream names it touches)
_RULES: dict[str, tuple[type, str, Callable]] = {
    "CreateStream": (pb.CreateStreamRequest, CREATE, lambda r: (r.name,)),
    "DeleteStream": (pb.DeleteStreamRequest, DELETE, lambda r: (r.name,)),
    "PauseStream": (pb.PauseStreamRequest, ADMIN, lambda r: (r.name,)),
    "SetStreamReadonly": (pb.SetStreamReadonlyRequest, ADMIN, lambda r: (r.name,)),
    "FetchPartitionMetadata": (pb.FetchPartitionMetadataRequest, CONSUME,
                               lambda r: (r.stream,)),
    "Publish": (pb.PublishRequest, PUBLISH, lambda r: (r.stream,)),
    "PublishAsync": (pb.PublishRequest, PUBLISH, lambda r: (r.stream,)),
    "Subscribe": (pb.SubscribeRequest, CONSUME, lambda r: (r.stream,)),
    "SetCursor": (pb.SetCursorRequest, CONSUME, lambda r: (r.stream,)),
    "FetchCursor": (pb.FetchCursorRequest, CONSUME, lambda r: (r.stream,)),
    "JoinConsumerGroup": (pb.JoinConsumerGroupRequest, CONSUME, lambda r: tuple(r.streams)),
}
# the calls of a consumer group member: request type (groupId, consumerId)
_MEMBER_CALLS: dict[str, type] = {
    "LeaveConsumerGroup": pb.LeaveConsumerGroupRequest,
    "FetchConsumerGroupAssignments": pb.FetchConsumerGroupAssignmentsRequest,
    "ReportConsumerGroupCoordinator": pb.ReportConsumerGroupCoordinatorRequest,
}


def partitions_on_subject(streams: Iterable, subject: str) -> list[tuple]:
    """(stream, partition index) of each partition that listens on the literal ``subject``
    (partition 0 on the stream's subject, partition N on ``subject.N``; wildcard subjects
    match as NATS does)."""
    found = []
    parent, _, last = subject.rpartition(".")
    index = int(last) if parent and last.isdigit() else 0
    for stream in streams:
        base = stream.config.subject
        if not base:
            continue
        if matches(base, subject):
            found.append((stream, 0))
        elif 0 < index < len(stream.partitions) and matches(base, parent):
            found.append((stream, index))
    return found



def _peer_host(peer: str) -> str | None:
    """The address of ``ServicerContext.peer()`` ("ipv4:1.2.3.4:5", "ipv6:[::1]:5")."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return None


CALLER: ContextVar[str | None] = ContextVar("riverlog_grpc_caller", default=None)
"""The authenticated user of the unary gRPC call being handled (None: anonymous, or no
checks on the door); what per-user limits count by (CreateStream's stream owner)."""


class GrpcAuth(grpc.aio.ServerInterceptor):
    """The interceptor. ``streams`` returns the broker's streams (for PublishToSubject),
    ``groups`` the consumer groups (Placement.consumer_groups', for their members' calls)."""

    def __init__(self, guard: Guard, streams: Callable[[], Iterable],
                 groups: Callable[[], object] | None = None) -> None:
        self.guard = guard
        self.streams = streams
        self.groups = groups
        # (group id, consumer id) -> the user who joined it through this door; entries of
        # members that are gone are dropped when the table doubles
        self.joined: dict[tuple[str, str], str] = {}
        self._joined_kept = 1024
        tls = guard.config.tls
        self.certificates = tls is not None and tls.client_auth  # CN only when verified
        self.anonymous = not guard.require_auth  # loopback clients need no credentials
        self._streaming: dict[asyncio.Task, str] = {}  # open streaming calls -> their user
        self._revoked: set[asyncio.Task] = set()  # ended by end_calls_of

    def end_calls_of(self, users: set[str]) -> int:
        """End the open streaming calls of ``users`` (deleted at runtime) with
        UNAUTHENTICATED; returns how many."""
        ended = [task for task, user in self._streaming.items() if user in users]
        for task in ended:
            self._revoked.add(task)
            task.cancel()
        return len(ended)

    async def _streamed(self, user: str | None, responses, context):
        """``responses`` of a streaming call of ``user``, ended with UNAUTHENTICATED when
        ``end_calls_of`` names the user meanwhile."""
        task = asyncio.current_task()
        if user is not None:
            self._streaming[task] = user
        try:
            async for response in responses:
                yield response
        except asyncio.CancelledError:
            if task not in self._revoked:
                raise
            log.info("gRPC streaming call of deleted user %r ended", user)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"user {user!r} was deleted")
        finally:
            self._streaming.pop(task, None)
            self._revoked.discard(task)

    async def user(self, context) -> str | None:
        """The caller's user name (None: an anonymous loopback client of a door that needs no
        credentials); aborts with UNAUTHENTICATED when there is none."""
        metadata = dict(context.invocation_metadata() or ())
        header = metadata.get("authorization")
        if header:
            scheme, _, token = str(header).partition(" ")
            try:
                name, sep, password = base64.b64decode(token, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                sep = ""
            if scheme.lower() != "basic" or not sep:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                    "authorization metadata must be Basic base64(user:password)")
            refused = await self.guard.login_async(name, password, _peer_host(context.peer()))
            if refused is None:
                return name
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                f"user {name!r} may only connect from loopback"
                                if refused == "loopback" else f"authentication failed for {name!r}")
        if self.certificates:
            names = context.auth_context().get("x509_common_name") or ()
            for cn in names:
                cn = cn.decode() if isinstance(cn, bytes) else cn
                if cn in self.guard.users:
                    return cn
        if self.anonymous and is_loopback(_peer_host(context.peer())):
            return None
        await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                            "credentials required: authorization metadata or a client certificate"
                            + (" (only loopback clients are served without)"
                               if self.anonymous else ""))

    async def check(self, method: str, user: str | None, raw: bytes, context) -> None:
        """Abort with PERMISSION_DENIED unless ``user`` may do ``method``'s request."""
        subjects: tuple[tuple[str, str], ...] = ()  # (subject, action) it needs too
        if method == "PublishToSubject":
            try:
                request = pb.PublishToSubjectRequest.FromString(raw)
            except DecodeError:
                return
            subject = request.subject
            streams = [s for s, _ in partitions_on_subject(self.streams(), subject)]
            if not streams:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                    f"no stream listens on subject {subject!r}")
            action, names = PUBLISH, [s.name for s in streams]
            subjects = tuple((s.config.subject, PUBLISH) for s in streams)
        elif method in _MEMBER_CALLS:
            await self._check_member(method, user, raw, context)
            return
        else:
            rule = _RULES.get(method)
            if rule is None:
                return
            request_type, action, stream_names = rule
            try:
                request = request_type.FromString(raw)
            except DecodeError:
                return
            names = stream_names(request)
            if method == "CreateStream" and request.subject:
                subjects = ((request.subject, PUBLISH), (request.subject, CONSUME))
        for name in names:
            if not self.guard.allowed(user, name, action):
                await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                    f"user {user!r} may not {action} stream {name!r}")
        for subject, need in subjects:
            if not self.guard.allowed(user, subject, need):
                await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                    f"user {user!r} may not {need} subject {subject!r}")
        if action == PUBLISH and user is not None and self.guard.config.authz:
            inbox = getattr(request, "ackInbox", "")  # Publish, PublishToSubject
            own = own_inboxes(user)
            if inbox and (own is None or not inbox.startswith(own)):
                await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                    f"ack inbox {inbox[:64]!r} is not an inbox of user {user!r} "
                                    f"({own or 'it has none'}>)")

    async def _check_member(self, method: str, user: str | None, raw: bytes, context) -> None:
        """A member's call: PERMISSION_DENIED when another user joined that member, or when
        ``user`` may not consume one of the member's streams. A non-member is left to the
        handler (Liftbridge's NotFound / FailedPrecondition)."""
        try:
            request = _MEMBER_CALLS[method].FromString(raw)
        except DecodeError:
            return
        member = (request.groupId, request.consumerId)
        owner = self.joined.get(member)
        if owner is not None and owner != user:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"consumer {request.consumerId[:64]!r} of group "
                                f"{request.groupId[:64]!r} was joined by another user")
        streams = self.groups().member_streams(*member) if self.groups is not None else None
        for name in streams or ():
            if not self.guard.allowed(user, name, CONSUME):
                await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                    f"user {user!r} may not {CONSUME} stream {name!r}")

    def _called(self, method: str, user: str | None, raw: bytes) -> None:
        """``method`` succeeded: note who joined a member, forget a member that left."""
        if user is None or method not in ("JoinConsumerGroup", "LeaveConsumerGroup"):
            return
        request = (pb.JoinConsumerGroupRequest if method == "JoinConsumerGroup"
                   else pb.LeaveConsumerGroupRequest).FromString(raw)
        member = (request.groupId, request.consumerId)
        if method == "LeaveConsumerGroup":
            self.joined.pop(member, None)
            return
        self.joined[member] = user
        if len(self.joined) > self._joined_kept and self.groups is not None:
            groups = self.groups()
            self.joined = {m: u for m, u in self.joined.items() if groups.is_member(*m)}
            self._joined_kept = max(1024, 2 * len(self.joined))

    async def intercept_service(self, continuation, details):
        """The grpc.aio transport's hook: ``wrap`` of the method's handler."""
        handler = await continuation(details)
        if handler is None:
            return None
        return self.wrap(details.method.rpartition("/")[2], handler)

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` of RPC ``method`` ("Publish") with the checks in front: the one place
        both gRPC transports (grpc.aio, server/grpc_h2_server.py) get them from."""
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._unary(method, handler.unary_unary))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._unary_stream(method,
                                                                    handler.unary_stream))
        return handler._replace(stream_stream=self._stream_stream(method, handler.stream_stream))

    def _unary(self, method: str, inner):
        async def behavior(raw, context):
            user = await self.user(context)
            await self.check(method, user, raw, context)
            CALLER.set(user)  # each call runs in its own task: the variable is the call's
            response = await inner(raw, context)
            self._called(method, user, raw)
            return response
        return behavior

    def _unary_stream(self, method: str, inner):
        async def behavior(raw, context):
            user = await self.user(context)
            await self.check(method, user, raw, context)
            async for response in self._streamed(user, inner(raw, context), context):
                yield response
        return behavior

    def _stream_stream(self, method: str, inner):
        """Each request is checked; the first refused one ends reading, and once the answers
        to the earlier ones are out the call ends with PERMISSION_DENIED."""
        request_type, action, stream_names = _RULES[method]

        async def behavior(requests, context):
            user = await self.user(context)
            denied: list[str] = []

            async def checked():
                async for raw in requests:
                    try:
                        names = stream_names(request_type.FromString(raw))
                    except DecodeError:
                        names = ()
                    refused = [n for n in names if not self.guard.allowed(user, n, action)]
                    if refused:
                        denied.append(f"user {user!r} may not {action} stream {refused[0]!r}")
                        return
                    yield raw

            async for response in self._streamed(user, inner(checked(), context), context):
                yield response
            if denied:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, denied[0])
        return behavior
