#!/usr/bin/env python3
"""How fast /health answers while many connections sit open (issue 30): IDLE connections that
connected and sent nothing, and HALF connections that sent half a request header and stopped.
A liveness probe that waits behind them gets a healthy server killed.

Starts `strata serve` (house-llama, cpu), opens the connections, then sends PROBES /health requests
one after another on fresh connections and prints p50 / p99 / max latency and how many got no 200
within TIMEOUT seconds. Traffic goes to 127.0.0.1 only.

  python3 bench/health_under_connections.py --idle 1000 --half 1000
"""
import argparse
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time


def probe(port, timeout):
    start = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        return time.monotonic() - start, data.startswith(b"HTTP/1.1 200")
    except OSError:
        return time.monotonic() - start, False
    finally:
        s.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/strata")
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--half", type=int, default=1000)
    ap.add_argument("--probes", type=int, default=50)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--server-args", default="")
    args = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the server inherits it too
    log_path = os.path.join(tempfile.mkdtemp(prefix="strata_health_"), "server.log")
    server = subprocess.Popen([args.binary, "serve", "--port", "0"] + args.server_args.split(),
                              stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    port = None
    for _ in range(600):
        time.sleep(0.1)
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", open(log_path).read())
        if m:
            port = int(m.group(1))
            break
    if port is None:
        server.kill()
        sys.exit("the server did not start: " + open(log_path).read())
    base, ok = probe(port, args.timeout)
    print(f"/health with nothing open: {base * 1e3:.1f} ms ({'200' if ok else 'no 200'})")
    held = []
    try:
        for _ in range(args.idle):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        for _ in range(args.half):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
            held.append(s)
        print(f"holding {args.idle} idle + {args.half} half-header connections")
        times, failed = [], 0
        for _ in range(args.probes):
            t, ok = probe(port, args.timeout)
            times.append(t)
            failed += not ok
        times.sort()
        p = lambda q: times[min(len(times) - 1, int(q * len(times)))]
        print(f"/health x{args.probes}: p50 {p(0.5) * 1e3:.1f} ms, p99 {p(0.99) * 1e3:.1f} ms, "
              f"max {times[-1] * 1e3:.1f} ms, {failed} without a 200 within {args.timeout:.0f} s")
    finally:
        for s in held:
            s.close()
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
