# cython: language_level=3
# The compiled twin of envelope.py's per-message paths (riverlog/_compiled.py): decode_publish
# (a NATS publish's Publish envelope and its api_pb2.Message) and AckTemplate.ack (the bytes of
# an Ack). envelope.py is the reference and binds these over its own names when they import.
# Rules:
# - Same results as envelope.py for every input, None included: only a payload of the plain
#   shape every client writes (fields 1-12 with their own wire types, one-byte tags, strict
#   UTF-8 strings, at most one header) is parsed here; anything else (unknown fields, other
#   wire types, two headers or more, whose order is upb's hash order) goes to
#   api_pb2.Message.FromString, as in envelope.py. tests/protocol/test_compiled_envelope.py
#   holds the two to that on generated and damaged bytes.
# - The parsed Message is a PublishMessage: the api_pb2.Message attributes callers read
#   (nats_bridge._ingest_turn/_ingest_one), headers a dict.
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

from ._varint cimport put_varint, varint_len

from crc32c import crc32c as _crc32c
from google.protobuf.message import DecodeError

from . import api_pb2

cdef bytes _PUBLISH = b"\xb9\x0e\x43\xb4\x00\x08\x00\x00"
cdef bytes _PUBLISH_CRC = b"\xb9\x0e\x43\xb4\x00\x0c\x01\x00"
cdef object _FromString = api_pb2.Message.FromString
cdef object _Ack = api_pb2.Ack
cdef object _varint = None  # envelope.varint, bound by _bind


def _bind(varint):
    """Called by envelope.py: the reference varint, for AckTemplate.ack's unusual arguments."""
    global _varint
    _varint = varint


cdef class PublishMessage:
    """The fields of an api_pb2.Message (api.proto) as decode_publish parsed them: offset,
    key, value, timestamp (ns), stream, partition, subject, replySubject, headers (dict
    str -> bytes), ackInbox, correlationId, ackPolicy; proto3 defaults where absent."""

    cdef readonly int64_t offset
    cdef readonly bytes key
    cdef readonly bytes value
    cdef readonly int64_t timestamp
    cdef readonly str stream
    cdef readonly int32_t partition
    cdef readonly str subject
    cdef readonly str replySubject
    cdef readonly dict headers
    cdef readonly str ackInbox
    cdef readonly str correlationId
    cdef readonly int32_t ackPolicy

    def __eq__(self, other):
        """Equal to a PublishMessage or api_pb2.Message with the same fields."""
        if not isinstance(other, (PublishMessage, api_pb2.Message)):
            return NotImplemented
        return _fields(self) == _fields(other)

    __hash__ = None

    def __repr__(self):
        return (f"PublishMessage(offset={self.offset}, key={self.key!r}, value={self.value!r}, "
                f"timestamp={self.timestamp}, stream={self.stream!r}, partition={self.partition}, "
                f"subject={self.subject!r}, replySubject={self.replySubject!r}, "
                f"headers={self.headers!r}, ackInbox={self.ackInbox!r}, "
                f"correlationId={self.correlationId!r}, ackPolicy={self.ackPolicy})")


cdef tuple _fields(m):
    return (m.offset, m.key, m.value, m.timestamp, m.stream, m.partition, m.subject,
            m.replySubject, dict(m.headers), m.ackInbox, m.correlationId, m.ackPolicy)


cdef inline Py_ssize_t _read_varint(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end,
                                    uint64_t* out) noexcept:
    """The position after the varint at ``pos``, its value in ``out``; -1 when it runs past
    ``end`` or is longer than 10 bytes (or its 10th byte is over 1)."""
    cdef uint64_t v = 0
    cdef int shift = 0
    cdef uint8_t b
    while pos < end:
        b = p[pos]
        pos += 1
        if shift == 63 and b > 1:
            return -1
        v |= (<uint64_t>(b & 0x7F)) << shift
        if b < 0x80:
            out[0] = v
            return pos
        shift += 7
        if shift > 63:
            return -1
    return -1


cdef inline Py_ssize_t _read_delimited(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end,
                                       Py_ssize_t* start) noexcept:
    """The position after the length-delimited field whose length is at ``pos``, its bytes'
    start in ``start``; -1 when the length is bad or the bytes run past ``end``."""
    cdef uint64_t n
    pos = _read_varint(p, pos, end, &n)
    if pos < 0 or n > <uint64_t>(end - pos):
        return -1
    start[0] = pos
    return pos + <Py_ssize_t>n


cdef object _text(const uint8_t* p, Py_ssize_t n):
    """The str of ``n`` strict UTF-8 bytes, or None when they are not."""
    try:
        return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    except UnicodeDecodeError:
        return None


