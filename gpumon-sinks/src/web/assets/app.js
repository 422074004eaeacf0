// gpumon live view. Every name (GPU, process, host, finding text) reaches the DOM through
// textContent or setAttribute only, never as markup; the Content-Security-Policy forbids inline
// script anyway.
"use strict";

const WINDOW_S = 600; // seconds kept in the charts
// The newest sample is "stale" once it is older than this many sampling intervals (and at
// least STALE_MIN_S): a stopped or wedged agent, a stream that stalled, a suspended laptop.
const STALE_INTERVALS = 2.5;
const STALE_MIN_S = 1.0;
// A stream that carried nothing for this long is dropped and reopened (a silently dead
// connection never errors by itself); every tick sends an event, failed samples included.
const SILENT_RECONNECT_S = 30;
// Above this many cards, each card draws one chart (its first figure) instead of all five.
const COMPACT_ABOVE = 8;
// Chart heights (CSS px of the plot, axes included): tall enough for four or five y-ticks.
const CHART_HEIGHT = 120;
const CHART_HEIGHT_COMPACT = 90;
const FIELDS = [
  // Utilisation on a fixed 0–100 % axis and memory on 0–total: a GPU at 8 % must not look
  // like its neighbours at 94 % because its chart scaled to its own data.
  { key: "util", label: "utilisation", unit: "%", color: "#50c070", fmt: (v) => v.toFixed(0) + " %",
    get: (d) => (d.utilization?.gpu != null ? d.utilization.gpu * 100 : null), max: () => 100 },
  { key: "mem", label: "memory", unit: "GiB", color: "#5090e0", fmt: (v) => v.toFixed(1) + " GiB",
    get: (d) => (d.memory?.used != null ? d.memory.used / 2 ** 30 : null),
    max: (d) => (d.memory?.total != null ? d.memory.total / 2 ** 30 : null) },
  { key: "power", label: "power", unit: "W", color: "#e0a030", fmt: (v) => v.toFixed(0) + " W",
    get: (d) => d.power?.usage_watts ?? null },
  { key: "temp", label: "temperature", unit: "°C", color: "#e05050", fmt: (v) => v.toFixed(0) + " °C",
    get: (d) => d.temperature?.gpu ?? null },
  { key: "sm_clock", label: "SM clock", unit: "MHz", color: "#b070e0", fmt: (v) => v.toFixed(0) + " MHz",
    get: (d) => (d.clocks?.sm != null ? d.clocks.sm / 1e6 : null) },
];
const CLOCK_EVENT_REASONS = [
  [0x1, "GPU idle"], [0x2, "application clocks setting"], [0x4, "software power cap"], [0x8, "hardware slowdown"],
  [0x10, "sync boost"], [0x20, "software thermal slowdown"], [0x40, "hardware thermal slowdown"],
  [0x80, "hardware power brake"], [0x100, "display clock setting"],
];

// uuid -> { card, dev, data: [t[], f0[], …], seen: [bool × 5], charts: [uPlot|undefined], … }
const gpus = new Map();
// What the page knows about its data and its connection; status() turns it into one state.
const st = {
  snap: null, // the newest snapshot
  recvAt: 0, // performance.now() when it arrived
  // Smallest (arrival − taken_at) seen lately, wall clock: the delivery delay plus any clock
  // difference between browser and agent, so a skewed browser clock does not read as stale.
  skew: [],
  times: [], // taken_at (s) of the latest snapshots, for the sampling interval
  arrivals: [], // performance.now() (ms) of the latest events: a replay's pace (see interval())
  link: "connecting", // connecting | open | waiting
  why: "", // why the stream is waiting
  retryAt: 0, // performance.now() of the next attempt
  attempt: 0,
  lastByteAt: 0,
  abort: null,
};
// Per-event main-thread time (ms) of the page's own work, newest last: read by the browser
// tests (performance, not correctness).
window.__gpumonTicks = [];
let visible = null; // IntersectionObserver of the cards (charts are drawn for visible cards only)
const openFindings = new Set(); // kinds whose GPU list the reader unfolded
let findingsSig = null; // what the findings list shows now (see findings())
let compact = false;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

function gib(bytes) {
  return bytes == null ? "–" : (bytes / 2 ** 30).toFixed(1) + " GiB";
}

function secs(s) {
  return s < 10 ? s.toFixed(1) + " s" : s < 120 ? Math.round(s) + " s" : Math.round(s / 60) + " min";
}

// "GPU 3" or, for a MIG instance, "GPU 3 · MIG 1 (2g.10gb)": instances share their parent's
// index, so the index alone never names one.
function deviceLabel(info) {
  const m = info.mig;
  if (!m) return "GPU " + info.index;
  return "GPU " + info.index + " · MIG " + m.mig_index + (m.profile ? " (" + m.profile + ")" : "");
}

function shortLabel(info) {
  return info.mig ? info.index + "." + info.mig.mig_index : String(info.index);
}

// Who holds a GPU or runs a process, as the exporters label it (gpumon_core::attribution::
// OwnerLabels::merge): each of namespace, pod, container, user is the owners' common value,
// "(shared)" where they disagree, left out where none knows it. "" when nothing is known.
const SHARED = "(shared)";
function ownerText(owners) {
  const merged = {};
  for (const o of owners || []) {
    if (!o) continue;
    for (const k of ["namespace", "pod", "container", "user"]) {
      const v = o[k];
      if (v == null) continue;
      merged[k] = merged[k] === undefined || merged[k] === v ? v : SHARED;
    }
  }
  const parts = [];
  if (merged.namespace !== undefined || merged.pod !== undefined) {
    parts.push("pod " + [merged.namespace, merged.pod].filter((x) => x !== undefined).join("/"));
  }
  if (merged.container !== undefined) parts.push("container " + merged.container);
  if (merged.user !== undefined) parts.push("user " + merged.user);
  return parts.join(" · ");
}

