// Fused attention inputs of a decode (or prefill) step: one launch takes the QKV projection's
// output apart, rotates Q and K (rope, HF semantics as rope.cu) and stores K and V into the
// layer's paged cache (quantized as kv_write.cu does). Replaces slice_columns ×3 + rope ×2 +
// kv_write, i.e. three launches of a graph-mode decode step, with the same bits: the rotated
// values are rounded to bf16 exactly where rope.cu rounds them, then scaled and stored exactly
// as kv_write.cu stores a bf16 input.
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/kv_write.h"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/rope.h"

namespace strata::cuda {
namespace {

template <int E>
__device__ __forceinline__ void store_kv(void* base, int64_t i, float v, float inv_scale) {
  if (inv_scale != 1.0f) v *= inv_scale;
  if constexpr (E == kKvBf16)
    static_cast<bf16_bits*>(base)[i] = float_to_bf16(v);
  else if constexpr (E == kKvE4M3)
    static_cast<uint8_t*>(base)[i] = float_to_e4m3(v);
  else
    static_cast<uint8_t*>(base)[i] = float_to_e5m2(v);
}

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
    d0 = p.interleaved ? 2 * u : u;
    d1 = p.interleaved ? 2 * u + 1 : u + p.half;
    float r0, r1;  // rope.cuh: the separate rope's arithmetic
    rope_pair_f32(bf16_to_float(src[d0]), bf16_to_float(src[d1]), p.positions[t], p.inv_freq[u],
                  p.attention_factor, &r0, &r1);
    o0 = round_bf16(r0);
    o1 = round_bf16(r1);
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

void launch_qkv_rope_kv_write(const QkvRopeParams& p, const Launch& launch) {
  CHECK(p.head_dim % 2 == 0 && 2 * p.half <= p.head_dim && p.half <= kMaxRopeHalf);
  const int64_t n = p.tokens * (p.heads + 2 * p.kv_heads) * (p.head_dim / 2);
  if (n == 0) return;
  const dim3 grid(unsigned(ceil_div(n, 128))), block(128);
  if (p.kv_elem == kKvE4M3)
    launch_pdl(qkv_rope_kernel<kKvE4M3>, grid, block, 0, launch, p);
  else if (p.kv_elem == kKvE5M2)
    launch_pdl(qkv_rope_kernel<kKvE5M2>, grid, block, 0, launch, p);
  else
    launch_pdl(qkv_rope_kernel<kKvBf16>, grid, block, 0, launch, p);
  CUDA_LAUNCH_CHECK();
}

// ---- host entries ----
void CudaBackend::qkv_rope_kv_write(const Tensor& qkv, int heads, int kv_heads, int head_dim,
                                    const RopeArgs& ra, KvStorage& kv, int layer,
                                    const AttentionMetadata& meta, const Tensor& q) {
  const KvLayout& lay = kv.layout();
  const int64_t t = qkv.dim(0), hd = head_dim;
  CHECK_EQ(qkv.numel(), t * (heads + 2 * kv_heads) * hd);
  CHECK_EQ(q.numel(), t * heads * hd);
  CHECK_EQ(t, meta.num_tokens);
  const int half = ra.rotary_dim / 2;
  const Tensor kc = kv.k(layer);
  const bool fused = tunables_.fusion && qkv.dtype == DType::kBF16 && q.dtype == DType::kBF16 &&
                     hd % 2 == 0 && ra.offset == 0 && ra.rotary_dim % 2 == 0 &&
                     ra.rotary_dim <= hd && half <= kMaxRopeHalf && lay.k_dim == kv_heads * hd &&
                     lay.v_dim == kv_heads * hd && !lay.k_row_is_split(layer) &&
                     kc.dtype == kv.v(layer).dtype;
  if (!fused) {
    return Backend::qkv_rope_kv_write(qkv, heads, kv_heads, head_dim, ra, kv, layer, meta, q);
  }
  for (int i = 0; i < meta.num_tokens; ++i) {
    const int64_t slot = meta.slot_mapping[i];
    CHECK_MSG(slot >= 0 && slot < lay.num_pages * lay.page_size, "slot {} out of pool", slot);
  }
  if (t == 0) return;
  begin_op();
  const DeviceMeta& dm = device_meta(meta);
  auto p = zeroed<QkvRopeParams>();
  p.qkv = qkv.ptr<bf16_bits>();
  p.q = q.ptr<bf16_bits>();
  p.cache_k = kc.data;
  p.cache_v = kv.v(layer).data;
  p.positions = dm.positions;
  p.slots = dm.slot_mapping;
  p.tokens = t;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = int(hd);
  p.half = half;
  p.interleaved = ra.interleaved;
  p.kv_elem = kv_elem_of(kc);
  p.pdl_early = tunables_.pdl_early;
  p.attention_factor = ra.attention_factor;
  // 1 / scale in float, as kv_write (and the CPU reference) computes it.
  p.inv_scale_k = 1.0f / kv.k_scale(layer);
  p.inv_scale_v = 1.0f / kv.v_scale(layer);
  for (int i = 0; i < half; ++i) p.inv_freq[i] = ra.inv_freq[i];
  record(kOpQkvRope, p, launch_qkv_rope_kv_write);
}

}  // namespace strata::cuda
