# cython: language_level=3
# The compiled twin of messages.py's MessageEncoder.extend (riverlog/_compiled.py): the
# per-record loop of a Subscribe, reading riverlog's own record layout and joining a Message's
# bytes in one buffer. messages.py is the reference: its MessageEncoder, with this extend
# bound over its own, is the class it exports when this imports.
# Rules:
# - Only a record whose message-annotations and suffix (empty header names, subject and
#   reply, application-properties) the encoder already read is taken here, with messages.py's
#   checks on the rest of the record, in the same order; every other record (the first of its
#   kind, anything that fails a check or is not bytes, offsets outside int64) goes to the
#   reference's extend, record by record, which reads it (filling the caches) or counts it as
#   foreign. So the two append the same bytes and count the same; tests hold them to it
#   (tests/protocol/test_compiled_messages.py).
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

from ._varint cimport put_varint, varint_len

cdef object _py_extend = None  # messages.MessageEncoder.extend (the reference), bound by _bind
cdef bytes _MA_KEY, _SEC_PROPERTIES, _NULL3, _SEC_APP_PROPERTIES, _SEC_DATA
cdef Py_ssize_t _KEY_AT, _KEY_VALUE_AT


def _bind(extend, ma_key, key_at, sec_properties, null3, sec_app_properties, sec_data):
    """Called by messages.py: the reference extend and the layout constants it reads with."""
    global _py_extend, _MA_KEY, _KEY_AT, _KEY_VALUE_AT, _SEC_PROPERTIES, _NULL3
    global _SEC_APP_PROPERTIES, _SEC_DATA
    _py_extend = extend
    _MA_KEY, _KEY_AT = ma_key, key_at
    _KEY_VALUE_AT = key_at + len(ma_key)
    _SEC_PROPERTIES, _NULL3, _SEC_APP_PROPERTIES, _SEC_DATA = (
        sec_properties, null3, sec_app_properties, sec_data)


cdef inline bint _at(const uint8_t* p, Py_ssize_t n, Py_ssize_t pos, bytes what) noexcept:
    """bytes.startswith(what, pos)."""
    cdef Py_ssize_t k = PyBytes_GET_SIZE(what)
    return pos >= 0 and pos + k <= n and memcmp(p + pos, PyBytes_AS_STRING(what), k) == 0


cdef inline uint32_t _u32(const uint8_t* p) noexcept:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline bint _compound(const uint8_t* p, Py_ssize_t n, Py_ssize_t pos, uint8_t small,
                           Py_ssize_t* count, Py_ssize_t* first, Py_ssize_t* end) noexcept:
    """The list8/map8 (``small``) or list32/map32 whose constructor is at ``pos``: its item
    count, first item and end (record._own_compound's); False when it is neither or its
    header runs past ``n``."""
    cdef uint8_t code
    if pos + 3 > n:
        return False
    code = p[pos]
    if code == small:
        count[0], first[0], end[0] = p[pos + 2], pos + 3, pos + 2 + p[pos + 1]
        return True
    if code == small + 0x10 and pos + 9 <= n:
        count[0], first[0], end[0] = _u32(p + pos + 5), pos + 9, pos + 5 + _u32(p + pos + 1)
        return True
    return False


cdef inline uint8_t* _put(uint8_t* o, bytes b) noexcept:
    cdef Py_ssize_t n = PyBytes_GET_SIZE(b)
    memcpy(o, PyBytes_AS_STRING(b), n)
    return o + n


