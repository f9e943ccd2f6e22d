// The rozd dashboard. One live stream per tab (GET /v1/observation/stream,
// server-sent events read with fetch() so the token travels as a header),
// and one MJPEG stream per camera, read the same way; everything else is
// fetched once, or again when the stream says something changed. The page
// never polls in a loop.
"use strict";

const TOKEN_KEY = "rozd-token";
const HISTORY_SECS = 180;
const $ = (id) => document.getElementById(id);

let token = sessionStorage.getItem(TOKEN_KEY) || "";
let lastEventId = "";
let streamGen = 0;
const sensors = new Map();      // name -> {card, plot, xs, ys, detail}
let world = null;               // /v1/sim
let lastStatus = null;
let watchedTask = null;
let auditTimer = null;
let lastActuatorKey = "";

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : String(c ?? ""));
  return e;
}

function headers(json) {
  const h = {};
  if (token) h["Authorization"] = "Bearer " + token;
  if (json) h["Content-Type"] = "application/json";
  return h;
}

class Unauthorized extends Error {}

async function api(method, path, body) {
  const init = { method, headers: headers(body !== undefined), cache: "no-store" };
  if (body !== undefined) init.body = JSON.stringify(body);
  const r = await fetch(path, init);
  if (r.status === 401) { askToken(refusedMessage()); throw new Unauthorized(); }
  let data = null;
  try { data = await r.json(); } catch (_) { /* empty */ }
  if (!r.ok) throw new Error((data && data.error && data.error.message) || ("HTTP " + r.status));
  return data;
}

// ---- the token ----
// Only a token that was sent can have been refused; without one the
// dialog just asks. It is not modal: STOP stays in reach while it is open.
function refusedMessage() {
  return token ? "The token was refused: check it and enter it again." : "";
}

function askToken(message) {
  token = "";
  sessionStorage.removeItem(TOKEN_KEY);
  $("token-error").textContent = message || "";
  $("link").textContent = "waiting for a token";
  const d = $("token-dialog");
  if (!d.open) d.show();
  $("token-input").focus();
}

$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  token = $("token-input").value.trim();
  sessionStorage.setItem(TOKEN_KEY, token);
  $("token-input").value = "";
  $("token-dialog").close();
  start();
});

// ---- the stop ----
$("stop-button").addEventListener("click", async () => {
  // One click, no confirmation: going safe is never gated.
  try {
    const s = await fetch("/v1/estop", { method: "POST", headers: headers(true), body: JSON.stringify({ reason: "dashboard STOP button" }) });
    if (s.ok) { $("safety-message").textContent = ""; showSafety(await s.json()); return; }
    if (s.status === 401) {
      // Anyone who may talk to this rozd may stop it, but it must know who:
      // it answers only callers with a token.
      const why = token
        ? "STOP was NOT sent: this rozd refused the token. Enter a valid token, then press STOP again."
        : "STOP was NOT sent: this rozd needs a token (any valid token may stop it). Enter it, then press STOP again.";
      $("safety-message").textContent = why;
      askToken(why);
      return;
    }
    const body = await s.json().catch(() => null);
    $("safety-message").textContent = "STOP was NOT confirmed: HTTP " + s.status + ((body && body.error) ? ": " + body.error.message : "");
  } catch (err) { $("safety-message").textContent = "STOP was NOT sent: " + err.message; }
});

$("clear-button").addEventListener("click", async () => {
  if (!confirm("Clear the protective stop?\n\nClearing moves nothing: actuators stay at their safe values until commanded again.")) return;
  try { showSafety(await api("POST", "/v1/estop/clear", { reason: "cleared from the dashboard" })); $("safety-message").textContent = ""; }
  catch (err) { if (!(err instanceof Unauthorized)) $("safety-message").textContent = err.message; }
});

function showSafety(s) {
  const active = s.active ?? s.estop_active;
  const causes = s.causes || [];
  $("stop-state").textContent = active ? "PROTECTIVE STOP" : "normal";
  $("stop-state").classList.toggle("active", !!active);
  $("safety").classList.toggle("active", !!active);
  $("clear-button").hidden = !active;
  $("stop-causes").replaceChildren(...causes.map((c) => el("li", {},
    el("b", {}, c.source), ": ", c.reason, c.by ? " (by " + c.by + ")" : "", " — since ", time(c.since_unix_ms))));
}

// ---- formatting ----
function time(ms) { return ms ? new Date(ms).toLocaleTimeString() : "—"; }
function num(v) { return v === null || v === undefined ? "—" : (Math.abs(v) >= 100 ? v.toFixed(1) : (+v.toFixed(3)).toString()); }
function dur(secs) {
  const d = Math.floor(secs / 86400), h = Math.floor(secs % 86400 / 3600), m = Math.floor(secs % 3600 / 60), s = secs % 60;
  return (d ? d + "d " : "") + (d || h ? h + "h " : "") + m + "m " + s + "s";
}
function fact(label, value) { return el("span", {}, label + " ", el("b", {}, value)); }

