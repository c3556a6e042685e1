# A hypothesis strategy for any protobuf message class of riverlog's api.proto, built from its
# descriptor: every scalar at its wire range edges, strings from a small alphabet (so names of
# streams, subjects and cursors collide with existing ones), enums including undefined numbers
# (proto3 enums are open), maps, repeated fields and nested messages to a bounded depth.
from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor as F
from hypothesis import strategies as st

NAMES = st.sampled_from(["fz", "fz.sub", "other", "", "a b", "fz.*", ">", "\u00e9\u00e9",
                         "x" * 300, "__cursors", "__activity"])
_I32 = st.one_of(st.integers(-3, 3), st.sampled_from([-(1 << 31), (1 << 31) - 1, 1000]))
_I64 = st.one_of(st.integers(-3, 3), st.sampled_from([-(1 << 63), (1 << 63) - 1, 1 << 40]))
_U32 = st.one_of(st.integers(0, 3), st.just((1 << 32) - 1))
_U64 = st.one_of(st.integers(0, 3), st.just((1 << 64) - 1))

_SCALARS = {
    F.TYPE_INT32: _I32, F.TYPE_SINT32: _I32, F.TYPE_SFIXED32: _I32,
    F.TYPE_INT64: _I64, F.TYPE_SINT64: _I64, F.TYPE_SFIXED64: _I64,
    F.TYPE_UINT32: _U32, F.TYPE_FIXED32: _U32, F.TYPE_UINT64: _U64, F.TYPE_FIXED64: _U64,
    F.TYPE_BOOL: st.booleans(),
    F.TYPE_STRING: st.one_of(NAMES, st.text(max_size=12)),
    F.TYPE_BYTES: st.binary(max_size=64),
    F.TYPE_DOUBLE: st.floats(), F.TYPE_FLOAT: st.floats(width=32),
}


def _value(field, depth: int):
    if field.type == F.TYPE_MESSAGE:
        return message_dict(field.message_type, depth - 1)
    if field.type == F.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), _I32)
    return _SCALARS[field.type]


def message_dict(descriptor, depth: int = 3):
    """Keyword arguments for ``descriptor``'s message class (nested messages as dicts)."""
    if depth <= 0:
        return st.just({})
    fields = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_f, value_f = field.message_type.fields
            fields[field.name] = st.dictionaries(_value(key_f, depth), _value(value_f, depth),
                                                 max_size=3)
        elif field.is_repeated:
            fields[field.name] = st.lists(_value(field, depth), max_size=3)
        else:
            fields[field.name] = _value(field, depth)
    return st.fixed_dictionaries({}, optional=fields)


def messages(cls, depth: int = 3):
    """Instances of the protobuf message class ``cls``."""
    return message_dict(cls.DESCRIPTOR, depth).map(lambda kw: cls(**kw))


def wire(cls, depth: int = 3):
    """Request bytes for ``cls``: a serialized instance, a truncated one, or random bytes."""
    valid = messages(cls, depth).map(lambda m: m.SerializeToString())
    return st.one_of(valid, valid, st.tuples(valid, st.integers(0, 64)).map(
        lambda t: t[0][:max(0, len(t[0]) - t[1] - 1)]), st.binary(max_size=64))
