// gpumon live view. Every name (GPU, process, host, finding text) reaches the DOM through
// textContent or setAttribute only, never as markup; the Content-Security-Policy forbids inline
// script anyway.
"use strict";

const WINDOW_S = 600; // seconds kept in the charts
const FIELDS = [
  { key: "util", label: "utilisation", unit: "%", color: "#50c070", fmt: (v) => v.toFixed(0) + " %" },
  { key: "mem", label: "memory", unit: "GiB", color: "#5090e0", fmt: (v) => v.toFixed(1) + " GiB" },
  { key: "power", label: "power", unit: "W", color: "#e0a030", fmt: (v) => v.toFixed(0) + " W" },
  { key: "temp", label: "temperature", unit: "°C", color: "#e05050", fmt: (v) => v.toFixed(0) + " °C" },
  { key: "sm_clock", label: "SM clock", unit: "MHz", color: "#b070e0", fmt: (v) => v.toFixed(0) + " MHz" },
];

const gpus = new Map(); // uuid -> { card, figs: [el], charts: [uPlot|null], data: [t[], f0[], ...] }
let lastSeq = -1;

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

// ---------------------------------------------------------------------------------- cards
function card(dev) {
  const uuid = dev.info.uuid;
  let g = gpus.get(uuid);
  if (g) return g;
  const card = el("article", "card");
  card.setAttribute("data-gpu-uuid", uuid);
  const h = el("h3");
  h.appendChild(el("span", "idx", "#" + dev.info.index));
  h.appendChild(el("span", "name", dev.info.name));
  card.appendChild(h);
  card.appendChild(el("div", "uuid", uuid));
  const owner = el("div", "owner");
  owner.hidden = true;
  card.appendChild(owner);
  const badges = el("div", "badges");
  card.appendChild(badges);
  const figs = el("div", "figs");
  const figEls = FIELDS.map((f) => {
    const box = el("div", "fig");
    const v = el("div", "v", "–");
    v.setAttribute("data-field", f.key);
    box.appendChild(v);
    box.appendChild(el("div", "l", f.label));
    figs.appendChild(box);
    return v;
  });
  card.appendChild(figs);
  const charts = el("div", "charts");
  card.appendChild(charts);
  const grid = document.getElementById("gpus");
  // Keep cards in index order.
  const after = [...grid.children].find((c) => Number(c.dataset.index) > dev.info.index);
  card.dataset.index = String(dev.info.index);
  grid.insertBefore(card, after || null);
  document.getElementById("empty").hidden = true;
  g = { card, owner, badges, figs: figEls, chartBox: charts, charts: [], data: [[], [], [], [], [], []] };
  gpus.set(uuid, g);
  makeCharts(g);
  return g;
}

function makeCharts(g) {
  if (typeof uPlot === "undefined") return; // figures still work without the library
  const width = Math.max(200, g.chartBox.clientWidth || 330);
  FIELDS.forEach((f, i) => {
    const box = el("div", "chart");
    box.appendChild(el("div", "l", f.label + " (" + f.unit + ")"));
    g.chartBox.appendChild(box);
    const opts = {
      width,
      height: 60,
      legend: { show: false },
      cursor: { show: false },
      scales: { x: { time: true }, y: { range: (u, min, max) => [Math.min(0, min), Math.max(max * 1.1, 1)] } },
      axes: [
        { show: false },
        // Small charts: allow ticks 14 px apart, or uPlot labels only the zero line.
        { stroke: "#9aa0aa", size: 44, space: 14, grid: { stroke: "#2a2f3a" }, ticks: { show: false }, font: "10px sans-serif" },
      ],
      series: [{}, { stroke: f.color, fill: f.color + "33", width: 1.5, points: { show: false } }],
    };
    g.charts.push(new uPlot(opts, [g.data[0], g.data[i + 1]], box));
  });
}

function pushPoint(point) {
  for (const [uuid, vals] of Object.entries(point.gpus)) {
    const g = gpus.get(uuid);
    if (!g) continue;
    const d = g.data;
    if (d[0].length && point.t <= d[0][d[0].length - 1]) continue; // already have it
    d[0].push(point.t);
    vals.forEach((v, i) => d[i + 1].push(v));
    while (d[0].length && d[0][0] < point.t - WINDOW_S) d.forEach((a) => a.shift());
  }
}

