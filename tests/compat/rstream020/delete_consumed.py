# rstream 0.20 as its users wrote it: one Consumer reads three streams (rstream 0.20 keeps
# them, its Metadata queries and its Delete requests on ONE connection), then deletes the
# three streams concurrently with Consumer.delete_stream. rstream 0.20 handles MetadataUpdate
# inside its frame reader and closes the connection there once the connection's last stream
# got one; a DeleteResponse that comes after that MetadataUpdate is never read (RabbitMQ sends
# the response first: rabbit_stream_reader.erl, delete_stream). Prints {"module", "received",
# "results": one "ok" or error text per stream, "seconds"}.
import asyncio
import json
import sys
import time

from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer


async def main(a: dict) -> dict:
    creds = dict(username=a["username"], password=a["password"])
    streams = a["streams"]
    async with Producer(a["host"], a["port"], **creds) as producer:
        for stream in streams:
            await producer.create_stream(stream)
            await producer.send_wait(stream, b"one")
    received: list[bytes] = []
    all_in = asyncio.Event()

    async def on_message(msg, ctx):
        received.append(bytes(msg))
        if len(received) == len(streams):
            all_in.set()

    consumer = Consumer(a["host"], a["port"], **creds)
    await consumer.start()
    for stream in streams:
        await consumer.subscribe(stream, on_message, decoder=lambda b: b,
                                 offset_specification=ConsumerOffsetSpecification(
                                     OffsetType.FIRST, None))
    await asyncio.wait_for(all_in.wait(), 10)

    async def delete(stream: str) -> str:
        try:
            await asyncio.wait_for(consumer.delete_stream(stream), a["delete_timeout"])
            return "ok"
        except Exception as exc:  # noqa: BLE001 - reported, the test decides
            return f"{type(exc).__name__}: {exc}"

    started = time.monotonic()
    results = await asyncio.gather(*(delete(s) for s in streams))
    seconds = time.monotonic() - started
    try:
        await asyncio.wait_for(consumer.close(), 10)
    except Exception:  # noqa: BLE001 - the connection may be gone already
        pass
    import rstream
    return {"module": rstream.__file__, "received": len(received), "results": results,
            "seconds": round(seconds, 2)}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
