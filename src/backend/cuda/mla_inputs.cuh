// The cache-row half of MLA's attention inputs on the device (mla_inputs.h): one block of
// kMlaInputsThreads threads turns token t's kv_a row into its cache row (RMSNorm of the latent in
// the separate norm kernel's order of sums, rope of the key part), stores it back into kv_row and
// encodes it into the token's slot. The fused inputs launch (mla_inputs.cu) and the fused MLA
// query (mla_query.cu) both run it, so their cache rows are the same bits.
#pragma once

#include "backend/cuda/common.cuh"
#include "backend/cuda/mla_inputs.h"
#include "backend/cuda/mla_row_encode.cuh"
#include "backend/cuda/rope.cuh"

namespace strata::cuda {

constexpr int kMlaInputsThreads = 256;
static_assert(kMlaInputsMaxLatent / 8 <= kMlaInputsThreads,
              "the vec norm layout needs R / 8 threads");

__device__ __forceinline__ float mla_norm_weight(const MlaInputsParams& p, int i) {
  return p.norm_f32 ? static_cast<const float*>(p.norm)[i]
                    : bf16_to_float(static_cast<const bf16_bits*>(p.norm)[i]);
}

// The rotated pair i's two dims within a head's rope part.
__device__ __forceinline__ void mla_rope_pair_dims(const MlaInputsParams& p, int i, int* d0,
                                                   int* d1) {
  *d0 = p.interleaved ? 2 * i : i;
  *d1 = p.interleaved ? 2 * i + 1 : i + p.half;
}

// Token t's cache row, by every thread of a block of kMlaInputsThreads (after the PDL wait):
// row_s holds kMlaInputsMaxLatent + 2 · kMaxRopeHalf values, warp_ss one float a warp.
__device__ __forceinline__ void mla_cache_row(const MlaInputsParams& p, int64_t t, uint16_t* row_s,
                                              float* warp_ss) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int R = p.fmt.latent;
  bf16_bits* kv = p.kv_row + t * p.kv_stride;
  const int32_t position = p.positions[t];

  // The latent's squares, in the order of the separate norm's kernel.
  const int nchunk = R / 8;
  const bool holds = p.norm_vec ? tid < nchunk : warp == 0;
  float v[8];
  float ss = 0;
  if (p.norm_vec) {
    if (holds) {
      unpack8(reinterpret_cast<const uint4*>(kv)[tid], v);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += v[e] * v[e];
    }
  } else if (holds) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int i = lane + j * 32;
      if (i < R) {
        v[j] = bf16_to_float(kv[i]);
        ss += v[j] * v[j];
      }
    }
  }

  // The cache row's rope part: rotated in kv_row and staged.
  for (int i = tid; i < p.half; i += kMlaInputsThreads) {
    int d0, d1;
    mla_rope_pair_dims(p, i, &d0, &d1);
    bf16_bits o0, o1;
    rope_pair(bf16_to_float(kv[R + d0]), bf16_to_float(kv[R + d1]), position, p.inv_freq[i],
              p.attention_factor, &o0, &o1);
    kv[R + d0] = o0;
    kv[R + d1] = o1;
    row_s[R + d0] = o0;
    row_s[R + d1] = o1;
  }

  // The sum: the xor butterfly within each warp; the vec order adds the holding warps' sums in
  // warp order (norm.cu block_sum over a block of ceil(R / 256) warps).
  if (p.norm_vec ? warp < (nchunk + 31) / 32 : warp == 0) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  }
  if (p.norm_vec) {
    if (lane == 0) warp_ss[warp] = ss;
    __syncthreads();
    float total = 0;
    for (int w = 0; w < (nchunk + 31) / 32; ++w) total += warp_ss[w];
    ss = total;
  }
  const float inv = rsqrtf(ss / float(R) + p.eps);
  if (holds) {
    if (p.norm_vec) {
      float o[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = mla_norm_weight(p, 8 * tid + e) * (v[e] * inv);
      const uint4 bits = pack8(o);
      reinterpret_cast<uint4*>(kv)[tid] = bits;
      reinterpret_cast<uint4*>(row_s)[tid] = bits;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int i = lane + j * 32;
        if (i < R) {
          const bf16_bits b = float_to_bf16(mla_norm_weight(p, i) * (v[j] * inv));
          kv[i] = b;
          row_s[i] = b;
        }
      }
    }
  }
  __syncthreads();
  char* row = static_cast<char*>(p.cache) + int64_t(p.slots[t]) * p.fmt.row_bytes;
  mla::encode_row(row_s, row, p.fmt, warp, kMlaInputsThreads / 32, lane);
}

}  // namespace strata::cuda
