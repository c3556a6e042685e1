# The frames of the RabbitMQ Stream protocol as plain values: one frozen, slotted dataclass per
# frame, named as the protocol names the command (a response adds "Response"). Rules: data only,
# no wire knowledge (keys, versions and layouts live in codec.py's table, so the draft dialect can
# map the same frames to its own keys); field order is wire order; arrays are tuples; string maps
# are dicts in wire order; a wire null (string/bytes length -1) is None; an optional trailing
# part that is absent on the wire is None. Frames holding a dict are not hashable.
# Wire facts: reference/rabbitmq-stream-protocol.md "Frame bodies" (C = correlation id u32);
# ResolveOffsetSpec from rabbit_stream_core.erl (rabbitmq-server 5b09e556).
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

Properties = dict[str, Optional[str]]
"""A protocol map: i32 count, then (string key, string value) pairs, kept in wire order."""


class Frame:
    """Base of every frame (a marker for typing; frames carry no wire key or version)."""

    __slots__ = ()


# -- records used inside frames ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Broker:
    """MetadataResponse node: ``reference`` u16 (index used by StreamMetadata), ``host`` string,
    ``port`` u32."""

    reference: int
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class StreamMetadata:
    """MetadataResponse stream entry: ``name``, ``response_code`` u16, ``leader_reference`` u16
    (0xFFFF = no leader), ``replica_references`` tuple of u16 broker references."""

    name: str
    response_code: int
    leader_reference: int
    replica_references: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CommandVersion:
    """ExchangeCommandVersions item: command ``key`` u16 (no response bit), ``min_version`` and
    ``max_version`` u16."""

    key: int
    min_version: int
    max_version: int


# -- publishing -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeclarePublisher(Frame):
    """0x0001: ``C, PublisherId u8, Reference string, Stream string``. An empty reference means
    no deduplication."""

    correlation_id: int
    publisher_id: int
    reference: Optional[str]
    stream: str


@dataclass(frozen=True, slots=True)
class DeclarePublisherResponse(Frame):
    """0x8001: ``C, ResponseCode u16``."""

    correlation_id: int
    response_code: int


@dataclass(frozen=True, slots=True)
class Publish(Frame):
    """0x0002 version 1: ``PublisherId u8, Count u32, Count x (PublishingId u64, entry)``.

    ``entries`` is a tuple of ``(publishing_id, entry)`` where ``entry`` is the raw entry bytes
    exactly as on the wire *including* its header, so a run of entries joined together is an
    osiris chunk data section without re-encoding: a simple entry ``0|Len:31, Len bytes`` or a
    sub-batch ``1|Codec:3|0:4, Records u16, UncompressedLen u32, Len u32, Len bytes``.
    Use ``codec.simple_entry(payload)`` to build a simple entry.
    """

    publisher_id: int
    entries: tuple[tuple[int, bytes], ...]


@dataclass(frozen=True, slots=True)
class PublishV2(Frame):
    """0x0002 version 2 (filtering): ``PublisherId u8, Count u32, Count x (PublishingId u64,
    FilterValue string, 0|Len:31, Len bytes)``; no sub-batches.

    ``entries`` is a tuple of ``(publishing_id, filter_value, entry)``; ``filter_value`` is None
    for a null string; ``entry`` is the raw simple entry including its ``0|Len`` header.
    """

    publisher_id: int
    entries: tuple[tuple[int, Optional[str], bytes], ...]


@dataclass(frozen=True, slots=True)
class PublishConfirm(Frame):
    """0x0003 (server): ``PublisherId u8, [PublishingId u64]``."""

    publisher_id: int
    publishing_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PublishError(Frame):
    """0x0004 (server): ``PublisherId u8, [PublishingId u64, Code u16]``; ``errors`` holds
    ``(publishing_id, response_code)`` pairs."""

    publisher_id: int
    errors: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class QueryPublisherSequence(Frame):
    """0x0005: ``C, Reference string, Stream string``."""

    correlation_id: int
    reference: str
    stream: str