// ---- status ----
function showStatus(s) {
  const changedSessions = !lastStatus || lastStatus.sessions.active !== s.sessions.active || lastStatus.sessions.total !== s.sessions.total;
  lastStatus = s;
  $("host-name").textContent = s.name || s.host_id;
  $("host-id").textContent = s.host_id;
  setTitle();
  const o = s.ooda || {};
  $("host-facts").replaceChildren(
    fact("environment", s.environment_id), fact("version", s.version), fact("up", dur(s.uptime_secs)),
    fact("listen", s.listen), fact("auth", s.auth_required ? "token required" : "none (loopback)"),
    fact("TLS", location.protocol === "https:" ? "on" : "off"),
    fact("loop", o.tick_hz + " Hz (" + o.timer + ")"),
    fact("lateness p50/p99", (o.lateness_p50_us ?? 0) + " / " + (o.lateness_p99_us ?? 0) + " µs"),
    fact("missed ticks", o.missed_ticks ?? 0));
  showCameras(s.cameras);
  if (changedSessions) loadSessions();
}

async function loadSessions() {
  try {
    const r = await api("GET", "/v1/sessions?limit=10");
    $("sessions").tBodies[0].replaceChildren(...r.data.map((x) => el("tr", {},
      el("td", {}, el("code", {}, x.id.slice(0, 8))), el("td", {}, x.model), el("td", {}, time(x.started_at_ms)),
      el("td", {}, x.turns), el("td", {}, x.ended_at_ms ? x.end_reason : el("b", {}, "running")))));
  } catch (_) { /* shown by the link state */ }
}

// ---- sensors ----
// Cards and pills keep the configuration's order (the Observation's), not
// the order in which each sensor's own request happens to answer.
function placeInOrder(container, element, index) {
  element.dataset.order = index;
  const after = [...container.children].find((c) => +c.dataset.order > index);
  container.insertBefore(element, after || null);
}

async function ensureSensor(s, index) {
  if (sensors.has(s.name)) return sensors.get(s.name);
  const entry = { xs: [], ys: [], detail: null, card: null, plot: null, pill: null };
  sensors.set(s.name, entry);
  try { entry.detail = await api("GET", "/v1/sensors/" + encodeURIComponent(s.name)); } catch (_) { entry.detail = {}; }
  if (entry.detail && entry.detail.digital) {
    entry.pill = el("span", { class: "pill", "data-input": s.name }, s.name);
    placeInOrder($("inputs"), entry.pill, index);
    return entry;
  }
  const value = el("span", { class: "value" }, "—");
  const badges = el("span", {});
  const plotBox = el("div", {});
  entry.card = el("div", { class: "sensor", "data-sensor": s.name },
    el("div", { class: "head" }, el("b", {}, s.name), value), badges, plotBox);
  entry.value = value; entry.badges = badges;
  placeInOrder($("sensors"), entry.card, index);
  // The plot starts with the last 3 minutes: the trend (each half second's
  // lowest and highest value) up to where the recent samples begin.
  const now = Date.now() / 1000;
  const history = entry.detail.history || [];
  const recentFrom = history.length ? now - history[0].age_ms / 1000 : Infinity;
  for (const p of entry.detail.trend || []) {
    const t = now - p.age_ms / 1000;
    if (t >= recentFrom) break;
    const [a, b] = p.rising ? [p.min, p.max] : [p.max, p.min];
    entry.xs.push(t); entry.ys.push(a);
    if (p.max !== p.min) { entry.xs.push(t + 0.25); entry.ys.push(b); }
  }
  for (const h of history) {
    const t = now - h.age_ms / 1000;
    if (!entry.xs.length || t > entry.xs[entry.xs.length - 1]) { entry.xs.push(t); entry.ys.push(h.value); }
  }
  const limits = entry.detail.limits || {};
  entry.plot = makePlot(plotBox, s, limits);
  entry.plot.setData([entry.xs, entry.ys]);
  if (entry.xs.length) { plotBox.dataset.from = entry.xs[0]; plotBox.title = "plotted from " + time(entry.xs[0] * 1000); }
  plotBox.className = "plot";
  entry.card.append(limitLegend(limits, s.unit));
  return entry;
}

// What the dashed lines of a plot are.
const LIMITS = [["critical_max", "critical"], ["warn_max", "warn"], ["warn_min", "warn"], ["critical_min", "critical"]];

