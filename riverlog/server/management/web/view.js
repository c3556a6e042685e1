// riverlog's web view (index.html): reads the management API every REFRESH_MS and draws the
// overview (#/) or one stream's page (#/streams/VHOST/NAME). Charts are plotly.js (Plotly,
// from /lib/plotly.min.js); without it the page shows its tables only. Rates are computed
// from the API's `message_stats` samples (cumulative counts, newest first, as RabbitMQ's);
// lag is the `riverlog_consumer_lag` gauge's samples. Values from clients (names,
// properties) are written as text, never as HTML. Buttons of administrators call the API
// and show its refusals; nothing is fetched from another host.
"use strict";
const REFRESH_MS = 2000;
const COLOURS = {publish: "#1f77b4", confirm: "#2ca02c", deliver_get: "#ff7f0e",
                 lag: "#9467bd"};
const DASHES = {publish: "solid", confirm: "dash", deliver_get: "dot"};  // lines that overlap
const LABELS = {publish: "published", confirm: "confirmed", deliver_get: "delivered"};
let admin = false;
const NO_CELL = Symbol("no cell");  // an administrator's column, left out for others
let incrS = 5;  // msg_rates_incr: the server's sample interval, in whole seconds
let ageS = 600;  // msg_rates_age: the charts' window (#window), at most what the server keeps

// -- the API ------------------------------------------------------------------------------
async function get(path) {
  const response = await fetch(path, {credentials: "same-origin"});
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

async function send(method, path, body) {
  // {ok, text}: the answer of a change; text says why it was refused
  const init = {method, credentials: "same-origin", headers: {}};
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  try {
    const response = await fetch(path, init);
    if (response.ok) return {ok: true, text: `done (HTTP ${response.status})`};
    let reason = response.statusText;
    try { reason = (await response.json()).reason || reason; } catch (e) { /* no JSON */ }
    return {ok: false, text: `refused: HTTP ${response.status} ${reason}`};
  } catch (error) {
    return {ok: false, text: `failed: ${error.message}`};
  }
}

const enc = encodeURIComponent;
const window_ = () => `msg_rates_age=${ageS}&msg_rates_incr=${incrS}`;

// -- tables -------------------------------------------------------------------------------
function fill(id, rows, columns) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren();
  if (!rows.length) {
    const td = body.insertRow().insertCell();
    td.colSpan = document.querySelectorAll(`#${id} th:not([hidden])`).length;
    td.className = "empty"; td.textContent = "none";
    return;
  }
  for (const row of rows) {
    const tr = body.insertRow();
    for (const value of columns(row)) {
      if (value === NO_CELL) continue;
      const td = tr.insertCell();
      if (value instanceof Node) { td.append(value); continue; }
      if (typeof value === "number") td.className = "n";
      td.textContent = value === undefined || value === null ? "–" : String(value);
    }
  }
}

function link(text, href) {
  const a = document.createElement("a");
  a.href = href; a.textContent = text;
  return a;
}

function button(text, onClick, className = "danger") {
  if (!admin) return NO_CELL;
  const b = document.createElement("button");
  b.textContent = text; b.className = className;
  b.addEventListener("click", onClick);
  return b;
}

