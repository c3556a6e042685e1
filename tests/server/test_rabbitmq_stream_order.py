"""A response goes before the notifications its request causes on the asking connection, as
rabbit_stream_reader.erl sends them (issue 20, item 7): Delete and DeleteSuperStream answer
with response_ok, then send metadata_update; Unsubscribe answers, and the
single-active-consumer change it causes reaches the reader later as a message. Frame level,
in-process server; the rstream scenario is tests/compat/test_rstream020.py."""
import asyncio

from riverlog.protocol.rabbitmq_stream import OffsetType, ResponseCode
from riverlog.protocol.rabbitmq_stream import frames as f

from test_rabbitmq_stream_door import client_for


async def _until(client, kinds, timeout=5.0) -> list:
    """Every frame received, in arrival order, until one of each of ``kinds`` came."""
    async def read():
        while not all(any(isinstance(fr, k) for fr in client.frames) for k in kinds):
            data = await client.reader.read(65536)
            if not data:
                raise ConnectionError("closed by the server")
            client.frames.extend(client.decoder.feed(data))
        return list(client.frames)
    return await asyncio.wait_for(read(), timeout)


def _kinds(frames, kinds) -> list[type]:
    return [type(fr) for fr in frames if isinstance(fr, kinds)]


async def test_delete_answers_before_the_metadata_update_of_its_own_subscriptions(app):
    client = await client_for(app)
    for name in ("a", "b"):
        await client.call(f.Create(client.next_corr(), name, {}), f.CreateResponse)
    await client.call(f.Subscribe(client.next_corr(), 1, "a", OffsetType.FIRST, None, 10),
                      f.SubscribeResponse)
    await client.call(f.DeclarePublisher(client.next_corr(), 2, "", "b"),
                      f.DeclarePublisherResponse)
    for name in ("a", "b"):
        client.frames.clear()
        client.send(f.Delete(client.next_corr(), name))
        frames = await _until(client, (f.DeleteResponse, f.MetadataUpdate))
        assert _kinds(frames, (f.DeleteResponse, f.MetadataUpdate)) == [
            f.DeleteResponse, f.MetadataUpdate], (name, frames)
        response = next(fr for fr in frames if isinstance(fr, f.DeleteResponse))
        update = next(fr for fr in frames if isinstance(fr, f.MetadataUpdate))
        assert response.response_code == ResponseCode.OK
        assert (update.stream, update.response_code) == (name,
                                                         ResponseCode.STREAM_NOT_AVAILABLE)


async def test_delete_super_stream_answers_before_the_metadata_updates(app):
    client = await client_for(app)
    resp = await client.call(f.CreateSuperStream(client.next_corr(), "ss", ("ss-0", "ss-1"),
                                                 ("0", "1"), {}), f.CreateSuperStreamResponse)
    assert resp.response_code == ResponseCode.OK
    for sub_id, name in enumerate(("ss-0", "ss-1"), 1):
        await client.call(f.Subscribe(client.next_corr(), sub_id, name, OffsetType.FIRST,
                                      None, 10), f.SubscribeResponse)
    client.frames.clear()
    client.send(f.DeleteSuperStream(client.next_corr(), "ss"))
    frames = await _until(client, (f.DeleteSuperStreamResponse, f.MetadataUpdate))
    await asyncio.sleep(0.1)  # the second MetadataUpdate, when it came apart
    frames = await _until(client, (f.DeleteSuperStreamResponse, f.MetadataUpdate))
    assert _kinds(frames, (f.DeleteSuperStreamResponse, f.MetadataUpdate)) == [
        f.DeleteSuperStreamResponse, f.MetadataUpdate, f.MetadataUpdate], frames
    assert sorted(fr.stream for fr in frames if isinstance(fr, f.MetadataUpdate)) == [
        "ss-0", "ss-1"]


async def test_unsubscribe_answers_before_the_consumer_update_it_causes(app):
    client = await client_for(app)
    await client.call(f.Create(client.next_corr(), "sac", {}), f.CreateResponse)
    sac = {"single-active-consumer": "true", "name": "group"}
    for sub_id in (1, 2):
        await client.call(f.Subscribe(client.next_corr(), sub_id, "sac", OffsetType.FIRST, None,
                                      10, sac), f.SubscribeResponse)
    first = await client.recv(f.ConsumerUpdate)
    assert (first.subscription_id, first.active) == (1, True)
    client.send(f.ConsumerUpdateResponse(first.correlation_id, ResponseCode.OK,
                                         OffsetType.NEXT, 0))
    client.frames.clear()
    client.send(f.Unsubscribe(client.next_corr(), 1))
    frames = await _until(client, (f.UnsubscribeResponse, f.ConsumerUpdate))
    assert _kinds(frames, (f.UnsubscribeResponse, f.ConsumerUpdate)) == [
        f.UnsubscribeResponse, f.ConsumerUpdate], frames
    update = next(fr for fr in frames if isinstance(fr, f.ConsumerUpdate))
    assert (update.subscription_id, update.active) == (2, True)
