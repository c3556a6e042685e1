# cython: language_level=3
# The compiled twin of record.py's encoding (riverlog/_compiled.py): encode_record and
# encode_records, the AMQP 1.0 layout of docs/record-format.md written in one buffer per
# record. record.py is the reference and binds these over its own names when they import.
# Rules:
# - Same bytes as record.py for every record, and the same errors: a record whose fields are
#   not of the exact plain types (bytes value, bytes or None key, dict of str -> bytes
#   headers, int timestamp in int64, str or None subject/reply/correlation id/ack inbox, every
#   length under 4 GiB, strings encodable as UTF-8) is encoded by record.py's encode_record,
#   which gives its bytes or raises its error. tests/log/test_compiled_record.py holds the two
#   to that.
# - Layout facts live in record.py: its section descriptors and annotation names are bound
#   here at its import (_bind); this file knows only the AMQP 1.0 type codes it writes.
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint8_t, uint32_t
from libc.string cimport memcpy, memmove

import json

cdef object _py_encode_record = None  # record.encode_record, bound by _bind
# record.py's layout constants, bound by _bind: annotation names (sym8) and section codes
cdef bytes _MA_TIMESTAMP_NAME, _MA_KEY, _MA_ACK, _MA_EMPTY, _EMPTY_REPLY
cdef bytes _SEC_MA, _SEC_PROPERTIES, _SEC_APP_PROPERTIES, _SEC_DATA


def _bind(encode_record, timestamp_name, key, ack, empty, empty_reply, sections):
    """Called by record.py: its encode_record (the fallback), its annotation names, the JSON
    of ["reply"] and its four section descriptors (annotations, properties, application
    properties, data)."""
    global _py_encode_record, _MA_TIMESTAMP_NAME, _MA_KEY, _MA_ACK, _MA_EMPTY, _EMPTY_REPLY
    global _SEC_MA, _SEC_PROPERTIES, _SEC_APP_PROPERTIES, _SEC_DATA
    _py_encode_record = encode_record
    _MA_TIMESTAMP_NAME, _MA_KEY, _MA_ACK, _MA_EMPTY = timestamp_name, key, ack, empty
    _EMPTY_REPLY = empty_reply
    _SEC_MA, _SEC_PROPERTIES, _SEC_APP_PROPERTIES, _SEC_DATA = sections


class _Fallback(Exception):
    """A record the plain path does not take: record.py encodes it."""


cdef struct Buf:
    char* p
    Py_ssize_t n
    Py_ssize_t cap


cdef int _grow(Buf* b, Py_ssize_t extra) except -1:
    cdef Py_ssize_t cap = b.cap * 2 if b.cap else 256
    while cap < b.n + extra:
        cap *= 2
    cdef char* p = <char*>PyMem_Realloc(b.p, cap)
    if p == NULL:
        raise MemoryError()
    b.p = p
    b.cap = cap
    return 0


cdef inline int _put(Buf* b, const char* data, Py_ssize_t n) except -1:
    if b.n + n > b.cap:
        _grow(b, n)
    memcpy(b.p + b.n, data, n)
    b.n += n
    return 0


cdef inline int _put_u8(Buf* b, uint8_t v) except -1:
    if b.n + 1 > b.cap:
        _grow(b, 1)
    b.p[b.n] = <char>v
    b.n += 1
    return 0


cdef inline int _put_u32(Buf* b, Py_ssize_t v) except -1:
    if b.n + 4 > b.cap:
        _grow(b, 4)
    cdef uint8_t* o = <uint8_t*>(b.p + b.n)
    o[0] = (v >> 24) & 0xFF
    o[1] = (v >> 16) & 0xFF
    o[2] = (v >> 8) & 0xFF
    o[3] = v & 0xFF
    b.n += 4
    return 0


