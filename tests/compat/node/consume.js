// Read the first `count` messages of `stream`: answers {messages: [{content (hex),
// applicationProperties, messageAnnotations, messageProperties}]} as the client decoded them.
"use strict";
const { connect, consume, main } = require("./harness");

main(async (args) => {
  const client = await connect();
  const messages = await consume(client, args.stream, args.count);
  await client.close();
  return {
    messages: messages.map((m) => ({
      content: m.content.toString("hex"),
      applicationProperties: m.applicationProperties,
      messageAnnotations: m.messageAnnotations,
      messageProperties: m.messageProperties,
    })),
  };
});
