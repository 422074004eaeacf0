"""The cost of one step mark from Python, side by side with a bare Python function call.

    python gpumon-py/bench/step_cost.py [--number 200000] [--repeat 7]

Each call gets a fresh, increasing step number (`next(counter)`), whose own cost is measured
and shown as the first line; the figures are the best of `repeat` runs (timeit's advice: the
others measure the machine's noise). Monitor runs on the mock (no sink), StepClient sends to a
Unix socket: a running agent's (--socket, e.g. `agent --backend mock --steps-socket PATH`) or
one drained by a thread of this process (which competes with the loop for the GIL).
"""

import argparse
import itertools
import os
import socket
import tempfile
import threading
import timeit

import gpumon


def bare(n):
    pass


def per_call_ns(stmt, number, repeat, **names):
    times = timeit.repeat(stmt, number=number, repeat=repeat, globals=names)
    return min(times) / number * 1e9


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--number", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--socket", help="a running agent's --steps-socket (default: a socket drained by a thread here)")
    a = p.parse_args()

    rows = []
    c = itertools.count(1)
    rows.append(("next(counter) alone", per_call_ns("next(c)", a.number, a.repeat, c=c)))
    c = itertools.count(1)
    rows.append(("bare Python function f(n)", per_call_ns("f(next(c))", a.number, a.repeat, f=bare, c=c)))
    with gpumon.Monitor(backend="mock", interval="1s") as m:
        c = itertools.count(1)
        rows.append(("Monitor.step(n)", per_call_ns("m.step(next(c))", a.number, a.repeat, m=m, c=c)))

    path = a.socket
    if path is None:
        path = os.path.join(tempfile.mkdtemp(), "steps.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(1)

        def drain():
            conn, _ = srv.accept()
            while conn.recv(1 << 16):
                pass

        threading.Thread(target=drain, daemon=True).start()
    client = gpumon.StepClient(path, job="bench", rank=0)
    c = itertools.count(1)
    rows.append(("StepClient.step(n) (Unix socket)", per_call_ns("s.step(next(c))", a.number, a.repeat, s=client, c=c)))
    client.close()

    base = rows[0][1]
    print(f"{'call':36} {'ns/call':>9} {'minus next()':>13}")
    for name, ns in rows:
        print(f"{name:36} {ns:9.1f} {ns - base:13.1f}")
    print(f"(best of {a.repeat} x {a.number} calls; StepClient dropped {client.dropped})")


if __name__ == "__main__":
    main()