@dataclass(frozen=True, slots=True)
class QueryPublisherSequenceResponse(Frame):
    """0x8005: ``C, ResponseCode u16, Sequence u64`` (0 when unknown)."""

    correlation_id: int
    response_code: int
    sequence: int


@dataclass(frozen=True, slots=True)
class DeletePublisher(Frame):
    """0x0006: ``C, PublisherId u8``."""

    correlation_id: int
    publisher_id: int


@dataclass(frozen=True, slots=True)
class DeletePublisherResponse(Frame):
    """0x8006: ``C, ResponseCode u16``."""

    correlation_id: int
    response_code: int


# -- consuming --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subscribe(Frame):
    """0x0007: ``C, SubscriptionId u8, Stream string, OffsetType u16 [Offset u64 | Timestamp
    i64 ms], Credit u16 (chunks), [Properties map]``.

    ``offset`` is set only for OffsetType OFFSET (u64) and TIMESTAMP (i64, ms since the epoch),
    None otherwise. ``properties`` is None when the map is absent on the wire (an empty dict is
    an empty map that is present).
    """

    correlation_id: int
    subscription_id: int
    stream: str
    offset_type: int
    offset: Optional[int]
    credit: int
    properties: Optional[Properties] = None


@dataclass(frozen=True, slots=True)
class SubscribeResponse(Frame):
    """0x8007: ``C, ResponseCode u16``."""

    correlation_id: int
    response_code: int


@dataclass(frozen=True, slots=True)
class Deliver(Frame):
    """0x0008 version 1 (server): ``SubscriptionId u8, Chunk``. ``chunk`` is the osiris chunk as
    sent (48-byte header + data section), kept raw: the codec does not look inside it."""

    subscription_id: int
    chunk: bytes


@dataclass(frozen=True, slots=True)
class DeliverV2(Frame):
    """0x0008 version 2 (server): ``SubscriptionId u8, CommittedChunkId u64, Chunk``; only for a
    client that announced Deliver max version >= 2."""

    subscription_id: int
    committed_chunk_id: int
    chunk: bytes


@dataclass(frozen=True, slots=True)
class Credit(Frame):
    """0x0009: ``SubscriptionId u8, Credit u16`` (chunks). No reply unless it fails."""

    subscription_id: int
    credit: int


@dataclass(frozen=True, slots=True)
class CreditResponse(Frame):
    """0x8009 (server, on error only): ``ResponseCode u16, SubscriptionId u8``; no correlation
    id."""

    response_code: int
    subscription_id: int


@dataclass(frozen=True, slots=True)
class StoreOffset(Frame):
    """0x000a: ``Reference string, Stream string, Offset u64``; no correlation id, no reply."""

    reference: str
    stream: str
    offset: int


@dataclass(frozen=True, slots=True)
class QueryOffset(Frame):
    """0x000b: ``C, Reference string, Stream string``."""

    correlation_id: int
    reference: str
    stream: str


@dataclass(frozen=True, slots=True)
class QueryOffsetResponse(Frame):
    """0x800b: ``C, ResponseCode u16, Offset u64`` (code NO_OFFSET 0x13 when none stored)."""

    correlation_id: int
    response_code: int
    offset: int


@dataclass(frozen=True, slots=True)
class Unsubscribe(Frame):
    """0x000c: ``C, SubscriptionId u8``."""

    correlation_id: int
    subscription_id: int


@dataclass(frozen=True, slots=True)
class UnsubscribeResponse(Frame):
    """0x800c: ``C, ResponseCode u16``."""

    correlation_id: int
    response_code: int


# -- streams and topology ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Create(Frame):
    """0x000d: ``C, Stream string, Arguments map`` (max-length-bytes, max-age, ...)."""

    correlation_id: int
    stream: str
    arguments: Properties


@dataclass(frozen=True, slots=True)
class CreateResponse(Frame):
    """0x800d: ``C, ResponseCode u16``."""

    correlation_id: int
    response_code: int


@dataclass(frozen=True, slots=True)
class Delete(Frame):
    """0x000e: ``C, Stream string``."""

    correlation_id: int
    stream: str


