# cython: language_level=3
# The compiled twin of chunk.py's count_entries (riverlog/_compiled.py): the walk over a chunk's
# data section that a follower runs on every chunk of every fetch answer (check_chunks ->
# counts_match), once per record, and recovery on every chunk it checks. chunk.py is the
# reference and binds this count_entries over its own when it imports.
# Rules:
# - Same results as chunk.count_entries for every input: the same (entries, records), or the
#   same ChunkFormatError with the same message. tests/log/test_compiled_chunk.py holds the
#   two to it on generated, truncated, damaged and random bytes.
# - C reads only bytes, bytearray and C-contiguous one-dimensional memoryviews of unsigned
#   bytes (format "B"): what counts_match and recovery pass. Anything else (other formats,
#   strided views, objects that are not buffers, a released memoryview) is handed to the
#   reference, which gives its result or raises its error.
# Wire facts: chunk.py (simple entry ``0|len:31`` u32 then the bytes; sub-batch
# ``1|codec:3|reserved:4`` u8, records u16, uncompressed length u32, length u32, then the body;
# all big-endian).
from cpython.buffer cimport PyBUF_FORMAT, PyBUF_ND, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t

cdef object _Error = None  # chunk.ChunkFormatError, bound by _bind
cdef object _py_count_entries = None  # chunk.count_entries (the reference), bound by _bind

cdef enum:
    SUB_BATCH_SIZE = 11  # chunk._SUB_BATCH.size: u8 u16 u32 u32


def _bind(error, count_entries):
    """Called by chunk.py: its ChunkFormatError and its count_entries (the fallback)."""
    global _Error, _py_count_entries
    _Error, _py_count_entries = error, count_entries


cdef inline Py_ssize_t _u32(const uint8_t* p) noexcept:
    return ((<Py_ssize_t>p[0] << 24) | (<Py_ssize_t>p[1] << 16) | (<Py_ssize_t>p[2] << 8)
            | <Py_ssize_t>p[3])


cdef tuple _count(const uint8_t* p, Py_ssize_t end):
    """(entries, records) of the data section ``p[0:end]``; raises ChunkFormatError as the
    reference does, with its messages."""
    cdef Py_ssize_t pos = 0, entries = 0, records = 0, count
    while pos < end:
        if end - pos < 4:
            raise _Error("truncated entry header")
        if p[pos] & 0x80 == 0:
            pos += 4 + _u32(p + pos)
            if pos > end:
                raise _Error("entry longer than the data section")
            records += 1
        else:
            if end - pos < SUB_BATCH_SIZE:
                raise _Error("truncated sub-batch header")
            count = (<Py_ssize_t>p[pos + 1] << 8) | p[pos + 2]
            pos += SUB_BATCH_SIZE + _u32(p + pos + 7)
            if pos > end or count == 0:
                raise _Error("malformed sub-batch entry")
            records += count
        entries += 1
    return entries, records


def count_entries(data):
    """chunk.count_entries, compiled: ``(entries, records)`` of an encoded data section, or
    the same ChunkFormatError."""
    cdef Py_buffer view
    if type(data) is bytes:
        return _count(<const uint8_t*>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
    if type(data) is not bytearray and type(data) is not memoryview:
        return _py_count_entries(data)
    try:
        PyObject_GetBuffer(data, &view, PyBUF_FORMAT | PyBUF_ND)
    except Exception:  # a released view, one that is not C-contiguous: the reference decides
        return _py_count_entries(data)
    try:
        # one dimension of unsigned bytes (66: "B"), as the reference indexes them
        if (view.ndim != 1 or view.itemsize != 1
                or (view.format != NULL and (view.format[0] != 66 or view.format[1] != 0))):
            return _py_count_entries(data)
        return _count(<const uint8_t*>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
