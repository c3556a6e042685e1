# riverlog's api.proto against the wire facts: field by field against gufo-liftbridge's
# generated descriptors (a real Liftbridge client, generated from Liftbridge's own api.proto),
# the internal envelope messages against reference/liftbridge.md, the gRPC method paths, and
# the build step's promises (private descriptor pool, generated code not stale in a checkout).
from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

import gufo.liftbridge.api_pb2 as gufo_pb2
from riverlog.protocol.liftbridge import api_pb2, api_pb2_grpc

FDP = descriptor_pb2.FieldDescriptorProto
REPO = Path(__file__).resolve().parents[2]

# What riverlog's api.proto has beyond gufo-liftbridge's (Liftbridge api.proto v1.9.0):
# the internal envelope messages (top level, with everything nested in them) and the
# best-effort `reverse` subscribe flag.
INTERNAL = {
    "proto.ReplicationRequest",
    "proto.RaftJoinRequest",
    "proto.RaftJoinResponse",
    "proto.LeaderEpochOffsetRequest",
    "proto.LeaderEpochOffsetResponse",
    "proto.PropagatedRequest",
    "proto.PropagatedResponse",
    "proto.ServerInfoRequest",
    "proto.ServerInfoResponse",
    "proto.PartitionStatusRequest",
    "proto.PartitionStatusResponse",
    "proto.PartitionNotification",
}
EXTRA_FIELDS = {"proto.SubscribeRequest": {"reverse"}}


def file_proto(module) -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(fdp)
    return fdp


def messages(fdp):
    """Full name -> DescriptorProto for every message, nested ones (map entries too) included."""
    out = {}

    def walk(prefix, descs):
        for d in descs:
            name = f"{prefix}.{d.name}"
            out[name] = d
            walk(name, d.nested_type)

    walk(fdp.package, fdp.message_type)
    return out


def enums(fdp):
    out = {f"{fdp.package}.{e.name}": e for e in fdp.enum_type}
    for name, msg in messages(fdp).items():
        out.update({f"{name}.{e.name}": e for e in msg.enum_type})
    return out


def field_key(f):
    return (f.name, f.number, FDP.Label.Name(f.label), FDP.Type.Name(f.type), f.type_name, f.proto3_optional)


OURS, THEIRS = file_proto(api_pb2), file_proto(gufo_pb2)


def test_same_package_and_both_parse_the_same_wire():
    assert OURS.package == THEIRS.package == "proto"
    assert OURS.syntax == THEIRS.syntax == "proto3"


@pytest.mark.parametrize("name", sorted(messages(THEIRS)))
def test_message_matches_gufo_field_by_field(name):
    ours = messages(OURS).get(name)
    assert ours is not None, f"{name} is missing from riverlog's api.proto"
    theirs = messages(THEIRS)[name]
    assert ours.options.map_entry == theirs.options.map_entry
    our_fields = {f.number: field_key(f) for f in ours.field}
    their_fields = {f.number: field_key(f) for f in theirs.field}
    for number, key in their_fields.items():
        assert our_fields.get(number) == key, f"{name} field {number}"
    extra = {our_fields[n][0] for n in our_fields.keys() - their_fields.keys()}
    assert extra == EXTRA_FIELDS.get(name, set())
    assert [o.name for o in ours.oneof_decl] == [o.name for o in theirs.oneof_decl]


@pytest.mark.parametrize("name", sorted(enums(THEIRS)))
def test_enum_matches_gufo(name):
    ours = enums(OURS).get(name)
    assert ours is not None, f"{name} is missing from riverlog's api.proto"
    assert [(v.name, v.number) for v in ours.value] == [(v.name, v.number) for v in enums(THEIRS)[name].value]


def test_nothing_else_beyond_gufo_but_the_internal_messages():
    ours, theirs = messages(OURS), messages(THEIRS)
    extra_top = {n for n in ours.keys() - theirs.keys() if n.count(".") == 1}
    assert extra_top == INTERNAL
    nested_extra = {n for n in ours.keys() - theirs.keys() if n.count(".") > 1}
    assert all(n.rsplit(".", 1)[0] in ours.keys() - theirs.keys() for n in nested_extra)
    top_enums_extra = {n for n in enums(OURS).keys() - enums(THEIRS).keys()}
    assert top_enums_extra == {"proto.PropagatedRequest.Op"}