function limitLegend(limits, unit) {
  const shown = LIMITS.filter(([k]) => limits[k] !== null && limits[k] !== undefined);
  if (!shown.length) return el("div", { class: "legend muted" }, "no limits");
  return el("div", { class: "legend" }, ...shown.map(([k, level]) =>
    el("span", { class: "limit " + level, title: k }, el("i", {}), k.replace("_", " ") + " " + num(limits[k]) + (unit ? " " + unit : ""))));
}

function makePlot(box, s, limits) {
  const width = Math.max(260, box.clientWidth || 300);
  const bands = [["warn_min", "#f59e0b"], ["warn_max", "#f59e0b"], ["critical_min", "#dc2626"], ["critical_max", "#dc2626"]]
    .filter(([k]) => limits[k] !== null && limits[k] !== undefined);
  const opts = {
    width, height: 120, legend: { show: false }, cursor: { show: false },
    scales: { x: { time: true }, y: { auto: true, range: (u, min, max) => {
      const vals = [min, max, ...bands.map(([k]) => limits[k])].filter(Number.isFinite);
      let lo = Math.min(...vals), hi = Math.max(...vals);
      if (lo === hi) { lo -= 1; hi += 1; }
      const pad = (hi - lo) * 0.08; return [lo - pad, hi + pad];
    } } },
    axes: [{ size: 28 }, { size: 44, label: s.unit || "" }],
    series: [{}, { stroke: "#2563eb", width: 1.5 }],
    hooks: { draw: [(u) => {
      const ctx = u.ctx;
      for (const [k, color] of bands) {
        const y = u.valToPos(limits[k], "y", true);
        ctx.save(); ctx.strokeStyle = color; ctx.setLineDash([6, 4]); ctx.lineWidth = 1.5;
        ctx.beginPath(); ctx.moveTo(u.bbox.left, y); ctx.lineTo(u.bbox.left + u.bbox.width, y); ctx.stroke(); ctx.restore();
      }
    }] },
  };
  return new uPlot(opts, [[], []], box);
}

function showSensor(entry, s) {
  if (entry.pill) {
    entry.pill.classList.toggle("on", s.value === 1);
    entry.pill.classList.toggle("critical", s.alarm === "critical");
    entry.pill.classList.toggle("warn", s.alarm === "warn");
    entry.pill.textContent = s.name + (s.value === null ? " —" : s.value === 1 ? " ON" : " off");
    entry.pill.title = s.health + (s.age_ms !== null ? ", " + s.age_ms + " ms old" : "");
    return;
  }
  if (!entry.card) return;
  entry.card.classList.toggle("critical", s.alarm === "critical");
  entry.card.classList.toggle("warn", s.alarm === "warn");
  entry.value.textContent = num(s.value) + (s.unit ? " " + s.unit : "");
  entry.badges.replaceChildren(
    el("span", { class: "badge " + s.health }, s.health), " ",
    el("span", { class: "badge " + s.alarm }, "alarm " + s.alarm), " ",
    el("span", { class: "muted" }, s.age_ms === null ? "no value yet" : "age " + s.age_ms + " ms"),
    s.error ? el("div", { class: "error" }, s.error) : "");
  if (s.value !== null && s.age_ms !== null) {
    const t = Date.now() / 1000 - s.age_ms / 1000;
    if (!entry.xs.length || t > entry.xs[entry.xs.length - 1]) { entry.xs.push(t); entry.ys.push(s.value); }
    const cutoff = Date.now() / 1000 - HISTORY_SECS;
    while (entry.xs.length && entry.xs[0] < cutoff) { entry.xs.shift(); entry.ys.shift(); }
    if (entry.plot) entry.plot.setData([entry.xs, entry.ys]);
  }
}

// ---- alarms: every sensor at warn or critical, impossible to miss ----
let lastAlarmKey = "";
let criticalCount = 0;

function setTitle() {
  const name = lastStatus ? lastStatus.name || lastStatus.host_id : "";
  document.title = (criticalCount ? "\u26a0 " + criticalCount + " CRITICAL · " : "") + "rozd · " + name;
}