function bytes(n) {
  if (n === undefined || n === null) return null;
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function duration(ms) {
  if (ms === undefined) return null;
  const s = Math.floor(ms / 1000);
  return `${Math.floor(s / 3600)}h ${Math.floor(s / 60) % 60}m ${s % 60}s`;
}

function say(text, error = false) {
  const status = document.getElementById("status");
  status.className = error ? "error" : "";
  status.textContent = text;
}

// -- charts -------------------------------------------------------------------------------
function ratePoints(details) {
  // [times, msg/s] from cumulative samples (newest first), oldest first, never negative
  const samples = (details && details.samples) || [];
  const x = [], y = [];
  for (let i = samples.length - 1; i > 0; i--) {
    const older = samples[i], newer = samples[i - 1];
    const seconds = (newer.timestamp - older.timestamp) / 1000;
    x.push(new Date(newer.timestamp));
    y.push(seconds > 0 ? Math.max(newer.sample - older.sample, 0) / seconds : 0);
  }
  return [x, y];
}

function draw(id, traces, unit) {
  const div = document.getElementById(id);
  if (typeof Plotly === "undefined") {
    div.innerHTML = '<p class="nochart">charts need /lib/plotly.min.js (pip install plotly)</p>';
    return;
  }
  const empty = traces.every(t => t.x.length < 2);  // a line needs two points
  Plotly.react(div, traces, {
    margin: {l: 55, r: 10, t: 10, b: 35}, height: 240, showlegend: true,
    annotations: empty ? [{text: "waiting for samples…", showarrow: false, xref: "paper",
                           yref: "paper", x: 0.5, y: 0.5, font: {color: "#889"}}] : [],
    legend: {orientation: "h", y: -0.2}, xaxis: {type: "date", visible: !empty},
    yaxis: {title: {text: unit}, rangemode: "tozero", fixedrange: true,
            visible: !empty},
    paper_bgcolor: "#fff", plot_bgcolor: "#fff",
  }, {displayModeBar: false, responsive: true});
}

function drawRates(id, stats) {
  draw(id, Object.keys(LABELS).map(key => {
    const [x, y] = ratePoints(stats && stats[`${key}_details`]);
    return {x, y, name: LABELS[key], type: "scatter", mode: "lines",
            line: {color: COLOURS[key], width: 2, dash: DASHES[key]}};
  }), "msg/s");
}

function drawLag(id, holder) {
  const samples = ((holder && holder.riverlog_consumer_lag_details) || {}).samples || [];
  const points = samples.slice().reverse();
  draw(id, [{x: points.map(s => new Date(s.timestamp)), y: points.map(s => s.sample),
             name: "consumer lag", type: "scatter", mode: "lines", fill: "tozeroy",
             line: {color: COLOURS.lag, width: 2}}], "messages");
}

// -- alarms and nodes ---------------------------------------------------------------------
function banner(alarms) {
  const div = document.getElementById("alarm-banner");
  div.hidden = !alarms.length;
  div.textContent = alarms.length ? "Resource alarm in force: " +
    alarms.map(a => `${a.resource} on ${a.node}`).join(", ") +
    ". Publishers are blocked until it clears." : "";
}

function nodeAlarms(node) {
  const span = document.createElement("span");
  const names = (node.alarms || []).map(a => a.resource);
  span.className = names.length ? "alarm" : "ok";
  span.textContent = names.length ? names.join(", ") : "none";
  return span;
}

// -- the overview -------------------------------------------------------------------------
async function overviewPage() {
  const [overview, nodes, queues, connections, publishers, consumers, vhosts] =
    await Promise.all([get(`/api/overview?${window_()}`), get("/api/nodes"),
      get("/api/queues"), get("/api/stream/connections"), get("/api/stream/publishers"),
      get("/api/stream/consumers"), get("/api/vhosts")]);
  header(overview);
  drawRates("chart-rates", overview.message_stats);
  drawLag("chart-lag", overview.queue_totals);
  fill("nodes", nodes, n => [n.name, n.running ? "yes" : "no", nodeAlarms(n),
    bytes(n.disk_free), bytes(n.disk_free_limit), bytes(n.mem_used), bytes(n.mem_limit),
    duration(n.uptime)]);
  fill("streams", queues, q => [q.vhost || "/",
    link(q.name, `#/streams/${enc(q.vhost || "/")}/${enc(q.name)}`),
    q.stream, q.partition, q.subject, q.leader, (q.members || []).join(", "),
    (q.online || []).join(", "), q.first_offset, q.committed_offset, q.messages,
    rateNow(q.message_stats), q.table_lag, q.consumers,
    button("Delete", () => deleteStream(q.vhost || "/", q.name))]);
  fill("connections", connections, c => [c.vhost, c.name, c.user_provided_name, c.user,
    [c.client_properties.product, c.client_properties.version].filter(Boolean).join(" "),
    c.state, button("Close", () => closeConnection(c.name))]);
  fill("publishers", publishers, p => [p.queue.vhost, p.queue.name, p.publisher_id, p.reference,
    p.connection_details.name, p.messages_published, p.messages_confirmed,
    p.messages_errored]);
  fill("consumers", consumers, c => [c.queue.vhost, c.queue.name, c.subscription_id,
    c.connection_details.name, c.offset, c.offset_lag, c.messages_consumed, c.credits,
    c.activity_status]);
  fill("vhosts", vhosts, v => [v.name, v.description,
    v.name === "/" ? (admin ? "" : NO_CELL) : button("Delete", () => deleteVhost(v.name))]);
}

function rateNow(stats) {
  const details = stats && stats.publish_details;
  return details ? details.rate : null;
}

function header(overview) {
  document.getElementById("node").textContent = `(${overview.node})`;
  incrS = Math.max(1, Math.round((overview.riverlog_sample_interval_ms || 5000) / 1000));
  banner(overview.alarms || []);
}

// -- a stream's page ----------------------------------------------------------------------
async function streamPage(vhost, name) {
  const q = `${enc(vhost)}/${enc(name)}`;
  const [overview, queue, publishers, consumers] = await Promise.all([
    get(`/api/overview`), get(`/api/queues/${q}?${window_()}`),
    get(`/api/stream/publishers/${q}`), get(`/api/stream/consumers/${q}`)]);
  header(overview);
  document.getElementById("stream-name").textContent = name;
  const stats = queue.message_stats || {};
  document.getElementById("stream-summary").textContent =
    `${queue.messages ?? "–"} messages, offsets ${queue.first_offset ?? "–"} to ` +
    `${queue.committed_offset ?? "–"}, leader ${queue.leader ?? "–"}, ` +
    `${queue.consumers} ` +
    `consumer(s); published ${stats.publish ?? 0}, confirmed ${stats.confirm ?? 0}, ` +
    `delivered ${stats.deliver_get ?? 0} since the server started`;
  drawRates("stream-chart-rates", stats);
  drawLag("stream-chart-lag", queue);
  fill("stream-publishers", publishers, p => [p.publisher_id, p.reference,
    p.connection_details.name, p.messages_published, p.messages_confirmed,
    p.messages_errored]);
  fill("stream-consumers", consumers, c => [c.subscription_id, c.connection_details.name,
    c.offset, c.offset_lag, c.messages_consumed, c.credits, c.activity_status]);
}

// -- administrators' actions ----------------------------------------------------------------
async function act(method, path, what, body, messageId) {
  const result = await send(method, path, body);
  const text = `${what}: ${result.text}`;
  if (messageId) {
    const span = document.querySelector(`#${messageId} .message`);
    span.className = result.ok ? "message ok" : "message error";
    span.textContent = text;
  }
  if (!result.ok) say(text, true);
  await refresh(false);
  return result.ok;
}

async function closeConnection(name) {
  if (!confirm(`Close connection ${name}?`)) return;
  await act("DELETE", `/api/connections/${enc(name)}`, `close ${name}`);
}

async function deleteStream(vhost, name) {
  if (!confirm(`Delete stream ${name} and all its messages?`)) return;
  if (await act("DELETE", `/api/queues/${enc(vhost)}/${enc(name)}`, `delete ${name}`)) {
    if (location.hash.startsWith("#/streams/")) location.hash = "#/";
  }
}

async function deleteVhost(name) {
  if (!confirm(`Delete virtual host ${name}, its streams and connections?`)) return;
  await act("DELETE", `/api/vhosts/${enc(name)}`, `delete virtual host ${name}`, undefined,
            "create-vhost");
}

document.getElementById("create-stream").addEventListener("submit", async event => {
  event.preventDefault();
  const form = event.target;
  const name = form.elements.name.value.trim();
  const args = {"x-queue-type": "stream"};
  if (form.elements.max_age.value.trim()) args["x-max-age"] = form.elements.max_age.value.trim();
  if (await act("PUT", `/api/queues/%2F/${enc(name)}`, `create stream ${name}`,
                {durable: true, auto_delete: false, arguments: args}, "create-stream")) {
    form.reset();
  }
});

document.getElementById("create-vhost").addEventListener("submit", async event => {
  event.preventDefault();
  const form = event.target;
  const name = form.elements.name.value.trim();
  if (await act("PUT", `/api/vhosts/${enc(name)}`, `create virtual host ${name}`, {},
                "create-vhost")) {
    form.reset();
  }
});

document.getElementById("delete-stream").addEventListener("click", () => {
  const [, vhost, name] = streamRoute();
  deleteStream(vhost, name);
});

// -- routing and refresh --------------------------------------------------------------------
function streamRoute() {
  // ["streams", vhost, name] of #/streams/VHOST/NAME, else null
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  return parts[0] === "streams" && parts.length === 3 ? parts : null;
}

let refreshing = false;
async function refresh(scheduled = true) {
  if (refreshing && scheduled) return;  // a slow API: skip a turn rather than pile up
  refreshing = true;
  const route = streamRoute();
  document.getElementById("overview-page").hidden = route !== null;
  document.getElementById("stream-page").hidden = route === null;
  try {
    if (route) await streamPage(route[1], route[2]);
    else await overviewPage();
    if (document.getElementById("status").className !== "error" || scheduled) {
      say(`updated ${new Date().toLocaleTimeString()}`);
    }
  } catch (error) {
    say(`cannot read the management API: ${error.message}`, true);
  } finally {
    refreshing = false;
  }
}

async function start() {
  try {
    const me = await get("/api/whoami");
    admin = (me.tags || []).includes("administrator");
    document.getElementById("user").textContent =
      `${me.name}${admin ? " (administrator)" : ""}`;
    for (const el of document.querySelectorAll(".admin")) el.hidden = !admin;
  } catch (error) {
    say(`cannot read the management API: ${error.message}`, true);
  }
  window.addEventListener("hashchange", () => refresh(false));
  document.getElementById("window").addEventListener("change", event => {
    ageS = Number(event.target.value);
    refresh(false);
  });
  await refresh();
  setInterval(refresh, REFRESH_MS);
}

start();
