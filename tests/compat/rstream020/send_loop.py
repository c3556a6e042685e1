# rstream 0.20's plain send() loop, as its users wrote it: `send` buffers every message and a
# background task sends the buffer every 0.5 s as ONE Publish frame (here ~100,000 messages,
# ~1.2 MB: above frame_max and above a chunk's 65,535 entries). Then it reads the stream
# back from `first` and from `last`. Prints {"version", "confirmed", "errors",
# "first_read": n, "in_order": bool, "last_first_offset": offset}.
import asyncio
import json
import sys

import rstream
from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer


async def main(a: dict) -> dict:
    n, stream = a["messages"], a["stream"]
    creds = dict(username=a["username"], password=a["password"])
    confirmed, errors = [], []

    def on_confirm(status):
        (confirmed if status.is_confirmed else errors).append(status.message_id)

    async with Producer(a["host"], a["port"], **creds) as producer:
        await producer.create_stream(stream, exists_ok=True)
        for i in range(n):
            await producer.send(stream, b"m%d" % i, on_publish_confirm=on_confirm)
        for _ in range(600):
            if len(confirmed) + len(errors) >= n:
                break
            await asyncio.sleep(0.1)

    async def read(spec, want):
        got = []
        done = asyncio.Event()

        async def on_message(msg, ctx):
            got.append((ctx.offset, bytes(msg)))
            if len(got) >= want:
                done.set()

        async with Consumer(a["host"], a["port"], **creds) as consumer:
            await consumer.subscribe(stream, on_message, decoder=lambda b: b,
                                     offset_specification=ConsumerOffsetSpecification(spec, None))
            try:
                await asyncio.wait_for(done.wait(), 30 if want > 1 else 10)
            except asyncio.TimeoutError:
                pass
        return got

    first = await read(OffsetType.FIRST, n)
    last = await read(OffsetType.LAST, 1)
    return {"version": rstream.__version__ if hasattr(rstream, "__version__") else "?",
            "module": rstream.__file__, "confirmed": len(confirmed), "errors": len(errors),
            "first_read": len(first),
            "in_order": [v for _, v in first] == [b"m%d" % i for i in range(len(first))],
            "last_first_offset": last[0][0] if last else None}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