function redraw() {
  for (const g of gpus.values()) {
    g.charts.forEach((c, i) => c.setData([g.data[0], g.data[i + 1]]));
  }
}

// ---------------------------------------------------------------------------------- snapshot
function render(s) {
  // Data not read from a GPU just now says so: simulated (mock) or a recorded trace (replay).
  const backend = s.system && s.system.backend;
  const banner = document.getElementById("banner");
  banner.hidden = !(backend === "mock" || backend === "replay");
  if (backend === "replay") {
    banner.textContent = "REPLAYED DATA — this agent plays back a recorded trace (--backend replay); no value on this page is being read from a GPU now.";
  }
  host(s);
  for (const dev of s.devices || []) {
    const g = card(dev);
    const vals = [
      dev.utilization?.gpu != null ? dev.utilization.gpu * 100 : null,
      dev.memory?.used != null ? dev.memory.used / 2 ** 30 : null,
      dev.power?.usage_watts,
      dev.temperature?.gpu,
      dev.clocks?.sm != null ? dev.clocks.sm / 1e6 : null,
    ];
    vals.forEach((v, i) => {
      g.figs[i].textContent = v == null ? "–" : FIELDS[i].fmt(v);
    });
    if (dev.memory?.total != null) g.figs[1].title = gib(dev.memory.used) + " of " + gib(dev.memory.total);
    // With attribution on: who holds the GPU (its pods, then its processes' owners).
    const who = ownerText(dev.owners);
    g.owner.textContent = who;
    g.owner.hidden = who === "";
    const up = dev.state === undefined || dev.state === "ok";
    g.card.classList.toggle("down", !up);
    g.card.title = up ? "" : "state: " + dev.state;
  }
  findings(s.diagnosis);
  processes(s.devices || []);
  steps(s.steps);
}

function host(s) {
  const dl = document.getElementById("host");
  clear(dl);
  const sys = s.system || {};
  const n = (s.devices || []).length;
  const rows = [
    ["host", sys.hostname],
    ["backend", sys.backend],
    ["driver", sys.driver_version],
    ["GPUs", n],
    ["busy", n ? (s.devices.filter((d) => (d.utilization?.gpu || 0) > 0.05).length + " of " + n) : null],
    ["power", n ? s.devices.reduce((a, d) => a + (d.power?.usage_watts || 0), 0).toFixed(0) + " W" : null],
    ["sample", "#" + s.seq + " at " + new Date((s.taken_at || 0) / 1e6).toLocaleTimeString()],
    // A tick whose sample failed carries no GPUs, only why (the cards keep their last values).
    ["sampling", s.sampling?.failed ? "FAILED: " + s.sampling.failed.reason : null],
  ];
  for (const [k, v] of rows) {
    if (v == null || v === "") continue;
    const d = el("div");
    d.appendChild(el("dt", null, k));
    d.appendChild(el("dd", null, v));
    dl.appendChild(d);
  }
}

// Findings grouped by kind: one entry per (severity, kind) with its GPUs, the advice once, and
// each GPU's evidence; each card also shows the kinds active on it.
function findings(diagnosis) {
  const list = document.getElementById("findings");
  const active = (diagnosis && diagnosis.active) || [];
  document.getElementById("findings-section").hidden = !diagnosis;
  clear(list);
  const byGpu = new Map();
  for (const f of active) {
    if (f.uuid == null) continue;
    if (!byGpu.has(f.uuid)) byGpu.set(f.uuid, []);
    byGpu.get(f.uuid).push(f);
  }
  for (const [uuid, g] of gpus) {
    const fs = byGpu.get(uuid) || [];
    clear(g.badges);
    for (const f of fs) g.badges.appendChild(el("span", "badge " + String(f.severity || ""), f.kind));
  }
  if (!active.length) {
    list.appendChild(el("li", null, "No active findings."));
    return;
  }
  const groups = new Map();
  for (const f of active) {
    const key = f.severity + "|" + f.kind;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(f);
  }
  for (const fs of groups.values()) {
    const f = fs[0];
    const li = el("li", String(f.severity || "").toLowerCase());
    const where = fs.map((x) => x.gpu).filter((x) => x != null);
    const what = [f.severity, f.kind, where.length ? (where.length > 1 ? "GPUs " : "GPU ") + where.join(", ") : null]
      .filter((x) => x != null)
      .join(" · ");
    li.appendChild(el("div", "what", what));
    if (f.advice) li.appendChild(el("div", "advice", "→ " + f.advice));
    const ev = el("ul", "evidence");
    for (const x of fs) if (x.evidence) ev.appendChild(el("li", null, (x.gpu != null ? "GPU " + x.gpu + ": " : "") + x.evidence));
    li.appendChild(ev);
    list.appendChild(li);
  }
}

