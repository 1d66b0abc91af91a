# PyTorch SDPA reference for the prefill-attention benchmark (bench/cuda/llama_bench.cc):
# causal attention over 8,192 tokens, 32 query / 8 KV heads, head_dim 128, bf16, on the GPU.
# Prints each SDPA backend that runs, median of 20 timed calls (CUDA events) after 3 warm-ups.
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

S, H, KV, D = 8192, 32, 8, 128
torch.manual_seed(0)
q = torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, KV, S, D, device="cuda", dtype=torch.bfloat16)
v = torch.randn(1, KV, S, D, device="cuda", dtype=torch.bfloat16)
k_full, v_full = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
flops = 4.0 * H * D * S * S / 2


def bench(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


for name, backend in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                      ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
    try:
        with sdpa_kernel(backend):
            ms = bench(lambda: F.scaled_dot_product_attention(q, k_full, v_full, is_causal=True))
        print(f"sdpa     {name}: causal {S} tokens ({H}/{KV} heads, hd {D}): {ms:.3f} ms, "
              f"{flops / (ms * 1e-3) / 1e12:.0f} TFLOP/s (causal FLOPs)")
    except Exception as e:  # a backend that does not run here
        print(f"sdpa     {name}: not available ({type(e).__name__})")