// ---------------------------------------------------------------------------------- freshness
// Whether the newest snapshot is a recorded trace played back (--backend replay): its time is
// when it was recorded, not now, so the page never calls it live.
function replaying() {
  return st.snap?.system?.backend === "replay";
}

// Seconds between samples: the samples' own times; for a replay, the time between their
// arrivals (a trace played at another speed than it was recorded at, or as fast as possible).
function interval() {
  const t = replaying() ? st.arrivals.map((ms) => ms / 1000) : st.times;
  const d = [];
  for (let i = 1; i < t.length; i++) if (t[i] > t[i - 1]) d.push(t[i] - t[i - 1]);
  if (!d.length) return 1;
  d.sort((a, b) => a - b);
  return d[Math.floor(d.length / 2)];
}

// "2026-12-05 20:08:03 UTC": when a replayed sample was recorded (UTC, so that the time reads
// the same in every browser and in the agent's logs).
function recordedAt(s) {
  const iso = new Date((s.taken_at || 0) / 1e6).toISOString();
  return iso.slice(0, 10) + " " + iso.slice(11, 19) + " UTC";
}

// Seconds since the newest sample was taken, as far as the page can tell; for a replay, since
// it arrived (it was taken when it was recorded).
function age() {
  if (!st.snap) return null;
  if (replaying()) return Math.max(0, (performance.now() - st.recvAt) / 1000);
  const skew = st.skew.length ? Math.min(...st.skew) : 0;
  const byClock = (Date.now() - (st.snap.taken_at || 0) / 1e6) / 1000 - skew;
  const byArrival = (performance.now() - st.recvAt) / 1000;
  return Math.max(0, byClock, byArrival);
}

function staleAfter() {
  return Math.max(STALE_MIN_S, STALE_INTERVALS * interval());
}

// One state for the whole page, shown in #conn (data-state) and on <body data-state>:
// connecting, live, replay (a recorded trace played back, arriving as it should), stale,
// failed (the newest sample failed), waiting (the stream is down).
function status() {
  const conn = document.getElementById("conn");
  const a = age();
  const failed = st.snap?.sampling?.failed;
  const replay = replaying();
  let state;
  let text;
  if (st.finished && st.link !== "open") {
    // Still retrying quietly (another agent may come up on this port), but the news is the end.
    state = "finished";
    text = "replay finished · the trace ended (last sample recorded " + recordedAt(st.snap) + ")";
  } else if (st.link === "waiting") {
    const inS = Math.max(0, Math.ceil((st.retryAt - performance.now()) / 1000));
    state = "waiting";
    text = st.why + " · retrying " + (inS > 0 ? "in " + inS + " s" : "now");
    if (a != null) text += " · last sample " + secs(a) + " old";
  } else if (a == null) {
    state = "connecting";
    text = "connecting…";
  } else if (a > staleAfter()) {
    state = "stale";
    text = replay
      ? "stale · last replayed sample arrived " + secs(a) + " ago (recorded " + recordedAt(st.snap) + ")"
      : "stale · last sample " + secs(a) + " old";
  } else if (failed) {
    state = "failed";
    text = (replay ? "replayed · " : "") + "sampling failed · " + failed.reason;
  } else if (replay) {
    state = "replay";
    text = "replayed · sample recorded " + recordedAt(st.snap);
  } else {
    state = "live";
    text = "live · sample " + secs(a) + " old";
  }
  if (conn.textContent !== text) conn.textContent = text;
  // How old the newest sample was when the page called it stale (for the browser tests: the
  // promise is "stale within three intervals", whenever a probe looks).
  if (state === "stale" && conn.dataset.state !== "stale") conn.dataset.staleAtAge = a.toFixed(2);
  conn.dataset.state = state;
  conn.classList.toggle("live", state === "live");
  document.body.dataset.state = state;
  const empty = document.getElementById("empty");
  empty.hidden = gpus.size > 0;
  if (!empty.hidden) {
    const msg = failed && state !== "waiting"
      ? "No GPU data: the agent cannot sample its GPUs (" + failed.reason + ")."
      : state === "waiting" || state === "finished" ? "Not connected: " + st.why + "."
      : st.snap ? "No GPU in this view." : "Waiting for the first sample…";
    if (empty.textContent !== msg) empty.textContent = msg;
  }
}

// ---------------------------------------------------------------------------------- cards
function cardOrder(info) {
  return info.index * 1000 + (info.mig ? 1 + info.mig.mig_index : 0);
}

// Whether a card shows another device than `info` under its UUID (an agent restarted on
// other GPUs, a trace of another host): its label, name and history are not this one's.
function sameDevice(a, b) {
  return a.name === b.name && a.index === b.index && (a.mig?.mig_index ?? null) === (b.mig?.mig_index ?? null) &&
    (a.mig?.profile ?? null) === (b.mig?.profile ?? null);
}