function processes(devices) {
  const rows = [];
  for (const d of devices) for (const p of d.processes || []) rows.push([d.info.index, p]);
  document.getElementById("procs-section").hidden = rows.length === 0;
  const body = document.getElementById("procs");
  clear(body);
  rows.sort((a, b) => a[0] - b[0] || a[1].pid - b[1].pid);
  for (const [gpu, p] of rows) {
    const tr = el("tr");
    const sm = p.sm_utilization != null ? (p.sm_utilization * 100).toFixed(0) + " %" : "–";
    [gpu, p.pid, p.name ?? "", ownerText([p.owner]), gib(p.memory_used), sm]
      .forEach((v) => tr.appendChild(el("td", null, v)));
    body.appendChild(tr);
  }
}

// Training steps: rendered from whatever the JSON holds (a list of records, or one record), so
// the page needs no change when the agent's step model grows a field.
function steps(st) {
  const section = document.getElementById("steps-section");
  const box = document.getElementById("steps");
  section.hidden = st == null;
  if (st == null) return;
  clear(box);
  let records = Array.isArray(st) ? st : (Array.isArray(st.recent) ? st.recent : [st]);
  records = records.filter((r) => r && typeof r === "object").slice(-10);
  if (!records.length) {
    box.appendChild(el("p", "empty", "No steps reported yet."));
    return;
  }
  const keys = [];
  for (const r of records) for (const k of Object.keys(r)) if (!keys.includes(k) && typeof r[k] !== "object") keys.push(k);
  const table = el("table", "steps");
  const head = el("tr");
  keys.forEach((k) => head.appendChild(el("th", null, k)));
  table.appendChild(head);
  for (const r of records) {
    const tr = el("tr");
    keys.forEach((k) => {
      const v = r[k];
      tr.appendChild(el("td", null, typeof v === "number" && !Number.isInteger(v) ? v.toPrecision(4) : v ?? ""));
    });
    table.appendChild(tr);
  }
  box.appendChild(table);
}

// ---------------------------------------------------------------------------------- wiring
function onEvent(msg) {
  const s = msg.snapshot;
  if (!s) return;
  render(s);
  if (msg.point) pushPoint(msg.point);
  lastSeq = s.seq;
  redraw();
}

async function start() {
  const conn = document.getElementById("conn");
  try {
    const r = await fetch("api/history?seconds=" + WINDOW_S, { cache: "no-store" });
    if (r.ok) {
      const snap = await fetch("api/snapshot", { cache: "no-store" });
      if (snap.ok) render(await snap.json());
      const h = await r.json();
      for (const p of h.points) pushPoint(p);
      redraw();
    }
  } catch (e) {
    conn.textContent = "history unavailable";
  }
  const es = new EventSource("api/stream");
  es.addEventListener("snapshot", (ev) => {
    conn.textContent = "live";
    conn.classList.add("live");
    try {
      onEvent(JSON.parse(ev.data));
    } catch (e) {
      conn.textContent = "bad event: " + e;
    }
  });
  es.onerror = () => {
    conn.textContent = "reconnecting…";
    conn.classList.remove("live");
  };
  window.addEventListener("resize", () => {
    for (const g of gpus.values()) {
      const w = Math.max(200, g.chartBox.clientWidth);
      g.charts.forEach((c) => c.setSize({ width: w, height: 60 }));
    }
  });
}

document.addEventListener("DOMContentLoaded", start);
