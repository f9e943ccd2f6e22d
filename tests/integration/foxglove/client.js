// A Foxglove client for rozd's tests: @foxglove/ws-protocol's FoxgloveClient
// over the `ws` package, driven by a JSON plan (argv[2]); prints one JSON
// report on stdout and exits.
//
// plan: {
//   url,                     ws://host:port/foxglove[?token=...]
//   authorization,           optional Authorization header
//   subscribe: [topic],      topics to subscribe to once advertised
//   wait: {topic: n},        messages to collect before the calls
//   calls: [{service, request}],  called one after another
//   after: {topic: n},       messages to collect after the calls
//   stall: bool,             subscribe, then never read again (prints {"stalled": true})
//   timeout_ms
// }
"use strict";
const { FoxgloveClient } = require("@foxglove/ws-protocol");
const WebSocket = require("ws");

const plan = JSON.parse(process.argv[2]);
const report = { channels: [], services: [], messages: {}, after: {}, calls: [], statuses: [] };
const done = (extra) => {
  Object.assign(report, extra || {});
  process.stdout.write(JSON.stringify(report) + "\n");
  process.exit(0);
};
setTimeout(() => done({ error: "timed out", timed_out: true }), plan.timeout_ms || 20000);

const headers = plan.authorization ? { authorization: plan.authorization } : {};
const ws = new WebSocket(plan.url, [FoxgloveClient.SUPPORTED_SUBPROTOCOL], { headers });
ws.on("unexpected-response", (_req, res) => {
  let body = "";
  res.on("data", (d) => (body += d));
  res.on("end", () => done({ error: "refused", status: res.statusCode, body }));
});
const client = new FoxgloveClient({ ws });
const decoder = new TextDecoder();
const byId = new Map(); // subscription id -> topic
let phase = "wait";
let servicesByName = new Map();
let callId = 1;
const pendingCalls = new Map();

client.on("error", (e) => done({ error: String(e && e.message ? e.message : e) }));
client.on("close", (e) => done({ closed: { code: e.code, reason: String(e.reason || "") } }));
client.on("serverInfo", (info) => (report.serverInfo = info));
client.on("status", (s) => report.statuses.push(s));
client.on("advertiseServices", (services) => {
  report.services.push(...services);
  for (const s of services) servicesByName.set(s.name, s);
  maybeStart();
});
client.on("advertise", (channels) => {
  report.channels.push(...channels);
  maybeStart();
});

let started = false;
function maybeStart() {
  if (started || report.channels.length === 0 || report.services.length === 0) return;
  started = true;
  for (const topic of plan.subscribe || []) {
    const channel = report.channels.find((c) => c.topic === topic);
    if (!channel) return done({ error: `no channel ${topic}` });
    byId.set(client.subscribe(channel.id), topic);
  }
  if (plan.stall) {
    // Never read again: the kernel's buffers fill and rozd's writer stalls.
    ws._socket.pause();
    process.stdout.write(JSON.stringify({ stalled: true }) + "\n");
    return;
  }
  check();
}

function enough(collected, wanted) {
  return Object.entries(wanted || {}).every(([t, n]) => (collected[t] || []).length >= n);
}

client.on("message", ({ subscriptionId, timestamp, data }) => {
  const topic = byId.get(subscriptionId);
  const text = decoder.decode(data);
  let body;
  try {
    body = JSON.parse(text);
  } catch (e) {
    return done({ error: `message on ${topic} is not JSON: ${text.slice(0, 200)}` });
  }
  // From the first call on, messages count as "after".
  const into = phase === "wait" ? report.messages : report.after;
  (into[topic] = into[topic] || []).push({ timestamp: timestamp.toString(), body });
  check();
});

client.on("serviceCallResponse", (r) => {
  const pending = pendingCalls.get(r.callId);
  if (!pending) return;
  pendingCalls.delete(r.callId);
  pending({ ok: true, encoding: r.encoding, response: JSON.parse(decoder.decode(r.data)) });
});
client.on("serviceCallFailure", (f) => {
  const pending = pendingCalls.get(f.callId);
  if (!pending) return;
  pendingCalls.delete(f.callId);
  pending({ ok: false, message: f.message });
});

function call(service, request) {
  const s = servicesByName.get(service);
  if (!s) return Promise.resolve({ ok: false, message: `no service ${service}` });
  const id = callId++;
  return new Promise((resolve) => {
    pendingCalls.set(id, resolve);
    client.sendServiceCallRequest({
      serviceId: s.id,
      callId: id,
      encoding: "json",
      data: new DataView(new TextEncoder().encode(JSON.stringify(request || {})).buffer),
    });
  });
}

async function check() {
  if (phase === "wait" && enough(report.messages, plan.wait)) {
    phase = "calling";
    for (const c of plan.calls || []) {
      report.calls.push({ service: c.service, ...(await call(c.service, c.request)) });
    }
    phase = "after";
  }
  if (phase === "after" && enough(report.after, plan.after)) done();
}
