#!/usr/bin/env python3
"""A model cut to a few layers, and decode steps projected from two such cuts (the device scripts'
shared helper: a full Kimi-K2.5 rank takes minutes to make, a 2- or 4-layer cut seconds).

  rank_cuts.py cut SRC_CONFIG LAYERS OUT_DIR
      OUT_DIR/config.json = SRC_CONFIG with num_hidden_layers = LAYERS (text_config's where the
      config nests one).
  rank_cuts.py project LOG_A LOG_B [--layers 2,4] [--to 61]
      From two rank_step_bench logs of the same model cut to LA and LB layers: every step (the
      default "decode ... as a CUDA graph" line and each "variant" line) projected linearly to
      TO layers: the layers past the first dense ones are alike, so (B - A) / (LB - LA) is one
      layer's time.
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
    text, out = open(path).read(), {}
    for b, ms in re.findall(r"^decode   batch (\d+),.*?step ([\d.]+) ms as a CUDA graph", text, re.M):
        out[(int(b), "default")] = float(ms)
    for b, name, ms in re.findall(r"^variant  batch (\d+), context \d+: (\S+)\s+step ([\d.]+) ms",
                                  text, re.M):
        out[(int(b), name)] = float(ms)
    return out


def project(log_a, log_b, la, lb, to):
    a, b = walls(log_a), walls(log_b)
    for key in sorted(a, key=lambda k: (k[0], k[1] != "default", k[1])):
        if key in b:
            per_layer = (b[key] - a[key]) / (lb - la)
            print(f"kimi {to}-layer step, batch {key[0]}, {key[1]:20s}: "
                  f"{a[key] + per_layer * (to - la):.3f} ms ({la} layers {a[key]:.3f}, {lb} layers "
                  f"{b[key]:.3f}; {per_layer * 1e3:.1f} us/layer)")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cut")
    c.add_argument("src")
    c.add_argument("layers", type=int)
    c.add_argument("out_dir")
    p = sub.add_parser("project")
    p.add_argument("log_a")
    p.add_argument("log_b")
    p.add_argument("--layers", default="2,4")
    p.add_argument("--to", type=int, default=61)
    args = ap.parse_args()
    if args.cmd == "cut":
        cut(args.src, args.layers, args.out_dir)
    else:
        la, lb = (int(x) for x in args.layers.split(","))
        project(args.log_a, args.log_b, la, lb, args.to)


if __name__ == "__main__":
    main()
