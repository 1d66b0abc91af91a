#!/usr/bin/env python3
"""The SASS instructions of an Nsight Compute source page that hold the most warp-stall samples.

Input: `ncu -i REPORT --page source --csv --print-source sass` (one kernel). Prints the columns
found, the sample total, the share of samples per opcode, then the top instructions by samples
with their address, text, executions and every nonzero per-reason stall column the export has.
Column names differ between ncu versions, so they are matched by substring.

Usage: ncu_source_top.py CSV [--top N]
"""
import csv
import sys
from collections import Counter


def num(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return 0.0


def pick(cols, *needles):
    for n in needles:
        for c in cols:
            if n.lower() in c.lower():
                return c
    return None


def main():
    path, top = sys.argv[1], 40
    if "--top" in sys.argv:
        top = int(sys.argv[sys.argv.index("--top") + 1])
    with open(path, newline="", errors="replace") as f:
        lines = [l for l in f if l.strip() and not l.startswith("==")]
    # A preamble row ("Kernel Name", ...) may precede the header, which starts with "Address".
    head = next((i for i, l in enumerate(lines) if l.startswith('"Address"')), 0)
    lines = lines[head:]
    # (a row longer than the header puts its extra cells under the key None: dropped)
    rows = [{k: v for k, v in r.items() if k is not None} for r in csv.DictReader(lines)]
    if not rows:
        print(f"{path}: no rows")
        return
    cols = list(rows[0].keys())
    print("columns:", " | ".join(cols)[:1500])
    c_src = pick(cols, "Source")
    c_addr = pick(cols, "Address")
    c_all = pick(cols, "Warp Stall Sampling (All", "Sampling (All")
    c_not = pick(cols, "Not-issued", "Not Issued")
    c_exec = pick(cols, "Instructions Executed", "Inst Executed")
    reasons = [c for c in cols if c.startswith("stall_") and "Not Issued" not in c]
    if c_all is None:
        print("no sampling column")
        return
    total = sum(num(r[c_all]) for r in rows)
    print(f"instructions {len(rows)}, samples {total:.0f}")
    ops = Counter()
    for r in rows:
        text = (r.get(c_src) or "").split()
        op = next((t for t in text if not t.startswith("@")), "?").split(".")[0]
        ops[op] += num(r[c_all])
    if reasons:
        by = sorted(((sum(num(r[c]) for r in rows), c) for c in reasons), reverse=True)
        print("samples by reason:", ", ".join(f"{c[6:]} {100 * v / total:.1f}%" for v, c in by[:10]))
    print("samples by opcode:", ", ".join(f"{o} {100 * s / total:.1f}%" for o, s in ops.most_common(14)))
    ranked = sorted(rows, key=lambda r: -num(r[c_all]))[:top]
    for r in ranked:
        extra = []
        for c in reasons:
            v = num(r[c])
            if v > 0:
                extra.append(f"{c[6:]}={v:.0f}")
        ex = f" exec {num(r[c_exec]):.0f}" if c_exec else ""
        nis = f" not-issued {num(r[c_not]):.0f}" if c_not else ""
        print(f"{r.get(c_addr, '')[-6:]:>6} {100 * num(r[c_all]) / total:5.2f}%{nis}{ex}  "
              f"{(r.get(c_src) or '')[:90]}  {' '.join(extra[:6])}")


if __name__ == "__main__":
    main()
