// x into shared memory for the INT4 GEMVs (the register GEMV, linear_int4_reg.cu; the stream
// GEMV, linear_int4_stream.cu): m <= 8 token rows of k bf16 in the mma's B-fragment order, and
// for the stream GEMV the sums of x per scale group times −136 (the magic's offset: (128 +
// nibble) into the mma; the register GEMV subtracts 136 from the weights instead).
#pragma once

#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/linear_int4.h"

namespace strata::cuda::int4 {

constexpr int kXsumTokens = 8;  // xsum's stride a group: one mma n tile of tokens

// Word (k tile kt, token t, half h, lane c, jj) at (kt·m + t)·32 + (h ^ swap)·16 + 4c + jj holds k
// 64kt + 16s + 2c + 8bb (and +1) with s = 2h + jj / 2, bb = jj % 2: lane (t, c)'s steps 2h,
// 2h + 1 as 16 contiguous bytes, the four lanes of a token 64 contiguous bytes. kSwapOdd (the
// register GEMV's): swap = t & 1, so that the 8 lanes of a 16-byte load phase (tokens 2j, 2j + 1)
// hit different banks; else swap = 0 (the stream GEMV's, whose lanes of a phase share a token).
// xsum[group · 8 + t] = −136 · Σx over the group; tokens >= m and padded tiles are not written
// here (the caller zeroes them). `piece(q)`: the q-th 16-byte piece of x (token q / (k / 8),
// piece q % (k / 8)), from global memory or a copy in shared memory. Loads kBatch pieces a thread
// before it uses them (warp-uniform loop; every thread of the block calls it). kSums false: no
// sums (xsum unused).
template <int kBatch, bool kSwapOdd, bool kSums, typename Piece>
__device__ __forceinline__ void stage_x_fragments(uint32_t* xs, float* xsum, int m, int64_t k,
                                                  int group, int gshift, Piece&& piece) {
  const int tid = int(threadIdx.x), lane = tid % 32;
  const int kc = int(k / 8), pieces = m * kc, lanes_per_group = group / 8;
  for (int q0 = tid - lane; q0 < pieces; q0 += kBatch * int(blockDim.x)) {  // warp-uniform
    uint4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int q = q0 + u * int(blockDim.x) + lane;
      v[u] = make_uint4(0, 0, 0, 0);
      if (q < pieces) v[u] = piece(q, kc);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int qw = q0 + u * int(blockDim.x);
      if (qw >= pieces) break;  // warp-uniform
      // A group's pieces are lanes_per_group aligned lanes (k % group == 0, group <= 256).
      const int q = qw + lane, t = q / kc, k0 = (q % kc) * 8;
      const int kt0 = k0 / kInt4TileK, col = k0 % kInt4TileK, s = col / 16, bb = (col % 16) / 8;
      float sum = 0.0f;
      if constexpr (kSums) {
        float f[8];
        unpack8(v[u], f);
        sum = ((f[0] + f[1]) + (f[2] + f[3])) + ((f[4] + f[5]) + (f[6] + f[7]));
        for (int o = 1; o < lanes_per_group; o <<= 1) sum += __shfl_xor_sync(~0u, sum, o);
      }
      if (q < pieces) {
        const int row = kSwapOdd ? (kt0 * m + t) * 32 + ((s / 2) ^ (t & 1)) * 16
                                 : ((kt0 * m + t) * 2 + s / 2) * 16;  // the two as they were
        uint32_t* dst = xs + row + 2 * (s % 2) + bb;
        dst[0] = v[u].x;
        dst[4] = v[u].y;
        dst[8] = v[u].z;
        dst[12] = v[u].w;
        if (kSums && lane % lanes_per_group == 0)
          xsum[(k0 >> gshift) * kXsumTokens + t] = -136.0f * sum;
      }
    }
  }
}

// The zeros stage_x_fragments leaves to the register GEMV (kSwapOdd's layout): x's padded half
// tile (k % 64 == 32). Disjoint from its writes; every thread calls it.
__device__ __forceinline__ void zero_x_padding(uint32_t* xs, int m, int64_t k, int kt) {
  if (k % kInt4TileK != 0)
    for (int i = int(threadIdx.x); i < m * 16; i += int(blockDim.x)) {
      const int t = i / 16;
      xs[((kt - 1) * m + t) * 32 + (1 ^ (t & 1)) * 16 + i % 16] = 0;
    }
}

}  // namespace strata::cuda::int4