function card(dev) {
  const uuid = dev.info.uuid;
  let g = gpus.get(uuid);
  if (g && sameDevice(g.dev.info, dev.info)) return g;
  if (g) removeCard(uuid);
  const card = el("article", "card" + (dev.info.mig ? " mig" : ""));
  card.setAttribute("data-gpu-uuid", uuid);
  card.tabIndex = -1;
  const h = el("h3");
  const label = el("span", "idx", deviceLabel(dev.info));
  const name = el("span", "name", dev.info.name);
  name.title = dev.info.name;
  h.appendChild(label);
  h.appendChild(name);
  const stateEl = el("span", "state");
  stateEl.hidden = true;
  h.appendChild(stateEl);
  card.appendChild(h);
  const uuidEl = el("div", "uuid", uuid);
  card.appendChild(uuidEl);
  const why = el("div", "why");
  why.hidden = true;
  card.appendChild(why);
  const owner = el("div", "owner");
  owner.hidden = true;
  card.appendChild(owner);
  const badges = el("div", "badges");
  card.appendChild(badges);
  const figs = el("div", "figs");
  const figBoxes = [];
  const figEls = FIELDS.map((f) => {
    const box = el("div", "fig");
    box.hidden = true; // shown once the device reports the figure (a MIG instance has few)
    const v = el("div", "v", "–");
    v.setAttribute("data-field", f.key);
    box.appendChild(v);
    box.appendChild(el("div", "l", f.label));
    figs.appendChild(box);
    figBoxes.push(box);
    return v;
  });
  card.appendChild(figs);
  const charts = el("div", "charts");
  card.appendChild(charts);
  const more = el("details", "more");
  more.appendChild(el("summary", null, "details"));
  const moreList = el("dl", "detail");
  more.appendChild(moreList);
  more.addEventListener("toggle", () => more.open && detail(g));
  card.appendChild(more);
  const order = cardOrder(dev.info);
  card.dataset.order = String(order);
  const grid = document.getElementById("gpus");
  const after = [...grid.children].find((c) => Number(c.dataset.order) > order);
  grid.insertBefore(card, after || null);
  const cell = el("button", "cell", shortLabel(dev.info));
  cell.type = "button";
  cell.setAttribute("data-gpu-uuid", uuid);
  cell.dataset.order = String(order);
  cell.addEventListener("click", () => jump(uuid));
  const ov = document.getElementById("overview");
  ov.insertBefore(cell, [...ov.children].find((c) => Number(c.dataset.order) > order) || null);
  g = {
    card, label, stateEl, why, owner, badges, figs: figEls, figBoxes, chartBox: charts, more, moreList, cell,
    charts: [], chartBoxes: [], seen: FIELDS.map(() => false), data: [[], [], [], [], [], []],
    dev, visible: false, dirty: true,
  };
  gpus.set(uuid, g);
  if (visible) visible.observe(card);
  return g;
}

function removeCard(uuid) {
  const g = gpus.get(uuid);
  if (!g) return;
  if (visible) visible.unobserve(g.card);
  g.charts.forEach((c) => c && c.destroy());
  g.card.remove();
  g.cell.remove();
  gpus.delete(uuid);
}

function jump(uuid) {
  const g = gpus.get(uuid);
  if (!g) return;
  g.card.scrollIntoView({ block: "start" });
  g.card.focus({ preventScroll: true });
  g.card.classList.remove("flash");
  void g.card.offsetWidth; // restart the highlight
  g.card.classList.add("flash");
}

// Which fields this card charts: the figures it has; on a large host only the first of them.
function chartFields(g) {
  const have = FIELDS.map((_, i) => i).filter((i) => g.seen[i]);
  return compact ? have.slice(0, 1) : have;
}

function ensureCharts(g) {
  if (typeof uPlot === "undefined") return; // figures still work without the library
  const want = chartFields(g);
  if (g.chartKey === want.join(",")) return;
  g.chartKey = want.join(",");
  g.charts.forEach((c) => c && c.destroy());
  g.charts = [];
  g.chartBoxes = [];
  clear(g.chartBox);
  const width = Math.max(200, g.chartBox.clientWidth || 330);
  for (const i of want) {
    const f = FIELDS[i];
    const box = el("div", "chart");
    box.setAttribute("role", "img");
    box.appendChild(el("div", "l", f.label + " (" + f.unit + ")"));
    g.chartBox.appendChild(box);
    const opts = {
      width,
      height: chartHeight(),
      legend: { show: true, live: true },
      cursor: { y: false, points: { size: 5 } },
      // At least the last minute on the time axis: a chart with one or two points would
      // otherwise span years.
      scales: { x: { time: true, range: (u, min, max) => xRange(min, max) }, y: { range: (u, min, max) => yRange(f, g.dev, min, max) } },
      axes: [
        // Clock times with minutes (14:05:30), never bare seconds (":30").
        { stroke: "#9aa0aa", size: 20, space: 70, grid: { show: false }, ticks: { size: 3 }, font: "10px sans-serif",
          values: (u, splits) => splits.map(clockTime) },
        { stroke: "#9aa0aa", size: 44, space: 22, grid: { stroke: "#2a2f3a" }, ticks: { show: false }, font: "10px sans-serif" },
      ],
      series: [
        { value: (u, v) => (v == null ? "" : new Date(v * 1000).toLocaleTimeString()) },
        { label: f.label, stroke: f.color, fill: f.color + "33", width: 1.5, points: { show: false },
          value: (u, v) => (v == null ? "–" : f.fmt(v)) },
      ],
    };
    box.setAttribute("aria-label", describe(f, g.data[i + 1]));
    g.charts[i] = new uPlot(opts, [g.data[0], g.data[i + 1]], box);
    g.chartBoxes[i] = box;
  }
  g.dirty = true;
}

