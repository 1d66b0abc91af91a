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
// The proj form (layers without q_lora: Moonlight, DeepSeek-V2-Lite; no q_a norm, q_b = q_proj
// over the layer's normed input h, k = hidden): the same launch after kv_a's GEMV, which then
// runs alone instead of paired with q_proj. Its CTAs stream their q_proj rows (24 rows of 2,048
// at Moonlight's dims, 96 KB) into shared memory by bulk copies before the PDL wait — registers
// cannot hold them, and with them in shared memory two CTAs fit an SM, so Moonlight's 17 clusters
// of 8 are resident at once (session 27's form, kv_a inside the launch and ~146 KB a CTA, was
// not: one CTA an SM, fewer than 16 cluster slots of 8 SMs; bench/results/2026-12-05-session27.md).
// What it takes off a Moonlight layer's critical path: the q_proj ‖ kv_a pair, then the cache
// rows ‖ W_UK branch and its join (H100, session 52: 6.2 + 6.0 µs) become kv_a's GEMV, then this
// launch, whose q_proj bytes stream under kv_a's.
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
constexpr int kMlaQueryProjMaxSteps = 8;    // ... of a q_proj row (shared memory): hidden <= 2,048
constexpr int kMlaQueryMaxUkPasses = 4;     // W_UK rows a warp folds, one a pass
constexpr int kMlaQueryMaxUkPieces = 2;     // 8-value pieces a lane of a W_UK row takes
constexpr int kMlaQueryMaxNope = 256;

struct MlaQueryParams {
  MlaInputsParams in;     // q [tokens, heads, q_stride], q_latent, the cache rows (all written)
  NormPrologue norm;      // q_a [tokens, k] and its RMSNorm; weight null: the proj form (x = h)
  const bf16_bits* q_b;   // [heads · q_stride, k]
  const bf16_bits* w_uk;  // [heads, latent, nope]
  bf16_bits*
      q_a_normed;    // [tokens, k]: the norm's output, stored by block 0 (not in the proj form)
  int k;             // q_lora_rank
  int nope;          // q's dims before the rope ones (= in.q_offset)
  int cluster;       // CTAs a head (1, 2, 4 or 8)
  int rows_per_cta;  // q_stride / cluster, a multiple of 8
  int uk_lanes;      // per_head_gemv_set_lanes for k = nope
  int norm_vec;      // 1: the q_a norm in the vec one-pass order, 0: the one-warp order
};
static_assert(sizeof(MlaQueryParams) ==
                  sizeof(MlaInputsParams) + sizeof(NormPrologue) + 3 * 8 + 6 * 4,
              "MlaQueryParams has no padding");

// The sizes of one launch; proj: the proj form (no q_a norm, q_b's rows in shared memory).
struct MlaQueryShape {
  int64_t tokens, k, heads, q_stride, nope, latent;
  bool proj;
};
// Whether the launch takes these sizes (besides what mla_inputs takes): tokens, a q_b row's
// steps, the cluster's split of the q rows and of the latent columns.
bool mla_query_fits(const MlaQueryShape& s);
// The launch's clusters at these sizes (after mla_query_fits) that the GPU holds at once (the
// driver's occupancy query; 0 on an error).
int mla_query_active_clusters(const MlaQueryShape& s);
// Fills cluster, rows_per_cta and uk_lanes for the sizes in p (after mla_query_fits).
void mla_query_set_split(MlaQueryParams& p);
void launch_mla_query(const MlaQueryParams& p, const Launch& launch);

}  // namespace strata::cuda