def test_service_matches_gufo():
    (ours,), (theirs,) = OURS.service, THEIRS.service
    assert ours.name == theirs.name == "API"

    def methods(svc):
        return {m.name: (m.input_type, m.output_type, m.client_streaming, m.server_streaming) for m in svc.method}

    assert methods(ours) == methods(theirs)


# reference/liftbridge.md "gRPC service": method -> (request, response, client streams, server streams)
REFERENCE_RPCS = {
    "CreateStream": ("CreateStreamRequest", "CreateStreamResponse", False, False),
    "DeleteStream": ("DeleteStreamRequest", "DeleteStreamResponse", False, False),
    "PauseStream": ("PauseStreamRequest", "PauseStreamResponse", False, False),
    "SetStreamReadonly": ("SetStreamReadonlyRequest", "SetStreamReadonlyResponse", False, False),
    "Subscribe": ("SubscribeRequest", "Message", False, True),
    "FetchMetadata": ("FetchMetadataRequest", "FetchMetadataResponse", False, False),
    "FetchPartitionMetadata": ("FetchPartitionMetadataRequest", "FetchPartitionMetadataResponse", False, False),
    "Publish": ("PublishRequest", "PublishResponse", False, False),
    "PublishAsync": ("PublishRequest", "PublishResponse", True, True),
    "PublishToSubject": ("PublishToSubjectRequest", "PublishToSubjectResponse", False, False),
    "SetCursor": ("SetCursorRequest", "SetCursorResponse", False, False),
    "FetchCursor": ("FetchCursorRequest", "FetchCursorResponse", False, False),
    "JoinConsumerGroup": ("JoinConsumerGroupRequest", "JoinConsumerGroupResponse", False, False),
    "LeaveConsumerGroup": ("LeaveConsumerGroupRequest", "LeaveConsumerGroupResponse", False, False),
    "FetchConsumerGroupAssignments": (
        "FetchConsumerGroupAssignmentsRequest",
        "FetchConsumerGroupAssignmentsResponse",
        False,
        False,
    ),
    "ReportConsumerGroupCoordinator": (
        "ReportConsumerGroupCoordinatorRequest",
        "ReportConsumerGroupCoordinatorResponse",
        False,
        False,
    ),
}


def test_service_matches_reference():
    svc = api_pb2.DESCRIPTOR.services_by_name["API"]
    assert svc.full_name == "proto.API"
    got = {
        m.name: (m.input_type.name, m.output_type.name, m.client_streaming, m.server_streaming)
        for m in svc.methods
    }
    assert got == REFERENCE_RPCS


def _record(kind):
    def method(self, path, *args, **kwargs):
        self.paths[path] = kind
        return object()

    return method


class _RecordingChannel:
    """Stands in for a grpc.Channel: records the method paths the generated stub asks for."""

    def __init__(self):
        self.paths = {}

    unary_unary = _record("unary_unary")
    unary_stream = _record("unary_stream")
    stream_unary = _record("stream_unary")
    stream_stream = _record("stream_stream")


def test_generated_stub_uses_proto_api_method_paths():
    channel = _RecordingChannel()
    api_pb2_grpc.APIStub(channel)
    kinds = {(False, False): "unary_unary", (False, True): "unary_stream", (True, True): "stream_stream"}
    assert channel.paths == {f"/proto.API/{name}": kinds[spec[2], spec[3]] for name, spec in REFERENCE_RPCS.items()}


def test_create_stream_request_has_all_18_fields():
    fields = api_pb2.CreateStreamRequest.DESCRIPTOR.fields_by_number
    assert sorted(fields) == list(range(1, 19))
    wrappers = {n: fields[n].message_type.name for n in range(6, 19)}
    assert wrappers == {
        6: "NullableInt64", 7: "NullableInt64", 8: "NullableInt64", 9: "NullableInt64",
        10: "NullableInt64", 11: "NullableInt64", 12: "NullableInt32", 13: "NullableBool",
        14: "NullableInt64", 15: "NullableBool", 16: "NullableInt32", 17: "NullableBool",
        18: "NullableBool",
    }  # fmt: skip


