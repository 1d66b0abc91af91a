// The product's configurations of the wgmma prefill kernel (attention_prefill_wgmma.cuh): K/V
// tiles of 64 keys; 3 K/V stages for bf16 KV at head_dim 64, 2 otherwise (fp8 KV always 2). The
// fastest measured on the H200 (bench/RESULTS.md "prefill attention": 64-key tiles run 2 blocks
// per SM; the 128-key tiles, the 3-stage pipeline at head_dim 128, the overlapped P·V schedule and
// the mma.sync kernel measured slower and live in bench/cuda/dev). Each also as a path-tile
// variant (kPaths) for deterministic mode's draft trees.
#include "backend/cuda/attention_prefill_wgmma.cuh"

namespace strata::cuda {

template <bool kPaths>
void set_limits() {
  w_set_limit<64, kKvBf16, 64, 3, kPaths>();
  w_set_limit<64, kKvE4M3, 64, 2, kPaths>();
  w_set_limit<64, kKvE5M2, 64, 2, kPaths>();
  w_set_limit<128, kKvBf16, 64, 2, kPaths>();
  w_set_limit<128, kKvE4M3, 64, 2, kPaths>();
  w_set_limit<128, kKvE5M2, 64, 2, kPaths>();
}

void init_wgmma_prefill_kernels() {
  set_limits<false>();
  set_limits<true>();  // path tiles (AttentionParams::tree_paths)
}

void launch_wgmma_prefill(const AttentionParams& p, const Launch& launch) {
  CHECK_MSG(p.scale_log2 * p.k_scale > 0, "prefill attention: scale {} · k_scale {} must be > 0",
            p.scale_log2, p.k_scale);
  switch (p.head_dim) {
    case 64:
      p.tree_paths ? w_launch_d<64, 64, 3, true>(p, launch) : w_launch_d<64, 64, 3>(p, launch);
      break;
    case 128:
      p.tree_paths ? w_launch_d<128, 64, 2, true>(p, launch) : w_launch_d<128, 64, 2>(p, launch);
      break;
    default:
      CHECK_MSG(false, "wgmma prefill attention: head_dim {}", p.head_dim);
  }
}

}  // namespace strata::cuda
