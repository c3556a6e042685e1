# cython: language_level=3
# The compiled twin of nats_wire.py's NatsParser (riverlog/_compiled.py): the one-pass framing
# of what nats-server sends the NATS door's data connection (riverlog/server/nats_data.py),
# MSG and HMSG in C, every other operation handed to the reference's _operation.
# nats_wire.py is the reference and binds this NatsParser over its own when it imports.
# Rules:
# - Same results as nats_wire.NatsParser for every input: the same (messages, operations),
#   the same NatsProtocolError with the same message, the same state afterwards (the kept
#   tail `_buf`, `max_message`, the subject cache `_subjects`, cleared at the same moments).
# - C reads only a MSG/HMSG control line of the plain shape: 3 or 4 (HMSG 4 or 5) arguments
#   split on bytes.split()'s whitespace, sizes of 1-18 ASCII digits within a max_message that
#   is an int in 0..10**18. Any other control line is judged by a copy of the reference's code
#   (_slow_sizes), which raises its errors or returns the sizes; a sid that is not 1-18 digits
#   goes to the reference's _sid. tests/protocol/test_compiled_nats_wire.py holds the two to
#   it on generated, split and damaged bytes.
# Wire facts (docs.nats.io "Client Protocol", https://docs.nats.io/reference/reference-protocols/
# nats-protocol): `MSG <subject> <sid> [reply-to] <#bytes>` CRLF payload CRLF, and `HMSG
# <subject> <sid> [reply-to] <#header bytes> <#total bytes>` CRLF headers+payload CRLF, the
# header bytes counted in the total.
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.long cimport PyLong_FromLongLong
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memchr, memcmp

cdef object _Error = None  # nats_wire.NatsProtocolError, bound by _bind
cdef object _size = None  # nats_wire._size, _sid and _operation (the reference), bound by _bind
cdef object _sid = None
cdef object _operation = None
cdef Py_ssize_t _MAX_LINE = 0
cdef Py_ssize_t _KEPT = 0
cdef str _TOO_LONG = ""
cdef long long _C_LIMIT = 1000000000000000000  # max_message values C compares (10**18)


def _bind(error, size, sid, operation, max_control_line, subjects_kept):
    """Called by nats_wire.py: its error class, its _size, _sid and _operation, and its
    MAX_CONTROL_LINE and _SUBJECTS_KEPT."""
    global _Error, _size, _sid, _operation, _MAX_LINE, _KEPT, _TOO_LONG
    _Error, _size, _sid, _operation = error, size, sid, operation
    _MAX_LINE, _KEPT = max_control_line, subjects_kept
    _TOO_LONG = f"a control line over {max_control_line} bytes"


cdef inline bint _space(char c) noexcept:
    """What bytes.split() splits on: space, \\t, \\n, \\v, \\f, \\r."""
    return c == 32 or 9 <= c <= 13


cdef inline long long _digits(const char* p, Py_ssize_t k) noexcept:
    """The value of ``k`` ASCII digits at ``p``; -1 when k is 0 or over 18 or one is not."""
    cdef long long v = 0
    cdef Py_ssize_t i
    if k < 1 or k > 18:
        return -1
    for i in range(k):
        if not 48 <= p[i] <= 57:
            return -1
        v = v * 10 + (p[i] - 48)
    return v


cdef inline Py_ssize_t _crlf(const char* p, Py_ssize_t pos, Py_ssize_t n) noexcept:
    """bytes.find(b"\\r\\n", pos)."""
    cdef const char* r
    while pos < n:
        r = <const char*>memchr(p + pos, 13, n - pos)
        if r == NULL:
            return -1
        pos = r - p
        if pos + 1 < n and p[pos + 1] == 10:
            return pos
        pos += 1
    return -1


