// Mixture-of-experts routing on the GPU (issue 23): the router's float32 logits and the expert
// choice, with the CPU twin's semantics (backend/cpu/moe.cc: Hugging Face DeepSeek-V2/V3).
//
//   launch_moe_router  logits f32 [T, E] = x bf16 [T, H] · gate bf16 [E, H]ᵀ for T <= 32 (decode):
//                      the gate streamed once with 16-byte loads, mma.sync with float32
//                      accumulation, k split over warps and CTAs, the CTAs' partial sums added
//                      in a fixed order by the last CTA of each row tile (deterministic). Larger
//                      T: cuBLAS (cublasGemmEx bf16 x bf16 -> CUDA_R_32F, compute 32F), which
//                      bench/cuda/moe_bench.cc calls as the backend would.
//   launch_moe_route   one warp per token: softmax or sigmoid scores, e_score_correction_bias
//                      added for the choice only, group-limited top-k (kMax or kTop2Sum group
//                      scores, best topk_groups groups kept), top-k by (choice desc, id asc),
//                      weights = the chosen experts' scores, normalized (sum + 1e-20) and scaled
//                      by routed_scaling_factor; summed in the CPU twin's order.
// Equality with the CPU twin: the same choice except at float near-ties, since the device's
// expf differs from the host's by an ulp or two (CUDA's expf: 2 ulp; the scores then differ by a
// few 1e-8 absolute). Exact ties (equal logits, saturated sigmoids) break to the lower expert id
// on both. tests/parity/moe_route_parity_test.cc counts the differing choices and checks each one's
// margin on the CPU side is below 1e-5.
//
// Parameter blocks are trivially copyable without padding bytes; launchers are asynchronous,
// never allocate or synchronize.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/launch.h"

namespace strata::cuda {

constexpr int kMoeRouterMaxTokens = 32;

struct MoeRouterParams {
  const bf16_bits* x;  // [T, H], 16-byte aligned rows (H % 32 == 0)
  const bf16_bits* w;  // [E, H] row-major (the checkpoint's gate weight)
  float* out;          // [T, E]
  float* partials;     // scratch: [splits, T, E] float32 (unused when splits == 1)
  int32_t* counters;   // [ceil(E / 16)] int32 (a row tile's), zero before the first launch; each
                       // launch leaves them zero again. Owned by the caller, not shared with
                       // other scratch.
  int64_t tokens;      // 1 .. kMoeRouterMaxTokens
  int64_t experts;
  int64_t hidden;
  int splits;     // CTAs per 16-row tile splitting H: 0 = moe_router_splits(E, H)
  int pdl_early;  // trigger the next kernel before waiting on the previous (common.cuh)
  int preload;    // each warp's first weight loads before the PDL wait (CudaTunables::
                  // moe_router_preload); the same arithmetic, the same bits
  int pad_;
};
// The split the launcher picks (its partials scratch: splits · T · E floats).
int moe_router_splits(int64_t experts, int64_t hidden);
inline size_t moe_router_partials_bytes(int64_t tokens, int64_t experts, int64_t hidden) {
  const int s = moe_router_splits(experts, hidden);
  return s > 1 ? size_t(s) * size_t(tokens) * size_t(experts) * 4 : 0;
}
inline size_t moe_router_counter_bytes(int64_t experts) { return size_t((experts + 15) / 16) * 4; }
void launch_moe_router(const MoeRouterParams& p, cudaStream_t stream);

enum MoeRouteScoring : int { kMoeSoftmax = 0, kMoeSigmoid = 1 };
enum MoeRouteGroupScore : int { kMoeGroupMax = 0, kMoeGroupTop2Sum = 1 };
constexpr int kMoeRouteMaxExperts = 1024;
constexpr int kMoeRouteMaxGroups = 32;

struct MoeRouteParams {
  const float* logits;  // [T, E]
  const float* bias;    // [E] (e_score_correction_bias) or null
  int32_t* topk_ids;    // [T, k]
  float* topk_weights;  // [T, k]
  int64_t tokens;
  int num_experts;  // <= kMoeRouteMaxExperts
  int top_k;        // <= min(E, 32)
  int num_groups;   // experts in equal contiguous groups, <= 32; 1 = no group limit
  int topk_groups;
  int scoring;      // MoeRouteScoring
  int group_score;  // MoeRouteGroupScore
  int normalize;    // norm_topk_prob
  float scaling_factor;
  int pdl_early;
  int pad_;
};
void launch_moe_route(const MoeRouteParams& p, cudaStream_t stream);

static_assert(std::has_unique_object_representations_v<MoeRouterParams>);
static_assert(std::is_trivially_copyable_v<MoeRouteParams> && sizeof(MoeRouteParams) == 80);

}  // namespace strata::cuda
