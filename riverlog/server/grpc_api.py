# The Liftbridge gRPC front door: the `/proto.API/*` service that Liftbridge clients
# (gufo-liftbridge, go-liftbridge, ...) call, on grpc.aio. Owns the listening port and the
# translation of each RPC into calls on the shared Liftbridge layer (server/liftbridge.py);
# the streaming RPCs are in grpc_subscribe.py and grpc_publish_async.py. Rules: handlers get
# raw request bytes and parse them, so a malformed request gets InvalidArgument naming the
# message type; every refusal uses exactly the gRPC status code Liftbridge uses, with its
# message; Publish waits for its ack only when the call has a deadline and the ack policy is
# not NONE; a subject or ack inbox that NATS or riverlog refuses (NatsBridge.ack_inbox_error)
# is refused before anything is stored. Bounds Liftbridge lacks (issue 24): ids (cursor,
# group, consumer) of at most 255 bytes, as stream names; FetchMetadata's names
# (grpc_metadata.py); cursors per stream (RESOURCE_EXHAUSTED); a PublishToSubject that would
# reach a read-only partition is refused as Publish is, where Liftbridge's times out.
# In a cluster (Broker.placement): CreateStream/DeleteStream, PauseStream/SetStreamReadonly and
# the consumer group calls go through the metadata, FetchMetadata lists every server and
# stream, and a Publish for a partition led elsewhere goes to the leader through its NATS
# subject, as Liftbridge publishes every gRPC Publish (refused here when read-only, resuming
# the partition first when paused).
# Wire facts: reference/liftbridge.md (service, field numbers, status codes); checks and
# messages from liftbridge's server/api.go and metadata.go (liftbridge-io/liftbridge 50ac358).
from __future__ import annotations

import asyncio
import functools
import logging
from typing import Callable

import grpc
from google.protobuf.message import DecodeError

from ..broker import StreamConfig
from ..broker.stream import MAX_NAME_BYTES
from ..broker.cursors import CursorLimitError, CursorsDisabledError, NotCursorLeaderError
from ..broker.groups import GroupError
from ..config import GrpcConfig
from ..errors import ClusterUnavailableError, LogClosedError
from ..metrics import GRPC, CallTracker
from ..protocol.liftbridge import api_pb2 as pb
from ..protocol.liftbridge.envelope import encode_publish
from ..protocol.nats_subject import subject_problem
from ..security.grpc_auth import CALLER, GrpcAuth, partitions_on_subject
from ..security.guard import Guard
from ..security.tls import grpc_server_credentials, server_context
from ..security.users import listens_on_loopback
from ..vhost_names import hidden
from .grpc_metadata import check_names, fetch_metadata, partition_metadata
from .grpc_publish_async import ack_error_to_async, exact_nats_size, nats_size, publish_async
from .grpc_subscribe import subscribe
from .group_quota import GroupQuota
from .liftbridge import NONE, Liftbridge, LiftbridgeError, partition_subject
from .nats_link import publish_wait_ack
from .server_id import new_id

log = logging.getLogger("riverlog.grpc")

SERVICE = "proto.API"
MAX_PARTITIONS = 4096
# grpcio's limit on a response (a Subscribe message is one stored record): as before the
# request limit became GrpcConfig.max_message_bytes, Liftbridge's 4 MiB (grpc-go's servers
# send up to 2 GiB by default)
MAX_SEND_BYTES = 64 * 1024 * 1024
"""Partitions per stream at most (Liftbridge has no limit; riverlog refuses a CreateStream
that would create more folders than this with InvalidArgument)."""
_ASYNC = pb.PublishAsyncError.Code
# Liftbridge's convertPublishAsyncError: PublishAsyncError code -> gRPC status
_PUBLISH_STATUS = {
    "NOT_FOUND": grpc.StatusCode.NOT_FOUND, _ASYNC.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    "BAD_REQUEST": grpc.StatusCode.INVALID_ARGUMENT,
    _ASYNC.BAD_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    "READONLY": grpc.StatusCode.FAILED_PRECONDITION,
    _ASYNC.READONLY: grpc.StatusCode.FAILED_PRECONDITION,
    _ASYNC.ENCRYPTION_FAILED: grpc.StatusCode.INTERNAL,
    "INTERNAL": grpc.StatusCode.INTERNAL,  # e.g. AckPolicy ALL below the stream's minIsr
    "RESOURCE_EXHAUSTED": grpc.StatusCode.RESOURCE_EXHAUSTED,  # a resource alarm (riverlog's)
}


