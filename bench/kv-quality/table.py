#!/usr/bin/env python3
"""Markdown rows for bench/RESULTS.md from `strata eval-kv --json` files (one per model).
With --buckets: the mean KLD by context position of each row instead."""
import json
import sys


def bucket_tables(paths):
    for path in paths:
        recs = json.load(open(path))
        recs = recs if isinstance(recs, list) else [recs]
        buckets = recs[0]["metrics"]["buckets"]
        print(f"\nMean KLD (nats) by context position, {recs[0]['model']['name']}:\n")
        print("| KV config | " + " | ".join(f"[{b['begin']},{b['end']})" for b in buckets) + " |")
        print("|---|" + "---|" * len(buckets))
        for r in recs:
            cells = [f"{b['kld']['mean']:.2e} ± {b['kld']['se']:.0e}" for b in r["metrics"]["buckets"]]
            print(f"| {r['label']} | " + " | ".join(cells) + " |")


if sys.argv[1:2] == ["--buckets"]:
    bucket_tables(sys.argv[2:])
    sys.exit(0)

print("| model | KV config | tokens | mean KLD ± SE (nats) | median | p99 | p99.9 | max | top-1 ± SE | Δp mean | Δp RMS | Δp p1 / p99 | ln(PPL_X/PPL_bf16) ± SE | free-run diverged (first pos.) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    recs = json.load(open(path))
    recs = recs if isinstance(recs, list) else [recs]
    model = recs[0]["model"]["name"]
    n = recs[0]["noise_floor"]
    k = n["kld"]
    print(f"| {model} | bf16 (noise floor: bf16 vs bf16, other batching) | {n['tokens']} | {k['mean']:.2e} ± {k['se']:.1e} | {k['median']:.1e} | {k['p99']:.1e} | {k['p99_9']:.1e} | {k['max']:.1e} | {n['top1']['agree']:.5f} ± {n['top1']['se']:.5f} | {n['dp']['mean']:.1e} | {n['dp']['rms']:.1e} | {n['dp']['p01']:.1e} / {n['dp']['p99']:.1e} | {n['ln_ppl_ratio']['value']:.1e} ± {n['ln_ppl_ratio']['se']:.1e} | - |")
    for r in recs:
        m = r["metrics"]
        k = m["kld"]
        fr = r["free_run"]
        firsts = ",".join(str(x) for x in fr["first_divergence"])
        print(f"| {model} | {r['label']} | {m['tokens']} | {k['mean']:.2e} ± {k['se']:.1e} | {k['median']:.1e} | {k['p99']:.1e} | {k['p99_9']:.1e} | {k['max']:.1e} | {m['top1']['agree']:.5f} ± {m['top1']['se']:.5f} | {m['dp']['mean']:.1e} | {m['dp']['rms']:.1e} | {m['dp']['p01']:.1e} / {m['dp']['p99']:.1e} | {m['ln_ppl_ratio']['value']:.1e} ± {m['ln_ppl_ratio']['se']:.1e} | {fr['diverged']}/{fr['prompts']} ({firsts}) |")