# reference/liftbridge.md "Internal messages" (numbers and names); types from liftbridge's
# server/protocol/internal.proto. message -> {number: (name, type)}
REFERENCE_INTERNAL = {
    "ReplicationRequest": {1: ("replicaID", "TYPE_STRING"), 2: ("offset", "TYPE_INT64"), 3: ("leaderEpoch", "TYPE_UINT64")},
    "LeaderEpochOffsetRequest": {1: ("leaderEpoch", "TYPE_UINT64")},
    "LeaderEpochOffsetResponse": {1: ("endOffset", "TYPE_INT64")},
    "ServerInfoResponse": {1: ("id", "TYPE_STRING"), 2: ("host", "TYPE_STRING"), 3: ("port", "TYPE_INT32")},
    "PartitionStatusResponse": {1: ("exists", "TYPE_BOOL"), 2: ("isLeader", "TYPE_BOOL")},
    "PartitionNotification": {1: ("stream", "TYPE_STRING"), 2: ("partition", "TYPE_INT32")},
}


# riverlog's own additions, which a Liftbridge peer skips as unknown fields: the epoch a
# LeaderEpochOffsetResponse answers for (Kafka's KIP-279; riverlog/cluster/replication_leader.py)
RIVERLOG_INTERNAL = {"LeaderEpochOffsetResponse": {2: ("leaderEpoch", "TYPE_UINT64")}}


@pytest.mark.parametrize("name", sorted(REFERENCE_INTERNAL))
def test_internal_message_matches_reference(name):
    desc = messages(OURS)[f"proto.{name}"]
    got = {f.number: (f.name, FDP.Type.Name(f.type)) for f in desc.field}
    assert got == {**REFERENCE_INTERNAL[name], **RIVERLOG_INTERNAL.get(name, {})}


def test_propagated_request_reuses_activity_ops_of_the_same_layout():
    fields = api_pb2.PropagatedRequest.DESCRIPTOR.fields_by_number
    assert fields[2].message_type.full_name == "proto.PropagatedRequest.CreateStreamOp"
    assert [fields[n].message_type.full_name for n in range(6, 12)] == [
        "proto.DeleteStreamOp",
        "proto.PauseStreamOp",
        "proto.ResumeStreamOp",
        "proto.SetStreamReadonlyOp",
        "proto.JoinConsumerGroupOp",
        "proto.LeaveConsumerGroupOp",
    ]
    assert api_pb2.PropagatedResponse.DESCRIPTOR.fields_by_name["op"].enum_type.full_name == "proto.PropagatedRequest.Op"


def test_generated_module_uses_a_private_descriptor_pool():
    # Both copies of the schema are imported in this process (gufo's registers `proto.*` in the
    # default pool): that only works because riverlog's is elsewhere.
    assert api_pb2.DESCRIPTOR.pool is not descriptor_pool.Default()
    assert gufo_pb2.DESCRIPTOR.pool is descriptor_pool.Default()
    wire = api_pb2.Message(offset=7, key=b"k", value=b"v", headers={"a": b"b"}).SerializeToString()
    theirs = gufo_pb2.Message.FromString(wire)
    assert (theirs.offset, theirs.key, theirs.value, dict(theirs.headers)) == (7, b"k", b"v", {"a": b"b"})


def test_generated_code_is_not_older_than_the_proto():
    # Editable installs generate into the source tree; after editing api.proto rerun
    # `make install-test` (or `pip install -e .`), which regenerates.
    generated = Path(api_pb2.__file__).resolve()
    proto = REPO / "riverlog" / "protocol" / "liftbridge" / "api.proto"
    if generated.parent != proto.parent:
        pytest.skip("riverlog is installed from a wheel: its api_pb2 was generated from that wheel's proto")
    for name in ("api_pb2.py", "api_pb2_grpc.py"):
        assert (proto.parent / name).stat().st_mtime >= proto.stat().st_mtime, (
            f"{name} is older than api.proto: run `make install-test` to regenerate"
        )