function chartHeight() {
  return compact ? CHART_HEIGHT_COMPACT : CHART_HEIGHT;
}

// A field's y range: from 0 to its fixed top (100 %, the memory's total) where it has one,
// else to a little above its data.
function yRange(f, dev, min, max) {
  const top = f.max ? f.max(dev) : null;
  if (top != null) return [0, Math.max(top, max ?? 0)];
  return [Math.min(0, min ?? 0), Math.max((max ?? 0) * 1.1, 1)];
}

// "14:05:30": a time-axis label, local time (UTC for a replay, as its recorded times read).
function clockTime(t) {
  const d = new Date(t * 1000);
  const utc = replaying();
  const p = (x) => String(x).padStart(2, "0");
  const [h, m, s] = utc ? [d.getUTCHours(), d.getUTCMinutes(), d.getUTCSeconds()] : [d.getHours(), d.getMinutes(), d.getSeconds()];
  return p(h) + ":" + p(m) + ":" + p(s);
}

function xRange(min, max) {
  const end = max ?? Date.now() / 1000;
  return min == null || end - min < 60 ? [end - 60, end] : [min, end];
}

function pushPoint(point) {
  const gap = STALE_INTERVALS * interval();
  for (const [uuid, vals] of Object.entries(point.gpus)) {
    const g = gpus.get(uuid);
    if (!g) continue;
    const d = g.data;
    const last = d[0].length ? d[0][d[0].length - 1] : null;
    if (last != null && point.t <= last) continue; // already have it
    // Missing samples (the agent stopped, the stream was down): a null point draws a gap
    // instead of a straight line across the outage.
    if (last != null && point.t - last > gap) {
      d[0].push(last + gap / STALE_INTERVALS);
      for (let i = 1; i < d.length; i++) d[i].push(null);
    }
    d[0].push(point.t);
    vals.forEach((v, i) => {
      d[i + 1].push(v);
      if (v != null) g.seen[i] = true;
    });
    while (d[0].length && d[0][0] < point.t - WINDOW_S) d.forEach((a) => a.shift());
    g.dirty = true;
  }
}

// "utilisation over the last 10 min: now 92 %, min 88 %, max 95 %" — the chart in words.
function describe(f, xs) {
  let min = Infinity;
  let max = -Infinity;
  let now = null;
  for (const v of xs) {
    if (v == null) continue;
    if (v < min) min = v;
    if (v > max) max = v;
    now = v;
  }
  if (now == null) return f.label + ": no data";
  // Gaps: runs of missing samples (pushPoint marks an outage with one null).
  let gaps = 0;
  for (let i = 1; i < xs.length; i++) if (xs[i] == null && xs[i - 1] != null) gaps++;
  return f.label + " over the last " + Math.round(WINDOW_S / 60) + " min: now " + f.fmt(now) + ", min " + f.fmt(min) + ", max " + f.fmt(max) +
    (gaps ? ", " + gaps + (gaps > 1 ? " gaps" : " gap") + " without samples" : "");
}

function redraw() {
  for (const g of gpus.values()) {
    // Every card gets its charts at once (a chart appearing later would move the page under
    // the reader), but a large host draws data only into the cards near the viewport; the
    // rest catch up when scrolled to.
    ensureCharts(g);
    if (!g.dirty) continue;
    g.charts.forEach((c, i) => c && g.chartBoxes[i].setAttribute("aria-label", describe(FIELDS[i], g.data[i + 1])));
    if (compact && !g.visible) continue;
    g.charts.forEach((c, i) => c && c.setData([g.data[0], g.data[i + 1]]));
    g.dirty = false;
  }
}

