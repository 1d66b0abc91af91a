#!/usr/bin/env python3
"""Projects an N-GPU tensor-parallel decode step from one rank's (rank_step_bench --tp-size N):
step = the rank's step (CUDA graph) + the collectives it skipped, at a stated, sourced cost.

Collective cost model for 8 x H200 (NVLink 4 through NVSwitch; to be replaced by a measurement
when multi-GPU machines are lent, issue 28):
  all-reduce of b bytes: piecewise-linear in b through SGLang's measured custom all-reduce on
    8 x H100 SXM (same NVLink 4 / NVSwitch fabric as the H200): 5.9 us at 512, 5.7 us at 4,096,
    7.8 us at 32,768, 16.7 us at 262,144, 22.1 us at 524,288, 33.8 us at 1,048,576
    (sgl-project/sglang pull request #2904, "custom allreduce" table, tp 8; its sizes are read as
    bytes, the slower reading if they were elements); beyond 1 MiB, + (b - 1 MiB) x 2 (N-1)/N at a
    bus bandwidth of 460 GB/s (nccl-tests all_reduce_perf busbw on 8 x H100 SXM NVLink, 460-480
    GB/s at large sizes: docs.alayanew.com's nccl-tests reference table; the low end taken);
  all-gather of b bytes from each rank: 10 us + b x (N-1) / 460 GB/s (ring: each rank receives
    N-1 parts; 10 us the latency class of the small all-reduces above, rounded up).

With --measured COLLECTIVES_LOG (collectives_bench's output on the GPUs of one host), the
measured latencies at that tp replace both estimates: piecewise-linear in the bytes between the
measured sizes, extended along the last two beyond them (each line says which it used).

Usage: python3 bench/cuda/project_tp.py LOG [--tp 8] [--measured COLLECTIVES_LOG]
"""
import argparse
import re

AR_TABLE = [(512, 5.9), (4096, 5.7), (32768, 7.8), (262144, 16.7), (524288, 22.1), (1048576, 33.8)]
BUS_GBS = 460.0


def all_reduce_us(b, n):
    if b <= AR_TABLE[0][0]:
        return AR_TABLE[0][1]
    for (x0, y0), (x1, y1) in zip(AR_TABLE, AR_TABLE[1:]):
        if b <= x1:
            return y0 + (y1 - y0) * (b - x0) / (x1 - x0)
    last_b, last_us = AR_TABLE[-1]
    return last_us + (b - last_b) * 2 * (n - 1) / n / (BUS_GBS * 1e3)


def all_gather_us(b, n):
    return 10.0 + b * (n - 1) / (BUS_GBS * 1e3)


def read_measured(path, tp):
    """{"all_reduce": [(bytes, us)], "all_gather": [...]} at `tp` from collectives_bench's lines."""
    pat = re.compile(r"^collective (all_reduce|all_gather) tp (\d+) bytes (\d+): latency ([\d.]+) us")
    table = {"all_reduce": [], "all_gather": []}
    for line in open(path):
        m = pat.match(line)
        if m and int(m.group(2)) == tp:
            table[m.group(1)].append((int(m.group(3)), float(m.group(4))))
    for kind, rows in table.items():
        if len(rows) < 2:
            raise SystemExit(f"{path}: fewer than two {kind} sizes measured at tp {tp}")
        rows.sort()
    return table


def interpolate(rows, b):
    """Piecewise-linear through the measured (bytes, us); beyond them, along the nearest two."""
    if b <= rows[0][0]:
        (x0, y0), (x1, y1) = rows[0], rows[1]
        return max(y0, y0 + (y1 - y0) * (b - x0) / (x1 - x0))  # never below the smallest's latency
    for (x0, y0), (x1, y1) in zip(rows, rows[1:]):
        if b <= x1:
            return y0 + (y1 - y0) * (b - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = rows[-2], rows[-1]
    return y1 + (y1 - y0) * (b - x1) / (x1 - x0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--measured", help="collectives_bench output: measured latencies replace the estimates")
    a = ap.parse_args()
    measured = read_measured(a.measured, a.tp) if a.measured else None
    pat = re.compile(r"decode\s+batch (\d+), context (\d+).*?step ([\d.]+) ms as a CUDA graph.*?"
                     r"all_reduce (\d+) x (\d+) B, all_gather (\d+) x (\d+) B")
    for line in open(a.log):
        m = pat.search(line)
        if not m:
            continue
        batch, ctx, step = int(m.group(1)), int(m.group(2)), float(m.group(3))
        n_ar, b_ar, n_ag, b_ag = (int(m.group(i)) for i in range(4, 8))
        if measured:
            ar_ms = n_ar * interpolate(measured["all_reduce"], b_ar) / 1e3
            ag_ms = n_ag * interpolate(measured["all_gather"], b_ag) / 1e3
        else:
            ar_ms = n_ar * all_reduce_us(b_ar, a.tp) / 1e3
            ag_ms = n_ag * all_gather_us(b_ag, a.tp) / 1e3
        total = step + ar_ms + ag_ms
        source = "measured" if measured else "estimated"
        print(f"project  tp {a.tp} ({source} collectives), batch {batch}, context {ctx}: rank step {step:.3f} ms + {n_ar} all-reduces of "
              f"{b_ar} B ({ar_ms:.3f} ms) + {n_ag} all-gather of {b_ag} B ({ag_ms:.3f} ms) = {total:.3f} ms "
              f"-> {batch / (total * 1e-3):.0f} output tok/s for the {a.tp}-GPU group")


if __name__ == "__main__":
    main()
