#!/usr/bin/env python3
"""Per-kernel time table of one decode step from `ncu --csv --metrics gpu__time_duration.sum`.

One CSV: the kernels of one step as profiled (name, launches, total us, % of the step's kernel
time). Two CSVs of the same model cut to two layer counts (--layers LA,LB) and --project L: each
kernel's count and time are extrapolated linearly in the layer count to L layers (per layer =
(B - A) / (LB - LA); the layers are alike, so the difference is exactly the added layers' kernels),
which profiles a 61-layer step from two small ones. --wall-ms gives the same step's wall time
under CUDA graphs without the profiler (one value, or one per CSV, projected the same way), so
the table's kernel sum against it shows the launch gaps (ncu runs kernels one at a time, with no
programmatic-launch overlap).

Usage: ncu_table.py --title T --csv A.csv [--csv B.csv --layers LA,LB --project L]
                    [--wall-ms W | --wall-ms WA,WB] [--top 40]
"""
import argparse
import csv
import re
import sys
from collections import defaultdict

# Kernel families for the summary line (first match wins): where a step's time goes at a glance.
GROUPS = [("experts", r"moe_gemv|moe_gemm|moe_combine|moe_plan"), ("routing", r"moe_route"),
          ("attention", r"mla_|decode_kernel|combine_kernel|attention|prefill|kv_write|qkv_rope"),
          ("linear", r"gemv|gemm|cutlass|sm90_|ampere_|cublas|per_head"), ("norm", r"rms_norm"),
          ("rope", r"rope"), ("copies", r"copy|slice|gather|embedding"),
          ("elementwise", r"silu|add_kernel|f32_to_bf16"), ("sampling", r"sample|argmax|logit")]

UNIT_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
           "second": 1e6, "s": 1e6}


def short_name(name):
    """The kernel's name without return type, namespaces and parameter list; templates kept."""
    name = re.sub(r"^void ", "", name.strip()).replace("(anonymous namespace)::", "")
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameter list: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    name = name[:cut]
    name = re.sub(r"\b(strata::cuda::|strata::|cuda::|\(anonymous namespace\)::)", "", name)
    return name[:70]


def read_csv(path):
    """{kernel: [launches, total us]} of the profiled kernels in an ncu CSV log."""
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{path}: no ncu CSV header (did ncu profile anything?)")
    rows = csv.DictReader(lines[start:])
    out = defaultdict(lambda: [0, 0.0])
    name_col = None
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        if name_col is None:
            name_col = "Kernel Name" if "Kernel Name" in r else "Function Name"
        unit = UNIT_US.get(r.get("Metric Unit", "nsecond").strip(), None)
        if unit is None:
            sys.exit(f"{path}: unknown unit {r.get('Metric Unit')}")
        value = float(r["Metric Value"].replace(",", "")) * unit
        k = short_name(r[name_col])
        out[k][0] += 1
        out[k][1] += value
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--title", required=True)
    ap.add_argument("--csv", action="append", required=True)
    ap.add_argument("--layers", default="")
    ap.add_argument("--project", type=int, default=0)
    ap.add_argument("--wall-ms", default="")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    tabs = [read_csv(p) for p in a.csv]
    walls = [float(w) for w in a.wall_ms.split(",") if w]
    if len(tabs) == 2:
        la, lb = (int(x) for x in a.layers.split(","))
        f = (a.project - la) / (lb - la)
        names = set(tabs[0]) | set(tabs[1])
        tab = {}
        for k in names:
            ca, ta = tabs[0].get(k, (0, 0.0))
            cb, tb = tabs[1].get(k, (0, 0.0))
            tab[k] = (ca + (cb - ca) * f, ta + (tb - ta) * f)
        wall = walls[0] + (walls[1] - walls[0]) * f if len(walls) == 2 else (walls[0] if walls else 0)
        scope = f"projected to {a.project} layers from {la} and {lb}"
    else:
        tab = {k: tuple(v) for k, v in tabs[0].items()}
        wall = walls[0] if walls else 0
        scope = "as profiled"
    total = sum(t for _, t in tab.values())
    print(f"== {a.title} ({scope}) ==")
    ranked = sorted(tab.items(), key=lambda kv: -kv[1][1])
    w = max([len(k) for k, _ in ranked[:a.top]] + [16])
    print(f"{'kernel':<{w}} {'count':>7} {'us/step':>9} {'%':>6}")
    for k, (c, t) in ranked[:a.top]:
        print(f"{k:<{w}} {c:7.1f} {t:9.1f} {100 * t / total:6.1f}")
    if len(ranked) > a.top:
        rest = ranked[a.top:]
        print(f"{'(' + str(len(rest)) + ' more kernels)':<{w}} {sum(c for _, (c, _) in rest):7.1f} "
              f"{sum(t for _, (_, t) in rest):9.1f} {100 * sum(t for _, (_, t) in rest) / total:6.1f}")
    groups = defaultdict(float)
    for k, (_, t) in tab.items():
        groups[next((g for g, rx in GROUPS if re.search(rx, k)), "other")] += t
    print("by family: " + ", ".join(f"{g} {t:.0f} us ({100 * t / total:.0f}%)"
                                    for g, t in sorted(groups.items(), key=lambda kv: -kv[1])))
    launches = sum(c for c, _ in tab.values())
    line = f"sum of kernel times {total / 1e3:.3f} ms over {launches:.0f} launches"
    if wall:
        line += (f"; wall under CUDA graphs without ncu {wall:.3f} ms: gaps {wall - total / 1e3:+.3f} ms "
                 f"({100 * (wall - total / 1e3) / wall:+.1f}% of the wall, {1e3 * (wall - total / 1e3) / max(1, launches):.2f} us a launch)")
    print(line)


if __name__ == "__main__":
    main()
