// One token's INT4 down projection and MoE combine in one launch (moe_experts_int4_reg.h
// launch_int4_down_combine; CudaTunables::moe_int4_down_combine): the batch-1 decode step's
// flat down projection and combine, without the combine's launch.
//
// ## Why (H200, 2026-12-04, a Kimi-K2.5 rank at batch 1, kernel timeline)
// A MoE layer's routed path is router -> route -> gate_up -> down -> combine, each launch
// waiting on the one before: the flat down took ~4.5 us for 7.3 MB and the combine ~3-4 us more
// for 8 rows of 14 KB, most of both the hand-off between two grids.
//
// ## This kernel (T = 1, top-k <= 8, the expert's slice k = 64, 128 or 256)
// - CTA rt: output rows [16 rt, 16 rt + 16) for all of the token's assignments; warp w takes the
//   assignments of ranks 2w and 2w + 1 in the combine's order (ascending expert id, then slot;
//   ids out of range take no rank), so every CTA's weights (2 KT 512-byte tiles a warp) are
//   loaded before the PDL wait: the ids were written two kernels back (gate_up triggers only
//   after its own wait), as the flat down kernel reads them.
// - Per assignment: the flat down kernel's arithmetic for one row tile held by one warp (weights
//   rounded to bf16, 4 mma.m16n8k16 a tile into two accumulators, y = bf16(0 + (acc + acc1))).
// - The CTA then adds the y rows in rank order as the combine does (fmul, fadd, rounded each),
//   plus `add`, rounded once to bf16: the flat down + combine's bits.
#include "backend/cuda/linear_int4.cuh"
#include "backend/cuda/moe_experts_int4_reg.h"

namespace strata::cuda {
namespace {

using namespace int4;

constexpr int kWarps = 4;
constexpr int kPerWarp = 2;  // assignments a warp: top-k <= kWarps · kPerWarp
static_assert(kWarps * kPerWarp == kInt4DownCombineMaxTopK);

// TPG: k tiles per scale group (1, 2 or 4 for groups 64, 128, 256), 0 for group 32.
template <int KT, int TPG>
__global__ void __launch_bounds__(kWarps * 32) int4_down_combine_kernel(Int4DownCombineParams p) {
  __shared__ float ys[kWarps * kPerWarp][kInt4TileRows];  // y rows by rank, rounded to bf16
  __shared__ float wr[kWarps * kPerWarp];                 // the routing weights by rank
  __shared__ int valid_n;
  const int lane = int(threadIdx.x) % 32, g = lane / 4, c = lane % 4;
  const int warp = __shfl_sync(~0u, int(threadIdx.x) / 32, 0);
  const int64_t rt = blockIdx.x;
  pdl_trigger();  // the next kernel waits for this grid's completion anyway

  // ---- the assignments' ranks (every warp computes them; lane j holds slot j) ----
  int id = -1;
  float w = 0.0f;
  if (lane < p.top_k) {
    id = __ldcg(p.ids + lane);
    w = __ldcg(p.weights + lane);
  }
  const bool valid = lane < p.top_k && id >= 0 && id < p.num_experts;
  int rank = 0;
  for (int j = 0; j < p.top_k; ++j) {
    const int o = __shfl_sync(~0u, id, j);
    if (o >= 0 && o < p.num_experts) rank += o < id || (o == id && j < lane);
  }
  const int count = __popc(__ballot_sync(~0u, valid));
  int slot[kPerWarp], expert[kPerWarp];
#pragma unroll
  for (int s = 0; s < kPerWarp; ++s) {
    const unsigned m = __ballot_sync(~0u, valid && rank == warp * kPerWarp + s);
    slot[s] = m ? __ffs(int(m)) - 1 : -1;
    expert[s] = __shfl_sync(~0u, id, m ? slot[s] : 0);
  }
  if (warp == 0 && valid) wr[rank] = w;
  if (threadIdx.x == 0) valid_n = count;

  // ---- the weights of this warp's assignments' row tile rt, before the wait ----
  const uint4* wsrc = static_cast<const uint4*>(p.packed) + lane;
  const uint32_t* ssrc = reinterpret_cast<const uint32_t*>(p.scale) + g;
  constexpr int kScales = TPG == 0 ? 2 : 1;
  uint4 ring[kPerWarp * KT];
  uint32_t sc[kPerWarp * KT * kScales];
#pragma unroll
  for (int s = 0; s < kPerWarp; ++s)
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
      const int t = s * KT + kt;
      if (slot[s] < 0) continue;
      const int64_t gt = int64_t(expert[s]) * p.expert_tiles + rt * KT + kt;
      ring[t] = __ldcs(wsrc + gt * 32);
      load_tile_scales<TPG>(ssrc, gt, sc + kScales * t);
    }
  pdl_wait();  // act (gate_up's output) and `add` (the joined side branch) are complete

  // ---- y of each assignment: rows g and g + 8 of the tile, the token in column 0 ----
#pragma unroll
  for (int s = 0; s < kPerWarp; ++s) {
    if (slot[s] < 0) continue;
    uint32_t xf[KT * 8];
    const uint32_t* xr = reinterpret_cast<const uint32_t*>(p.x + int64_t(slot[s]) * p.k);
#pragma unroll
    for (int q = 0; q < 4 * KT; ++q) {
      xf[2 * q] = __ldg(xr + 8 * q + c);
      xf[2 * q + 1] = __ldg(xr + 8 * q + c + 4);
    }
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
      const int t = s * KT + kt;
      mma_tile_round(ring[t], sc[TPG == 0 ? 2 * t : t], sc[TPG == 0 ? 2 * t + 1 : t], xf + kt * 8,
                     acc, acc1);
    }
    if (c == 0) {
      const int r = warp * kPerWarp + s;
      ys[r][g] = bf16_to_float(float_to_bf16(0.0f + (acc[0] + acc1[0])));
      ys[r][g + 8] = bf16_to_float(float_to_bf16(0.0f + (acc[2] + acc1[2])));
    }
  }
  __syncthreads();

  // ---- the combine of the tile's rows (moe_combine.cu's sum order) ----
  const int i = int(threadIdx.x);
  const int64_t row = rt * kInt4TileRows + i;
  if (i < kInt4TileRows && row < p.n) {
    float a = 0.0f;
    for (int r = 0; r < valid_n; ++r) a = __fadd_rn(a, __fmul_rn(wr[r], ys[r][i]));
    if (p.add != nullptr) a += bf16_to_float(p.add[row]);
    p.out[row] = float_to_bf16(a);
  }
}

}  // namespace

bool launch_int4_down_combine(const Int4DownCombineParams& p, cudaStream_t stream) {
  if (!int4_flat_down_fits(p.k, p.group, 1) || p.top_k < 1 || p.top_k > kInt4DownCombineMaxTopK ||
      p.n < 1)
    return false;
  const bool ok = with_row_tile_kernel(int(p.k / kInt4TileK), p.group, [&](auto kt, auto tpg) {
    launch_pdl(int4_down_combine_kernel<decltype(kt)::value, decltype(tpg)::value>,
               dim3(unsigned(p.row_tiles)), dim3(kWarps * 32), 0, Launch{stream}, p);
  });
  CUDA_LAUNCH_CHECK();
  return ok;
}

}  // namespace strata::cuda