@dataclass(frozen=True, slots=True)
class DeleteResponse(Frame):
    """0x800e: ``C, ResponseCode u16``."""

    correlation_id: int
    response_code: int


@dataclass(frozen=True, slots=True)
class Metadata(Frame):
    """0x000f: ``C, [Stream string]``."""

    correlation_id: int
    streams: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MetadataResponse(Frame):
    """0x800f: ``C, [Broker], [StreamMetadata]``; no top-level response code."""

    correlation_id: int
    brokers: tuple[Broker, ...]
    streams: tuple[StreamMetadata, ...]


@dataclass(frozen=True, slots=True)
class MetadataUpdate(Frame):
    """0x0010 (server): ``Code u16, Stream string`` (0x06 when a stream is deleted or moves)."""

    response_code: int
    stream: str


@dataclass(frozen=True, slots=True)
class StreamStats(Frame):
    """0x001c: ``C, Stream string``."""

    correlation_id: int
    stream: str


@dataclass(frozen=True, slots=True)
class StreamStatsResponse(Frame):
    """0x801c: ``C, ResponseCode u16, [Key string, Value i64]`` (first_chunk_id,
    committed_chunk_id, last_chunk_id), as a dict in wire order."""

    correlation_id: int
    response_code: int
    stats: dict[str, int]


@dataclass(frozen=True, slots=True)
class CreateSuperStream(Frame):
    """0x001d: ``C, Name string, [Partition string], [BindingKey string], Arguments map``."""

    correlation_id: int
    name: str
    partitions: tuple[str, ...]
    binding_keys: tuple[str, ...]
    arguments: Properties


@dataclass(frozen=True, slots=True)
class CreateSuperStreamResponse(Frame):
    """0x801d: ``C, ResponseCode u16``."""

    correlation_id: int
    response_code: int


@dataclass(frozen=True, slots=True)
class DeleteSuperStream(Frame):
    """0x001e: ``C, Name string``."""

    correlation_id: int
    name: str


@dataclass(frozen=True, slots=True)
class DeleteSuperStreamResponse(Frame):
    """0x801e: ``C, ResponseCode u16``."""

    correlation_id: int
    response_code: int


@dataclass(frozen=True, slots=True)
class Route(Frame):
    """0x0018: ``C, RoutingKey string, SuperStream string``."""

    correlation_id: int
    routing_key: str
    super_stream: str


@dataclass(frozen=True, slots=True)
class RouteResponse(Frame):
    """0x8018: ``C, ResponseCode u16, [Stream string]``."""

    correlation_id: int
    response_code: int
    streams: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Partitions(Frame):
    """0x0019: ``C, SuperStream string``."""

    correlation_id: int
    super_stream: str


@dataclass(frozen=True, slots=True)
class PartitionsResponse(Frame):
    """0x8019: ``C, ResponseCode u16, [Stream string]``."""

    correlation_id: int
    response_code: int
    streams: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ConsumerUpdate(Frame):
    """0x001a (server asks the client): ``C, SubscriptionId u8, Active u8 (0/1)``."""

    correlation_id: int
    subscription_id: int
    active: bool


@dataclass(frozen=True, slots=True)
class ConsumerUpdateResponse(Frame):
    """0x801a (client answers): ``C, ResponseCode u16, OffsetType u16 [value u64/i64]``.

    ``offset`` is required for OFFSET (u64) and TIMESTAMP (i64 ms); for other types it is the
    optional trailing u64 some clients append (rstream always sends one), None when absent.
    """

    correlation_id: int
    response_code: int
    offset_type: int
    offset: Optional[int] = None


@dataclass(frozen=True, slots=True)
class ResolveOffsetSpec(Frame):
    """0x001f: ``C, Stream string, OffsetType u16 [Offset u64 | Timestamp i64 ms],
    [Properties map]`` (filter.N, match-unfiltered, chunk_selector). ``offset`` and
    ``properties`` follow the same rules as in Subscribe. Source: rabbit_stream_core.erl
    ``parse_request(?COMMAND_RESOLVE_OFFSET_SPEC)`` (rabbitmq-server 5b09e556)."""

    correlation_id: int
    stream: str
    offset_type: int
    offset: Optional[int]
    properties: Optional[Properties] = None