def _serialize(message) -> bytes:
    return message.SerializeToString()


async def _parse(cls, raw: bytes, context):
    """The request ``cls`` of ``raw``; INVALID_ARGUMENT when malformed or when it creates a
    stream of a name no client may use, NOT_FOUND when it names such a stream (another
    virtual host's: riverlog.vhost_names; the Liftbridge doors are on ``/``)."""
    try:
        req = cls.FromString(raw)
    except DecodeError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {cls.__name__}: {exc}")
    names = [getattr(req, field, "") for field in ("stream", "name")]
    names += getattr(req, "streams", ())  # JoinConsumerGroup's (FetchMetadata: its own)
    if cls is not pb.FetchMetadataRequest and any(isinstance(n, str) and hidden(n)
                                                  for n in names):
        if cls is pb.CreateStreamRequest:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Stream name is reserved")
        await context.abort(grpc.StatusCode.NOT_FOUND, "No such stream")
    return req


def _nullable(field):
    return field.value if field is not None else None


class GrpcApi:
    """The gRPC server. ``await start()`` (raises OSError naming a taken port), ``await stop()``."""

    def __init__(self, service: Liftbridge, config: GrpcConfig,
                 guard: Guard | None = None) -> None:
        self.service = service
        self.config = config
        self.guard = guard
        self.port = config.port
        self._server = None  # grpc.aio.Server, or GrpcH2Server (config.transport "h2")
        self.auth: GrpcAuth | None = None  # the checks in front of the handlers, once started
        self.calls = CallTracker(GRPC)  # calls in progress per peer, failed calls counted
        self.group_quota = GroupQuota(lambda: service.groups, guard.config.max_groups_per_user
                                      if guard is not None else 0)

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        if self.config.transport == "h2":
            await self._start_h2()
            return
        options = [("grpc.max_receive_message_length", self.config.max_message_bytes),
                   ("grpc.max_send_message_length", MAX_SEND_BYTES),
                   ("grpc.so_reuseport", 0)]
        auth = self.auth = self._auth()
        server = grpc.aio.server(options=options, interceptors=[auth] if auth else [])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            SERVICE, self._handlers()),))
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        address = f"{host}:{self.config.port}"
        tls = self.guard.config.tls if self.guard is not None else None
        credentials = None if tls is None else grpc_server_credentials(
            tls.cert, tls.key, tls.ca, tls.client_auth)
        port = self._listen(server, address, credentials)
        if not port and self.config.port_fallback and self.config.port:
            log.warning("Liftbridge gRPC port %s is taken; listening on a free port instead "
                        "(pass --port to require one)", address)
            port = self._listen(server, f"{host}:0", credentials)
        if not port:
            raise OSError(f"cannot listen for Liftbridge gRPC clients on {address}: the address "
                          f"is in use or not available (use --port for another port)")
        await server.start()
        self._server = server
        self.port = self.service.port = port
        log.info("Liftbridge gRPC API listening on %s:%d%s", self.config.host, port,
                 " (TLS)" if credentials is not None else "")

    async def _start_h2(self) -> None:
        """The same handlers on riverlog's own HTTP/2 transport (server/grpc_h2_server.py)."""
        from .grpc_h2_server import GrpcH2Server
        handlers = self._handlers()
        authenticate = None
        auth = self.auth = self._auth()
        if auth is not None:
            handlers = {name: auth.wrap(name, h) for name, h in handlers.items()}
            authenticate = auth.user
        tls = self.guard.config.tls if self.guard is not None else None
        context = None if tls is None else server_context(tls.cert, tls.key, tls.ca,
                                                          tls.client_auth)
        server = GrpcH2Server({f"/{SERVICE}/{name}": h for name, h in handlers.items()},
                              self.config.host, self.config.port, context,
                              self.config.max_message_bytes, authenticate,
                              self.config.handshake_timeout_ms / 1000)
        address = f"{self.config.host}:{self.config.port}"
        try:
            port = await server.start()
        except OSError as exc:
            if not (self.config.port_fallback and self.config.port):
                raise OSError(f"cannot listen for Liftbridge gRPC clients on {address}: {exc} "
                              f"(use --port for another port)") from None
            log.warning("Liftbridge gRPC port %s is taken; listening on a free port instead "
                        "(pass --port to require one)", address)
            server.port = 0
            port = await server.start()
        self._server = server
        self.port = self.service.port = port
        log.info("Liftbridge gRPC API (h2 transport) listening on %s:%d%s", self.config.host,
                 port, " (TLS)" if context is not None else "")

    def end_calls_of(self, users: set[str]) -> None:
        """End the streaming calls (Subscribe, PublishAsync) of ``users``, deleted at
        runtime, with UNAUTHENTICATED (GrpcAuth.end_calls_of; without checks in front, no
        call has a user)."""
        if self.auth is not None and self.auth.end_calls_of(users):
            log.info("ended the gRPC streaming calls of deleted user(s) %s", sorted(users))

    def _auth(self) -> GrpcAuth | None:
        """The checks in front of the handlers: when the door requires credentials, or
        listens beyond loopback (remote clients must log in); None: every client is on
        loopback and needs none."""
        guard = self.guard
        if guard is None or not (guard.require_auth
                                 or not listens_on_loopback(self.config.host)):
            return None
        return GrpcAuth(guard, lambda: self.service.broker.streams.values(),
                        lambda: self.service.groups)

    @staticmethod
    def _listen(server, address: str, credentials) -> int:
        """The port bound (0: could not), with TLS when ``credentials`` are given."""
        try:
            if credentials is not None:
                return server.add_secure_port(address, credentials)
            return server.add_insecure_port(address)
        except RuntimeError as exc:
            log.debug("listening on %s: %s", address, exc)
            return 0

    async def stop(self, grace: float = 2.0) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    def _handlers(self) -> dict:
        unary = grpc.unary_unary_rpc_method_handler
        handlers: dict[str, object] = {}
        for name in ("CreateStream", "DeleteStream", "PauseStream", "SetStreamReadonly",
                     "FetchMetadata", "FetchPartitionMetadata", "Publish", "PublishToSubject",
                     "SetCursor", "FetchCursor", "JoinConsumerGroup", "LeaveConsumerGroup",
                     "FetchConsumerGroupAssignments", "ReportConsumerGroupCoordinator"):
            handlers[name] = unary(self.calls.unary(self._guard(getattr(self, name))),
                                   response_serializer=_serialize)
        service = self.service
        # async generator functions (not lambdas): grpc.aio must see one
        handlers["Subscribe"] = grpc.unary_stream_rpc_method_handler(
            self.calls.streaming(functools.partial(subscribe, service)))
        handlers["PublishAsync"] = grpc.stream_stream_rpc_method_handler(
            self.calls.streaming(functools.partial(publish_async, service)))
        return handlers

    @staticmethod
    def _guard(method: Callable):
        async def handler(raw: bytes, context):
            try:
                return await method(raw, context)
            except LiftbridgeError as exc:
                await context.abort(getattr(grpc.StatusCode, exc.code, grpc.StatusCode.UNKNOWN),
                                    exc.message)
            except GroupError as exc:
                code = (grpc.StatusCode.NOT_FOUND if exc.kind == "not_found"
                        else grpc.StatusCode.FAILED_PRECONDITION)
                await context.abort(code, str(exc))
            except NotCursorLeaderError as exc:  # Liftbridge's cursors.go
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            except CursorLimitError as exc:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            except CursorsDisabledError as exc:
                await context.abort(grpc.StatusCode.INTERNAL, str(exc))
            except LogClosedError as exc:
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"not available: {exc}")
            except ClusterUnavailableError as exc:  # Liftbridge's answer without a Raft leader
                await context.abort(grpc.StatusCode.INTERNAL, f"no known metadata leader ({exc})")
        handler.__name__ = method.__name__
        return handler

    # -- streams ------------------------------------------------------------------------
    async def CreateStream(self, raw: bytes, context) -> pb.CreateStreamResponse:
        req = await _parse(pb.CreateStreamRequest, raw, context)
        partitions = req.partitions or 1
        if partitions < 0:
            raise LiftbridgeError("INVALID_ARGUMENT", f"Invalid partitions {req.partitions}")
        if partitions > MAX_PARTITIONS:  # one request must not make 2**31 folders
            raise LiftbridgeError("INVALID_ARGUMENT", f"Invalid partitions {req.partitions}: "
                                                      f"at most {MAX_PARTITIONS} per stream")
        rf = req.replicationFactor or 1
        placement = self.service.broker.placement
        size = len(placement.servers()) if placement.clustered else 1
        if rf == -1 and not placement.clustered:
            rf = 1
        if rf <= 0 and rf != -1:
            raise LiftbridgeError("INVALID_ARGUMENT", f"Invalid replicationFactor {rf}")
        if rf > size and placement.forming():  # riverlog's: try again, not a bad request
            raise LiftbridgeError("UNAVAILABLE", f"the cluster is forming ({size} servers so "
                                  f"far): replicationFactor {rf} cannot be placed yet; try again")
        if rf > size:  # Liftbridge's metadata.go
            raise LiftbridgeError("INVALID_ARGUMENT",
                                  f"Invalid replicationFactor {rf}, cluster size {size}")
        if req.HasField("minIsr") and req.minIsr.value > (size if rf == -1 else rf):
            raise LiftbridgeError("INVALID_ARGUMENT", f"Invalid minIsr {req.minIsr.value}, "
                                                      f"replicationFactor {rf}")
        if req.HasField("encryption") and req.encryption.value:
            raise LiftbridgeError("FAILED_PRECONDITION",
                                  "Failed on preconditions for stream's encryption handler: "
                                  "riverlog does not encrypt streams at rest")
        defaults = self.config

        def opt(name: str):
            return _nullable(getattr(req, name)) if req.HasField(name) else None

        occ = opt("optimisticConcurrencyControl")
        auto_pause = opt("autoPauseTime")
        auto_subs = opt("autoPauseDisableIfSubscribers")
        config = StreamConfig(
            subject=req.subject, group=req.group or None, partitions=partitions,
            retention_max_bytes=opt("retentionMaxBytes"),
            retention_max_messages=opt("retentionMaxMessages"),
            retention_max_age_ms=opt("retentionMaxAge"),
            cleaner_interval_ms=opt("cleanerInterval"),
            segment_max_bytes=opt("segmentMaxBytes"),
            segment_max_age_ms=opt("segmentMaxAge"),
            compact=opt("compactEnabled"),
            compact_max_goroutines=opt("compactMaxGoroutines"),
            min_isr=opt("minIsr"), replication_factor=rf,
            optimistic_concurrency=defaults.concurrency_control if occ is None else occ,
            auto_pause_time_ms=defaults.auto_pause_time_ms if auto_pause is None else auto_pause,
            auto_pause_disable_if_subscribers=(defaults.auto_pause_disable_if_subscribers
                                               if auto_subs is None else auto_subs),
            owner=CALLER.get())
        await self.service.create_stream(req.name, req.subject, config)
        if self.service.bridge is not None:
            await self.service.bridge.sync()
        return pb.CreateStreamResponse()

    async def DeleteStream(self, raw: bytes, context) -> pb.DeleteStreamResponse:
        req = await _parse(pb.DeleteStreamRequest, raw, context)
        await self.service.delete_stream(req.name)
        if self.service.bridge is not None:
            await self.service.bridge.sync()
        return pb.DeleteStreamResponse()

    async def PauseStream(self, raw: bytes, context) -> pb.PauseStreamResponse:
        req = await _parse(pb.PauseStreamRequest, raw, context)
        await self.service.pause(req.name, list(req.partitions), req.resumeAll)
        if self.service.bridge is not None:
            await self.service.bridge.sync()
        return pb.PauseStreamResponse()

    async def SetStreamReadonly(self, raw: bytes, context) -> pb.SetStreamReadonlyResponse:
        req = await _parse(pb.SetStreamReadonlyRequest, raw, context)
        await self.service.set_readonly(req.name, list(req.partitions), req.readonly)
        return pb.SetStreamReadonlyResponse()

    # -- metadata -----------------------------------------------------------------------
    async def FetchMetadata(self, raw: bytes, context) -> pb.FetchMetadataResponse:
        check_names(raw)
        req = await _parse(pb.FetchMetadataRequest, raw, context)
        return await fetch_metadata(self.service, req)

    async def FetchPartitionMetadata(self, raw: bytes, context):
        req = await _parse(pb.FetchPartitionMetadataRequest, raw, context)
        partition = self.service.partition(req.stream, req.partition)
        if partition is None:
            raise LiftbridgeError("NOT_FOUND", "partition not found")
        if not self.service.broker.placement.leads(req.stream, req.partition):
            raise LiftbridgeError("FAILED_PRECONDITION",
                                  "The request should be sent to partition leader")
        return pb.FetchPartitionMetadataResponse(
            metadata=partition_metadata(self.service, req.stream, partition))

    # -- publishing ---------------------------------------------------------------------
    async def Publish(self, raw: bytes, context) -> pb.PublishResponse:
        req = await _parse(pb.PublishRequest, raw, context)
        service = self.service
        bridge = service.bridge
        subject = elsewhere = service.led_elsewhere(req.stream, req.partition)
        try:
            if elsewhere is None:
                stream, partition = service.check_publish(req.stream, req.partition,
                                                          req.ackPolicy)
                subject = partition_subject(stream.config.subject or "", partition.index)
            else:
                service.refuse_read_only(req.stream, req.partition)
        except LiftbridgeError as exc:
            await context.abort(_PUBLISH_STATUS.get(exc.code, grpc.StatusCode.UNKNOWN),
                                exc.message)
        nats_ack = None
        if bridge is not None and req.ackInbox:
            error = bridge.ack_inbox_error(req.ackInbox)
            if error is not None:
                raise error
            nats_ack = bridge.send_ack
        resuming = service.resume_for_publish(req.stream, req.partition)
        if resuming is not None:  # Liftbridge's resumeStream, before the publish
            await resuming
        if elsewhere is not None:
            # Liftbridge publishes every gRPC Publish to the partition's NATS subject, where
            # its leader takes it (api.go publish): riverlog does so for another leader's
            ack = await self._through_nats(subject, pb.Message(
                key=req.key, value=req.value, stream=req.stream, subject=subject,
                headers=dict(req.headers), ackInbox=req.ackInbox,
                correlationId=req.correlationId, ackPolicy=req.ackPolicy,
                offset=req.expectedOffset), context)
            if ack is None:
                return pb.PublishResponse()
            return await self._acked(ack, context)
        size = nats_size(req, subject)
        if size > service.config.replication_max_bytes:
            size = exact_nats_size(req, subject)
        timeout = context.time_remaining()
        expected = None if req.expectedOffset == -1 else req.expectedOffset
        if timeout is None or req.ackPolicy == NONE:
            service.ingest(stream, partition, value=req.value, key=req.key or None,
                           headers=req.headers, msg_subject=subject, reply="",
                           ack_inbox=req.ackInbox, correlation_id=req.correlationId,
                           ack_policy=req.ackPolicy, expected_offset=expected, size=size,
                           deliver=nats_ack, door=GRPC)
            return pb.PublishResponse()
        inbox = req.ackInbox or f"{service.namespace}.ack.{new_id()}"
        future = asyncio.get_running_loop().create_future()

        def deliver(ack: pb.Ack) -> None:
            if nats_ack is not None:
                nats_ack(ack)
            if not future.done():
                future.set_result(ack)

        def fail(exc: BaseException) -> None:
            if not future.done():
                future.set_exception(exc)

        service.ingest(stream, partition, value=req.value, key=req.key or None,
                       headers=req.headers, msg_subject=subject, reply="", ack_inbox=inbox,
                       correlation_id=req.correlationId, ack_policy=req.ackPolicy,
                       expected_offset=expected, size=size, deliver=deliver, fail=fail,
                       door=GRPC)
        try:
            ack = await asyncio.wait_for(future, max(timeout, 0.001))
        except asyncio.TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "timed out waiting for the ack")
        except Exception as exc:
            await context.abort(grpc.StatusCode.INTERNAL, f"publish failed: {exc}")
        return await self._acked(ack, context)

    @staticmethod
    async def _acked(ack: pb.Ack, context) -> pb.PublishResponse:
        """Publish's answer to ``ack``: the ack, or its error as Liftbridge's status."""
        problem = ack_error_to_async(ack.ackError)
        if problem is not None:
            await context.abort(_PUBLISH_STATUS.get(problem[0], grpc.StatusCode.UNKNOWN),
                                problem[1])
        return pb.PublishResponse(ack=ack)

    async def PublishToSubject(self, raw: bytes, context) -> pb.PublishToSubjectResponse:
        req = await _parse(pb.PublishToSubjectRequest, raw, context)
        bridge = self.service.bridge
        if bridge is None:
            raise LiftbridgeError("UNAVAILABLE", "NATS is not configured on this server")
        if not req.subject:
            raise LiftbridgeError("INVALID_ARGUMENT", "No subject provided")
        problem = subject_problem(req.subject)
        if problem is not None:
            raise LiftbridgeError("INVALID_ARGUMENT", f"the subject {problem}")
        if req.ackInbox:
            error = bridge.ack_inbox_error(req.ackInbox)
            if error is not None:
                raise error
        try:  # Liftbridge's Publish precondition; its own PublishToSubject times out here
            for stream, index in partitions_on_subject(self.service.broker.streams.values(),
                                                       req.subject):
                self.service.refuse_read_only(stream.name, index)
        except LiftbridgeError as exc:
            await context.abort(_PUBLISH_STATUS[exc.code], exc.message)
        ack = await self._through_nats(req.subject, pb.Message(
            key=req.key, value=req.value, subject=req.subject, headers=dict(req.headers),
            ackInbox=req.ackInbox, correlationId=req.correlationId, ackPolicy=req.ackPolicy),
            context)
        return pb.PublishToSubjectResponse(ack=ack) if ack is not None else \
            pb.PublishToSubjectResponse()

    async def _through_nats(self, subject: str, message: pb.Message, context) -> pb.Ack | None:
        """Publish ``message`` enveloped on NATS ``subject`` (with an ack inbox of riverlog's
        own when it names none) and, when the call has a deadline and the policy is not
        NONE, return the first Ack; None otherwise. Aborts UNAVAILABLE without NATS,
        DEADLINE_EXCEEDED when no ack comes in time."""
        bridge = self.service.bridge
        if bridge is None:
            raise LiftbridgeError("UNAVAILABLE", "NATS is not configured on this server")
        if not message.ackInbox:
            message.ackInbox = f"{self.service.namespace}.ack.{new_id()}"
        timeout = context.time_remaining()
        if message.ackPolicy == NONE:
            timeout = None
        try:
            return await publish_wait_ack(bridge.nc, subject, encode_publish(message),
                                          message.ackInbox, timeout)
        except asyncio.TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "timed out waiting for the ack")
        except OSError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    # -- cursors ------------------------------------------------------------------------
    @staticmethod
    def _cursor_ids(req) -> None:
        """Liftbridge's checks of a cursor request, and riverlog's bound on the cursor id
        (as on a stream name: every cursor is kept, and read back at every start). Raises
        LiftbridgeError INVALID_ARGUMENT."""
        if not req.stream:
            raise LiftbridgeError("INVALID_ARGUMENT", "No stream provided")
        if not req.cursorId:
            raise LiftbridgeError("INVALID_ARGUMENT", "No cursorId provided")
        if len(req.cursorId.encode()) > MAX_NAME_BYTES:
            raise LiftbridgeError("INVALID_ARGUMENT",
                                  f"cursorId longer than {MAX_NAME_BYTES} bytes")

    async def SetCursor(self, raw: bytes, context) -> pb.SetCursorResponse:
        req = await _parse(pb.SetCursorRequest, raw, context)
        self._cursor_ids(req)
        try:
            await self.service.cursors.set(req.cursorId, req.stream, req.partition, req.offset)
        except (OSError, LogClosedError) as exc:
            raise LiftbridgeError("INTERNAL", f"cannot store the cursor: {exc}") from None
        return pb.SetCursorResponse()

    async def FetchCursor(self, raw: bytes, context) -> pb.FetchCursorResponse:
        req = await _parse(pb.FetchCursorRequest, raw, context)
        self._cursor_ids(req)
        return pb.FetchCursorResponse(
            offset=self.service.cursors.get(req.cursorId, req.stream, req.partition))

    # -- consumer groups ----------------------------------------------------------------
    @staticmethod
    def _ids(req) -> None:
        """Liftbridge's checks of a consumer group request's ids, and riverlog's bound on
        them (as on a stream name: they are kept, in a cluster in the Raft metadata every
        server holds). Raises LiftbridgeError INVALID_ARGUMENT."""
        if not req.groupId:
            raise LiftbridgeError("INVALID_ARGUMENT", "No groupId provided")
        if not req.consumerId:
            raise LiftbridgeError("INVALID_ARGUMENT", "No consumerId provided")
        for what, value in (("groupId", req.groupId), ("consumerId", req.consumerId)):
            if len(value.encode()) > MAX_NAME_BYTES:
                raise LiftbridgeError("INVALID_ARGUMENT",
                                      f"{what} longer than {MAX_NAME_BYTES} bytes")

    async def JoinConsumerGroup(self, raw: bytes, context) -> pb.JoinConsumerGroupResponse:
        req = await _parse(pb.JoinConsumerGroupRequest, raw, context)
        self._ids(req)
        if not req.streams:
            raise LiftbridgeError("INVALID_ARGUMENT", "No streams provided")
        counted = self.group_quota.check(CALLER.get(), req.groupId)
        try:
            coordinator, epoch = await self.service.join_group(req.groupId, req.consumerId,
                                                               list(req.streams))
        finally:
            if counted:
                self.group_quota.settled(req.groupId)
        # Liftbridge sends Go time.Duration values here: nanoseconds.
        return pb.JoinConsumerGroupResponse(
            coordinator=coordinator, epoch=epoch,
            consumerTimeout=self.config.consumer_timeout_ms * 1_000_000,
            coordinatorTimeout=self.config.coordinator_timeout_ms * 1_000_000)

    async def LeaveConsumerGroup(self, raw: bytes, context) -> pb.LeaveConsumerGroupResponse:
        req = await _parse(pb.LeaveConsumerGroupRequest, raw, context)
        self._ids(req)
        await self.service.groups.leave(req.groupId, req.consumerId)
        return pb.LeaveConsumerGroupResponse()

    async def FetchConsumerGroupAssignments(self, raw: bytes, context):
        req = await _parse(pb.FetchConsumerGroupAssignmentsRequest, raw, context)
        self._ids(req)
        assignments, epoch = self.service.groups.assignments(req.groupId, req.consumerId,
                                                             req.epoch)
        resp = pb.FetchConsumerGroupAssignmentsResponse(epoch=epoch)
        for stream in sorted(assignments):
            resp.assignments.add(stream=stream, partitions=assignments[stream])
        return resp

    async def ReportConsumerGroupCoordinator(self, raw: bytes, context):
        req = await _parse(pb.ReportConsumerGroupCoordinatorRequest, raw, context)
        self._ids(req)
        if not req.coordinator:
            raise LiftbridgeError("INVALID_ARGUMENT", "No coordinator provided")
        await self.service.groups.report_coordinator(req.groupId, req.consumerId,
                                                     req.coordinator, req.epoch)
        return pb.ReportConsumerGroupCoordinatorResponse()
