# PyTorch side-by-side for bench/cuda/moe_bench.cc: the same MoE layers (router in float32,
# sigmoid + correction bias, group-limited top-k where the config has groups, normalized and
# scaled weights; routed experts as a Python loop over experts with torch.matmul on bf16 weights,
# i.e. the quantized checkpoints dequantized; the shared expert), at the same token counts.
# The loop sorts the assignments once and reads the per-expert counts to the host once per layer
# (the usual eager-mode MoE; a per-expert nonzero() would add a sync per expert).
# Timing: CUDA events around whole layers, median of 5 after 2 warm-ups; weights rotate between
# two copies and hidden states between 4 batches (as the C++ bench, so L2 does not serve repeats).
# Prints per config and token count: ms per layer, distinct experts touched, the routed experts'
# bf16 bytes over the layer time (GB/s) and routed TFLOP/s.
#
# Usage: python3 bench/cuda/moe_torch_baseline.py [--configs kimi,moonlight,dsv3]
#        [--tokens 1,8,32,128,512,8192]
import argparse

import torch
import torch.nn.functional as F

CONFIGS = {
    # name: experts, top_k, hidden, inter, groups, topk_groups, scaling, shared_inter
    "kimi": (384, 8, 7168, 256, 1, 1, 2.827, 256),
    "moonlight": (64, 6, 2048, 1408, 1, 1, 2.446, 2816),
    "dsv3": (256, 8, 7168, 256, 8, 4, 2.5, 256),
}


def route(x, gate, bias, k, groups, topk_groups, scaling):
    logits = F.linear(x.float(), gate.float())
    scores = logits.sigmoid()
    choice = scores + bias
    if groups > 1 and topk_groups < groups:
        t, e = choice.shape
        g = choice.view(t, groups, e // groups)
        gscore = g.topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(gscore, dtype=torch.bool)
        keep.scatter_(1, gscore.topk(topk_groups, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(e // groups, dim=1), float("-inf"))
    idx = choice.topk(k, dim=-1).indices
    w = scores.gather(1, idx)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * scaling
    return idx, w


def swiglu(h, w_gu, w_d):
    gu = torch.matmul(h, w_gu.t())
    g, u = gu.chunk(2, dim=-1)
    return torch.matmul(F.silu(g) * u, w_d.t())


def moe_layer(x, L, cfg):
    experts, k, hidden, inter, groups, topk_groups, scaling, _ = cfg
    idx, w = route(x, L["gate"], L["bias"], k, groups, topk_groups, scaling)
    flat = idx.reshape(-1)
    order = flat.argsort()
    counts = torch.bincount(flat, minlength=experts).tolist()  # one host sync
    tok = order // k
    wts = w.reshape(-1)[order].to(x.dtype)
    out = swiglu(x, L["shared_gu"], L["shared_d"])
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        t = tok[start:start + n]
        y = swiglu(x[t], L["gu"][e], L["d"][e]) * wts[start:start + n, None]
        out.index_add_(0, t, y)
        start += n
    return out, idx


def make_layer(cfg, dev):
    experts, k, hidden, inter, _, _, _, shared_inter = cfg
    s = 0.02
    return {
        "gate": torch.randn(experts, hidden, device=dev, dtype=torch.bfloat16) * s,
        "bias": torch.randn(experts, device=dev) * 0.01,
        "gu": torch.randn(experts, 2 * inter, hidden, device=dev, dtype=torch.bfloat16) * s,
        "d": torch.randn(experts, hidden, inter, device=dev, dtype=torch.bfloat16) * s,
        "shared_gu": torch.randn(2 * shared_inter, hidden, device=dev, dtype=torch.bfloat16) * s,
        "shared_d": torch.randn(hidden, shared_inter, device=dev, dtype=torch.bfloat16) * s,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="kimi,moonlight,dsv3")
    ap.add_argument("--tokens", default="1,8,32,128,512,8192")
    args = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        experts, k, hidden, inter = cfg[:4]
        layers = [make_layer(cfg, dev) for _ in range(2)]
        expert_bytes = 3 * hidden * inter * 2
        for T in [int(t) for t in args.tokens.split(",")]:
            xs = [torch.rand(T, hidden, device=dev, dtype=torch.bfloat16) * 2 - 1 for _ in range(4)]
            touched = 0.0
            for i in range(2):  # warm-up; count the distinct experts
                _, idx = moe_layer(xs[i % 4], layers[i % 2], cfg)
                touched += idx.unique().numel() / 2
            times = []
            for i in range(5):
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                moe_layer(xs[i % 4], layers[i % 2], cfg)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            ms = sorted(times)[len(times) // 2]
            gbs = touched * expert_bytes / (ms * 1e-3) / 1e9
            tflops = 2.0 * T * k * 3 * hidden * inter / (ms * 1e-3) / 1e12
            print(f"torch {name:10s} T={T:<5d} layer {ms * 1e3:10.1f} us  touched {touched:.1f} experts  "
                  f"{gbs:6.0f} GB/s (bf16 bytes)  {tflops:6.1f} TFLOP/s routed", flush=True)
        del layers
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
