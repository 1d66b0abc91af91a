# PyTorch baseline for the MLA decode benchmark (bench/cuda/mla_bench.cc): the same absorbed
# decode as plain bmm + softmax on contiguous (unpaged) bf16 latent rows, batch 64 x 4,096-token
# contexts, one new token a sequence, 16 / 8 / 128 heads, kv_lora_rank 512 + rope 64:
#   scores = q [B, H, 576] . kv [B, L, 576]^T * scale; p = softmax(scores) (float32); out = p . kv[..., :512]
# Reported as mla_bench reports its kernels: GB/s of latent rows read (B * L * 576 * 2 bytes) and
# TFLOP/s (2 * B * H * L * (576 + 512)). CUDA events, median of 20 calls after 3 warm-ups.
import torch

B, L, R, P = 64, 4096, 512, 64
torch.manual_seed(0)
kv = torch.randn(B, L, R + P, device="cuda", dtype=torch.bfloat16)
scale = 192 ** -0.5


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


for H in (16, 8, 128):
    q = torch.randn(B, H, R + P, device="cuda", dtype=torch.bfloat16)

    def decode():
        s = torch.bmm(q, kv.transpose(1, 2)).float() * scale
        p = torch.softmax(s, dim=-1).to(torch.bfloat16)
        return torch.bmm(p, kv[:, :, :R])

    ms = bench(decode)
    gbs = B * L * (R + P) * 2 / (ms * 1e-3) / 1e9
    tflops = 2.0 * B * H * L * (R + P + R) / (ms * 1e-3) / 1e12
    print(f"torch    decode  bf16 bmm+softmax batch {B} x ctx {L}, {H:3d} heads: {ms:8.3f} ms, "
          f"{gbs:5.0f} GB/s of latent rows, {tflops:5.0f} TFLOP/s")
