# PublishAsync's batch path (server/grpc_streams.py): the requests of one loop turn are stored
# in runs (one encode pass, one append, one AckTemplate per partition and ack policy), and the
# PublishResponses are built from template bytes. These tests hold the template to the bytes
# of the generated protobuf classes, and a mixed batch (partitions, ack policies, errors,
# optimistic concurrency, oversized messages) to what one-by-one publishing gives, on both
# gRPC transports, with a real grpc.aio client.
from __future__ import annotations

import grpc
import pytest

from _lb import create, read_all, wait_for_offset
from riverlog.metrics import REGISTRY
from riverlog.protocol.liftbridge import api_pb2 as pb
from riverlog.protocol.liftbridge import api_pb2_grpc
from riverlog.server.grpc_streams import AckTemplate

LEADER, ALL, NONE = pb.AckPolicy.LEADER, pb.AckPolicy.ALL, pb.AckPolicy.NONE


@pytest.mark.parametrize("offset", [0, 1, 127, 128, 300_000, 2**62])
@pytest.mark.parametrize("correlation_id", ["", "7", "0-12345", "é✓" * 70])
@pytest.mark.parametrize("policy", [LEADER, ALL])
@pytest.mark.parametrize("names", [("s", "s.sub", "s.sub.1"), ("", "", ""), ("x" * 200,) * 3])
def test_ack_template_gives_the_generated_classes_bytes(offset, correlation_id, policy, names):
    stream, partition_subject, msg_subject = names
    template = AckTemplate(stream, partition_subject, msg_subject, policy, 1_700_000_000_123)
    for commit_ns in (1_700_000_000_456, 1_700_000_001_000):  # the tail follows the clock
        data = template.response(offset, correlation_id, commit_ns)
        ack = pb.Ack(stream=stream, partitionSubject=partition_subject, msgSubject=msg_subject,
                     offset=offset, correlationId=correlation_id, ackPolicy=policy,
                     receptionTimestamp=1_700_000_000_123, commitTimestamp=commit_ns)
        want = pb.PublishResponse(correlationId=correlation_id, ack=ack)
        assert data == want.SerializeToString()
        parsed = pb.PublishResponse.FromString(data)
        assert parsed == want and parsed.HasField("ack") and not parsed.HasField("asyncError")


def _published(stream: str) -> float:
    return REGISTRY.get_sample_value("riverlog_published_messages_total",
                                     {"vhost": "/", "stream": stream, "door": "grpc"}) or 0.0


@pytest.mark.parametrize("transport", ["grpcio", "h2"])
async def test_a_mixed_batch_is_stored_and_answered_as_one_by_one(server_factory, transport):
    server = await server_factory(transport=transport, replication_max_bytes=2000)
    channel = grpc.aio.insecure_channel(server.grpc_addr)
    stub = api_pb2_grpc.APIStub(channel)
    try:
        await create(stub, "mix", "mix.sub", partitions=2)
        await create(stub, "occ", optimisticConcurrencyControl=pb.NullableBool(value=True))
        before = _published("mix")
        sent: list[pb.PublishRequest] = []
        for i in range(300):
            sent.append(pb.PublishRequest(
                stream="mix", partition=i % 3 // 2, value=b"v%d" % i, correlationId=f"c{i}",
                key=b"k%d" % i if i % 5 == 0 else b"",
                headers={"h": b"%d" % i} if i % 7 == 0 else {},
                ackPolicy=(LEADER, ALL, NONE)[i % 4 % 3]))
            if i == 100:
                sent.append(pb.PublishRequest(stream="nope", value=b"x", correlationId="bad"))
                sent.append(pb.PublishRequest(stream="mix", partition=0, value=b"L" * 3000,
                                              correlationId="big"))
                sent.append(pb.PublishRequest(stream="occ", value=b"o0", expectedOffset=0,
                                              correlationId="occ-ok"))
                sent.append(pb.PublishRequest(stream="occ", value=b"o1", expectedOffset=5,
                                              correlationId="occ-bad"))

        async def requests():
            for request in sent:
                yield request

        responses = [r async for r in stub.PublishAsync(requests(), timeout=20)]
        by_corr = {r.correlationId: r for r in responses}
        answered = {r.correlationId for r in sent if r.ackPolicy != NONE}
        assert len(responses) == len(by_corr) == len(answered)
        assert set(by_corr) == answered
        assert by_corr["bad"].asyncError.code == pb.PublishAsyncError.Code.NOT_FOUND
        assert by_corr["big"].asyncError.code == pb.PublishAsyncError.Code.BAD_REQUEST
        assert by_corr["occ-bad"].asyncError.code == pb.PublishAsyncError.Code.INCORRECT_OFFSET
        assert by_corr["occ-ok"].ack.offset == 0 and not by_corr["occ-ok"].HasField("asyncError")

        stored = {0: [], 1: []}  # what each partition must hold, in sending order
        for request in sent:
            if request.stream == "mix" and request.correlationId != "big":
                stored[request.partition].append(request)
        for index, requests_in in stored.items():
            await wait_for_offset(server, "mix", len(requests_in) - 1, partition=index)
            messages = await read_all(stub, "mix", index)
            assert [(m.value, m.key, m.subject, dict(m.headers)) for m in messages] == [
                (r.value, r.key, "mix.sub" if index == 0 else "mix.sub.1",
                 {**r.headers, "subject": (b"mix.sub" if index == 0 else b"mix.sub.1"),
                  "reply": b""}) for r in requests_in]
            for offset, request in enumerate(requests_in):
                if request.ackPolicy == NONE:
                    continue
                ack = by_corr[request.correlationId].ack
                assert not by_corr[request.correlationId].HasField("asyncError")
                assert (ack.stream, ack.partitionSubject, ack.msgSubject, ack.offset,
                        ack.correlationId, ack.ackPolicy, ack.ackInbox, ack.ackError) == (
                    "mix", "mix.sub", messages[offset].subject, offset, request.correlationId,
                    request.ackPolicy, "", pb.Ack.Error.OK)
                assert 0 < ack.receptionTimestamp <= ack.commitTimestamp
                assert messages[offset].timestamp == ack.receptionTimestamp
        assert _published("mix") - before == len(stored[0]) + len(stored[1])
    finally:
        await channel.close()


async def test_per_turn_counting_helpers_count_once_per_turn():
    import asyncio

    from riverlog.metrics import TurnLatency, counters

    def sample(name, **labels):
        return REGISTRY.get_sample_value(name, labels) or 0.0

    turns = {"vhost": "/", "stream": "turns", "door": "nats"}
    published = ("riverlog_published_messages_total", turns)
    confirms = ("riverlog_confirm_latency_seconds_count", {"door": "nats"})
    nbytes = ("riverlog_published_bytes_total", turns)
    before = [sample(name, **labels) for name, labels in (published, confirms, nbytes)]
    counted, latency = counters("turns", "nats"), TurnLatency("nats")
    for _ in range(3):
        counted.published_soon(10)
        latency.observe(0.002)
    assert sample(published[0], **published[1]) == before[0]  # not before the turn ends
    await asyncio.sleep(0)
    assert sample(published[0], **published[1]) == before[0] + 3
    assert sample(nbytes[0], **nbytes[1]) == before[2] + 30
    assert sample(confirms[0], **confirms[1]) == before[1] + 1
    latency.observe(0.001)  # a new turn: observed again
    assert sample(confirms[0], **confirms[1]) == before[1] + 2
