// What MLA's fused decode queries do once a head's q rows exist (mla_query.cu: q_b after the q_a
// norm; mla_query_proj.cu: q_proj, no q_lora): CTA `rank` of the head's cluster gathers the
// head's q_nope from every CTA's q rows (distributed shared memory), ropes its share of the
// head's rope pairs into q and q_latent's rope columns, and folds q_nope into its share of the
// latent columns with W_UK. Bits: a latent column is per_head_gemv.cu's sum (`lanes` lanes,
// fmaf in k order, the xor butterfly), the ropes rope_pair's (mla_query.h).
#pragma once

#include "backend/cuda/cluster.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/mla_inputs.cuh"
#include "backend/cuda/mla_query.h"

namespace strata::cuda::mla_query_head {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
static_assert(kThreads == kMlaInputsThreads, "the cache rows run mla_cache_row");

// This CTA's share of a head: its q rows [rank · rows, +rows) of the head, its latent columns
// [rank · cols, +cols), and how W_UK's rows spread over the warps (`lanes` lanes a row).
struct Share {
  int head, rank, cluster, rows, nope, lanes, cols;
  __device__ __forceinline__ int col0() const { return rank * cols; }
  __device__ __forceinline__ int uk_rows() const { return 32 / lanes; }  // rows a warp a pass
  // The latent column (within the share) that lane `lane` of warp `warp` folds in pass ps.
  __device__ __forceinline__ int uk_col(int ps, int warp, int lane) const {
    return (ps * kWarps + warp) * uk_rows() + lane / lanes;
  }
  // Element of that W_UK row where the lane's piece i starts.
  __device__ __forceinline__ int uk_k0(int i, int lane) const {
    return (lane % lanes) * 8 + i * lanes * 8;
  }
};

// Everything after the cluster barrier that follows the q rows (every CTA's q rows in its q_s
// [M][q_s_stride]); arrives on the cluster barrier once done with the others' q_s (the caller
// waits on it before exiting). uk(ps, i) returns the 8 W_UK values of this lane's piece i in
// pass ps (only called for columns within the share and pieces within nope).
template <int M, typename UkPiece>
__device__ __forceinline__ void finish(const MlaInputsParams& in, const Share& s,
                                       const bf16_bits* q_s, int q_s_stride,
                                       bf16_bits (*nope_s)[kMlaQueryMaxNope], UkPiece&& uk) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int heads = in.heads, rows = s.rows, nope = s.nope;
  const int R = in.fmt.latent, P = in.fmt.rope;
  // The head's q_nope gathered (16-byte pieces: rows is a multiple of 8), and this CTA's share of
  // the rope pairs: rotated into q and q_latent's rope columns.
  const int pieces = nope / 8;
  for (int i = int(threadIdx.x); i < M * pieces; i += kThreads) {
    const int m = i / pieces, d = (i - m * pieces) * 8;
    const uint32_t at = uint32_t(__cvta_generic_to_shared(q_s + m * q_s_stride + d % rows));
    *reinterpret_cast<uint4*>(&nope_s[m][d]) = ld_cluster_v4(cluster_map(at, uint32_t(d / rows)));
  }
  const int half = in.half;
  for (int idx = s.rank * kThreads + int(threadIdx.x); idx < M * half;
       idx += s.cluster * kThreads) {
    const int m = idx / half, i = idx - m * half;
    int d0, d1;
    mla_rope_pair_dims(in, i, &d0, &d1);
    const int e0 = nope + d0, e1 = nope + d1;
    const uint32_t a0 = uint32_t(__cvta_generic_to_shared(q_s + m * q_s_stride + e0 % rows));
    const uint32_t a1 = uint32_t(__cvta_generic_to_shared(q_s + m * q_s_stride + e1 % rows));
    const float x0 = bf16_to_float(ld_cluster_u16(cluster_map(a0, uint32_t(e0 / rows))));
    const float x1 = bf16_to_float(ld_cluster_u16(cluster_map(a1, uint32_t(e1 / rows))));
    bf16_bits o0, o1;
    rope_pair(x0, x1, in.positions[m], in.inv_freq[i], in.attention_factor, &o0, &o1);
    bf16_bits* qh = in.q + (int64_t(m) * heads + s.head) * in.q_stride;
    bf16_bits* lh = in.q_latent + (int64_t(m) * heads + s.head) * (R + P) + R;
    qh[e0] = o0;
    qh[e1] = o1;
    lh[d0] = o0;
    lh[d1] = o1;
  }
  cluster_arrive();  // done with the other CTAs' q_s
  __syncthreads();   // nope_s complete

  // W_UK: latent column col0 + c of the head, per_head_gemv's sum of `lanes` lanes.
  const int L = s.lanes, col0 = s.col0();
#pragma unroll
  for (int ps = 0; ps < kMlaQueryMaxUkPasses; ++ps) {
    const int c = s.uk_col(ps, warp, lane);
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.0f;
    if (c < s.cols) {
#pragma unroll
      for (int i = 0; i < kMlaQueryMaxUkPieces; ++i) {
        const int k0 = s.uk_k0(i, lane);
        if (k0 < nope) {
          float w[8];
          unpack8(uk(ps, i), w);
#pragma unroll
          for (int m = 0; m < M; ++m) {
            float x[8];
            unpack8(*reinterpret_cast<const uint4*>(&nope_s[m][k0]), x);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[m] = fmaf(w[e], x[e], acc[m]);
          }
        }
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m)
      for (int o = L / 2; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
    if (c < s.cols && lane % L == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m)
        in.q_latent[(int64_t(m) * heads + s.head) * (R + P) + col0 + c] = float_to_bf16(acc[m]);
    }
  }
}

}  // namespace strata::cuda::mla_query_head
