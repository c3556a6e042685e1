// Connect with the argument's credentials and vhost, expecting a refusal, and report what the
// client went through until the server closed the socket: {closed: true, errors: [...]}, the
// errors being whatever the client raised meanwhile, caught process-wide (this client raises
// a refused login as an unhandled rejection and leaves connect() pending).
"use strict";
const { connect, answer } = require("./harness");

const errors = [];
const record = (err) => errors.push(String(err && err.message || err));
process.on("uncaughtException", record);
process.on("unhandledRejection", record);
const closed = () => setImmediate(() => answer({ closed: true, errors }));
connect({ listeners: { connection_closed: closed } })
  .then(() => answer({ closed: false, connected: true, errors }), record);