// An actuator's alarms: its feedback's mismatch (commanded is not what was
// measured) and a safe value its device never confirmed; both critical.
function actuatorAlarms(actuatorList) {
  const unit = (a) => (a.unit ? " " + a.unit : "");
  const alarms = [];
  for (const a of actuatorList || []) {
    if (a.mismatch) {
      alarms.push({ key: a.name + ".mismatch", text: [a.name, a.value, a.measured].join("|"),
        node: () => el("div", { class: "alarm critical", "data-alarm": a.name + ".mismatch" },
          el("span", { class: "level" }, "MISMATCH"),
          el("span", {}, el("b", {}, a.name), " commanded " + num(a.value) + unit(a)),
          el("span", { class: "limit" }, a.feedback_sensor + " measured " + (a.measured === null || a.measured === undefined ? "nothing" : num(a.measured))
            + (a.expected === null || a.expected === undefined ? "" : ", expected " + num(a.expected))),
          el("span", { class: "since" }, "feedback " + (a.feedback_status || "—"))) });
    }
    if (a.safe_unconfirmed) {
      alarms.push({ key: a.name + ".safe_unconfirmed", text: a.safe_unconfirmed,
        node: () => el("div", { class: "alarm critical", "data-alarm": a.name + ".safe_unconfirmed" },
          el("span", { class: "level" }, "NOT SAFE?"),
          el("span", {}, el("b", {}, a.name), " safe value " + num(a.safe_value) + unit(a) + " not confirmed by the device"),
          el("span", { class: "limit" }, a.safe_unconfirmed)) });
    }
  }
  return alarms;
}

function showAlarms(sensorList, actuatorList) {
  const alarmed = sensorList.filter((s) => s.alarm === "critical" || s.alarm === "warn")
    .sort((a, b) => (a.alarm === b.alarm ? 0 : a.alarm === "critical" ? -1 : 1));
  const actuated = actuatorAlarms(actuatorList);
  const key = actuated.map((a) => a.key + "|" + a.text).concat(alarmed.map((s) => [s.name, s.alarm, num(s.value), s.alarm_since_unix_ms].join("|"))).join(",");
  if (key === lastAlarmKey) return;
  lastAlarmKey = key;
  const banner = $("alarm-banner");
  banner.hidden = !alarmed.length && !actuated.length;
  banner.classList.toggle("warn-only", !actuated.length && !alarmed.some((s) => s.alarm === "critical"));
  criticalCount = actuated.length + alarmed.filter((s) => s.alarm === "critical").length;
  setTitle();
  const unit = (s) => (s.unit ? " " + s.unit : "");
  banner.replaceChildren(...actuated.map((a) => a.node()), ...alarmed.map((s) => {
    const l = s.alarm_limit;
    const side = l ? (l.limit.endsWith("_min") ? "below " : "above ") + l.limit + " " + num(l.value) + unit(s) : "";
    return el("div", { class: "alarm " + s.alarm, "data-alarm": s.name },
      el("span", { class: "level" }, s.alarm.toUpperCase()),
      el("span", {}, el("b", {}, s.name), " ", num(s.value) + unit(s)),
      side ? el("span", { class: "limit" }, side) : "",
      s.alarm_since_unix_ms ? el("span", { class: "since" }, "since " + time(s.alarm_since_unix_ms)) : "",
      s.health !== "ok" ? el("span", { class: "since" }, "(" + s.health + ")") : "");
  }));
}

// ---- reflex rules ----
const PHASES = { armed: ["armed", "ok"], holding: ["condition true, holding", "warn"], fired: ["fired, re-arms when false", "critical"] };

function showRules(list) {
  $("rules-none").hidden = list.length > 0;
  $("rules").hidden = !list.length;
  $("rules").tBodies[0].replaceChildren(...list.map((r) => {
    const [label, cls] = PHASES[r.phase] || [r.phase, ""];
    const when = r.when + (r.for_ms ? " for " + r.for_ms + " ms" : "") + (r.cooldown_ms ? ", cooldown " + r.cooldown_ms + " ms" : "");
    return el("tr", { "data-rule": r.name },
      el("td", {}, el("b", {}, r.name)), el("td", {}, el("code", {}, when)), el("td", {}, r.then),
      el("td", { class: "phase" }, el("span", { class: "badge " + cls }, label)),
      el("td", { class: "fired" }, r.fired), el("td", {}, time(r.last_fired_unix_ms)),
      el("td", { class: "result" }, r.last_result || (r.fired ? "…" : "—")));
  }));
}

// ---- actuators ----
let actuatorSpecs = new Map();   // name -> GET /v1/actuators entry

function range(spec) {
  if (!spec) return "—";
  if (spec.allowed) return "{" + spec.allowed.map(num).join(", ") + "}";
  if (spec.min === null && spec.max === null) return "—";
  return num(spec.min) + " … " + num(spec.max);
}

// "session 1f2e3d4c", "rule stop_before", "mcp:5a6b7c8d": the kind and a short id (the whole in the tooltip).
function shortOwner(owner) {
  if (!owner) return "—";
  const [kind, ...rest] = owner.split(" ");
  const id = rest.join(" ");
  if (!id) return el("span", { title: owner }, owner.length > 18 ? owner.slice(0, 17) + "…" : owner);
  const tail = id.split(":").pop();
  return el("span", { title: owner }, kind + " " + (tail.length > 10 ? tail.slice(0, 8) + "…" : tail));
}

