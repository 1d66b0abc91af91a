#!/usr/bin/env python3
"""Soak test of `strata serve` (issue 30): steady mixed traffic with the KV pool full for a long time.

Starts the server (house-llama on cpu unless --server-args say otherwise) with a small KV pool, then
runs CLIENTS concurrent clients until DURATION seconds pass: chat and completions, streaming and not,
prompts of 20-600 tokens, max_tokens 16-256, a few clients that hang up mid-stream, and a /health
probe every second. Every minute it prints the server's RSS, its KV use and the requests so far; at
the end p50/p99 latency per kind, the error count and whether RSS stayed flat after the warm-up
(bound: the largest sample after WARMUP seconds is at most 5% + 16 MiB above the first one).
Exit status 1 on any error or RSS growth. Traffic goes to 127.0.0.1 only; every loop is bounded by
the deadline.

  python3 bench/soak.py --duration 600                 # 10 minutes
  python3 bench/soak.py --duration 7200 --warmup 600   # the 2-hour soak
"""
import argparse
import http.client
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

WORDS = ("harbor kernel the of ship water rain cloud system memory quietly north river stone light "
         "engine market winter garden signal").split()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def metric(text, name):
    m = re.search(r"^" + re.escape(name) + r"(?:\{[^}]*\})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.latency = {}  # kind -> [seconds]
        self.errors = []
        self.count = 0
        self.hangups = 0

    def ok(self, kind, seconds):
        with self.lock:
            self.latency.setdefault(kind, []).append(seconds)
            self.count += 1

    def error(self, what):
        with self.lock:
            self.errors.append(what)


def one_request(port, rng, stats, deadline):
    chat = rng.random() < 0.5
    stream = rng.random() < 0.5
    hang_up = stream and rng.random() < 0.03
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 450)))
    body = {"max_tokens": rng.choice([16, 32, 64, 128, 256]), "temperature": rng.choice([0, 0.7]),
            "stream": stream, "ignore_eos": rng.random() < 0.5}
    if chat:
        body["messages"] = [{"role": "user", "content": words}]
    else:
        body["prompt"] = words
    path = "/v1/chat/completions" if chat else "/v1/completions"
    kind = ("chat" if chat else "completions") + ("-stream" if stream else "")
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=max(5.0, deadline - time.monotonic() + 120))
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if hang_up:
            resp.read(64)
            conn.sock.shutdown(socket.SHUT_RDWR)
            with stats.lock:
                stats.hangups += 1
            return
        data = resp.read().decode()
        if resp.status != 200:
            stats.error(f"{kind}: HTTP {resp.status} {data[:200]}")
            return
        if stream:
            if not data.rstrip().endswith("data: [DONE]") or '"finish_reason":"' not in data:
                stats.error(f"{kind}: incomplete stream {data[-200:]}")
                return
        else:
            reply = json.loads(data)
            if reply["choices"][0]["finish_reason"] not in ("stop", "length"):
                stats.error(f"{kind}: finish_reason {reply['choices'][0]['finish_reason']}")
                return
        stats.ok(kind, time.monotonic() - start)
    except Exception as e:  # a failed exchange is an error of the run, never a crash of it
        stats.error(f"{kind}: {type(e).__name__}: {e}")
    finally:
        conn.close()


def client(port, seed, stats, deadline):
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        one_request(port, rng, stats, deadline)


def health_prober(port, stats, deadline):
    while time.monotonic() < deadline:
        start = time.monotonic()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("GET", "/health")
            resp = conn.getresponse()
            resp.read()
            conn.close()
            if resp.status != 200:
                stats.error(f"/health: HTTP {resp.status}")
            else:
                stats.ok("health", time.monotonic() - start)
        except Exception as e:
            stats.error(f"/health: {type(e).__name__}: {e}")
        time.sleep(max(0.0, 1.0 - (time.monotonic() - start)))


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100.0 * len(values)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/strata")
    ap.add_argument("--duration", type=float, default=600, help="seconds of traffic")
    ap.add_argument("--warmup", type=float, default=120, help="seconds before the RSS baseline")
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--server-args", default="--max-total-tokens 4096 --max-running-requests 16",
                    help="extra `strata serve` flags (the default pool is small, so the traffic keeps it full)")
    args = ap.parse_args()

    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    log_path = os.path.join(tempfile.mkdtemp(prefix="strata_soak_"), "server.log")
    log = open(log_path, "w")
    server = subprocess.Popen([args.binary, "serve", "--port", "0"] + args.server_args.split(), stdout=log,
                              stderr=subprocess.STDOUT)
    port = None
    for _ in range(600):
        time.sleep(0.1)
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", open(log_path).read())
        if m:
            port = int(m.group(1))
            break
        if server.poll() is not None:
            sys.exit("the server exited: " + open(log_path).read())
    if port is None:
        server.kill()
        sys.exit("the server did not start")
    print(f"strata serve pid {server.pid} on port {port} (log {log_path}); {args.clients} clients for {args.duration:.0f} s; "
          f"server flags: {args.server_args}", flush=True)

    stats = Stats()
    start = time.monotonic()
    deadline = start + args.duration
    threads = [threading.Thread(target=client, args=(port, 1000 + i, stats, deadline)) for i in range(args.clients)]
    threads.append(threading.Thread(target=health_prober, args=(port, stats, deadline)))
    for t in threads:
        t.start()
    samples = []  # (seconds, rss KiB)
    next_sample = start
    while time.monotonic() < deadline:
        time.sleep(max(0.0, min(next_sample, deadline) - time.monotonic()))
        if time.monotonic() >= deadline:
            break
        next_sample += 60
        now = time.monotonic() - start
        rss = rss_kib(server.pid)
        samples.append((now, rss))
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", "/metrics")
            m = conn.getresponse().read().decode()
            conn.close()
        except Exception:
            m = ""
        with stats.lock:
            done, errors = stats.count, len(stats.errors)
        print(f"t={now:6.0f}s rss={rss / 1024:7.1f} MiB kv_usage={metric(m, 'strata_kv_cache_usage_ratio'):.2f} "
              f"running={metric(m, 'strata_num_running_requests'):.0f} queued={metric(m, 'strata_num_queued_requests'):.0f} "
              f"requests={done} errors={errors}", flush=True)
    for t in threads:
        t.join()
    samples.append((time.monotonic() - start, rss_kib(server.pid)))
    server.terminate()
    server.wait(timeout=120)

    print(f"\n{stats.count} requests in {args.duration:.0f} s, {stats.hangups} deliberate hang-ups, "
          f"{len(stats.errors)} errors; server exit code {server.returncode}")
    for e in stats.errors[:10]:
        print("  error:", e)
    for kind in sorted(stats.latency):
        v = stats.latency[kind]
        print(f"  {kind:20s} n={len(v):6d} p50={statistics.median(v):7.3f}s p99={percentile(v, 99):7.3f}s")
    after = [r for t, r in samples if t >= args.warmup]
    flat = True
    if len(after) >= 2:
        bound = after[0] * 1.05 + 16 * 1024
        flat = max(after) <= bound
        print(f"RSS after the {args.warmup:.0f} s warm-up: first {after[0] / 1024:.1f} MiB, max {max(after) / 1024:.1f} "
              f"MiB, last {after[-1] / 1024:.1f} MiB (bound {bound / 1024:.1f} MiB): {'flat' if flat else 'GREW'}")
    else:
        print("RSS: too few samples after the warm-up to judge")
    sys.exit(0 if not stats.errors and flat and server.returncode == 0 else 1)


if __name__ == "__main__":
    main()
