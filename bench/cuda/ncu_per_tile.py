#!/usr/bin/env python3
"""Warp instructions per 512-byte weight tile of each profiled kernel, from ncu's text output.

A decode GEMV streams its weights once, so DRAM bytes read / 512 is its tile count, and
smsp__inst_executed.sum / tiles what one tile costs in issue slots (session 16: the FP8 MoE GEMV ran
143 a tile, the bf16 one 51, the INT4 register GEMV 118; at 85% of copy bandwidth an SM has ~37
clocks a tile, 4 issue slots a clock over its schedulers). The ncu run must collect
dram__bytes_read.sum and smsp__inst_executed.sum (bench/cuda/instr_check.sh does); other metrics
it finds (issue active, warps active, DRAM throughput, duration) are printed beside them.

Usage: ncu_per_tile.py LOG [LOG ...]
"""
import re
import sys

# "  void unnamed>::moe_gemv_kernel<1, 1, 1>(MoeGroupedParams) (4, 64, 1)x(256, 1, 1), Context 1, ..."
KERNEL = re.compile(r"^\s+(?:void )?(?:[\w<>]+::)*([\w]+(?:<[^>]*>)?)\(.*\)\s+\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\), Context")
METRIC = re.compile(r"^\s+([a-z_]+__\S+)\s+(\S+)\s+([\d,.]+)\s*$")
BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
SHOWN = [("sm__issue_active.avg.pct_of_peak_sustained_active", "issue %"),
         ("sm__warps_active.avg.pct_of_peak_sustained_active", "warps %"),
         ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram %"),
         ("gpu__time_duration.sum", "us")]


def read(path):
    rows, cur = [], None
    for line in open(path, errors="replace"):
        m = KERNEL.match(line)
        if m:
            cur = {"kernel": m.group(1)}
            rows.append(cur)
            continue
        m = METRIC.match(line)
        if m and cur is not None:
            name, unit, value = m.group(1), m.group(2), float(m.group(3).replace(",", ""))
            if name == "dram__bytes_read.sum":
                value *= BYTES.get(unit, 1)
            if name == "gpu__time_duration.sum":
                value *= {"ns": 1e-3, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}.get(unit, 1)
            cur[name] = value
    return rows


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    print(f"{'log':<16} {'kernel':<44} {'MB read':>9} {'warp inst':>12} {'per tile':>9} "
          + " ".join(f"{label:>8}" for _, label in SHOWN))
    for path in sys.argv[1:]:
        for r in read(path):
            b, n = r.get("dram__bytes_read.sum"), r.get("smsp__inst_executed.sum")
            per = n / (b / 512) if b and n else float("nan")
            extra = " ".join(f"{r.get(k, float('nan')):8.1f}" for k, _ in SHOWN)
            name = path.rsplit("/", 1)[-1][:16]
            print(f"{name:<16} {r['kernel'][:44]:<44} {(b or 0) / 1e6:9.2f} {n or 0:12,.0f} "
                  f"{per:9.1f} {extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
