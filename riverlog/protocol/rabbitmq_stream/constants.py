# Numbers of the current RabbitMQ Stream protocol: command keys, response codes, offset types,
# sub-batch codecs and frame-size defaults. Values only, no behaviour; names are the protocol's
# own (PROTOCOL.adoc command names, rabbit_stream.hrl response codes). Draft-dialect keys do not
# belong here: they go with the draft dialect's own table.
# Wire facts: reference/rabbitmq-stream-protocol.md "Commands", "Response codes", "Framing and
# types"; codes 0x14/0x15 and key 0x1f from rabbit_stream.hrl (rabbitmq-server 5b09e556).
from __future__ import annotations

from enum import IntEnum

RESPONSE_FLAG = 0x8000
"""Bit set in the key of every response frame: response key = ``RESPONSE_FLAG | command key``."""

DEFAULT_FRAME_MAX = 1_048_576
"""Default negotiated frame_max in bytes (1 MiB); 0 on the wire means no limit."""

INITIAL_FRAME_MAX = 8192
"""Largest frame RabbitMQ accepts before Open succeeds (bytes, the size field's value)."""

DEFAULT_HEARTBEAT = 60
"""Default heartbeat interval in seconds; 0 on the wire disables heartbeats."""


class Command(IntEnum):
    """Command keys (request direction; a response adds ``RESPONSE_FLAG``)."""

    DeclarePublisher = 0x01
    Publish = 0x02
    PublishConfirm = 0x03
    PublishError = 0x04
    QueryPublisherSequence = 0x05
    DeletePublisher = 0x06
    Subscribe = 0x07
    Deliver = 0x08
    Credit = 0x09
    StoreOffset = 0x0A
    QueryOffset = 0x0B
    Unsubscribe = 0x0C
    Create = 0x0D
    Delete = 0x0E
    Metadata = 0x0F
    MetadataUpdate = 0x10
    PeerProperties = 0x11
    SaslHandshake = 0x12
    SaslAuthenticate = 0x13
    Tune = 0x14
    Open = 0x15
    Close = 0x16
    Heartbeat = 0x17
    Route = 0x18
    Partitions = 0x19
    ConsumerUpdate = 0x1A
    ExchangeCommandVersions = 0x1B
    StreamStats = 0x1C
    CreateSuperStream = 0x1D
    DeleteSuperStream = 0x1E
    ResolveOffsetSpec = 0x1F


MAX_METADATA_NAMES = 1000
"""Stream names one Metadata frame may carry (more: the connection is closed with 0x0e frame
too large). riverlog's bound; RabbitMQ's is frame_max alone (~350,000 short names in 1 MiB),
but its reader parses and answers a frame in the connection's own Erlang process, where
riverlog's door answers on the one event loop every connection shares (10,000 names held it
for ~0.2 s on a loaded machine). Clients name the streams they use, or a super stream's
partitions."""


class ResponseCode(IntEnum):
    """Response codes (u16) carried by responses, Close, MetadataUpdate and PublishError."""

    OK = 0x01
    STREAM_DOES_NOT_EXIST = 0x02
    SUBSCRIPTION_ID_ALREADY_EXISTS = 0x03
    SUBSCRIPTION_ID_DOES_NOT_EXIST = 0x04
    STREAM_ALREADY_EXISTS = 0x05
    STREAM_NOT_AVAILABLE = 0x06
    SASL_MECHANISM_NOT_SUPPORTED = 0x07
    AUTHENTICATION_FAILURE = 0x08
    SASL_ERROR = 0x09
    SASL_CHALLENGE = 0x0A
    SASL_AUTHENTICATION_FAILURE_LOOPBACK = 0x0B
    VIRTUAL_HOST_ACCESS_FAILURE = 0x0C
    UNKNOWN_FRAME = 0x0D
    FRAME_TOO_LARGE = 0x0E
    INTERNAL_ERROR = 0x0F
    ACCESS_REFUSED = 0x10
    PRECONDITION_FAILED = 0x11
    PUBLISHER_DOES_NOT_EXIST = 0x12
    NO_OFFSET = 0x13
    SASL_CANNOT_CHANGE_MECHANISM = 0x14
    SASL_CANNOT_CHANGE_USERNAME = 0x15


class OffsetType(IntEnum):
    """Offset specification types (u16). ``NONE`` appears only in ConsumerUpdateResponse."""

    NONE = 0
    FIRST = 1
    LAST = 2  # start of the last chunk
    NEXT = 3
    OFFSET = 4  # followed by an offset u64
    TIMESTAMP = 5  # followed by milliseconds since the epoch, i64


class Compression(IntEnum):
    """Sub-batch codec, bits 6..4 of a sub-batch entry's first byte."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4
