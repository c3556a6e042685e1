// client.close() while a consumer's close() is under way: the client then sends a second
// Close on the consumer's connection right behind the first one (both unanswered yet), and
// waits for both CloseResponses. Answers {closed: true} once client.close() returned.
"use strict";
const { rabbit, connect, main } = require("./harness");

main(async (args) => {
  const client = await connect();
  await client.createStream({ stream: args.stream });
  const consumer = await client.declareConsumer(
    { stream: args.stream, offset: rabbit.Offset.first() }, () => {});
  await Promise.all([consumer.close(), client.close()]);
  return { closed: true };
});
