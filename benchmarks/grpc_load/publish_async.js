// Load generator of benchmarks/liftbridge_bench.py (benchmark only, not part of riverlog or
// its tests; not installed by CI): @grpc/grpc-js calling /proto.API/PublishAsync on riverlog.
// Usage: node publish_async.js ADDR STREAM MESSAGES SIZE CALLS PROTO
// Encodes MESSAGES PublishRequests (SIZE-byte values, distinct correlation ids) with
// protobufjs from PROTO, connects, prints "ready", waits for a line on stdin, then runs CALLS
// concurrent PublishAsync calls on one channel sending them; prints "done <acked> <seconds>"
// once every PublishResponse is in. Requests are encoded before the clock starts and responses
// are checked (a PublishResponse with an asyncError, field 2, fails the run) but not decoded
// further, so the client spends its time in gRPC and HTTP/2, as a producer reusing buffers would.
'use strict';
const grpc = require('@grpc/grpc-js');
const protobuf = require('protobufjs');

const [addr, stream, total, size, calls, proto] = process.argv.slice(2);
const PublishRequest = protobuf.loadSync(proto).lookupType('proto.PublishRequest');
const ncalls = Number(calls);
const per = Math.floor(Number(total) / ncalls);
const value = Buffer.alloc(Number(size), 120);
const batches = Array.from({length: ncalls}, (_, c) => Array.from({length: per}, (_, i) =>
  Buffer.from(PublishRequest.encode({stream, value, correlationId: `${c}-${i}`}).finish())));
const client = new grpc.Client(addr, grpc.credentials.createInsecure());
const identity = (b) => b;

function failed(resp) {
  // top level of a PublishResponse: skip field 1 (ack), then field 2 is an asyncError
  let pos = 0;
  if (resp[pos] === 0x0a) {
    let len = 0, shift = 0, byte;
    pos += 1;
    do { byte = resp[pos++]; len |= (byte & 0x7f) << shift; shift += 7; } while (byte & 0x80);
    pos += len;
  }
  return resp[pos] === 0x12;
}

function run(requests) {
  return new Promise((resolve, reject) => {
    const call = client.makeBidiStreamRequest('/proto.API/PublishAsync', identity, identity);
    let acked = 0;
    let sent = 0;
    call.on('data', (resp) => {
      if (failed(resp)) { reject(new Error('PublishAsync answered an asyncError')); return; }
      acked += 1;
      if (acked === requests.length) { call.end(); resolve(acked); }
    });
    call.on('error', (err) => { if (acked < requests.length) reject(err); });
    function pump() {
      while (sent < requests.length) {
        const ok = call.write(requests[sent]);
        sent += 1;
        if (!ok) { call.once('drain', pump); return; }
      }
    }
    pump();
  });
}

client.waitForReady(Date.now() + 30000, (err) => {
  if (err) { console.error(err); process.exit(1); }
  console.log('ready');
  process.stdin.once('data', async () => {
    const start = process.hrtime.bigint();
    const counts = await Promise.all(batches.map(run));
    const secs = Number(process.hrtime.bigint() - start) / 1e9;
    console.log(`done ${counts.reduce((a, b) => a + b, 0)} ${secs}`);
    client.close();
    process.exit(0);
  });
});
