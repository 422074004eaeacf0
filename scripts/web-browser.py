#!/usr/bin/env python3
"""Drive headless Chromium against gpumon's web view, in real time, and print what it shows.

Usage:
  web-browser.py URL [--at SECONDS]... [--screenshot OUT.png [--full-page]] [--size 1280x900]
                 [--header 'Name: value']...

Opens URL in a fresh headless Chromium profile and, at each --at time (seconds after the page
started loading; default 3), probes the live DOM: the GPU cards (data-gpu-uuid, name, figures),
the banner, the host summary, the findings, how many elements of each tag exist. Prints one JSON
object: {"probes": [...], "dialogs": [...], "exceptions": [...], "console_errors": [...]}.
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
  const tags = {};
  for (const e of document.getElementsByTagName('*')) tags[e.tagName.toLowerCase()] = (tags[e.tagName.toLowerCase()] || 0) + 1;
  return JSON.stringify({
    title: document.title,
    cards: [...document.querySelectorAll('[data-gpu-uuid]')].map((c) => ({
      uuid: c.getAttribute('data-gpu-uuid'),
      name: c.querySelector('.name') ? c.querySelector('.name').textContent : null,
      name_children: c.querySelector('.name') ? c.querySelector('.name').children.length : null,
      owner: c.querySelector('.owner') && !c.querySelector('.owner').hidden ? c.querySelector('.owner').textContent : null,
      owner_children: c.querySelector('.owner') ? c.querySelector('.owner').children.length : null,
      figures: Object.fromEntries([...c.querySelectorAll('[data-field]')].map((v) => [v.getAttribute('data-field'), v.textContent])),
      canvases: c.querySelectorAll('canvas').length,
    })),
    banner: q('#banner') ? !q('#banner').hidden : null,
    banner_text: q('#banner') ? q('#banner').textContent : null,
    host: q('#host') ? q('#host').textContent : null,
    conn: q('#conn') ? q('#conn').textContent : null,
    findings: q('#findings-section') && !q('#findings-section').hidden ? [...document.querySelectorAll('#findings > li')].map((l) => l.textContent) : null,
    processes: q('#procs-section') && !q('#procs-section').hidden ? document.querySelectorAll('#procs tr').length : null,
    process_rows: [...document.querySelectorAll('#procs tr')].map((tr) => [...tr.children].map((td) => td.textContent)),
    steps: q('#steps-section') && !q('#steps-section').hidden ? q('#steps').textContent : null,
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
    ap.add_argument("--chromium", default=os.environ.get("GPUMON_TEST_CHROMIUM") or shutil.which("chromium") or "chromium")
    args = ap.parse_args()
    times = sorted(args.at or [3.0])
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
        for domain in ("Page", "Runtime", "Log"):
            call(f"{domain}.enable", {}, session)
        if args.header:
            headers = dict(h.split(":", 1) for h in args.header)
            call("Network.enable", {}, session)
            call("Network.setExtraHTTPHeaders", {"headers": {k.strip(): v.strip() for k, v in headers.items()}}, session)
        call("Emulation.setDeviceMetricsOverride",
             {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
        t0 = time.monotonic()
        call("Page.navigate", {"url": args.url}, session)
        for at in times:
            time.sleep(max(0.0, t0 + at - time.monotonic()))  # real time: the stream keeps running
            expr = {"expression": PROBE, "returnByValue": True}
            value = call("Runtime.evaluate", expr, session)["result"].get("value")
            probe = json.loads(value) if value else {}
            probe["at"] = round(time.monotonic() - t0, 2)
            out["probes"].append(probe)
        if args.screenshot:
            shot = call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": args.full_page}, session)
            with open(args.screenshot, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
        # A dialog would block the page: if one opened, close it so the browser can exit.
        for ev in events:
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Page.javascriptDialogOpening":
                out["dialogs"].append(p.get("message"))
            elif m == "Runtime.exceptionThrown":
                out["exceptions"].append(p.get("exceptionDetails", {}).get("text"))
            elif m == "Runtime.consoleAPICalled" and p.get("type") == "error":
                out["console_errors"].append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out["console_errors"].append(p["entry"].get("text"))
    finally:
        chrome.kill()
        chrome.wait()
        shutil.rmtree(profile, ignore_errors=True)
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
