# Bombs in stored records (issue 15, items 7-10): what reading a record may cost is bounded by
# the record, whoever wrote it. AMQP 1.0 values that would decode into far more objects than
# their octets are handed over as raw bytes; compressed sub-entry batches inflate at most to
# their declared size (and a hard cap), and one that cannot be read is skipped alone; the
# internal streams (__cursors, __activity) can be written by the server only, on every door.
# Real servers in this process (_sec.running), real rstream / grpcio / nats-py clients; memory
# is the peak resident set of this process (_memory), with bounds far from both outcomes.
from __future__ import annotations

import grpc
from rstream import Producer

from _memory import MIB, peak_growth
from _sec import running
from riverlog.config import SecurityConfig
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc

GUEST = {"username": "guest", "password": "guest"}


def nested_array_bomb(arrays: int) -> bytes:
    """An AMQP 1.0 message whose amqp-value is an array32 of ``arrays`` array8 elements, each
    claiming 255 list0 elements under 64 null descriptors: 131 octets per inner array that a
    decoder without bounds turns into 255 x 65 objects."""
    inner_body = bytes([255]) + b"\x00\x40" * 64 + b"\x45"
    inner = bytes([len(inner_body)]) + inner_body
    body = arrays.to_bytes(4, "big") + b"\xe0" + inner * arrays
    return b"\x00\x53\x77" + b"\xf0" + len(body).to_bytes(4, "big") + body


async def subscribe_all(app, stream: str) -> list[pb.Message]:
    """Every message of ``stream`` through gRPC Subscribe (EARLIEST to STOP_LATEST)."""
    unlimited = [("grpc.max_receive_message_length", -1)]  # the server alone decides sizes
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}", unlimited) as channel:
        call = api_pb2_grpc.APIStub(channel).Subscribe(pb.SubscribeRequest(
            stream=stream, startPosition=pb.StartPosition.EARLIEST,
            stopPosition=pb.StopPosition.STOP_LATEST), timeout=30)
        got = []
        try:
            async for message in call:
                got.append(message)
        except grpc.aio.AioRpcError as exc:  # Liftbridge ends STOP_LATEST with this status
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
    return got[1:]  # the first message is the empty "subscription created"


async def test_amqp_decode_bomb_is_served_as_raw_bytes(tmp_path):
    """Item 7: a 1.8 KB message of nested described arrays made 65 MB of objects (+280 MB RSS,
    a 3 s stall) for a gRPC Subscribe; now it is the value as stored, at a few MB at most."""
    bomb = nested_array_bomb(14)
    assert len(bomb) < 2000
    async with running(tmp_path, SecurityConfig()) as app:
        async with Producer("127.0.0.1", app.rabbitmq_stream.port, **GUEST) as producer:
            await producer.create_stream("bombs")
            await producer.send_wait("bombs", bomb)
            await producer.send_wait("bombs", b"after the bomb")
        with peak_growth() as peak:
            got = await subscribe_all(app, "bombs")
    assert peak.growth < 32 * MIB, f"reading a {len(bomb)}-byte record grew RSS by " \
                                   f"{peak.growth / MIB:.0f} MiB"
    assert [(m.offset, m.value) for m in got] == [(0, bomb), (1, b"after the bomb")]