// Commanded versus measured: only `confirmed` means the hardware did it.
const VERDICTS = { confirmed: "ok", settling: "", unconfirmed: "warn", mismatch: "critical" };
function feedbackCell(a) {
  if (!a.feedback_sensor) return el("td", { class: "feedback muted" }, "—");
  const status = a.feedback_status || "none yet";
  const measured = a.measured === null || a.measured === undefined ? "no value" : num(a.measured);
  return el("td", { class: "feedback", title: "feedback from " + a.feedback_sensor },
    el("span", { class: "badge " + (VERDICTS[a.feedback_status] || "") }, a.mismatch && status !== "mismatch" ? status + ", MISMATCH ALARM" : status),
    " " + a.feedback_sensor + " " + measured);
}

function safeBadge(a) {
  if (a.at_safe_value) return el("span", { class: "badge ok" }, "at safe");
  if (a.safe_unconfirmed) return el("span", { class: "badge critical", title: a.safe_unconfirmed }, "NOT confirmed");
  return el("span", { class: "badge warn" }, "moved");
}

function showActuators(list) {
  $("actuators").tBodies[0].replaceChildren(...list.map((a) => el("tr", { "data-actuator": a.name, class: a.mismatch || a.safe_unconfirmed ? "alarmed" : "" },
    el("td", {}, a.name), el("td", { class: "value" }, num(a.value) + (a.unit ? " " + a.unit : "")),
    el("td", { class: "range" }, range(actuatorSpecs.get(a.name))),
    el("td", { class: "safe" }, num(a.safe_value), " ", safeBadge(a)),
    feedbackCell(a),
    el("td", { class: "owner" }, shortOwner(a.owner)), el("td", {}, a.hold_remaining_ms === null ? "—" : (a.hold_remaining_ms / 1000).toFixed(1) + " s"))));
  const key = list.map((a) => a.name + "=" + a.value + "@" + a.owner).join(",");
  if (key !== lastActuatorKey) { lastActuatorKey = key; scheduleAudit(); }
}

// ---- the simulated world ----
async function showWorld(rover, observation) {
  if (!rover) { $("world-card").hidden = true; return; }
  if (!world) {
    world = {};
    try { world = await api("GET", "/v1/sim"); } catch (_) { world = null; return; }
  }
  if (!world.width) return;
  $("world-card").hidden = false;
  const c = $("world"), ctx = c.getContext("2d");
  const scale = Math.min((c.width - 20) / world.width, (c.height - 20) / world.depth);
  const X = (x) => 10 + x * scale, Y = (y) => c.height - 10 - y * scale;
  ctx.clearRect(0, 0, c.width, c.height);
  ctx.strokeStyle = "#1d2330"; ctx.lineWidth = 2; ctx.strokeRect(X(0), Y(world.depth), world.width * scale, world.depth * scale);
  ctx.fillStyle = "#9ca3af";
  for (const o of world.obstacles) ctx.fillRect(X(o.min_x), Y(o.max_y), (o.max_x - o.min_x) * scale, (o.max_y - o.min_y) * scale);
  if (rover.object && !rover.holding) { ctx.fillStyle = "#a855f7"; ctx.fillRect(X(rover.object[0]) - 4, Y(rover.object[1]) - 4, 8, 8); }
  const h = rover.heading_deg * Math.PI / 180, r = world.rover_radius;
  const range = world.range_sensor && observation.sensors.find((s) => s.name === world.range_sensor);
  if (range && range.value !== null) {
    const fx = rover.x + Math.cos(h) * r, fy = rover.y + Math.sin(h) * r;
    ctx.strokeStyle = "#ef4444"; ctx.setLineDash([5, 4]); ctx.lineWidth = 1.5; ctx.beginPath();
    ctx.moveTo(X(fx), Y(fy)); ctx.lineTo(X(fx + Math.cos(h) * range.value), Y(fy + Math.sin(h) * range.value)); ctx.stroke(); ctx.setLineDash([]);
  }
  ctx.fillStyle = rover.bumper ? "#dc2626" : "#2563eb";
  ctx.beginPath(); ctx.arc(X(rover.x), Y(rover.y), Math.max(4, r * scale), 0, 2 * Math.PI); ctx.fill();
  ctx.strokeStyle = "#fff"; ctx.lineWidth = 2; ctx.beginPath(); ctx.moveTo(X(rover.x), Y(rover.y));
  ctx.lineTo(X(rover.x + Math.cos(h) * r), Y(rover.y + Math.sin(h) * r)); ctx.stroke();
  $("world-facts").replaceChildren(fact("x", num(rover.x) + " m"), fact("y", num(rover.y) + " m"), fact("heading", num(rover.heading_deg) + "°"),
    fact("speed", num(rover.speed) + " m/s"), fact("range", range ? num(range.value) + " m" : "—"), fact("collisions", rover.collisions),
    fact("bumper", rover.bumper ? "pressed" : "free"));
}

