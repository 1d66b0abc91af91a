// The decode GEMV's RMSNorm prologue (GemvParams::norm_x; CudaBackend::merge_gemv_norm in
// gemv_norm.cc): a block normalizes its m rows of x into shared memory itself, so the norm's own
// launch goes (MLA's q_a norm before q_b: one kernel boundary of the batch-1 critical path).
//
// Bits: those of launch_rms_norm's one-pass vec kernel (norm.h kVecOnePass), whose order of sums
// this follows: norm thread i of ceil(k / 256) warps holds values [8i, 8i + 8) and sums their
// squares in order, each norm warp's sum by the xor butterfly, the warps' sums added in warp
// order; out = weight · (x · rsqrt(sum / k + eps)) rounded to bf16. The block's warps play the
// norm warps in turn (warp w: norm warps w, w + W, ...). Block 0 also stores the rows where the
// norm would have (GemvParams::x), so the step's tensors hold what they held before the merge.
#pragma once

#include "backend/cuda/common.cuh"
#include "backend/cuda/linear.h"
#include "backend/cuda/norm_weight.cuh"

namespace strata::cuda {

// Dynamic shared memory the prologue takes: m rows of k bf16, then one float per norm warp.
inline size_t gemv_norm_smem_bytes(int m, int64_t k) {
  return size_t(m) * size_t(k) * 2 + size_t((k / 8 + 31) / 32) * 4;
}

// Every thread of the block, after pdl_wait: returns the normalized rows (shared memory).
template <int M>
__device__ __forceinline__ const bf16_bits* gemv_norm_prologue(const GemvParams& p, char* smem) {
  bf16_bits* xs = reinterpret_cast<bf16_bits*>(smem);
  float* warp_ss = reinterpret_cast<float*>(smem + size_t(M) * size_t(p.k) * 2);
  const int nchunk = int(p.k / 8), norm_warps = (nchunk + 31) / 32;
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int nw = int(blockDim.x) / 32;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const uint4* x = reinterpret_cast<const uint4*>(p.norm_x + int64_t(m) * p.k);
    for (int vw = warp; vw < norm_warps; vw += nw) {
      const int i = vw * 32 + lane;
      float ss = 0;
      if (i < nchunk) {
        float v[8];
        unpack8(__ldg(x + i), v);
#pragma unroll
        for (int e = 0; e < 8; ++e) ss += v[e] * v[e];
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) warp_ss[vw] = ss;
    }
    __syncthreads();
    float total = 0;
    for (int w = 0; w < norm_warps; ++w) total += warp_ss[w];
    const float inv = rsqrtf(total / float(p.k) + p.norm_eps);
    uint4* dst = reinterpret_cast<uint4*>(xs + int64_t(m) * p.k);
    uint4* keep = reinterpret_cast<uint4*>(const_cast<bf16_bits*>(p.x) + int64_t(m) * p.k);
    for (int i = int(threadIdx.x); i < nchunk; i += int(blockDim.x)) {
      float v[8], w[8], o[8];
      unpack8(__ldg(x + i), v);
      norm_weight8(p.norm_w, p.norm_w_f32, i, w);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = w[e] * (v[e] * inv);
      const uint4 bits = pack8(o);
      dst[i] = bits;
      if (blockIdx.x == 0) keep[i] = bits;
    }
    __syncthreads();  // the rows complete; warp_ss free for the next row
  }
  return xs;
}

}  // namespace strata::cuda