// ---------------------------------------------------------------------------------- snapshot
function render(s) {
  // Data not read from a GPU just now says so: simulated (mock) or a recorded trace (replay).
  const backend = s.system && s.system.backend;
  const banner = document.getElementById("banner");
  banner.hidden = !(backend === "mock" || backend === "replay");
  if (backend === "replay") {
    // What recorded the trace stays said: a replay of the mock is simulated data played back.
    const recorded = s.system.recorded_backend;
    banner.textContent = recorded === "mock"
      ? "REPLAYED DATA, simulated when recorded — this agent plays back a trace recorded on the mock backend (simulated GPUs); no value on this page was ever read from a GPU."
      : "REPLAYED DATA — this agent plays back a trace recorded" + (recorded ? " on the " + recorded + " backend" : "") +
        " (--backend replay); no value on this page is being read from a GPU now.";
    banner.dataset.recordedBackend = recorded || "";
  }
  const host = s.system?.hostname;
  const title = host ? host + " · gpumon" : "gpumon";
  if (document.title !== title) document.title = title;
  const failed = s.sampling?.failed;
  if (failed) {
    // No GPU data this tick: keep the last cards, greyed, with why.
    for (const g of gpus.values()) {
      g.card.classList.add("failed");
      g.why.textContent = "sampling failed: " + failed.reason;
      g.why.hidden = false;
    }
    return;
  }
  const devices = s.devices || [];
  // The cards are exactly the snapshot's devices: a GPU or MIG instance that is gone (lost,
  // reconfigured, an agent restarted on a smaller host) loses its card.
  const present = new Set(devices.map((d) => d.info.uuid));
  for (const uuid of [...gpus.keys()]) if (!present.has(uuid)) removeCard(uuid);
  const newCompact = devices.length > COMPACT_ABOVE;
  if (newCompact !== compact) {
    compact = newCompact;
    document.body.classList.toggle("compact", compact);
  }
  for (const dev of devices) {
    const g = card(dev);
    g.dev = dev;
    g.card.classList.remove("failed");
    g.why.hidden = true;
    FIELDS.forEach((f, i) => {
      const v = f.get(dev);
      if (v != null) g.seen[i] = true;
      g.figBoxes[i].hidden = !g.seen[i];
      const text = v == null ? "–" : f.fmt(v);
      if (g.figs[i].textContent !== text) g.figs[i].textContent = text;
    });
    if (dev.memory?.total != null) g.figs[1].title = gib(dev.memory.used) + " of " + gib(dev.memory.total);
    // With attribution on: who holds the GPU (its pods, then its processes' owners).
    const who = ownerText(dev.owners);
    if (g.owner.textContent !== who) g.owner.textContent = who;
    g.owner.hidden = who === "";
    const up = dev.state === undefined || dev.state === "ok";
    g.card.classList.toggle("down", !up);
    g.stateEl.hidden = up;
    g.stateEl.textContent = up ? "" : String(dev.state).toUpperCase();
    const util = FIELDS[0].get(dev);
    g.cell.classList.toggle("down", !up);
    g.cell.dataset.util = util == null ? "" : String(Math.round(util));
    // Utilisation as the cell's colour: grey (unknown) or dark to bright green.
    g.cell.style.backgroundColor = util == null ? "" : "hsl(130, " + (25 + util * 0.4) + "%, " + (14 + util * 0.26) + "%)";
    g.cell.title = deviceLabel(dev.info) + " · " + dev.info.name + (util == null ? "" : " · " + util.toFixed(0) + " %") + (up ? "" : " · " + dev.state);
    if (g.more.open) detail(g);
  }
  findings(s.diagnosis, (s.taken_at || 0) / 1e9);
  processes(devices);
  steps(s.steps, devices);
}

function hostSummary(s) {
  const dl = document.getElementById("host");
  clear(dl);
  const sys = s.system || {};
  const devs = s.sampling?.failed ? [] : s.devices || [];
  const phys = devs.filter((d) => !d.info.mig);
  const inst = devs.length - phys.length;
  const busy = busyCount(s.diagnosis, phys);
  const rows = [
    ["host", sys.hostname],
    ["backend", sys.backend],
    ["driver", sys.driver_version],
    ["GPUs", s.sampling?.failed ? null : phys.length],
    ["MIG instances", inst || null],
    // Only GPUs that report utilisation count (a GPU in MIG mode reports none).
    ["busy", busy?.of ? busy.n + " of " + busy.of : null],
    ["power", phys.length ? phys.reduce((a, d) => a + (d.power?.usage_watts || 0), 0).toFixed(0) + " W" : null],
    ["sample", "#" + s.seq + " at " + new Date((s.taken_at || 0) / 1e6).toLocaleTimeString()],
  ];
  for (const [k, v] of rows) {
    if (v == null || v === "") continue;
    const d = el("div");
    d.appendChild(el("dt", null, k));
    const dd = el("dd", k === "host" ? "hostname" : null, v);
    if (k === "host") dd.title = String(v);
    if (k === "busy") {
      dd.title = "GPUs whose mean utilisation over the diagnosis window (the last " + busy.window + " s) is at least " +
        busy.level + " % (diagnosis's \"busy\")";
      dd.setAttribute("data-busy", String(busy.n));
    }
    d.appendChild(dd);
    dl.appendChild(d);
  }
}

// "busy" as diagnosis says it, from the snapshot (gpumon_core::Busy): the mean level over the
// diagnosis' own window (--diagnose-window) at or above its `imbalance_busy`, never one reading —
// a starved GPU swinging between 0 and 95 % each second is not busy. No second copy of the rule
// here: without a diagnosis (or one that does not say) there is no count. `of` counts the GPUs
// diagnosis judged (those that read a level).
function busyCount(diagnosis, phys) {
  const b = diagnosis?.busy;
  if (!b) return null;
  const judged = new Map((b.gpus || []).map((g) => [g.uuid, g.busy]));
  let n = 0;
  let of = 0;
  for (const d of phys) {
    if (!judged.has(d.info.uuid)) continue;
    of++;
    if (judged.get(d.info.uuid)) n++;
  }
  const round = (x) => Math.round(x * 100) / 100;
  return { n, of, window: round(b.window_seconds), level: round(b.level * 100) };
}

// "0–3, 5, 7–9": GPU indices as ranges.
function ranges(xs) {
  const v = [...new Set(xs)].sort((a, b) => a - b);
  const out = [];
  for (let i = 0; i < v.length; i++) {
    let j = i;
    while (j + 1 < v.length && v[j + 1] === v[j] + 1) j++;
    out.push(j > i + 1 ? v[i] + "–" + v[j] : j === i + 1 ? v[i] + ", " + v[j] : String(v[i]));
    i = j;
  }
  return out.join(", ");
}

const SEVERITY = { critical: 3, warning: 2, info: 1 };