// ---- cameras: each one live beside the world ----
// One stream.mjpeg per camera, read with fetch() (the token travels as a
// header, never in a URL); every whole part becomes the <img>'s picture.
// The server sends the latest frame when the page is ready for one, so a
// slow page skips frames instead of queueing them.
const cameras = new Map();      // name -> {figure, img, caption, gen, frames}
const CRLF2 = [13, 10, 13, 10];

function indexOf(bytes, pattern, from) {
  outer: for (let i = from; i + pattern.length <= bytes.length; i++) {
    for (let j = 0; j < pattern.length; j++) if (bytes[i + j] !== pattern[j]) continue outer;
    return i;
  }
  return -1;
}

function showCameras(list) {
  if (!list || !list.length) { $("cameras-card").hidden = true; return; }
  $("cameras-card").hidden = false;
  list.forEach((c, i) => {
    let cam = cameras.get(c.name);
    if (!cam) {
      const img = el("img", { alt: c.name + " (live)" });
      const caption = el("figcaption");
      const figure = el("figure", { class: "camera", "data-camera": c.name }, img, caption);
      cam = { figure, img, caption, gen: -1, frames: 0 };
      cameras.set(c.name, cam);
      placeInOrder($("cameras"), figure, i);
    }
    if (streamGen > 0 && cam.gen !== streamGen) { cam.gen = streamGen; watchCamera(c.name, cam, streamGen); }
    cam.caption.replaceChildren(el("b", {}, c.name), el("span", { class: "badge " + c.health }, c.health),
      c.width ? el("span", {}, c.width + "×" + c.height) : "", el("span", {}, num(c.fps) + " fps"),
      c.description ? el("span", {}, c.description) : "",
      c.last_error && c.health !== "ok" ? el("span", { class: "error" }, c.last_error) : "");
  });
}

async function watchCamera(name, cam, gen) {
  // Reconnects while the page's stream generation lasts (a new token starts a new one).
  while (gen === streamGen) {
    try { await cameraStream(name, cam, gen); } catch (err) { if (err instanceof Unauthorized) return; }
    if (gen !== streamGen) return;
    await new Promise((res) => setTimeout(res, 2000));
  }
}

async function cameraStream(name, cam, gen) {
  const r = await fetch("/v1/cameras/" + encodeURIComponent(name) + "/stream.mjpeg", { headers: headers(false), cache: "no-store" });
  if (r.status === 401) throw new Unauthorized();
  if (!r.ok || !r.body) { cam.figure.setAttribute("data-refused", String(r.status)); return; }
  const reader = r.body.getReader();
  let buffer = new Uint8Array(0);
  try {
    while (gen === streamGen) {
      const { value, done } = await reader.read();
      if (done) return;
      const joined = new Uint8Array(buffer.length + value.length);
      joined.set(buffer); joined.set(value, buffer.length); buffer = joined;
      for (;;) {
        const end = indexOf(buffer, CRLF2, 0);
        if (end < 0) break;
        const head = new TextDecoder().decode(buffer.subarray(0, end));
        const m = /content-length:\s*(\d+)/i.exec(head);
        if (!m) { buffer = buffer.slice(end + 4); continue; }
        const length = +m[1];
        if (buffer.length < end + 4 + length) break;
        const jpeg = buffer.slice(end + 4, end + 4 + length);
        buffer = buffer.slice(end + 4 + length);
        const old = cam.img.src;
        cam.img.src = URL.createObjectURL(new Blob([jpeg], { type: "image/jpeg" }));
        if (old.startsWith("blob:")) URL.revokeObjectURL(old);
        cam.frames += 1;
        cam.figure.setAttribute("data-frames", String(cam.frames));
      }
    }
  } finally { reader.cancel().catch(() => {}); }
}

// ---- approvals: every call waiting, whoever asks (MCP, gRPC session, task) ----
const ASKERS = { mcp: "MCP client", session: "gRPC session", task: "task" };