@dataclass(frozen=True, slots=True)
class ResolveOffsetSpecResponse(Frame):
    """0x801f: ``C, ResponseCode u16, OffsetType u16, Offset u64`` (RabbitMQ always answers
    type OFFSET). Source: rabbit_stream_core.erl ``response_body(resolve_offset_spec)``."""

    correlation_id: int
    response_code: int
    offset_type: int
    offset: int


# -- connection -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerProperties(Frame):
    """0x0011: ``C, Properties map`` (product, version, platform, ...)."""

    correlation_id: int
    properties: Properties


@dataclass(frozen=True, slots=True)
class PeerPropertiesResponse(Frame):
    """0x8011: ``C, ResponseCode u16, Properties map``."""

    correlation_id: int
    response_code: int
    properties: Properties


@dataclass(frozen=True, slots=True)
class SaslHandshake(Frame):
    """0x0012: ``C``."""

    correlation_id: int


@dataclass(frozen=True, slots=True)
class SaslHandshakeResponse(Frame):
    """0x8012: ``C, ResponseCode u16, [Mechanism string]``."""

    correlation_id: int
    response_code: int
    mechanisms: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SaslAuthenticate(Frame):
    """0x0013: ``C, Mechanism string, Data bytes`` (i32 length; PLAIN data is
    ``\\0user\\0password``); ``data`` None is a null (-1) length."""

    correlation_id: int
    mechanism: str
    data: Optional[bytes]


@dataclass(frozen=True, slots=True)
class SaslAuthenticateResponse(Frame):
    """0x8013: ``C, ResponseCode u16, [Challenge]``: the challenge, i16-length encoded, is on the
    wire only when the server sends one; ``challenge`` None means absent."""

    correlation_id: int
    response_code: int
    challenge: Optional[bytes] = None


@dataclass(frozen=True, slots=True)
class Tune(Frame):
    """0x0014, both directions (server proposes, client echoes): ``FrameMax u32`` (bytes, 0 = no
    limit), ``Heartbeat u32`` (seconds, 0 = none). No correlation id."""

    frame_max: int
    heartbeat: int


@dataclass(frozen=True, slots=True)
class TuneResponse(Frame):
    """0x8014: the same body as Tune; some clients echo the server's Tune with the response
    bit set."""

    frame_max: int
    heartbeat: int


@dataclass(frozen=True, slots=True)
class Open(Frame):
    """0x0015: ``C, VirtualHost string``."""

    correlation_id: int
    virtual_host: str


@dataclass(frozen=True, slots=True)
class OpenResponse(Frame):
    """0x8015: ``C, ResponseCode u16, [Properties map]`` (advertised_host, advertised_port);
    on failure the map is left out entirely: ``properties`` None."""

    correlation_id: int
    response_code: int
    properties: Optional[Properties] = None


@dataclass(frozen=True, slots=True)
class Close(Frame):
    """0x0016, either direction: ``C, Code u16, Reason string``."""

    correlation_id: int
    code: int
    reason: Optional[str]


@dataclass(frozen=True, slots=True)
class CloseResponse(Frame):
    """0x8016: ``C, ResponseCode u16``."""

    correlation_id: int
    response_code: int


@dataclass(frozen=True, slots=True)
class Heartbeat(Frame):
    """0x0017, either direction: empty body."""


@dataclass(frozen=True, slots=True)
class ExchangeCommandVersions(Frame):
    """0x001b: ``C, [Key u16, MinVersion u16, MaxVersion u16]``."""

    correlation_id: int
    versions: tuple[CommandVersion, ...]


@dataclass(frozen=True, slots=True)
class ExchangeCommandVersionsResponse(Frame):
    """0x801b: ``C, ResponseCode u16, [Key u16, MinVersion u16, MaxVersion u16]``."""

    correlation_id: int
    response_code: int
    versions: tuple[CommandVersion, ...]