// Findings grouped by kind: one entry per kind with its GPUs as ranges, the advice once, and
// each GPU's evidence in a list that folds (folded when more than three GPUs); each card
// shows the kinds active on it and the overview colours its cell by the worst.
function findings(diagnosis, nowS) {
  const list = document.getElementById("findings");
  const active = (diagnosis && diagnosis.active) || [];
  document.getElementById("findings-section").hidden = !diagnosis;
  const byGpu = new Map();
  for (const f of active) {
    if (f.uuid == null) continue;
    if (!byGpu.has(f.uuid)) byGpu.set(f.uuid, []);
    byGpu.get(f.uuid).push(f);
  }
  for (const [uuid, g] of gpus) {
    const fs = byGpu.get(uuid) || [];
    // Rebuilt only when they change: on a large host most ticks change no badge.
    const sig = fs.map((f) => f.severity + " " + f.kind).join("|");
    if (g.badgeSig !== sig) {
      g.badgeSig = sig;
      clear(g.badges);
      let worst = "";
      for (const f of fs) {
        const sev = String(f.severity || "").toLowerCase();
        g.badges.appendChild(el("span", "badge " + sev, f.kind));
        if ((SEVERITY[sev] || 0) > (SEVERITY[worst] || 0)) worst = sev;
      }
      g.cell.dataset.finding = worst;
    }
    if (fs.length) g.cell.title += " · " + fs.map((f) => f.kind).join(", ");
  }
  // The list is rebuilt when its entries change; otherwise only the evidence of unfolded
  // entries is refreshed (the evidence quotes figures that move every tick).
  const sig = active.map((f) => [f.severity, f.kind, f.gpu, f.advice].join(" ")).join("|") + "|" + !!diagnosis;
  if (sig === findingsSig) {
    for (const li of list.children) {
      const sinceEl = li.querySelector(".since");
      if (sinceEl) sinceEl.textContent = sinceText(active.filter((f) => f.kind === li.dataset.kind), nowS);
      const fold = li.querySelector("details.fold");
      if (!fold || !fold.open) continue;
      const fs = active.filter((f) => f.kind === li.dataset.kind && f.evidence);
      const ev = fold.querySelector("ul.evidence");
      clear(ev);
      for (const x of fs) ev.appendChild(el("li", null, (x.gpu != null ? "GPU " + x.gpu + ": " : "") + x.evidence));
    }
    return;
  }
  findingsSig = sig;
  clear(list);
  if (!active.length) {
    list.appendChild(el("li", null, "No active findings."));
    return;
  }
  const groups = new Map();
  for (const f of active) {
    if (!groups.has(f.kind)) groups.set(f.kind, []);
    groups.get(f.kind).push(f);
  }
  const sorted = [...groups.entries()].sort((a, b) => {
    const sa = Math.max(...a[1].map((f) => SEVERITY[String(f.severity).toLowerCase()] || 0));
    const sb = Math.max(...b[1].map((f) => SEVERITY[String(f.severity).toLowerCase()] || 0));
    return sb - sa || (a[0] < b[0] ? -1 : 1);
  });
  for (const [kind, fs] of sorted) {
    const worst = fs.map((f) => String(f.severity || "").toLowerCase()).sort((a, b) => (SEVERITY[b] || 0) - (SEVERITY[a] || 0))[0];
    const li = el("li", worst);
    li.setAttribute("data-kind", kind);
    const where = fs.map((x) => x.gpu).filter((x) => x != null);
    const what = [worst, kind, where.length ? (where.length > 1 ? where.length + " GPUs: " : "GPU ") + ranges(where) : "host"]
      .filter((x) => x)
      .join(" · ");
    li.appendChild(el("div", "what", what));
    li.appendChild(el("div", "since", sinceText(fs, nowS)));
    const advice = fs.find((x) => x.advice)?.advice;
    if (advice) li.appendChild(el("div", "advice", "→ " + advice));
    const withEvidence = fs.filter((x) => x.evidence);
    if (withEvidence.length) {
      const fold = el("details", "fold");
      fold.open = openFindings.has(kind) || (withEvidence.length <= 3 && !openFindings.has("-" + kind));
      fold.appendChild(el("summary", null, "evidence (" + withEvidence.length + ")"));
      const ev = el("ul", "evidence");
      for (const x of withEvidence) ev.appendChild(el("li", null, (x.gpu != null ? "GPU " + x.gpu + ": " : "") + x.evidence));
      fold.appendChild(ev);
      // Setting `open` fires "toggle" too: only a change from what the page set is the reader's.
      fold.dataset.set = String(fold.open);
      fold.addEventListener("toggle", () => {
        if (String(fold.open) === fold.dataset.set) return;
        fold.dataset.set = String(fold.open);
        openFindings.delete(kind);
        openFindings.delete("-" + kind);
        openFindings.add(fold.open ? kind : "-" + kind);
      });
      li.appendChild(fold);
    }
    list.appendChild(li);
  }
}

// "since 14:05:30 (2 min 10 s)": when the earliest of a kind's findings started to hold (its
// `since`, the first tick of the window that raised it) and for how long as of this sample.
function sinceText(fs, nowS) {
  const ts = fs.map((f) => f.since).filter((x) => typeof x === "number");
  if (!ts.length) return "";
  const t = Math.min(...ts) / 1e9;
  const held = Math.max(0, nowS - t);
  const d = held < 60 ? Math.round(held) + " s" : Math.floor(held / 60) + " min " + Math.round(held % 60) + " s";
  return "holds since " + clockTime(t) + " (" + d + ")";
}

