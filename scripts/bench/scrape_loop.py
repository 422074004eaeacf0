#!/usr/bin/env python3
"""The scrape loop used for every Prometheus endpoint in scripts/bench-peers.sh (gpumon's and
nvitop-exporter's alike): GET the URL N times at a fixed interval over one kept-alive HTTP/1.1
connection (as Prometheus does), record each request's latency (request sent -> whole body
read), and write them, one per line in milliseconds, to --out. Stdlib only.

    python scrape_loop.py --url http://127.0.0.1:9400/metrics --count 200 --interval 0.1 --out lat.txt

Exits 1 if any scrape fails (non-200 or connection error after one reconnect).
"""
import argparse
import http.client
import sys
import time
import urllib.parse

from pacing import Pacer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--interval", type=float, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the endpoint to answer 200 with a body")
    args = ap.parse_args()
    u = urllib.parse.urlsplit(args.url)
    path = u.path or "/"
    headers = {"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "identity"}

    def connect():
        return http.client.HTTPConnection(u.hostname, u.port, timeout=10)

    # Wait until the endpoint is up and has data.
    deadline = time.monotonic() + args.wait
    conn = connect()
    while True:
        try:
            conn.request("GET", path, headers=headers)
            r = conn.getresponse()
            body = r.read()
            if r.status == 200 and b"\n" in body and (b"gpu" in body.lower()):
                break
        except OSError:
            conn.close()
            conn = connect()
        if time.monotonic() > deadline:
            print(f"scrape_loop: {args.url} not ready after {args.wait}s", file=sys.stderr)
            return 1
        time.sleep(0.05)

    lat = []
    size = 0
    failures = 0
    pacer = Pacer(args.interval)
    for _ in range(args.count):
        t0 = time.perf_counter()
        try:
            conn.request("GET", path, headers=headers)
            r = conn.getresponse()
            body = r.read()
            ok = r.status == 200
        except OSError:
            conn.close()
            conn = connect()
            ok = False
            body = b""
        lat.append((time.perf_counter() - t0) * 1e3)
        if not ok:
            failures += 1
        size = len(body)
        pacer.wait()
    conn.close()
    with open(args.out, "w") as f:
        f.write("\n".join(f"{x:.4f}" for x in lat) + "\n")
    print(f"scrapes={len(lat)} failures={failures} body_bytes={size}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
