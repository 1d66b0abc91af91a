// An RMSNorm run as the prologue of the decode GEMV that reads its output (NormPrologue in norm.h;
// graph mode merges the norm launch into it: norm_prologue.cc; MLA's q_a norm before q_b). Each
// block normalizes the m rows itself into shared memory, so the norm's own launch, one kernel
// boundary of the batch-1 critical path, goes.
//
// Bits: those of launch_rms_norm's one-pass vec kernel (norm.h kVecOnePass), whose order of sums
// this follows: norm thread i of ceil(k / 256) warps holds values [8i, 8i + 8) and sums their
// squares in order, each norm warp's sum by the xor butterfly, the warps' sums added in warp
// order; out = weight · (x · rsqrt(sum / k + eps)) rounded to bf16. The block's warps play the
// norm warps in turn (warp w: norm warps w, w + W, ...). Block 0 also stores the rows where the
// norm would have (`keep`), so the step's tensors hold what they held before the merge.
//
// Not an add_rms_norm: its residual update inside the GEMV (the block that read last stored the
// sums) ran slower than the two launches on the H200, because every block of a large grid
// repeats the row's add and norm (Llama-3.1-8B batch 1 4.879 against 4.141 ms a step, a
// Kimi-K2.5 rank +10%; the router GEMV with the post-attention norm likewise; 2026-12-03,
// bench/results/2026-12-03-session13.md). That design is in commit fb9159d.
#pragma once

#include "backend/cuda/common.cuh"
#include "backend/cuda/norm.h"
#include "backend/cuda/norm_weight.cuh"

namespace strata::cuda {

// Dynamic shared memory the prologue takes: m rows of k bf16, then one float per norm warp.
inline size_t norm_prologue_smem_bytes(int m, int64_t k) {
  return size_t(m) * size_t(k) * 2 + size_t((k / 8 + 31) / 32) * 4;
}

// A thread's bf16 norm weights, chunks threadIdx.x + c · blockDim.x (c < 2), loaded before the PDL
// wait (weights are parameters, never written by a kernel), as rms_norm_vec_kernel's
// weight_preload: the output pass then waits on no load after the rows' reduction (8 KB a layer,
// untouched since the previous step: a trip to DRAM on the critical path). `ok` false (f32
// weights, more chunks a thread, or none preloaded): the output pass reads them itself.
// Measured: Llama-3.1-8B W4A16 batch-1 step 2.647-2.654 against 2.678-2.684 ms (H100, 2026-12-07
// session 48, three processes; bf16 unchanged).
struct NormHeld {
  uint4 w[2];
  bool ok;
};
__device__ __forceinline__ NormHeld norm_prologue_preload(const NormPrologue& n, int64_t k) {
  NormHeld h{};
  const int nchunk = int(k / 8);
  h.ok = !n.weight_f32 && nchunk <= 2 * int(blockDim.x);
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int i = int(threadIdx.x) + c * int(blockDim.x);
    if (h.ok && i < nchunk) h.w[c] = __ldg(static_cast<const uint4*>(n.weight) + i);
  }
  return h;
}

// x's 8 values at chunk i of row m.
__device__ __forceinline__ void norm_input8(const NormPrologue& n, int64_t k, int m, int i,
                                            float* v) {
  unpack8(__ldg(reinterpret_cast<const uint4*>(n.x + int64_t(m) * k) + i), v);
}

// Every thread of the block, after pdl_wait: returns the M normalized rows of k values (shared
// memory, `smem` of norm_prologue_smem_bytes). `keep` [M, k]: where block 0 stores them.
template <int M>
__device__ __forceinline__ const bf16_bits* norm_prologue(const NormPrologue& n, int64_t k,
                                                          bf16_bits* keep, char* smem,
                                                          const NormHeld& held = NormHeld{}) {
  bf16_bits* xs = reinterpret_cast<bf16_bits*>(smem);
  float* warp_ss = reinterpret_cast<float*>(smem + size_t(M) * size_t(k) * 2);
  const int nchunk = int(k / 8), norm_warps = (nchunk + 31) / 32;
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int nw = int(blockDim.x) / 32;
  const int64_t block = blockIdx.x + int64_t(gridDim.x) * blockIdx.y;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    for (int vw = warp; vw < norm_warps; vw += nw) {
      const int i = vw * 32 + lane;
      float ss = 0;
      if (i < nchunk) {
        float v[8];
        norm_input8(n, k, m, i, v);
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
    const float inv = rsqrtf(total / float(k) + n.eps);
    uint4* dst = reinterpret_cast<uint4*>(xs + int64_t(m) * k);
    uint4* kept = reinterpret_cast<uint4*>(keep + int64_t(m) * k);
    for (int i = int(threadIdx.x), c = 0; i < nchunk; i += int(blockDim.x), ++c) {
      float v[8], w[8], o[8];
      norm_input8(n, k, m, i, v);
      if (held.ok)
        unpack8(c == 0 ? held.w[0] : held.w[1], w);  // c < 2 where ok
      else
        norm_weight8(n.weight, n.weight_f32, i, w);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = w[e] * (v[e] * inv);
      const uint4 bits = pack8(o);
      dst[i] = bits;
      if (block == 0) kept[i] = bits;
    }
    __syncthreads();  // the rows complete; warp_ss free for the next row
  }
  return xs;
}
// The same for m (1 or 2) known at run time only.
__device__ __forceinline__ const bf16_bits* norm_prologue_rows(const NormPrologue& n, int m,
                                                               int64_t k, bf16_bits* keep,
                                                               char* smem, const NormHeld& held) {
  return m == 1 ? norm_prologue<1>(n, k, keep, smem, held)
                : norm_prologue<2>(n, k, keep, smem, held);
}

}  // namespace strata::cuda
