// Create `stream` with the Create `arguments`, publish `count` messages ("message-<i>") and
// read them back from the first offset: answers {bodies: [...]} in the order received.
"use strict";
const { connect, consume, main } = require("./harness");

main(async (args) => {
  const client = await connect();
  await client.createStream({ stream: args.stream, arguments: args.arguments });
  const publisher = await client.declarePublisher({ stream: args.stream });
  for (let i = 0; i < args.count; i++) await publisher.send(Buffer.from(`message-${i}`));
  await publisher.flush();
  const messages = await consume(client, args.stream, args.count);
  await client.close();
  return { bodies: messages.map((m) => m.content.toString()) };
});