function processes(devices) {
  const rows = [];
  for (const d of devices) for (const p of d.processes || []) rows.push([d.info, p]);
  document.getElementById("procs-section").hidden = rows.length === 0;
  const body = document.getElementById("procs");
  clear(body);
  rows.sort((a, b) => cardOrder(a[0]) - cardOrder(b[0]) || a[1].pid - b[1].pid);
  for (const [info, p] of rows) {
    const tr = el("tr");
    const sm = p.sm_utilization != null ? (p.sm_utilization * 100).toFixed(0) + " %" : "–";
    [deviceLabel(info), p.pid, p.name ?? "", ownerText([p.owner]), gib(p.memory_used), sm]
      .forEach((v) => tr.appendChild(el("td", null, v)));
    body.appendChild(tr);
  }
}

// A card's detail view (filled only while open): what a person debugging this GPU asks next.
function detail(g) {
  const d = g.dev;
  const rows = [];
  const add = (k, v) => v != null && v !== "" && rows.push([k, v]);
  add("UUID", d.info.uuid);
  if (d.info.mig) add("MIG", "parent " + d.info.mig.parent_uuid + " · GI " + d.info.mig.gpu_instance_id + " / CI " + d.info.mig.compute_instance_id);
  add("PCI bus", d.info.pci_bus_id);
  add("performance state", d.performance_state != null ? "P" + d.performance_state : null);
  if (d.clock_event_reasons != null) {
    const r = CLOCK_EVENT_REASONS.filter(([bit]) => d.clock_event_reasons & bit).map(([, n]) => n);
    add("clock event reasons", r.length ? r.join(", ") : "none (full clocks)");
  }
  add("fan", d.fan_speed != null ? (d.fan_speed * 100).toFixed(0) + " %" : null);
  add("power limit", d.power?.limit_watts != null ? d.power.limit_watts.toFixed(0) + " W" : null);
  add("memory temperature", d.temperature?.memory != null ? d.temperature.memory.toFixed(0) + " °C" : null);
  const pcie = d.pcie || {};
  if (pcie.link_generation != null || pcie.link_width != null) {
    const max = d.info.pcie_max_link_generation != null ? " (max Gen" + d.info.pcie_max_link_generation + " x" + (d.info.pcie_max_link_width ?? "?") + ")" : "";
    add("PCIe link", "Gen" + (pcie.link_generation ?? "?") + " x" + (pcie.link_width ?? "?") + max);
  }
  add("PCIe replays", pcie.replays);
  if (pcie.tx_bytes_per_second != null || pcie.rx_bytes_per_second != null) {
    add("PCIe tx / rx", gbs(pcie.tx_bytes_per_second) + " / " + gbs(pcie.rx_bytes_per_second));
  }
  const ecc = d.ecc || {};
  if (ecc.corrected != null || ecc.uncorrected != null) add("ECC corrected / uncorrected", (ecc.corrected ?? "–") + " / " + (ecc.uncorrected ?? "–"));
  if (ecc.remapped_rows_correctable != null) {
    add("remapped rows", ecc.remapped_rows_correctable + " correctable, " + ecc.remapped_rows_uncorrectable + " uncorrectable" +
      (ecc.remapped_rows_pending ? ", pending" : "") + (ecc.remapped_rows_failure ? ", FAILED" : ""));
  }
  if (ecc.retired_pages_single_bit != null) add("retired pages", ecc.retired_pages_single_bit + " single-bit, " + ecc.retired_pages_double_bit + " double-bit");
  add("XID errors", (d.xid_errors || []).length ? d.xid_errors.map((x) => "XID " + x.code + " × " + x.count).join(", ") : "none");
  const nv = nvlinkTotals(d.nvlink);
  if (nv) {
    add("NVLink", nv.up + " of " + nv.links + " links up · tx " + gib(nv.tx_bytes) + " · rx " + gib(nv.rx_bytes));
    add("NVLink errors", "CRC " + nv.crc_errors + " · replay " + nv.replay_errors + " · recovery " + nv.recovery_errors);
  }
  for (const e of d.errors || []) add("not read", (e.metric ?? "") + (e.error ? ": " + e.error : ""));
  clear(g.moreList);
  for (const [k, v] of rows) {
    const row = el("div");
    row.appendChild(el("dt", null, k));
    row.appendChild(el("dd", null, v));
    g.moreList.appendChild(row);
  }
}

function gbs(x) {
  return x == null ? "–" : (x / 1e9).toFixed(2) + " GB/s";
}

// NVLink totals of a device: the stream sends them summed (`totals`); a full snapshot lists
// links.
function nvlinkTotals(nv) {
  if (!nv) return null;
  if (nv.totals) return nv.totals;
  const t = { links: 0, up: 0, tx_bytes: 0, rx_bytes: 0, crc_errors: 0, replay_errors: 0, recovery_errors: 0 };
  for (const l of nv.links || []) {
    t.links++;
    if (l.state === "up") t.up++;
    for (const k of ["tx_bytes", "rx_bytes", "crc_errors", "replay_errors", "recovery_errors"]) t[k] += l[k] || 0;
  }
  return t;
}

