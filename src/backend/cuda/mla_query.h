// MLA's decode query in one launch (mla_query.cu; Backend::mla_query, CudaTunables::
// mla_query_fusion): q = q_b · rms_norm(q_a), q's rope, q_latent = [W_UK_hᵀ q_nope | q's roped
// dims] and the cache rows (mla_inputs.cuh), which were four launches of a batch-1 layer's
// critical path: the q_b GEMV (with the q_a norm as its prologue), W_UK's per-head GEMV on a
// side branch beside the attention inputs, then the branch's join.
//
// Why one launch: at batch 1 a Kimi-K2.5 rank's q_b streams 4.7 MB and W_UK 1 MB, ~1.5 µs at the
// H200's bandwidth, while the q_b launch and the inputs ‖ W_UK pair after it took ~8 µs of a
// layer's critical path (H200 timelines, bench/results/2026-12-04-session24.md; fused: the pair's
// end to the MLA decode's end 15.0-15.3 -> 12.0-12.6 µs, session 25). Head h's W_UK product needs
// all of head h's q_nope, which one CTA cannot stream fast enough, so a cluster of CTAs shares each
// head: every CTA streams a slice of the head's q_b rows, the slices meet in distributed shared
// memory, and every CTA then folds the head's q_nope into its own slice of latent columns. One more
// cluster writes the cache rows.
//
// Bits: those of the separate launches. A q_b row is one warp's sum in the decode GEMV's order
// (linear.cu gemv_kernel: lane l's 8-value steps at l · 8 + 256 s in order, the xor butterfly),
// after the q_a norm in the norm prologue's order (norm_prologue.cuh) or, for q_lora_rank <= 256,
// the one-warp norm's; a latent column is per_head_gemv.cu's sum (`uk_lanes` lanes, fmaf in k
// order, the xor butterfly); the ropes share rope_pair; the cache rows are mla_inputs.cuh's.
#pragma once

#include "backend/cuda/launch.h"
#include "backend/cuda/mla_inputs.h"
#include "backend/cuda/norm.h"

namespace strata::cuda {

constexpr int kMlaQueryMaxTokens = 2;
constexpr int kMlaQueryMaxRowsPerWarp = 3;  // q_b rows a warp streams
constexpr int kMlaQueryMaxSteps = 6;        // 256-value steps of a q_b row: q_lora_rank <= 1,536
constexpr int kMlaQueryMaxUkPasses = 4;     // W_UK rows a warp folds, one a pass
constexpr int kMlaQueryMaxUkPieces = 2;     // 8-value pieces a lane of a W_UK row takes
constexpr int kMlaQueryMaxNope = 256;

struct MlaQueryParams {
  MlaInputsParams in;     // q [tokens, heads, q_stride], q_latent, the cache rows (all written)
  NormPrologue norm;      // q_a [tokens, k] and its RMSNorm
  const bf16_bits* q_b;   // [heads · q_stride, k]
  const bf16_bits* w_uk;  // [heads, latent, nope]
  bf16_bits* q_a_normed;  // [tokens, k]: the norm's output, stored by block 0
  int k;                  // q_lora_rank
  int nope;               // q's dims before the rope ones (= in.q_offset)
  int cluster;            // CTAs a head (1, 2, 4 or 8)
  int rows_per_cta;       // q_stride / cluster, a multiple of 8
  int uk_lanes;           // per_head_gemv_set_lanes for k = nope
  int norm_vec;           // 1: the q_a norm in the vec one-pass order, 0: the one-warp order
};
static_assert(sizeof(MlaQueryParams) ==
                  sizeof(MlaInputsParams) + sizeof(NormPrologue) + 3 * 8 + 6 * 4,
              "MlaQueryParams has no padding");

// Whether the launch takes these sizes (besides what mla_inputs takes): tokens, a q_b row's
// steps, the cluster's split of the q rows and of the latent columns.
bool mla_query_fits(int64_t tokens, int64_t k, int64_t heads, int64_t q_stride, int64_t nope,
                    int64_t latent);
// The launch's clusters at these sizes (after mla_query_fits) that the GPU holds at once (the
// driver's occupancy query; 0 on an error).
int mla_query_active_clusters(int64_t tokens, int64_t k, int64_t heads, int64_t q_stride,
                              int64_t nope, int64_t latent);
// Fills cluster, rows_per_cta and uk_lanes for the sizes in p (after mla_query_fits).
void mla_query_set_split(MlaQueryParams& p);
void launch_mla_query(const MlaQueryParams& p, const Launch& launch);

}  // namespace strata::cuda
