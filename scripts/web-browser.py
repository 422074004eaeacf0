#!/usr/bin/env python3
"""Drive headless Chromium against gpumon's web view, in real time, and print what it shows.

Usage:
  web-browser.py URL [--at SECONDS]... [--screenshot OUT.png [--full-page]] [--size 1280x900]
                 [--header 'Name: value']... [--exec-at SECONDS:COMMAND]... [--click-at SECONDS:SELECTOR]...
                 [--metrics]

Opens URL in a fresh headless Chromium profile and, at each --at time (seconds after the page
started loading; default 3), probes the live DOM: the GPU cards (data-gpu-uuid, name, figures),
the banner, the host summary, the connection state, the overview, the findings, the page's size,
the page's own per-event main-thread time, how many elements of each tag exist. --exec-at runs a
command at a given time (stop the agent, release a held stream) and --click-at clicks an element,
both in the same timeline as the probes. Prints one JSON object: {"probes": [...], "actions":
[...], "dialogs": [...], "exceptions": [...], "console_errors": [...]}.
"dialogs" lists every alert/confirm/prompt the page opened (there must be none: names are text).

Why not `chromium --dump-dom`: with a live stream (Server-Sent Events) open, virtual time never
runs out and it never returns. This talks the DevTools protocol over --remote-debugging-pipe
(file descriptors 3 and 4), Python standard library only, like ../shared/backends/dom-live.py.
"""
import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