function showApprovals(list) {
  $("approvals-card").classList.toggle("waiting", list.length > 0);
  $("approvals-count").textContent = list.length ? list.length + " waiting" : "";
  if (!list.length) { $("approvals").replaceChildren(el("p", { class: "muted" }, "none waiting")); return; }
  $("approvals").replaceChildren(...list.map((a) => el("div", { class: "approval", "data-call": a.id, "data-kind": a.kind },
    el("div", {}, el("span", { class: "badge kind" }, ASKERS[a.kind] || a.kind), " ", el("b", { class: "tool" }, a.tool),
      " ", el("span", { class: "muted" }, (a.category || "").toUpperCase())),
    el("div", { class: "who" }, "asked by ", el("code", {}, a.origin), a.credential ? el("span", {}, " as ", el("b", {}, a.credential)) : ""),
    el("pre", {}, JSON.stringify(a.parameters ?? {}, null, 1)),
    el("div", { class: "muted" }, "since ", time(a.since_unix_ms), " · denied at ", time(a.expires_unix_ms), " unless answered"),
    el("button", { type: "button", class: "approve", onclick: (e) => decide(e.target, a.id, true) }, "Approve"), " ",
    el("button", { type: "button", class: "deny", onclick: (e) => decide(e.target, a.id, false) }, "Deny"))));
}

async function decide(button, id, approve) {
  button.disabled = true;
  try { await api("POST", "/v1/approvals/" + encodeURIComponent(id), { approve }); $("approvals-message").textContent = ""; }
  catch (err) { if (!(err instanceof Unauthorized)) $("approvals-message").textContent = err.message; button.disabled = false; }
}

// ---- open sessions: gRPC (served here or relayed on), MCP ----
const STREAMS = { grpc: "gRPC", relayed: "relayed", mcp: "MCP" };

function showOpenSessions(r) {
  const list = r.data || [];
  $("sessions-active").replaceChildren(fact("open", list.length),
    ...Object.keys(STREAMS).map((k) => fact(STREAMS[k], list.filter((x) => x.kind === k).length)),
    fact("since start", lastStatus ? lastStatus.sessions.total : "—"));
  $("open-sessions").tBodies[0].replaceChildren(...list.map((x) => el("tr", { "data-open-session": x.kind },
    el("td", {}, el("span", { class: "badge" }, STREAMS[x.kind] || x.kind)),
    el("td", {}, x.id ? el("code", { title: x.id }, x.id.slice(0, 8)) : el("span", { class: "muted" }, "starting")),
    el("td", {}, x.credential || el("span", { class: "muted" }, "anonymous")),
    el("td", {}, time(x.opened_unix_ms)),
    el("td", {}, x.kind === "relayed" ? "to host " + x.host_id : x.kind === "mcp" ? (x.listening ? "client listening" : "client not listening") + (x.in_flight ? ", " + x.in_flight + " call(s) running" : "") : (x.model || "")),
    el("td", {}, x.pending_approvals ? el("span", { class: "badge warn" }, x.pending_approvals + " approval(s)") : "—"))));
}

// ---- tasks ----
function showTasks(tasks) {
  $("tasks").tBodies[0].replaceChildren(...tasks.map((t) => el("tr", { "data-task": t.id, class: t.id === watchedTask ? "mine" : "" },
    el("td", {}, el("code", {}, t.id.split(":").pop().slice(0, 8))), el("td", {}, el("span", { class: "badge" }, t.status)),
    el("td", {}, t.prompt), el("td", {}, t.detail || ""),
    el("td", {}, el("button", { type: "button", onclick: () => watchTask(t.id) }, "team")))));
  if (watchedTask && tasks.some((t) => t.id === watchedTask)) watchTask(watchedTask);
  scheduleAudit();
}

async function watchTask(id) {
  watchedTask = id;
  try {
    const r = await api("GET", "/v1/tasks/" + encodeURIComponent(id) + "/events");
    $("team").hidden = false;
    $("team-task").textContent = id;
    $("team-events").replaceChildren(...r.data.filter((e) => e.kind !== "status" || true).map((e) => el("li", {},
      time(e.at_ms), " ", el("b", {}, e.kind), e.worker_id ? " " + e.worker_id.split(":").pop() : "", " ",
      el("span", { class: "muted" }, JSON.stringify(e.body)))));
  } catch (_) { /* the task may be gone */ }
}

// ---- audit ----
function scheduleAudit() {
  // Coalesces bursts of changes into one fetch.
  if (auditTimer) return;
  auditTimer = setTimeout(() => { auditTimer = null; loadAudit(); }, 500);
}

async function loadAudit() {
  const session = $("audit-session").value.trim();
  const q = "/v1/audit?limit=5000" + (session ? "&session=" + encodeURIComponent(session) : "");
  try {
    const r = await api("GET", q);
    const rows = r.data.slice(-30).reverse();
    $("audit").tBodies[0].replaceChildren(...rows.map((a) => el("tr", {},
      el("td", {}, time(a.at_ms || a.started_at_ms)), el("td", {}, a.kind),
      el("td", {}, a.tool || a.actuator || "", a.parameters ? " " + JSON.stringify(a.parameters) : "", a.decision ? " (" + a.decision + (a.approved_by ? " by " + a.approved_by : "") + ")" : ""),
      el("td", {}, a.error ? el("span", { class: "error" }, a.error) : (a.result || "")),
      el("td", {}, a.origin || ""))));
  } catch (_) { /* shown by the link state */ }
}
$("audit-filter").addEventListener("submit", (e) => { e.preventDefault(); loadAudit(); });

