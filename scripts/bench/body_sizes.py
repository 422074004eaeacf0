"""The bytes each sink of the agent moves per tick, for scripts/bench/export_floor.rs.

Runs the agent command given after `--` for a few seconds with every sink at 1 s — stdout JSON,
InfluxDB and OTLP/HTTP pointed at a capturing HTTP server here, Prometheus on a free port that is
scraped once — and prints one line: `<stdout> <otlp> <influx> <scrape>`, the byte sizes of the
longest JSON line, of the largest OTLP and InfluxDB request bodies, and of one exposition.
(An InfluxDB request may hold two snapshots when two exports fall within one batch interval;
the largest body is then an upper bound.)
Loopback only; stdlib only.

    python body_sizes.py -- gpumon-agent --backend nvml --nvml-library .../libnvidia-ml.so.1
"""
import http.server
import socket
import subprocess
import sys
import threading
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    if "--" not in sys.argv:
        print(__doc__, file=sys.stderr)
        return 2
    agent = sys.argv[sys.argv.index("--") + 1 :]
    sizes = {"/v1/metrics": 0, "/write": 0}

    class Capture(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802 (http.server's naming)
            n = int(self.headers.get("Content-Length", 0))
            self.rfile.read(n)
            path = self.path.split("?")[0]
            if path in sizes:
                sizes[path] = max(sizes[path], n)
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    cap_port, prom_port = free_port(), free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", cap_port), Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cmd = agent + [
        "--interval", "1s", "--duration", "4s", "--stdout-format", "json", "--stdout",
        "--influx-url", f"http://127.0.0.1:{cap_port}", "--influx-db", "gpumon",
        "--otlp-endpoint", f"http://127.0.0.1:{cap_port}", "--otlp-protocol", "http",
        "--prometheus-listen", f"127.0.0.1:{prom_port}",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    first = proc.stdout.readline()
    scrape = 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and scrape == 0:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/metrics", timeout=2) as r:
                scrape = len(r.read())
        except OSError:
            time.sleep(0.1)
    longest = max([len(first)] + [len(line) for line in proc.stdout])
    proc.wait(timeout=30)
    server.shutdown()
    got = [longest, sizes["/v1/metrics"], sizes["/write"], scrape]
    if 0 in got:
        print(f"body_sizes: a sink moved nothing: stdout otlp influx scrape = {got}", file=sys.stderr)
        return 1
    print(*got)
    return 0


if __name__ == "__main__":
    sys.exit(main())
