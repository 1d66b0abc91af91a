#!/usr/bin/env python3
"""A model cut to a few layers, and decode steps projected from two such cuts (the device scripts'
shared helper: a full Kimi-K2.5 rank takes minutes to make, a 2- or 4-layer cut seconds).

  rank_cuts.py cut SRC_CONFIG LAYERS OUT_DIR
      OUT_DIR/config.json = SRC_CONFIG with num_hidden_layers = LAYERS (text_config's where the
      config nests one).
  rank_cuts.py project LOG_A LOG_B [LOG_C ...] [--layers 2,4[,...]] [--to 61] [--name kimi]
      From rank_step_bench logs of the same model cut to LA, LB, ... layers: every step (the
      default "decode ... as a CUDA graph" line and each "variant" line) projected linearly to
      TO layers: the layers past the first dense ones are alike, so the slope of step time over
      layers is one layer's time. Two cuts: the line through them; three or more: the least-
      squares line, and its largest residual (how far one cut sits off the line: each cut's
      noise is multiplied by about TO / (LB - LA) in a two-cut projection, so a third cut shows
      whether a projection can be trusted).
"""
import argparse
import json
import os
import re


def cut(src, layers, out_dir):
    c = json.load(open(src))
    (c.get("text_config") or c)["num_hidden_layers"] = layers
    os.makedirs(out_dir, exist_ok=True)
    json.dump(c, open(os.path.join(out_dir, "config.json"), "w"), indent=1)


def walls(path):
    """{(batch, name): [ms, ...]}: every timing of the default and of each variant, in log order
    (a variant listed twice, e.g. beside the no-change control `defaults`, is timed twice)."""
    text, out = open(path).read(), {}
    for b, ms in re.findall(r"^decode   batch (\d+),.*?step ([\d.]+) ms as a CUDA graph", text, re.M):
        out.setdefault((int(b), "default"), []).append(float(ms))
    for b, name, ms in re.findall(r"^variant  batch (\d+), context \d+: (\S+)\s+step ([\d.]+) ms",
                                  text, re.M):
        out.setdefault((int(b), name), []).append(float(ms))
    return out


def fit(xs, ys):
    """Least-squares line through (xs, ys): (intercept, slope), exact through two points."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def project(logs, layers, to, name):
    ws = [walls(path) for path in logs]
    first = ws[0]
    for key in sorted(first, key=lambda k: (k[0], k[1] != "default", k[1])):
        if not all(key in w for w in ws):
            continue
        # Each cut's mean timing; with the same count in every cut, also each round's projection.
        ys = [sum(w[key]) / len(w[key]) for w in ws]
        b0, per_layer = fit(layers, ys)
        cuts = ", ".join(f"{n} layers {y:.3f}" for n, y in zip(layers, ys))
        line = (f"{name} {to}-layer step, batch {key[0]}, {key[1]:20s}: "
                f"{b0 + per_layer * to:.3f} ms ({cuts}; {per_layer * 1e3:.1f} us/layer")
        if len(layers) > 2:
            worst = max(abs(y - (b0 + per_layer * n)) for n, y in zip(layers, ys))
            line += f"; largest residual {worst * 1e3:.1f} us"
        counts = {len(w[key]) for w in ws}
        if counts != {1}:
            line += "; mean of " + "/".join(str(len(w[key])) for w in ws) + " timings a cut"
            if len(counts) == 1:
                rounds = []
                for i in range(counts.pop()):
                    r0, r1 = fit(layers, [w[key][i] for w in ws])
                    rounds.append(r0 + r1 * to)
                line += ", rounds " + " / ".join(f"{r:.3f}" for r in rounds)
        print(line + ")")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cut")
    c.add_argument("src")
    c.add_argument("layers", type=int)
    c.add_argument("out_dir")
    p = sub.add_parser("project")
    p.add_argument("logs", nargs="+")
    p.add_argument("--layers", default="2,4")
    p.add_argument("--to", type=int, default=61)
    p.add_argument("--name", default="kimi", help="the model's name on the printed lines")
    args = ap.parse_args()
    if args.cmd == "cut":
        cut(args.src, args.layers, args.out_dir)
    else:
        layers = [int(x) for x in args.layers.split(",")]
        if len(layers) != len(args.logs) or len(layers) < 2 or len(set(layers)) < 2:
            ap.error(f"--layers {args.layers}: one layer count a log, two different ones at least")
        project(args.logs, layers, args.to, args.name)


if __name__ == "__main__":
    main()