// ---- fleet ----
// Why a host is not live (`why` of /v1/hosts).
const WHY = { shutdown: "shut down", will: "last will: connection lost", unstated: "no cause given",
  silent: "silent, no last will", reported: "reported silent" };
function showHosts(h) {
  const f = h.fleet || {};
  const facts = [fact("fleet", f.configured ? (f.connected ? "connected" : "not connected") + " to " + f.broker : "not configured (this host only)")];
  if (h.total > h.data.length) facts.push(fact("shown", h.data.length + " of " + h.total + " hosts"));
  if (f.broker_dropped_messages) facts.push(fact("broker dropped", f.broker_dropped_messages + " messages (this view may miss hosts)"));
  $("fleet-facts").replaceChildren(...facts);
  $("hosts").tBodies[0].replaceChildren(...h.data.map((x) => el("tr", {},
    el("td", {}, x.name || x.id, x.this_host ? " (this host)" : ""), el("td", {}, x.environment_id),
    el("td", {}, el("span", { class: "badge " + (x.status === "online" ? "ok" : "warn") }, x.status),
      x.why ? " " + (WHY[x.why] || x.why) + (x.reported_by ? " (by " + x.reported_by + ")" : "") : ""),
    el("td", {}, x.estop_active ? el("span", { class: "badge critical" }, "STOP " + (x.estop ? x.estop.source : "")) : "—"),
    el("td", {}, x.endpoint || ""))));
}

$("fleet-stop").addEventListener("click", async () => {
  try {
    const r = await fetch("/v1/fleet/estop", { method: "POST", headers: headers(true), body: JSON.stringify({ reason: "dashboard fleet stop" }) });
    const data = await r.json().catch(() => null);
    $("fleet-message").textContent = r.ok ? "fleet stop sent; confirmed: " + data.confirmed : ((data && data.error && data.error.message) || "HTTP " + r.status);
  } catch (err) { $("fleet-message").textContent = err.message; }
});

// ---- the stream ----
function handle(event, data) {
  switch (event) {
    case "observation": {
      $("link").textContent = "live · tick " + data.seq;
      showSafety({ active: !!data.protective_stop, causes: data.protective_stop_causes || (data.protective_stop ? [data.protective_stop] : []) });
      data.sensors.forEach((s, i) => ensureSensor(s, i).then((entry) => showSensor(entry, s)));
      showAlarms(data.sensors, data.actuators);
      showActuators(data.actuators);
      showWorld(data.sim, data);
      break;
    }
    case "safety": showSafety(data); break;
    case "status": showStatus(data); break;
    case "tasks": showTasks(data); break;
    case "approvals": showApprovals(data.data || []); break;
    case "rules": showRules(data.data || []); break;
    case "sessions": showOpenSessions(data); loadSessions(); break;
    case "hosts": showHosts(data); break;
  }
}

async function stream(gen) {
  const h = headers(false);
  if (lastEventId) h["Last-Event-ID"] = lastEventId;
  const r = await fetch("/v1/observation/stream", { headers: h, cache: "no-store" });
  if (r.status === 401) { askToken(refusedMessage()); throw new Unauthorized(); }
  if (!r.ok || !r.body) throw new Error("HTTP " + r.status);
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  while (gen === streamGen) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
      let event = "message", data = "";
      for (const line of block.split("\n")) {
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const val = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "id") lastEventId = val;
        else if (field === "event") event = val;
        else if (field === "data") data += (data ? "\n" : "") + val;
      }
      if (data) { try { handle(event, JSON.parse(data)); } catch (err) { console.error(event, err); } }
    }
  }
  reader.cancel().catch(() => {});
}

async function run(gen) {
  // Reconnects after a broken stream (a restart, a network gap), resuming after the last event.
  while (gen === streamGen) {
    try { await stream(gen); }
    catch (err) { if (err instanceof Unauthorized) return; }
    if (gen !== streamGen) return;
    $("link").textContent = "reconnecting…"; $("link").classList.add("down");
    await new Promise((res) => setTimeout(res, 1000));
    $("link").classList.remove("down");
  }
}

async function start() {
  try { showStatus(await api("GET", "/v1/status")); }
  catch (err) { if (err instanceof Unauthorized) return; $("link").textContent = err.message; }
  try { actuatorSpecs = new Map((await api("GET", "/v1/actuators")).data.map((a) => [a.name, a])); }
  catch (_) { /* the table shows no range */ }
  loadAudit();
  streamGen += 1;
  run(streamGen);
}

start();
