// Fused attention inputs of a decode (or prefill) step: one launch takes the QKV projection's
// output apart, rotates Q and K (rope, HF semantics as rope.cu) and stores K and V into the
// layer's paged cache (quantized as kv_write.cu does). Replaces slice_columns ×3 + rope ×2 +
// kv_write, i.e. three launches of a graph-mode decode step, with the same bits: the rotated
// values are rounded to bf16 exactly where rope.cu rounds them, then scaled and stored exactly
// as kv_write.cu stores a bf16 input.
#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8.cuh"

namespace strata::cuda {
namespace {

template <int E>
__device__ __forceinline__ void store_kv(void* base, int64_t i, float v, float inv_scale) {
  if (inv_scale != 1.0f) v *= inv_scale;
  if constexpr (E == kKvBf16) static_cast<bf16_bits*>(base)[i] = float_to_bf16(v);
  else if constexpr (E == kKvE4M3) static_cast<uint8_t*>(base)[i] = float_to_e4m3(v);
  else static_cast<uint8_t*>(base)[i] = float_to_e5m2(v);
}

__device__ __forceinline__ float round_bf16(float v) { return bf16_to_float(float_to_bf16(v)); }

// One thread per (token, head of Q | K | V, pair of dims). Q and K heads: pairs below `half` are
// rotated (neox: dims i and i + half; interleaved: 2i and 2i + 1), the rest are copied two
// consecutive dims at a time; V heads copy pairs of consecutive dims.
template <int E>
__global__ void qkv_rope_kernel(QkvRopeParams p) {
  pdl_enter(p.pdl_early);
  const int hd = p.head_dim, pairs = hd / 2;
  const int nh = p.heads + 2 * p.kv_heads;
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= p.tokens * nh * pairs) return;
  const int u = int(idx % pairs);
  const int64_t rest = idx / pairs;
  const int h = int(rest % nh);
  const int64_t t = rest / nh;
  const bf16_bits* src = p.qkv + (t * nh + h) * hd;
  const bool rotated = h < p.heads + p.kv_heads && u < p.half;
  int d0, d1;
  float o0, o1;
  if (rotated) {
    const float angle = float(p.positions[t]) * p.inv_freq[u];
    float s, c;
    sincosf(angle, &s, &c);  // as rope.cu: accurate range reduction for large positions
    c *= p.attention_factor;
    s *= p.attention_factor;
    d0 = p.interleaved ? 2 * u : u;
    d1 = p.interleaved ? 2 * u + 1 : u + p.half;
    const float a = bf16_to_float(src[d0]), b = bf16_to_float(src[d1]);
    o0 = round_bf16(a * c - b * s);
    o1 = round_bf16(b * c + a * s);
  } else {
    d0 = h < p.heads + p.kv_heads ? 2 * (u - p.half) + 2 * p.half : 2 * u;
    d1 = d0 + 1;
    o0 = bf16_to_float(src[d0]);
    o1 = bf16_to_float(src[d1]);
  }
  if (h < p.heads) {
    bf16_bits* q = p.q + (t * p.heads + h) * hd;
    q[d0] = float_to_bf16(o0);
    q[d1] = float_to_bf16(o1);
    return;
  }
  const int64_t slot = p.slots[t];
  const int64_t row = int64_t(p.kv_heads) * hd;
  if (h < p.heads + p.kv_heads) {
    const int64_t base = slot * row + int64_t(h - p.heads) * hd;
    store_kv<E>(p.cache_k, base + d0, o0, p.inv_scale_k);
    store_kv<E>(p.cache_k, base + d1, o1, p.inv_scale_k);
  } else {
    const int64_t base = slot * row + int64_t(h - p.heads - p.kv_heads) * hd;
    store_kv<E>(p.cache_v, base + d0, o0, p.inv_scale_v);
    store_kv<E>(p.cache_v, base + d1, o1, p.inv_scale_v);
  }
}

}  // namespace

void launch_qkv_rope_kv_write(const QkvRopeParams& p, cudaStream_t stream) {
  CHECK(p.head_dim % 2 == 0 && 2 * p.half <= p.head_dim && p.half <= kMaxRopeHalf);
  const int64_t n = p.tokens * (p.heads + 2 * p.kv_heads) * (p.head_dim / 2);
  if (n == 0) return;
  const dim3 grid(unsigned(ceil_div(n, 128))), block(128);
  if (p.kv_elem == kKvE4M3) launch_pdl(qkv_rope_kernel<kKvE4M3>, grid, block, 0, stream, p);
  else if (p.kv_elem == kKvE5M2) launch_pdl(qkv_rope_kernel<kKvE5M2>, grid, block, 0, stream, p);
  else launch_pdl(qkv_rope_kernel<kKvBf16>, grid, block, 0, stream, p);
  CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