cdef object _parse(bytes payload):
    """The PublishMessage of ``payload``, or None when it is not of the plain shape."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(payload)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(payload)
    cdef Py_ssize_t pos = 0, start, entry_end
    cdef uint64_t v
    cdef uint8_t tag, field
    cdef object text
    cdef PublishMessage m = PublishMessage.__new__(PublishMessage)
    m.key = m.value = b""
    m.stream = m.subject = m.replySubject = m.ackInbox = m.correlationId = ""
    m.headers = {}
    cdef bint have_header = False
    cdef object hkey, hvalue
    while pos < end:
        tag = p[pos]
        pos += 1
        field = tag >> 3
        if tag >= 0x80 or field == 0 or field > 12:
            return None
        if field in (1, 4, 6, 12):
            if tag & 7 != 0:
                return None
            pos = _read_varint(p, pos, end, &v)
            if pos < 0:
                return None
            if field == 1:
                m.offset = <int64_t>v
            elif field == 4:
                m.timestamp = <int64_t>v
            elif field == 6:
                m.partition = <int32_t><uint32_t>v
            else:
                m.ackPolicy = <int32_t><uint32_t>v
            continue
        if tag & 7 != 2:
            return None
        pos = _read_delimited(p, pos, end, &start)
        if pos < 0:
            return None
        if field == 2:
            m.key = PyBytes_FromStringAndSize(<const char*>p + start, pos - start)
        elif field == 3:
            m.value = PyBytes_FromStringAndSize(<const char*>p + start, pos - start)
        elif field == 9:
            if have_header:  # two entries: upb's map order is not insertion order
                return None
            have_header = True
            hkey, hvalue = "", b""
            entry_end = pos
            pos = start
            while pos < entry_end:
                tag = p[pos]
                pos += 1
                if tag != 0x0A and tag != 0x12:
                    return None
                pos = _read_delimited(p, pos, entry_end, &start)
                if pos < 0:
                    return None
                if tag == 0x0A:
                    hkey = _text(p + start, pos - start)
                    if hkey is None:
                        return None
                else:
                    hvalue = PyBytes_FromStringAndSize(<const char*>p + start, pos - start)
            m.headers[hkey] = hvalue
        else:
            text = _text(p + start, pos - start)
            if text is None:
                return None
            if field == 5:
                m.stream = text
            elif field == 7:
                m.subject = text
            elif field == 8:
                m.replySubject = text
            elif field == 10:
                m.ackInbox = text
            else:
                m.correlationId = text
    return m


def decode_publish(data):
    """The api_pb2.Message of a Publish envelope (a PublishMessage with the same attributes),
    or None if ``data`` is not one: envelope.decode_publish, compiled."""
    if type(data) is not bytes:
        data = bytes(data)
    cdef bytes raw = <bytes>data
    cdef Py_ssize_t n = PyBytes_GET_SIZE(raw)
    cdef const char* p = PyBytes_AS_STRING(raw)
    cdef bytes payload
    if n >= 8 and memcmp(p, PyBytes_AS_STRING(_PUBLISH), 8) == 0:
        payload = raw[8:]
    elif n >= 12 and memcmp(p, PyBytes_AS_STRING(_PUBLISH_CRC), 8) == 0:
        payload = raw[12:]
        if _crc32c(payload) != int.from_bytes(raw[8:12], "big"):
            return None
    else:
        return None
    parsed = _parse(payload)
    if parsed is not None:
        return parsed
    try:
        return _FromString(payload)
    except DecodeError:
        return None


cdef class AckTemplate:
    """envelope.AckTemplate, compiled: ``ack(offset, ack_inbox, correlation_id, commit_ns)``
    gives the same bytes (see envelope.py for the layout)."""

    cdef public object head
    cdef public object policy
    cdef public object reception_ns
    cdef object _commit_ns
    cdef bytes _tail
    cdef object _inbox
    cdef bytes _inbox_field

    def __init__(self, stream, partition_subject, msg_subject, policy, reception_ns,
                 prefix=b""):
        self.head = prefix + _Ack(stream=stream, partitionSubject=partition_subject,
                                  msgSubject=msg_subject).SerializeToString()
        self.policy = policy
        self.reception_ns = reception_ns
        self._commit_ns = None
        self._tail = b""
        self._inbox = b""
        self._inbox_field = b""

    def ack(self, offset, ack_inbox, correlation_id, commit_ns):
        if commit_ns != self._commit_ns:
            self._commit_ns = commit_ns
            self._tail = _Ack(ackPolicy=self.policy, receptionTimestamp=self.reception_ns,
                              commitTimestamp=commit_ns).SerializeToString()
        if ack_inbox != self._inbox:
            self._inbox = ack_inbox
            self._inbox_field = (b"\x2a" + _varint(len(ack_inbox)) + ack_inbox
                                 if ack_inbox else b"")
        if (type(offset) is not int or type(correlation_id) is not bytes
                or type(self.head) is not bytes or not 0 <= offset < 0x8000000000000000):
            return b"".join((  # what envelope.py does, whatever the arguments
                self.head,
                b"\x20" + _varint(offset) if offset else b"",
                self._inbox_field,
                b"\x32" + _varint(len(correlation_id)) + correlation_id if correlation_id else b"",
                self._tail))
        cdef uint64_t off = <uint64_t>offset
        cdef bytes corr = <bytes>correlation_id
        cdef Py_ssize_t nc = PyBytes_GET_SIZE(corr)
        cdef Py_ssize_t nh = PyBytes_GET_SIZE(self.head)
        cdef Py_ssize_t ni = PyBytes_GET_SIZE(self._inbox_field)
        cdef Py_ssize_t nt = PyBytes_GET_SIZE(self._tail)
        cdef Py_ssize_t size = nh + ni + nt
        if off:
            size += 1 + varint_len(off)
        if nc:
            size += 1 + varint_len(<uint64_t>nc) + nc
        cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
        cdef uint8_t* o = <uint8_t*>PyBytes_AS_STRING(out)
        memcpy(o, PyBytes_AS_STRING(self.head), nh)
        o += nh
        if off:
            o[0] = 0x20
            o = put_varint(o + 1, off)
        memcpy(o, PyBytes_AS_STRING(self._inbox_field), ni)
        o += ni
        if nc:
            o[0] = 0x32
            o = put_varint(o + 1, <uint64_t>nc)
            memcpy(o, PyBytes_AS_STRING(corr), nc)
            o += nc
        memcpy(o, PyBytes_AS_STRING(self._tail), nt)
        return out