PROBE = r"""
(() => {
  const q = (s) => document.querySelector(s);
  const shown = (e) => !!e && !e.hidden && e.getClientRects().length > 0;
  const tags = {};
  for (const e of document.getElementsByTagName('*')) tags[e.tagName.toLowerCase()] = (tags[e.tagName.toLowerCase()] || 0) + 1;
  const ticks = (window.__gpumonTicks || []).slice().sort((a, b) => a - b);
  const pct = (p) => ticks.length ? ticks[Math.min(ticks.length - 1, Math.floor(p * ticks.length))] : null;
  return JSON.stringify({
    title: document.title,
    cards: [...document.querySelectorAll('#gpus [data-gpu-uuid]')].map((c) => ({
      uuid: c.getAttribute('data-gpu-uuid'),
      label: c.querySelector('.idx') ? c.querySelector('.idx').textContent : null,
      name: c.querySelector('.name') ? c.querySelector('.name').textContent : null,
      name_title: c.querySelector('.name') ? c.querySelector('.name').title : null,
      name_children: c.querySelector('.name') ? c.querySelector('.name').children.length : null,
      owner: c.querySelector('.owner') && !c.querySelector('.owner').hidden ? c.querySelector('.owner').textContent : null,
      owner_children: c.querySelector('.owner') ? c.querySelector('.owner').children.length : null,
      figures: Object.fromEntries([...c.querySelectorAll('[data-field]')].map((v) => [v.getAttribute('data-field'), v.textContent])),
      shown_figures: [...c.querySelectorAll('[data-field]')].filter((v) => shown(v)).map((v) => v.getAttribute('data-field')),
      figure_opacity: c.querySelector('.figs') ? Number(getComputedStyle(c.querySelector('.figs')).opacity) : null,
      canvases: c.querySelectorAll('canvas').length,
      legend_values: [...c.querySelectorAll('.u-legend .u-value')].map((v) => v.textContent),
      chart_labels: [...c.querySelectorAll('.chart')].map((x) => x.getAttribute('aria-label')),
      // uPlot draws axis text on the canvas; each axis it draws has a div of its own.
      chart_axes: c.querySelector('.chart') ? c.querySelector('.chart').querySelectorAll('.u-axis').length : null,
      // Each chart's scales and axis labels as uPlot drew them (the page's `gpus` map; uPlot
      // 1.6 keeps an axis's last splits and labels in _splits / _values).
      charts: (() => {
        const g = typeof gpus !== 'undefined' ? gpus.get(c.getAttribute('data-gpu-uuid')) : null;
        if (!g) return [];
        return g.charts.map((u, i) => u ? {
          field: FIELDS[i].key, y_min: u.scales.y.min, y_max: u.scales.y.max, height: u.height,
          plot_height: Math.round(u.bbox.height / devicePixelRatio),
          x_labels: (u.axes[0]._values || []).map(String), y_ticks: (u.axes[1]._splits || []).length,
        } : null).filter((x) => x);
      })(),
      width: Math.round(c.getBoundingClientRect().width),
      failed: c.classList.contains('failed'),
      why: c.querySelector('.why') && !c.querySelector('.why').hidden ? c.querySelector('.why').textContent : null,
      state: c.querySelector('.state') && !c.querySelector('.state').hidden ? c.querySelector('.state').textContent : null,
      detail: [...c.querySelectorAll('.detail dt')].map((dt) => [dt.textContent, dt.nextSibling ? dt.nextSibling.textContent : null]),
      overflows: c.scrollWidth > c.clientWidth + 1,
      right: Math.round(c.getBoundingClientRect().right),
      top: Math.round(c.getBoundingClientRect().top + window.scrollY),
      height: Math.round(c.getBoundingClientRect().height),
    })),
    overview: [...document.querySelectorAll('#overview .cell')].map((c) => ({
      uuid: c.getAttribute('data-gpu-uuid'), text: c.textContent, util: c.dataset.util, finding: c.dataset.finding || '',
      top: Math.round(c.getBoundingClientRect().top + window.scrollY),
    })),
    overview_bottom: q('#overview') ? Math.round(q('#overview').getBoundingClientRect().bottom + window.scrollY) : null,
    banner: q('#banner') ? !q('#banner').hidden : null,
    banner_text: q('#banner') ? q('#banner').textContent : null,
    busy: q('#host [data-busy]') ? q('#host [data-busy]').textContent : null,
    busy_title: q('#host [data-busy]') ? q('#host [data-busy]').title : null,
    grid_width: q('#gpus') ? Math.round(q('#gpus').getBoundingClientRect().width) : null,
    host: q('#host') ? q('#host').textContent : null,
    conn: q('#conn') ? q('#conn').textContent : null,
    conn_state: q('#conn') ? q('#conn').dataset.state : null,
    stale_at_age: q('#conn') && q('#conn').dataset.staleAtAge ? Number(q('#conn').dataset.staleAtAge) : null,
    empty: q('#empty') && !q('#empty').hidden ? q('#empty').textContent : null,
    findings: q('#findings-section') && !q('#findings-section').hidden ? [...document.querySelectorAll('#findings > li')].map((l) => l.textContent) : null,
    finding_groups: [...document.querySelectorAll('#findings > li[data-kind]')].map((l) => ({
      kind: l.dataset.kind, what: l.querySelector('.what').textContent,
      since: l.querySelector('.since') ? l.querySelector('.since').textContent : null,
      evidence_text: [...l.querySelectorAll('.evidence li')].map((e) => e.textContent),
      folded: !!l.querySelector('details.fold') && !l.querySelector('details.fold').open,
      evidence: l.querySelectorAll('.evidence li').length,
      height: Math.round(l.getBoundingClientRect().height),
    })),
    processes: q('#procs-section') && !q('#procs-section').hidden ? document.querySelectorAll('#procs tr').length : null,
    process_rows: [...document.querySelectorAll('#procs tr')].map((tr) => [...tr.children].map((td) => td.textContent)),
    steps: q('#steps-section') && !q('#steps-section').hidden ? q('#steps').textContent : null,
    step_runs: [...document.querySelectorAll('#steps .run')].map((r) => ({
      job: r.dataset.job, what: r.querySelector('.what').textContent,
      recent: [...r.querySelectorAll('table.recent tr')].slice(1).map((tr) => [...tr.children].map((td) => td.textContent)),
      per_gpu: [...r.querySelectorAll('table.per-gpu tr')].slice(1).map((tr) => [...tr.children].map((td) => td.textContent)),
    })),
    page: { width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight,
            viewport: window.innerWidth, viewport_height: window.innerHeight, body_width: document.body.scrollWidth, scroll_y: Math.round(window.scrollY) },
    ticks: { n: ticks.length, median_ms: pct(0.5), p95_ms: pct(0.95), max_ms: ticks.length ? ticks[ticks.length - 1] : null },
    tags,
    pwned: window.__pwned === true,
  });
})()
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--at", type=float, action="append")
    ap.add_argument("--screenshot")
    ap.add_argument("--size", default="1280x900")
    ap.add_argument("--full-page", action="store_true", help="screenshot the whole page, not the window")
    ap.add_argument("--header", action="append", default=[],
                    help="send this header with every request of the page, its fetches and its live stream "
                         "(e.g. 'Authorization: Basic …')")
    ap.add_argument("--exec-at", action="append", default=[], metavar="SECONDS:COMMAND",
                    help="run COMMAND (sh -c, not waited for) this many seconds after the page started loading: "
                         "e.g. '4:kill -STOP 1234' to stop the agent while the page watches")
    ap.add_argument("--click-at", action="append", default=[], metavar="SECONDS:SELECTOR",
                    help="click the first element matching SELECTOR (scrolling it into view) at this time")
    ap.add_argument("--hover-at", action="append", default=[], metavar="SECONDS:SELECTOR",
                    help="move the mouse to the middle of the first element matching SELECTOR at this time")
    ap.add_argument("--start-when", metavar="STATE",
                    help="start the timeline (--at, --exec-at, …) when the page's state (#conn data-state: live, "
                         "stale, failed, waiting, …) first reads STATE rather than when it starts loading; fails after 60 s")
    ap.add_argument("--metrics", action="store_true",
                    help="add the renderer's DevTools Performance.getMetrics (TaskDuration, ScriptDuration, "
                         "LayoutDuration, …, cumulative seconds) to each probe")
    ap.add_argument("--network", action="store_true",
                    help="add \"network\": per request path, its status, Content-Encoding, and the bytes received "
                         "on the wire (encoded) and after decoding, up to the last probe")
    ap.add_argument("--chromium", default=os.environ.get("GPUMON_TEST_CHROMIUM") or shutil.which("chromium") or "chromium")
    args = ap.parse_args()
    times = sorted(args.at or [3.0])
    actions = []  # (seconds, kind, argument)
    for spec in args.exec_at:
        at, cmd = spec.split(":", 1)
        actions.append((float(at), "exec", cmd))
    for spec in args.click_at:
        at, sel = spec.split(":", 1)
        actions.append((float(at), "click", sel))
    for spec in args.hover_at:
        at, sel = spec.split(":", 1)
        actions.append((float(at), "hover", sel))
    width, height = (int(x) for x in args.size.split("x"))

    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()

    def wire():
        os.dup2(to_r, 3)
        os.dup2(from_w, 4)

    profile = tempfile.mkdtemp(prefix="gpumon-chromium.")
    chrome = subprocess.Popen(
        [args.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--no-default-browser-check", "--hide-scrollbars",
         f"--user-data-dir={profile}", f"--window-size={width},{height}", "--remote-debugging-pipe", "about:blank"],
        pass_fds=(3, 4), preexec_fn=wire, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(to_r)
    os.close(from_w)
    state = {"pending": b"", "id": 0}
    events = []

    def read_msg(deadline):
        while b"\0" not in state["pending"]:
            if time.monotonic() > deadline:
                raise SystemExit("web-browser.py: chromium did not answer in time")
            chunk = os.read(from_r, 1 << 16)
            if not chunk:
                raise SystemExit("web-browser.py: chromium closed the pipe")
            state["pending"] += chunk
        line, state["pending"] = state["pending"].split(b"\0", 1)
        return json.loads(line)

    def call(method, params=None, session=None):
        state["id"] += 1
        msg = {"id": state["id"], "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + 30
        while True:
            reply = read_msg(deadline)
            if reply.get("id") == state["id"]:
                if "error" in reply:
                    raise SystemExit(f"web-browser.py: {method}: {reply['error']}")
                return reply["result"]
            if "method" in reply:
                events.append(reply)

    out = {"probes": [], "dialogs": [], "exceptions": [], "console_errors": []}
    try:
        target = call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        domains = ("Page", "Runtime", "Log", "Performance") if args.metrics else ("Page", "Runtime", "Log")
        for domain in domains:
            call(f"{domain}.enable", {}, session)
        if args.header or args.network:
            call("Network.enable", {}, session)
        if args.header:
            headers = dict(h.split(":", 1) for h in args.header)
            call("Network.setExtraHTTPHeaders", {"headers": {k.strip(): v.strip() for k, v in headers.items()}}, session)
        call("Emulation.setDeviceMetricsOverride",
             {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
        t0 = time.monotonic()
        call("Page.navigate", {"url": args.url}, session)
        if args.start_when:
            # A loaded machine can take seconds to bring the page up: time the script from the
            # state it is about, not from navigation.
            expr = "(() => { const c = document.querySelector('#conn'); return c ? c.dataset.state : null; })()"
            while call("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session)["result"].get("value") != args.start_when:
                if time.monotonic() - t0 > 60:
                    raise SystemExit(f"web-browser.py: the page never reached state {args.start_when!r} in 60 s")
                time.sleep(0.05)
            out["started_after"] = round(time.monotonic() - t0, 2)
            t0 = time.monotonic()
        out["actions"] = []
        steps = sorted([(at, "probe", None) for at in times] + actions, key=lambda x: x[0])
        for at, kind, arg in steps:
            time.sleep(max(0.0, t0 + at - time.monotonic()))  # real time: the stream keeps running
            if kind == "exec":
                subprocess.Popen(["sh", "-c", arg])
                out["actions"].append({"at": round(time.monotonic() - t0, 2), "exec": arg})
                continue
            if kind == "hover":
                js = ("(() => { const e = document.querySelector(%s); if (!e) return null; e.scrollIntoView({block: 'center'}); "
                      "const r = e.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; })()"
                      % json.dumps(arg))
                xy = call("Runtime.evaluate", {"expression": js, "returnByValue": True}, session)["result"].get("value")
                if xy:
                    call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": xy[0], "y": xy[1]}, session)
                out["actions"].append({"at": round(time.monotonic() - t0, 2), "hover": arg, "found": bool(xy)})
                continue
            if kind == "click":
                js = ("(() => { const e = document.querySelector(%s); if (!e) return false; e.click(); return true; })()"
                      % json.dumps(arg))
                ok = call("Runtime.evaluate", {"expression": js, "returnByValue": True}, session)["result"].get("value")
                out["actions"].append({"at": round(time.monotonic() - t0, 2), "click": arg, "found": ok,
                                       "scroll_y": call("Runtime.evaluate", {"expression": "window.scrollY", "returnByValue": True}, session)["result"].get("value")})
                continue
            expr = {"expression": PROBE, "returnByValue": True}
            value = call("Runtime.evaluate", expr, session)["result"].get("value")
            probe = json.loads(value) if value else {}
            probe["at"] = round(time.monotonic() - t0, 2)
            if args.metrics:
                metrics = call("Performance.getMetrics", {}, session)["metrics"]
                probe["metrics"] = {m["name"]: m["value"] for m in metrics}
            out["probes"].append(probe)
        if args.screenshot:
            shot = call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": args.full_page}, session)
            with open(args.screenshot, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
        requests = {}  # requestId -> {path, status, encoding, encoded, decoded}
        # A dialog would block the page: if one opened, close it so the browser can exit.
        for ev in events:
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Network.responseReceived":
                resp = p.get("response", {})
                url = resp.get("url", "")
                path = "/" + url.split("/", 3)[3] if url.count("/") >= 3 else url
                headers = {k.lower(): v for k, v in resp.get("headers", {}).items()}
                requests[p["requestId"]] = {"path": path, "status": resp.get("status"),
                                            "encoding": headers.get("content-encoding"), "encoded": 0, "decoded": 0}
            elif m == "Network.dataReceived" and p.get("requestId") in requests:
                r = requests[p["requestId"]]
                r["encoded"] += p.get("encodedDataLength", 0)
                r["decoded"] += p.get("dataLength", 0)
            elif m == "Network.loadingFinished" and p.get("requestId") in requests:
                # Whole answers report their size on the wire here (headers included).
                r = requests[p["requestId"]]
                r["encoded"] = max(r["encoded"], p.get("encodedDataLength", 0))
            if m == "Page.javascriptDialogOpening":
                out["dialogs"].append(p.get("message"))
            elif m == "Runtime.exceptionThrown":
                out["exceptions"].append(p.get("exceptionDetails", {}).get("text"))
            elif m == "Runtime.consoleAPICalled" and p.get("type") == "error":
                out["console_errors"].append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out["console_errors"].append(p["entry"].get("text"))
        if args.network:
            out["network"] = list(requests.values())
    finally:
        chrome.kill()
        chrome.wait()
        shutil.rmtree(profile, ignore_errors=True)
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