// ---------------------------------------------------------------------------------- wiring
function onEvent(msg) {
  const t0 = performance.now();
  const s = msg.snapshot;
  if (!s) return;
  const takenS = (s.taken_at || 0) / 1e9;
  st.snap = s;
  st.recvAt = performance.now();
  st.arrivals.push(st.recvAt);
  if (st.arrivals.length > 9) st.arrivals.shift();
  st.skew.push(Date.now() / 1000 - takenS);
  if (st.skew.length > 30) st.skew.shift();
  if (!st.times.length || takenS > st.times[st.times.length - 1]) st.times.push(takenS);
  if (st.times.length > 9) st.times.shift();
  render(s);
  if (msg.point) pushPoint(msg.point);
  hostSummary(s);
  redraw();
  status();
  const ticks = window.__gpumonTicks;
  ticks.push(performance.now() - t0);
  if (ticks.length > 300) ticks.shift();
}

async function loadHistory() {
  try {
    const r = await fetch("api/history?seconds=" + WINDOW_S, { cache: "no-store" });
    if (!r.ok) return;
    const h = await r.json();
    for (const p of h.points) {
      st.times.push(p.t);
      if (st.times.length > 9) st.times.shift();
    }
    return h.points;
  } catch (e) {
    return null;
  }
}

// The live stream, read with fetch rather than EventSource: the page sees the status of a
// refused stream (a 503 when the server is full, a 401) and says why it waits, and reconnects
// with backoff after any error instead of giving up.
async function connect() {
  st.link = "connecting";
  st.abort = new AbortController();
  let r;
  try {
    r = await fetch("api/stream", { cache: "no-store", signal: st.abort.signal });
  } catch (e) {
    return retry(ended("cannot reach the agent"), 1);
  }
  if (!r.ok) {
    // The server's own words (a short text body), and when it says to come back.
    let reason = "";
    try {
      reason = (await r.text()).trim().slice(0, 200);
    } catch (e) {
      reason = "";
    }
    const label = r.status === 503 ? "server full" : r.status === 401 || r.status === 403 ? "not authorised" : "refused";
    const why = label + " (HTTP " + r.status + (reason ? ": " + reason : "") + ")";
    const after = Number(r.headers.get("retry-after"));
    return retry(why, r.status === 503 ? (after > 0 && after <= 300 ? after : 5) : 1);
  }
  st.link = "open";
  st.finished = false;
  st.lastByteAt = performance.now();
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      st.lastByteAt = performance.now();
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        sseBlock(block);
      }
    }
  } catch (e) {
    return retry(ended(st.silent ? "no data for " + SILENT_RECONNECT_S + " s" : "stream interrupted"), 1);
  }
  return retry(ended("the agent closed the stream"), 1);
}

// Why the stream is down, once a replay was playing: an agent ends a replay by exiting at the
// trace's end (docs/replay.md), so the stream going away then is the replay finishing.
function ended(why) {
  const failed = st.snap?.sampling?.failed;
  st.finished = replaying() && (!failed || /trace has ended/.test(failed.reason || ""));
  return st.finished ? "replay finished" : why;
}

function sseBlock(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  if (event !== "snapshot" || !data.length) return;
  let msg;
  try {
    msg = JSON.parse(data.join("\n"));
  } catch (e) {
    console.warn("gpumon: unreadable event", e);
    return;
  }
  st.attempt = 0;
  onEvent(msg);
}

// Waits (1, 2, 4 … 30 s, or from `first` s; ±20 % jitter so many pages do not return at
// once), saying why, then reconnects.
function retry(why, first) {
  st.silent = false;
  const delay = Math.min(30, first * 2 ** st.attempt) * (0.8 + 0.4 * Math.random());
  st.attempt++;
  st.link = "waiting";
  st.why = why;
  st.retryAt = performance.now() + delay * 1000;
  status();
  setTimeout(connect, delay * 1000);
}

function tick() {
  if (st.link === "open" && performance.now() - st.lastByteAt > SILENT_RECONNECT_S * 1000) {
    st.silent = true;
    st.abort.abort();
  }
  status();
}

async function start() {
  visible = new IntersectionObserver((entries) => {
    for (const e of entries) {
      const g = gpus.get(e.target.getAttribute("data-gpu-uuid"));
      if (!g) continue;
      g.visible = e.isIntersecting;
    }
    redraw();
  }, { rootMargin: "300px" });
  for (const g of gpus.values()) visible.observe(g.card);
  // The history and the stream in parallel: the stream's first event (the latest snapshot)
  // makes the cards, then the history fills their charts.
  const history = loadHistory();
  connect();
  const points = await history;
  if (points) {
    const wait = () => (st.snap || st.link === "waiting" ? Promise.resolve() : new Promise((r) => setTimeout(r, 50)).then(wait));
    await wait();
    // The history goes before what the stream already added.
    const live = new Map([...gpus].map(([uuid, g]) => [uuid, g.data]));
    for (const g of gpus.values()) g.data = [[], [], [], [], [], []];
    for (const p of points) pushPoint(p);
    for (const [uuid, d] of live) {
      const g = gpus.get(uuid);
      if (!g) continue;
      const last = g.data[0].length ? g.data[0][g.data[0].length - 1] : -Infinity;
      d[0].forEach((t, k) => {
        if (t <= last) return;
        g.data.forEach((a, i) => a.push(d[i][k]));
      });
    }
    redraw();
  }
  setInterval(tick, 200);
  window.addEventListener("resize", () => {
    for (const g of gpus.values()) {
      const w = Math.max(200, g.chartBox.clientWidth);
      g.charts.forEach((c) => c && c.setSize({ width: w, height: chartHeight() }));
    }
  });
}

document.addEventListener("DOMContentLoaded", start);