cdef object _message(object self, bytes raw, object offset_obj, dict heads, dict suffixes):
    """The Message of ``raw`` and its value's length, or None when the reference must read
    it (see the rules above)."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(raw)
    cdef Py_ssize_t n_raw = PyBytes_GET_SIZE(raw)
    cdef Py_ssize_t pos, key_end, first, end, count, i, n
    cdef uint8_t code
    cdef bytes key = None
    if n_raw < 5 or p[3] != 0xC1:
        return None
    # message-annotations, looked up by their bytes (or those around a str8/vbin8 key)
    pos = 5 + p[4]
    if pos > n_raw:
        return None
    if not _at(p, n_raw, _KEY_AT, _MA_KEY):
        head = heads.get(raw[:pos])
    else:
        if _KEY_VALUE_AT + 1 >= n_raw:
            return None
        code = p[_KEY_VALUE_AT]
        key_end = _KEY_VALUE_AT + 2 + p[_KEY_VALUE_AT + 1]
        if not ((code == 0xA0 or code == 0xA1) and key_end <= pos):
            return None
        head = heads.get((raw[:_KEY_AT], raw[key_end:pos]))
        if head is not None:
            key = raw[_KEY_VALUE_AT + 2:key_end]
            if code == 0xA1 and not key.isascii():  # _own_text_or_bin's way
                key = key.decode("utf-8", "replace").encode()
    if head is None:
        return None
    cdef bytes ts_field = head[0]
    cdef bytes key_field = head[1]
    cdef bytes empty = head[2]

    # properties: subject, reply-to, correlation id (not part of a Message)
    cdef bytes subject_reply = b""
    if _at(p, n_raw, pos, _SEC_PROPERTIES):
        if not _compound(p, n_raw, pos + 3, 0xC0, &count, &first, &end):
            return None
        if not 4 <= count <= 6 or not _at(p, n_raw, first, _NULL3):
            return None
        first += 3
        pos = first
        for i in range(count - 3):  # subject, reply-to, correlation id: str or null
            if i == 2:
                subject_reply = raw[first:pos]
            if pos >= n_raw:
                return None
            code = p[pos]
            if code == 0xA1:
                if pos + 2 > n_raw:
                    return None
                pos += 2 + p[pos + 1]
            elif code == 0x40:
                pos += 1
            elif code == 0xB1:
                if pos + 5 > n_raw:
                    return None
                pos += 5 + _u32(p + pos + 1)
            else:
                return None
        if pos != end or end > n_raw:
            return None
        if count < 6:
            subject_reply = raw[first:pos]

    # application-properties: their bytes, for the suffix lookup
    cdef bytes app = b""
    if _at(p, n_raw, pos, _SEC_APP_PROPERTIES):
        if not _compound(p, n_raw, pos + 3, 0xC1, &count, &first, &end):
            return None
        if end > n_raw:
            return None
        app = raw[pos:end]
        pos = end

    # data: the value, to the end of the record
    if not _at(p, n_raw, pos, _SEC_DATA) or pos + 5 > n_raw:
        return None
    code = p[pos + 3]
    if code == 0xB0:
        if pos + 8 > n_raw:
            return None
        n = _u32(p + pos + 4)
        pos += 8
    elif code == 0xA0:
        n = p[pos + 4]
        pos += 5
    else:
        return None
    if pos + n != n_raw:
        return None
    suffix = suffixes.get((empty, subject_reply, app))
    if suffix is None:
        return None

    # offset, key, value, timestamp, then the suffix (stream ... headers)
    cdef uint64_t offset = <uint64_t><long long>offset_obj
    cdef Py_ssize_t n_key = PyBytes_GET_SIZE(key) if key else 0
    cdef Py_ssize_t size = (1 + varint_len(offset) + PyBytes_GET_SIZE(key_field) + n
                            + PyBytes_GET_SIZE(ts_field) + PyBytes_GET_SIZE(<bytes>suffix))
    if n_key:
        size += 1 + varint_len(<uint64_t>n_key) + n_key
    if n:
        size += 1 + varint_len(<uint64_t>n)
    cdef bytes message = PyBytes_FromStringAndSize(NULL, size)
    cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(message)
    o[0] = 0x08
    o = put_varint(o + 1, offset)
    o = _put(o, key_field)
    if n_key:
        o[0] = 0x12
        o = put_varint(o + 1, <uint64_t>n_key)
        o = _put(o, key)
    if n:
        o[0] = 0x1A
        o = put_varint(o + 1, <uint64_t>n)
        memcpy(o, p + pos, n)
        o += n
    o = _put(o, ts_field)
    _put(o, <bytes>suffix)
    return message, n


def extend(self, out, records, start, stop, default_ns):
    """messages.MessageEncoder.extend, compiled: the same Messages appended to ``out``, the
    same ``value_bytes`` and ``foreign`` counts, the same return value and errors."""
    cdef dict heads = self._heads
    cdef dict suffixes = self._suffixes
    cdef object value_bytes = 0  # added to self.value_bytes before the reference runs, and at the end
    append = out.append
    try:
        for offset, raw in records:
            if offset < start:
                continue
            made = None
            if (type(raw) is bytes and type(offset) is int
                    and -0x8000000000000000 <= offset <= 0x7FFFFFFFFFFFFFFF):
                made = _message(self, <bytes>raw, offset, heads, suffixes)
            if made is None:
                self.value_bytes += value_bytes
                value_bytes = 0
                if _py_extend(self, out, ((offset, raw),), start, stop, default_ns):
                    return True
                continue
            append(made[0])
            value_bytes += made[1]
            if offset == stop:
                return True
        return False
    finally:
        self.value_bytes += value_bytes
