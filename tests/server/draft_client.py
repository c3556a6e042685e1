# A RabbitMQ Stream client of the 2020 draft dialect, written from the seed document
# (../shared/seeds/rabbitmq-stream-PROTOCOL-draft.adoc) with struct and asyncio only: it must
# not share code with riverlog's codec, so that the tests check riverlog against an
# independent reading of the draft. What the seed does not say is marked where it is used:
# the frame version and the response-code numbers come from the reference implementation the
# seed names (rabbitmq-stream-java-client, 2020: VERSION_0 = 0, RESPONSE_CODE_OK = 0, ...),
# the sub-batch entry header from the osiris commit the seed cites (348db05).
from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field

# Commands (seed, "Commands" table)
PUBLISH, PUBLISH_CONFIRM, SUBSCRIBE, DELIVER, CREDIT, UNSUBSCRIBE, PUBLISH_ERROR = 0, 1, 2, 3, 4, 5, 6
METADATA_UPDATE, METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE, TUNE, OPEN, CLOSE = 7, 8, 9, 10, 11, 12, 13
HEARTBEAT, PEER_PROPERTIES, COMMIT_OFFSET, QUERY_OFFSET, CREATE, DELETE = 14, 15, 16, 17, 998, 999
VERSION = 0  # not in the seed: the Java client of 2020 sent VERSION_0 = 0

# Offset types (seed, Subscribe): 0 first, 1 last, 2 next, 3 offset, 4 timestamp
FIRST, LAST, NEXT, OFFSET, TIMESTAMP = 0, 1, 2, 3, 4

# Response codes: not in the seed; the Java client of 2020 (Constants.java)
OK, STREAM_DOES_NOT_EXIST, SUBSCRIPTION_ID_ALREADY_EXISTS, SUBSCRIPTION_ID_DOES_NOT_EXIST = 0, 1, 2, 3
STREAM_ALREADY_EXISTS, STREAM_NOT_AVAILABLE, AUTHENTICATION_FAILURE = 4, 5, 7
UNKNOWN_FRAME, FRAME_TOO_LARGE, ACCESS_REFUSED = 12, 13, 15

# requests whose response reuses the key, carrying the correlation id after key and version
_REQUESTS = {SUBSCRIBE, UNSUBSCRIBE, METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE, OPEN,
             PEER_PROPERTIES, QUERY_OFFSET, CREATE, DELETE}


def string(s: str) -> bytes:
    """string: int16 length then the bytes"""
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def blob(b: bytes) -> bytes:
    """bytes: int32 length then the bytes"""
    return struct.pack(">i", len(b)) + b


def string_map(d: dict) -> bytes:
    """[Key string, Value string] with an int32 count"""
    return struct.pack(">i", len(d)) + b"".join(string(k) + string(v) for k, v in d.items())


def frame(key: int, body: bytes, version: int = VERSION) -> bytes:
    """Size int32 (not counting itself), Key int16, Version int16, then the body"""
    return struct.pack(">ihh", 4 + len(body), key, version) + body