cdef class NatsParser:
    """nats_wire.NatsParser, compiled: ``feed(data)`` returns ``(messages, operations)`` of
    the same shapes (messages ``(sid, subject, reply, headers, payload)``: int, str, str,
    bytes or None, bytes; operations ``(name, argument)``) and raises the same
    NatsProtocolError; ``max_message`` (bytes) bounds a message's headers and payload."""

    cdef readonly bytes _buf
    cdef public object max_message
    cdef readonly dict _subjects
    cdef bytes _subject_raw  # the last subject read and its text: in _subjects
    cdef str _subject_text
    cdef bytes _reply_raw  # the last reply read and its text: in _subjects
    cdef str _reply_text

    def __init__(self, max_message=64 * 1024 * 1024):
        if _operation is None:
            raise RuntimeError("riverlog.protocol._nats_wire_c is bound by importing "
                               "riverlog.protocol.nats_wire")
        self._buf = b""
        self.max_message = max_message
        self._subjects = {}

    cdef str _text(self, const char* p, Py_ssize_t k, bint is_reply):
        """nats_wire.NatsParser._text of the ``k`` bytes at ``p``. The last subject and the
        last reply are remembered apart (each in the cache until it is cleared), so a turn of
        one subject and one reply looks neither up."""
        cdef bytes last = self._reply_raw if is_reply else self._subject_raw
        if (last is not None and PyBytes_GET_SIZE(last) == k
                and memcmp(PyBytes_AS_STRING(last), p, k) == 0):
            return self._reply_text if is_reply else self._subject_text
        cdef bytes raw = PyBytes_FromStringAndSize(p, k)
        cdef PyObject* hit = PyDict_GetItem(self._subjects, raw)
        cdef str text
        if hit != NULL:
            text = <object>hit
        else:
            if len(self._subjects) >= _KEPT:
                self._subjects.clear()
                self._subject_raw = self._reply_raw = None
                self._subject_text = self._reply_text = None
            text = PyUnicode_DecodeUTF8(p, k, "replace")
            self._subjects[raw] = text
        if is_reply:
            self._reply_raw, self._reply_text = raw, text
        else:
            self._subject_raw, self._subject_text = raw, text
        return text

    cdef tuple _slow_sizes(self, bytes buf, Py_ssize_t pos, Py_ssize_t end, bint headers):
        """(total, header_size) of the MSG/HMSG line at ``pos``, the reference's code."""
        head = buf[pos:pos + 4]
        args = buf[pos + 4 + headers:end].split()
        if len(args) != 4 + headers and len(args) != 3 + headers:
            raise _Error(f"{head.strip().decode()} with {len(args)} arguments")
        count = len(args)  # args[-1] and args[-2] (wraparound is off)
        total = _size(args[count - 1], self.max_message)
        header_size = _size(args[count - 2], total) if headers else 0
        return total, header_size

    def feed(self, data):
        """nats_wire.NatsParser.feed: every complete operation of what has come so far; the
        incomplete tail is kept. Raises NatsProtocolError (and leaves the kept tail as it
        was), or TypeError for what is not bytes-like."""
        cdef bytes buf
        if self._buf:
            buf = self._buf + data
        elif type(data) is bytes:
            buf = <bytes>data
        else:
            buf = bytes(data)
        cdef const char* p = PyBytes_AS_STRING(buf)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(buf)
        cdef Py_ssize_t pos = 0, end, s, count, start, stop, tok_start
        cdef Py_ssize_t starts[6]
        cdef Py_ssize_t lens[6]
        cdef long long total, header_size, limit = -1, v
        cdef bint headers, fast
        cdef list messages = []
        cdef list operations = []
        cdef object reply, block, sid, sizes
        limit_obj = self.max_message
        if type(limit_obj) is int and 0 <= limit_obj <= _C_LIMIT:
            limit = limit_obj
        while pos < n:
            end = _crlf(p, pos, n)
            if end < 0:
                if n - pos > _MAX_LINE:
                    raise _Error(_TOO_LONG)
                break
            if end - pos > _MAX_LINE:
                raise _Error(_TOO_LONG)
            if pos + 4 <= n and (memcmp(p + pos, b"MSG ", 4) == 0
                                 or memcmp(p + pos, b"HMSG", 4) == 0):
                headers = p[pos] == 72  # H
                s = pos + 4 + headers
                count = 0
                while s < end:
                    while s < end and _space(p[s]):
                        s += 1
                    if s >= end:
                        break
                    tok_start = s
                    while s < end and not _space(p[s]):
                        s += 1
                    if count < 6:
                        starts[count] = tok_start
                        lens[count] = s - tok_start
                    count += 1
                fast = limit >= 0 and (count == 3 + headers or count == 4 + headers)
                if fast:
                    total = _digits(p + starts[count - 1], lens[count - 1])
                    fast = 0 <= total <= limit
                    header_size = 0
                    if fast and headers:
                        header_size = _digits(p + starts[count - 2], lens[count - 2])
                        fast = 0 <= header_size <= total
                if not fast:
                    sizes = self._slow_sizes(buf, pos, end, headers)
                    if sizes[0] > n:
                        break
                    total, header_size = sizes[0], sizes[1]
                start = end + 2
                stop = start + total
                if stop + 2 > n:
                    break
                if p[stop] != 13 or p[stop + 1] != 10:
                    raise _Error("a message payload not followed by CRLF")
                v = _digits(p + starts[1], lens[1])
                if v >= 0:
                    sid = PyLong_FromLongLong(v)
                else:
                    sid = _sid(PyBytes_FromStringAndSize(p + starts[1], lens[1]))
                subject = self._text(p + starts[0], lens[0], False)
                if count == 4 + headers:
                    reply = self._text(p + starts[2], lens[2], True)
                else:
                    reply = ""
                if headers:
                    block = PyBytes_FromStringAndSize(p + start, header_size)
                else:
                    block = None
                messages.append((sid, subject, reply, block,
                                 PyBytes_FromStringAndSize(p + start + header_size,
                                                           total - header_size)))
                pos = stop + 2
            else:
                operations.append(_operation(buf[pos:end]))
                pos = end + 2
        self._buf = buf[pos:] if pos else buf
        return messages, operations
