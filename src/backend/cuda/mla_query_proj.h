// MLA's decode query of a layer without q_lora (Moonlight, DeepSeek-V2-Lite) in one launch
// (mla_query_proj.cu; Backend::mla_query_proj, CudaTunables::mla_query_proj_fusion): q = q_proj ·
// h, kv_row = kv_a · h, q's rope, q_latent = [W_UK_hᵀ q_nope | q's roped dims] and the cache rows
// (mla_inputs.cuh), which were three launches and a side branch on a batch-1 layer's critical
// path: q_proj and kv_a as one GEMV launch, then W_UK's per-head GEMV on a side branch beside the
// attention inputs, then the branch's join.
//
// Why: at batch 1 Moonlight's q_proj and kv_a stream 15 MB (~3.5 µs at the H200's bandwidth),
// W_UK 2 MB, while the GEMV pair and the inputs ‖ W_UK pair after it took ~15 µs of each of its 27
// layers (ncu, bench/results/2026-12-03-session11.md: q_proj 7.0, kv_a 3.5, W_UK 6.8, inputs
// 4.7 µs). mla_query.h fused the same chain for q_lora layers (a Kimi-K2.5 rank: −0.9 to −3.5% a
// step); here the GEMVs' input is h itself, so kv_a joins the launch too.
//
// How: a cluster of `cluster` CTAs a head, as mla_query.cu. Before the PDL wait every CTA copies
// its weights into shared memory by bulk copies (weights are never written by a kernel): its
// slice of the head's q_proj rows, its share of W_UK's latent columns, and its share of kv_a's
// rows (R + P rows over all CTAs of the grid: ~5 a CTA for Moonlight). After the wait: its kv_a
// rows into kv_row, then its q rows, the cluster barrier, q_nope, the rope and W_UK
// (mla_query_head.cuh). The cache rows need every kv_a row: each CTA counts itself done with its
// kv_a rows on a word in global memory, and the last to do so makes the cache rows (norm, rope,
// page write; mla_inputs.cuh) and zeroes the word for the next launch. No CTA waits on another
// outside its cluster, so the grid need not be resident at once to be correct; the backend still
// takes the launch only where it is (a second wave would double its latency).
//
// Bits: those of the separate launches. A q_proj or kv_a row is one warp's sum in the decode
// GEMV's order at one warp a row (linear.cu gemv_kernel: lane l's 8-value steps at l · 8 + 256 s
// in order, the xor butterfly; CudaTunables::gemv_max_ksplit 1, the default; other splits
// decline); the rest as mla_query.h.
#pragma once

#include "backend/cuda/l2_prefetch.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mla_inputs.h"

namespace strata::cuda {

constexpr int kMlaQueryProjMaxTokens = 2;

struct MlaQueryProjParams {
  MlaInputsParams in;       // q, q_latent, kv_row (kv_a's rows, then the cache rows), the cache
  const bf16_bits* x;       // [tokens, k]: h, the layer's normalized hidden state
  const bf16_bits* q_proj;  // [heads · q_stride, k]
  const bf16_bits* kv_a;    // [R + P, k]
  const bf16_bits* w_uk;    // [heads, R, nope]
  unsigned* done;           // CTAs done with their kv_a rows (zero between launches)
  int k;                    // hidden size
  int nope;                 // q's dims before the rope ones (= in.q_offset)
  int cluster;              // CTAs a head (1, 2, 4 or 8)
  int rows_per_cta;         // q_stride / cluster, a multiple of 8
  int uk_lanes;             // per_head_gemv_set_lanes for k = nope
  int kv_rows_max;          // the most kv_a rows a CTA takes
  L2PrefetchRanges l2;      // weights the CTAs bring into L2 after their wait (Backend::prefetch)
};
static_assert(sizeof(MlaQueryProjParams) ==
                  sizeof(MlaInputsParams) + 5 * 8 + 6 * 4 + sizeof(L2PrefetchRanges),
              "MlaQueryProjParams has no padding");

// Fills k, nope, cluster, rows_per_cta, uk_lanes and kv_rows_max of p for these sizes (latent R,
// rope P); false where the launch does not take them (tokens, a head's split, nope).
bool mla_query_proj_plan(int64_t tokens, int64_t k, int64_t heads, int64_t q_stride, int64_t nope,
                         int64_t latent, int64_t rope, MlaQueryProjParams& p);
// Whether a CTA's weights and h fit its shared memory and the GPU holds every cluster at once
// (after mla_query_proj_plan; asks the driver; false on an error).
bool mla_query_proj_one_wave(int64_t tokens, int64_t heads, int64_t latent,
                             const MlaQueryProjParams& p);
void launch_mla_query_proj(const MlaQueryProjParams& p, const Launch& launch);

}  // namespace strata::cuda