class Reader:
    """Reads big-endian fields from a frame body."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        values = struct.unpack_from(">" + fmt, self.data, self.pos)
        self.pos += struct.calcsize(">" + fmt)
        return values if len(values) > 1 else values[0]

    def string(self) -> str | None:
        n = self.take("h")
        if n < 0:
            return None
        self.pos += n
        return self.data[self.pos - n:self.pos].decode()

    def blob(self) -> bytes | None:
        n = self.take("i")
        if n < 0:
            return None
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def string_map(self) -> dict:
        return {self.string(): self.string() for _ in range(self.take("i"))}

    def rest(self) -> bytes:
        return self.data[self.pos:]


@dataclass
class Chunk:
    """The OsirisChunk of a Deliver (seed, Deliver), its messages split out."""

    magic_version: int
    entries: int
    records: int
    epoch: int
    first_offset: int
    crc: int
    data: bytes
    messages: list = field(default_factory=list)  # (offset, bytes); sub-batches as one item

    @classmethod
    def parse(cls, raw: bytes) -> "Chunk":
        r = Reader(raw)
        magic, entries, records, epoch, first, crc, length = r.take("bHIQQiI")
        data = r.rest()
        assert len(data) == length, f"DataLength {length}, {len(data)} bytes follow"
        chunk = cls(magic, entries, records, epoch, first, crc, data)
        body, offset = Reader(data), first
        while body.pos < len(data):
            (head,) = struct.unpack_from(">I", data, body.pos)
            if head >> 31 == 0:  # simple entry: 0, size:31, data
                body.pos += 4
                chunk.messages.append((offset, data[body.pos:body.pos + head]))
                body.pos += head
                offset += 1
            else:  # sub-batch (osiris 348db05): 1, codec:3, 0:4, records:16, size:32, data
                _, count, size = body.take("BHI")
                chunk.messages.append((offset, ("sub-batch", (head >> 28) & 7, count,
                                                data[body.pos:body.pos + size])))
                body.pos += size
                offset += count
        return chunk


class DraftClient:
    """One connection. Requests wait for their response; server commands are collected:
    ``confirms[publisher id]``, ``errors[publisher id]`` (publishing id, code),
    ``chunks[subscription id]``, ``metadata_updates``, ``credit_errors``, ``closed_with``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.corr = 0
        self.pending: dict[int, asyncio.Future] = {}
        self.tune: asyncio.Future = asyncio.get_running_loop().create_future()
        self.confirms: dict[int, list[int]] = {}
        self.errors: dict[int, list[tuple[int, int]]] = {}
        self.chunks: dict[int, list[Chunk]] = {}
        self.metadata_updates: list[tuple[int, str]] = []
        self.credit_errors: list[tuple[int, int]] = []
        self.closed_with: tuple[int, str] | None = None
        self.failure: Exception | None = None  # a server frame this client found wrong
        self.eof = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def connect(cls, host: str, port: int) -> "DraftClient":
        return cls(*await asyncio.open_connection(host, port))

    # -- plumbing -------------------------------------------------------------------------------
    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr

    async def request(self, key: int, body_after_corr: bytes, timeout: float = 10) -> Reader:
        """Send Key Version CorrelationId body; the response body after its correlation id."""
        corr = self.next_corr()
        future = self.pending[corr] = asyncio.get_running_loop().create_future()
        self.send_raw(frame(key, struct.pack(">i", corr) + body_after_corr))
        key_back, body = await asyncio.wait_for(future, timeout)
        assert key_back == key, f"response key {key_back} to request key {key}"
        return body

    async def _read_loop(self) -> None:
        try:
            while True:
                size = struct.unpack(">i", await self.reader.readexactly(4))[0]
                self._dispatch(await self.reader.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception as exc:  # reported by every wait below
            self.failure = exc
        finally:
            self.eof.set()
            for future in self.pending.values():
                if not future.done():
                    future.set_exception(self.failure or ConnectionError("closed by the server"))

    async def _until(self, done, timeout: float):
        """Poll ``done()`` until it returns a value that is not None; raises what the reader
        found wrong, if anything."""
        async def poll():
            while True:
                if self.failure is not None:
                    raise self.failure
                result = done()
                if result is not None:
                    return result
                await asyncio.sleep(0.01)
        return await asyncio.wait_for(poll(), timeout)

    def _dispatch(self, data: bytes) -> None:
        r = Reader(data)
        key, version = r.take("hh")
        assert version == VERSION, f"key {key} came with version {version}"
        if key == PUBLISH_CONFIRM:
            pid, n = r.take("Bi")
            self.confirms.setdefault(pid, []).extend(r.take("q") for _ in range(n))
        elif key == PUBLISH_ERROR:
            pid, n = r.take("Bi")
            self.errors.setdefault(pid, []).extend(r.take("qh") for _ in range(n))
        elif key == DELIVER:
            sub = r.take("B")
            self.chunks.setdefault(sub, []).append(Chunk.parse(r.rest()))
        elif key == CREDIT:  # only sent on a problem: ResponseCode, SubscriptionId
            self.credit_errors.append(r.take("hB"))
        elif key == METADATA_UPDATE:
            self.metadata_updates.append((r.take("h"), r.string()))
        elif key == TUNE:
            self.tune.set_result(r.take("ii"))
        elif key == HEARTBEAT:
            pass
        elif key == CLOSE and len(data) > 4 + 6:  # a CloseRequest (it has a reason)
            corr, code = r.take("ih")
            self.closed_with = (code, r.string())
            self.send_raw(frame(CLOSE, struct.pack(">ih", corr, OK)))
        else:  # a response: CorrelationId first
            corr = r.take("i")
            future = self.pending.pop(corr, None)
            assert future is not None, f"response key {key} to unknown correlation id {corr}"
            future.set_result((key, Reader(r.rest())))

    # -- commands -------------------------------------------------------------------------------
    async def handshake(self, user: str = "guest", password: str = "guest",
                        vhost: str = "/", heartbeat: int = 0) -> int:
        """Peer properties, SASL PLAIN, Tune, Open (seed, "Authentication"); the first code
        that is not OK, or OK."""
        r = await self.request(PEER_PROPERTIES, string_map({"product": "draft-test-client"}))
        code = r.take("h")
        self.server_properties = r.string_map()
        if code != OK:
            return code
        r = await self.request(SASL_HANDSHAKE, b"")
        code, n = r.take("hi")
        mechanisms = [r.string() for _ in range(n)]
        assert code == OK and "PLAIN" in mechanisms, (code, mechanisms)
        r = await self.request(SASL_AUTHENTICATE,
                               string("PLAIN") + blob(b"\0" + user.encode() + b"\0" + password.encode()))
        code = r.take("h")
        self.sasl_data = r.blob()  # the seed's SaslAuthenticateResponse carries SaslOpaqueData
        if code != OK:
            return code
        frame_max, server_heartbeat = await asyncio.wait_for(self.tune, 10)
        self.tuned = (frame_max, server_heartbeat)
        self.send_raw(frame(TUNE, struct.pack(">ii", frame_max, heartbeat)))
        return (await self.request(OPEN, string(vhost))).take("h")

    async def create(self, stream: str, arguments: dict | None = None) -> int:
        return (await self.request(CREATE, string(stream) + string_map(arguments or {}))).take("h")

    async def delete(self, stream: str) -> int:
        return (await self.request(DELETE, string(stream))).take("h")

    async def metadata(self, *streams: str) -> tuple[list, list]:
        r = await self.request(METADATA, struct.pack(">i", len(streams))
                               + b"".join(string(s) for s in streams))
        brokers = [(r.take("h"), r.string(), r.take("i")) for _ in range(r.take("i"))]
        metadata = []
        for _ in range(r.take("i")):
            name, code, leader = r.string(), r.take("h"), r.take("h")
            metadata.append((name, code, leader, [r.take("h") for _ in range(r.take("i"))]))
        return brokers, metadata

    def publish(self, stream: str, publisher_id: int, messages: list[tuple[int, bytes]]) -> None:
        """Publish => Stream, PublisherId uint8, [PublishingId int64, Message bytes]"""
        self.send_raw(frame(PUBLISH, string(stream) + struct.pack(">Bi", publisher_id, len(messages))
                            + b"".join(struct.pack(">q", pid) + blob(m) for pid, m in messages)))

    async def wait_confirmed(self, publisher_id: int, n: int, timeout: float = 10) -> list[int]:
        """The confirmed ids once ``n`` ids of ``publisher_id`` are confirmed or in error."""
        def answered():
            confirmed = self.confirms.get(publisher_id, [])
            if len(confirmed) + len(self.errors.get(publisher_id, ())) >= n:
                return confirmed
        return await self._until(answered, timeout)

    async def subscribe(self, subscription_id: int, stream: str, offset_type: int,
                        offset: int | None = None, credit: int = 10) -> int:
        spec = struct.pack(">h", offset_type)
        if offset_type == OFFSET:
            spec += struct.pack(">Q", offset)
        elif offset_type == TIMESTAMP:
            spec += struct.pack(">q", offset)
        body = struct.pack(">B", subscription_id) + string(stream) + spec + struct.pack(">h", credit)
        return (await self.request(SUBSCRIBE, body)).take("h")

    def credit(self, subscription_id: int, credit: int) -> None:
        self.send_raw(frame(CREDIT, struct.pack(">Bh", subscription_id, credit)))

    async def unsubscribe(self, subscription_id: int) -> int:
        return (await self.request(UNSUBSCRIBE, struct.pack(">B", subscription_id))).take("h")

    def commit_offset(self, reference: str, stream: str, offset: int) -> None:
        """CommitOffset => CorrelationId (not used), Reference, Stream, Offset int64"""
        self.send_raw(frame(COMMIT_OFFSET, struct.pack(">i", self.next_corr()) + string(reference)
                            + string(stream) + struct.pack(">q", offset)))

    async def query_offset(self, reference: str, stream: str) -> tuple[int, int]:
        return (await self.request(QUERY_OFFSET, string(reference) + string(stream))).take("hq")

    async def messages(self, subscription_id: int, n: int, timeout: float = 10) -> list:
        """The first ``n`` delivered (offset, message) pairs, granting one credit per chunk."""
        seen = 0

        def enough():
            nonlocal seen
            chunks = self.chunks.get(subscription_id, [])
            for _ in chunks[seen:]:
                self.credit(subscription_id, 1)
            seen = len(chunks)
            got = [m for c in chunks for m in c.messages]
            if len(got) >= n:
                return got[:n]
        return await self._until(enough, timeout)

    async def close(self, code: int = OK, reason: str = "bye") -> int:
        code = (await self.request(CLOSE, struct.pack(">h", code) + string(reason))).take("h")
        self.writer.close()
        return code

    async def wait_closed(self, timeout: float = 10) -> None:
        await asyncio.wait_for(self.eof.wait(), timeout)
        self.writer.close()
        if self.failure is not None:
            raise self.failure
