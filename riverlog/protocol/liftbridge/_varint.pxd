# cython: language_level=3
# Protobuf base-128 varints for the compiled twins (_envelope_c, _messages_c), cimported:
# inline C, no module of its own. The Python reference is envelope.varint.
from libc.stdint cimport uint8_t, uint64_t


cdef inline Py_ssize_t varint_len(uint64_t v) noexcept:
    """The bytes of the varint of ``v`` (1..10)."""
    cdef Py_ssize_t n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline uint8_t* put_varint(uint8_t* o, uint64_t v) noexcept:
    """Write the varint of ``v`` at ``o``; the position after it."""
    while v >= 0x80:
        o[0] = <uint8_t>((v & 0x7F) | 0x80)
        v >>= 7
        o += 1
    o[0] = <uint8_t>v
    return o + 1