cdef inline int _put_bytes(Buf* b, bytes data) except -1:
    return _put(b, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


cdef inline int _put_variable(Buf* b, uint8_t short_code, const char* data,
                              Py_ssize_t n) except -1:
    """str8/vbin8 (``short_code``) or str32/vbin32 holding ``n`` bytes."""
    if n < 256:
        _put_u8(b, short_code)
        _put_u8(b, <uint8_t>n)
    else:
        if n > 0xFFFFFFFF:
            raise _Fallback
        _put_u8(b, short_code + 0x10)
        _put_u32(b, n)
    return _put(b, data, n)


cdef inline int _put_str(Buf* b, object s) except -1:
    """str8/str32 of the exact str ``s``; _Fallback for anything else."""
    cdef Py_ssize_t n
    cdef const char* u
    if type(s) is not str:
        raise _Fallback
    try:
        u = PyUnicode_AsUTF8AndSize(s, &n)
    except UnicodeEncodeError:
        raise _Fallback
    return _put_variable(b, 0xA1, u, n)


cdef inline int _put_text_or_binary(Buf* b, bytes data) except -1:
    """amqp10.text_or_binary: str8/str32 when ``data`` is UTF-8, else vbin8/vbin32."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data), i
    cdef uint8_t code = 0xA1
    for i in range(n):
        if p[i] >= 0x80:
            try:
                PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
            except UnicodeDecodeError:
                code = 0xA0
            break
    return _put_variable(b, code, <const char*>p, n)


cdef inline Py_ssize_t _open(Buf* b, bytes section) except -1:
    """Start a compound section: its descriptor, room for the largest header; returns where
    the section starts (for _close)."""
    cdef Py_ssize_t start = b.n
    _put_bytes(b, section)
    if b.n + 9 > b.cap:
        _grow(b, 9)
    b.n += 9
    return start


cdef int _close(Buf* b, Py_ssize_t start, uint8_t small, Py_ssize_t count) except -1:
    """amqp10.compound: list8/map8 (``small``) when it fits, else list32/map32; moves the body
    written after _open's room to right after the header."""
    cdef Py_ssize_t head = start + 3
    cdef Py_ssize_t body = head + 9
    cdef Py_ssize_t n = b.n - body
    cdef uint8_t* o = <uint8_t*>(b.p + head)
    if n < 255 and count < 256:
        o[0] = small
        o[1] = <uint8_t>(n + 1)
        o[2] = <uint8_t>count
        memmove(b.p + head + 3, b.p + body, n)
        b.n = head + 3 + n
        return 0
    if n + 4 > 0xFFFFFFFF:
        raise _Fallback
    o[0] = small + 0x10
    b.n = head + 1
    _put_u32(b, n + 4)
    _put_u32(b, count)
    b.n = body + n
    return 0


cdef bytes _encode(Buf* b, object record):
    """The bytes of one record on the plain path; _Fallback when it is not plain."""
    value = record.value
    key = record.key
    headers = record.headers
    ts = record.timestamp_ns
    subject = record.subject
    reply = record.reply
    corr = record.correlation_id
    ack = record.ack_inbox
    if (type(value) is not bytes or (key is not None and type(key) is not bytes)
            or type(headers) is not dict or type(ts) is not int
            or not -0x8000000000000000 <= ts <= 0x7FFFFFFFFFFFFFFF
            or PyBytes_GET_SIZE(<bytes>value) > 0xFFFFFFFF):
        raise _Fallback
    cdef int64_t t = ts
    cdef Py_ssize_t start, count
    cdef list empty = None
    b.n = 0

    # application-properties first, into the buffer's tail, to learn the empty header names
    # (written before them, in the message-annotations): moved into place below
    cdef Py_ssize_t app_start = -1
    cdef Py_ssize_t n_app = 0
    for name, hval in (<dict>headers).items():
        if type(hval) is not bytes or type(name) is not str:
            raise _Fallback
        if PyBytes_GET_SIZE(<bytes>hval) == 0:
            if empty is None:
                empty = [name]
            else:
                empty.append(name)
            continue
        if app_start < 0:
            app_start = _open(b, _SEC_APP_PROPERTIES)
        _put_str(b, name)
        _put_text_or_binary(b, <bytes>hval)
        n_app += 2
    if app_start >= 0:
        _close(b, app_start, 0xC1, n_app)
    cdef Py_ssize_t app_len = b.n
    cdef Py_ssize_t here = b.n

    # message-annotations
    start = _open(b, _SEC_MA)
    _put_bytes(b, _MA_TIMESTAMP_NAME)
    _put_u8(b, 0x80 if t >= 0 else 0x81)
    _put_u32(b, <uint32_t>((<unsigned long long>t) >> 32))
    _put_u32(b, <uint32_t>((<unsigned long long>t) & 0xFFFFFFFF))
    count = 2
    if key is not None:
        _put_bytes(b, _MA_KEY)
        _put_text_or_binary(b, <bytes>key)
        count = 4
    if ack is not None:
        _put_bytes(b, _MA_ACK)
        _put_str(b, ack)
        count += 2
    if empty is not None:
        _put_bytes(b, _MA_EMPTY)
        if len(empty) == 1 and empty[0] == "reply":
            _put_variable(b, 0xA1, PyBytes_AS_STRING(_EMPTY_REPLY), PyBytes_GET_SIZE(_EMPTY_REPLY))
        else:
            _put_str(b, json.dumps(empty, ensure_ascii=False, separators=(",", ":")))
        count += 2
    _close(b, start, 0xC1, count)

    # properties
    if corr is not None or subject is not None or reply is not None:
        start = _open(b, _SEC_PROPERTIES)
        _put(b, b"\x40\x40\x40", 3)
        if subject is None:
            _put_u8(b, 0x40)
        else:
            _put_str(b, subject)
        count = 4
        if corr is not None or reply is not None:
            if reply is None:
                _put_u8(b, 0x40)
            else:
                _put_str(b, reply)
            count = 5
            if corr is not None:
                _put_str(b, corr)
                count = 6
        _close(b, start, 0xC0, count)

    # the record: annotations and properties, application-properties, data header, value
    cdef Py_ssize_t n_value = PyBytes_GET_SIZE(<bytes>value)
    cdef Py_ssize_t n_head = b.n - here
    cdef Py_ssize_t n_data = 2 if n_value < 256 else 5  # vbin8 or vbin32 code and length
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n_head + app_len + 3 + n_data + n_value)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
    memcpy(o, b.p + here, n_head)
    memcpy(o + n_head, b.p, app_len)
    o += n_head + app_len
    memcpy(o, PyBytes_AS_STRING(_SEC_DATA), 3)
    if n_value < 256:
        o[3] = 0xA0
        o[4] = <uint8_t>n_value
    else:
        o[3] = 0xB0
        o[4] = (n_value >> 24) & 0xFF
        o[5] = (n_value >> 16) & 0xFF
        o[6] = (n_value >> 8) & 0xFF
        o[7] = n_value & 0xFF
    memcpy(o + 3 + n_data, PyBytes_AS_STRING(<bytes>value), n_value)
    return out


def encode_record(record):
    """record.encode_record, compiled: the same bytes, or the same error."""
    cdef Buf b
    b.p, b.n, b.cap = NULL, 0, 0
    try:
        return _encode(&b, record)
    except Exception:  # not plain (or anything unforeseen): the reference decides
        return _py_encode_record(record)
    finally:
        PyMem_Free(b.p)


def encode_records(records):
    """record.encode_records, compiled: ``[encode_record(r) for r in records]``."""
    cdef Buf b
    b.p, b.n, b.cap = NULL, 0, 0
    cdef list out = []
    try:
        for record in records:
            try:
                encoded = _encode(&b, record)
            except Exception:  # not plain (or anything unforeseen): the reference decides
                encoded = _py_encode_record(record)
            out.append(encoded)
    finally:
        PyMem_Free(b.p)
    return out
