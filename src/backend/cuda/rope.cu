// Rotary embedding in place on bf16 [tokens, heads, stride]: HF semantics (float32 angle
// position · inv_freq, cos/sin × attention_factor), neox (halves) or interleaved pairs. The
// inverse frequencies travel in the launch parameters, so a captured graph needs no upload.
#include <cstring>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/rope.h"

namespace strata::cuda {
namespace {

// One thread per (token, head, rotated pair) over both tensors (q and k when merged).
__global__ void rope_kernel(RopeParams p) {
  pdl_wait();
  pdl_trigger();
  const int heads_total = p.heads + (p.x2 ? p.heads2 : 0);
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= p.tokens * heads_total * p.half) return;
  const int i = int(idx % p.half);
  const int64_t rest = idx / p.half;
  const int h = int(rest % heads_total);
  const int64_t t = rest / heads_total;
  const int offset = h < p.heads ? p.offset : p.offset2;
  const int i0 = offset + (p.interleaved ? 2 * i : i);
  const int i1 = offset + (p.interleaved ? 2 * i + 1 : i + p.half);
  bf16_bits* v = h < p.heads ? p.x + (t * p.heads + h) * p.stride
                             : p.x2 + (t * p.heads2 + (h - p.heads)) * p.stride2;
  rope_pair(bf16_to_float(v[i0]), bf16_to_float(v[i1]), p.positions[t], p.inv_freq[i],
            p.attention_factor, &v[i0], &v[i1]);
}

}  // namespace

void launch_rope(const RopeParams& p, const Launch& launch) {
  const int64_t n = p.tokens * (p.heads + (p.x2 ? p.heads2 : 0)) * p.half;
  if (n == 0) return;
  launch_pdl(rope_kernel, dim3(unsigned(ceil_div(n, 128))), dim3(128), 0, launch, p);
  CUDA_LAUNCH_CHECK();
}

// ---- host entries ----
void CudaBackend::rope(const Tensor& x, const int32_t* positions, const RopeArgs& args) {
  CHECK_EQ(x.rank(), 3);
  check_bf16(x, "rope x");
  const int half = args.rotary_dim / 2;
  CHECK_LE(args.offset + args.rotary_dim, x.dim(2));
  CHECK_MSG(half <= kMaxRopeHalf, "rope: rotary_dim {} too large", args.rotary_dim);
  if (x.dim(0) == 0 || half == 0) return;
  auto p = zeroed<RopeParams>();
  p.positions = stage_i32(positions, x.dim(0));
  p.x = x.ptr<bf16_bits>();
  p.tokens = x.dim(0);
  p.heads = int(x.dim(1));
  p.stride = int(x.dim(2));
  p.offset = args.offset;
  p.half = half;
  p.interleaved = args.interleaved;
  p.attention_factor = args.attention_factor;
  for (int i = 0; i < half; ++i) p.inv_freq[i] = args.inv_freq[i];
  // Graph mode: rope(q) then rope(k) with the same positions and frequencies: one launch (each
  // tensor keeps its own offset: MLA's cache row and q rotate different dims).
  RopeParams m;
  if (recorder_.last(kOpRope, &m) && m.x2 == nullptr && m.positions == p.positions &&
      m.tokens == p.tokens && m.half == p.half && m.x != p.x &&
      (tunables_.fusion || m.offset == p.offset) && m.interleaved == p.interleaved &&
      m.attention_factor == p.attention_factor &&
      std::memcmp(m.inv_freq, p.inv_freq, sizeof p.inv_freq) == 0) {
    recorder_.drop_last();
    m.x2 = p.x;
    m.heads2 = p.heads;
    m.stride2 = p.stride;
    m.offset2 = p.offset;
    record(kOpRope, m, launch_rope);
    return;
  }
  record(kOpRope, p, launch_rope);
}

}  // namespace strata::cuda
