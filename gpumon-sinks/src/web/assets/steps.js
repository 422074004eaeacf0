// gpumon live view: the training-steps section (loaded after app.js, whose helpers — el,
// clear, gib, deviceLabel — it uses; every name reaches the DOM as text, as in app.js).
"use strict";

// Training steps (the step tracker's `steps`: one entry per run — job and rank — with its last
// step): per run the step time of its recent steps as they arrive, and per GPU the utilisation,
// memory peak and energy of the last step.
const stepLog = new Map(); // "job|rank" -> [{ step, duration, util }] (newest last, at most 10)
function steps(st, devices) {
  const section = document.getElementById("steps-section");
  const box = document.getElementById("steps");
  const runs = (st && Array.isArray(st.runs) ? st.runs : []).filter((r) => r && r.last_step != null);
  section.hidden = runs.length === 0;
  if (!runs.length) return;
  clear(box);
  const byUuid = new Map(devices.map((d) => [d.info.uuid, d.info]));
  for (const run of runs) {
    const key = run.job + "|" + (run.rank_label ?? "");
    const log = stepLog.get(key) || [];
    const last = run.last;
    if (last && (!log.length || log[log.length - 1].step !== last.step)) {
      const us = (last.devices || []).map((g) => g.utilization_mean).filter((u) => u != null);
      log.push({ step: last.step, duration: last.duration, util: us.length ? us.reduce((a, b) => a + b, 0) / us.length : null });
      if (log.length > 10) log.shift();
      stepLog.set(key, log);
    }
    const div = el("div", "run");
    div.setAttribute("data-job", String(run.job));
    const rank = run.rank_label ? " · rank " + run.rank_label : "";
    const dur = run.last_duration != null ? " · " + run.last_duration.toFixed(3) + " s per step" : "";
    div.appendChild(el("div", "what", "job " + run.job + rank + " · step " + run.last_step + dur));
    const recent = el("table", "steps recent");
    const head = el("tr");
    ["step", "time", "mean utilisation"].forEach((k) => head.appendChild(el("th", null, k)));
    recent.appendChild(head);
    for (const r of [...log].reverse()) {
      const tr = el("tr");
      [r.step, r.duration != null ? r.duration.toFixed(3) + " s" : "–", r.util != null ? (r.util * 100).toFixed(0) + " %" : "–"]
        .forEach((v) => tr.appendChild(el("td", null, v)));
      recent.appendChild(tr);
    }
    div.appendChild(recent);
    if (last && (last.devices || []).length) {
      const per = el("table", "steps per-gpu");
      const h = el("tr");
      ["device (step " + last.step + ")", "utilisation mean", "max", "memory peak", "energy"].forEach((k) => h.appendChild(el("th", null, k)));
      per.appendChild(h);
      for (const g of last.devices) {
        const info = byUuid.get(g.uuid);
        const tr = el("tr");
        const pct = (x) => (x != null ? (x * 100).toFixed(0) + " %" : "–");
        [info ? deviceLabel(info) : g.uuid, pct(g.utilization_mean), pct(g.utilization_max), gib(g.memory_peak_bytes),
          g.energy_joules != null ? g.energy_joules.toFixed(0) + " J" : "–"].forEach((v) => tr.appendChild(el("td", null, v)));
        per.appendChild(tr);
      }
      div.appendChild(per);
    }
    box.appendChild(div);
  }
}
