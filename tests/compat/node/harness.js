// Shared by the scripts here (run by tests/compat/_node.py): the test's JSON argument, a
// connection built from it, and the one JSON object a script prints as its answer.
"use strict";
const rabbit = require("rabbitmq-stream-js-client");

const args = JSON.parse(process.argv[2]);

/** A client connected with the argument's host, port, credentials and vhost. */
function connect(extra = {}) {
  return rabbit.connect({
    hostname: args.host, port: args.port, username: args.username,
    password: args.password, vhost: args.vhost, ...extra,
  });
}

/** Print `result` (BigInts as decimal strings, Buffers as hex) and exit 0. */
function answer(result) {
  const text = JSON.stringify(result, (_, value) => {
    if (typeof value === "bigint") return value.toString();
    if (value && value.type === "Buffer" && Array.isArray(value.data)) {
      return Buffer.from(value.data).toString("hex");
    }
    return value;
  });
  process.stdout.write(text + "\n", () => process.exit(0));
}

/** Run `body(args)` and answer what it returns; an error answers `{error}` and exits 1. */
function main(body) {
  body(args).then(answer, (err) => {
    process.stdout.write(JSON.stringify({ error: String(err && err.stack || err) }) + "\n",
      () => process.exit(1));
  });
}

/** The first `count` messages of `stream` from its first offset, as the client decoded them. */
async function consume(client, stream, count) {
  const messages = [];
  let done;
  const all = new Promise((resolve) => { done = resolve; });
  const consumer = await client.declareConsumer(
    { stream, offset: rabbit.Offset.first() },
    (message) => { messages.push(message); if (messages.length === count) done(); });
  if (count > 0) await all;
  await consumer.close();
  return messages.slice(0, count);
}

module.exports = { args, rabbit, connect, answer, main, consume };
