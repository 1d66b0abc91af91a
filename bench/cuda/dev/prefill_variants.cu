// Prefill attention variants (dev_kernels.h): the mma.sync kernel and the configurations of the
// product's wgmma kernel template (src/backend/cuda/attention_prefill_wgmma.cuh) that the product
// does not run, each a launcher CudaBackend takes as DevKernels::prefill_attention. On the H200
// they measured slower than the product's choice (bench/RESULTS.md "prefill attention").
#include "backend/cuda/attention_prefill_wgmma.cuh"
#include "dev_kernels.h"
#include "prefill_mma.h"

namespace strata::cuda::dev {
namespace {

// The wgmma kernel with BN-key tiles and NS stages for bf16 KV (fp8 KV: 2).
template <int BN, int NS>
void launch_wgmma(const AttentionParams& p, const Launch& launch) {
  CHECK_MSG(p.scale_log2 * p.k_scale > 0, "prefill attention: scale {} · k_scale {} must be > 0",
            p.scale_log2, p.k_scale);
  switch (p.head_dim) {
    case 64:
      w_launch_d<64, BN, NS>(p, launch);
      break;
    case 128:
      w_launch_d<128, BN, NS>(p, launch);
      break;
    default:
      CHECK_MSG(false, "wgmma prefill attention: head_dim {}", p.head_dim);
  }
}

// The overlapped schedule (P·V one tile behind) exists for head_dim 128 with 128-key tiles; at
// head_dim 64 this variant ran 128-key tiles with 3 stages.
void launch_wgmma128_ov(const AttentionParams& p, const Launch& launch) {
  if (p.head_dim == 128)
    launch_wgmma<128, kOverlap>(p, launch);
  else
    launch_wgmma<128, 3>(p, launch);
}

// Variant V for grouped head_dim 64/128, the product's kernel for the rest (head_dim 16/32).
template <void (*V)(const AttentionParams&, const Launch&)>
void launch_variant(const AttentionParams& p, const Launch& launch) {
  if (p.num_tiles == 0) return;
  if (!grouped_prefill_supported(p.head_dim, p.heads / p.kv_heads))
    return launch_prefill_attention(p, launch);
  V(p, launch);
}

template <int D, int BN>
void w_set_limits() {
  w_set_limit<D, kKvBf16, BN, 2>();
  w_set_limit<D, kKvBf16, BN, 3>();
  w_set_limit<D, kKvBf16, BN, kOverlap>();
  w_set_limit<D, kKvE4M3, BN, 2>();
  w_set_limit<D, kKvE5M2, BN, 2>();
}

void init_variants() {
  init_mma_prefill_kernels();
  w_set_limits<64, 64>();
  w_set_limits<64, 128>();
  w_set_limits<128, 64>();
  w_set_limits<128, 128>();
}

}  // namespace

const char* prefill_variant_name(PrefillVariant v) {
  switch (v) {
    case PrefillVariant::kMma:
      return "mma";
    case PrefillVariant::kWgmma64:
      return "wgmma64";
    case PrefillVariant::kWgmma128:
      return "wgmma128";
    case PrefillVariant::kWgmma64S3:
      return "wgmma64s3";
    case PrefillVariant::kWgmma128S3:
      return "wgmma128s3";
    case PrefillVariant::kWgmma128Ov:
      return "wgmma128ov";
  }
  return "?";
}

DevKernels prefill_variant_kernels(PrefillVariant v) {
  init_variants();
  DevKernels k;
  switch (v) {
    case PrefillVariant::kMma:
      k.prefill_attention = launch_variant<launch_mma_prefill>;
      break;
    case PrefillVariant::kWgmma64:
      k.prefill_attention = launch_variant<launch_wgmma<64, 2>>;
      break;
    case PrefillVariant::kWgmma128:
      k.prefill_attention = launch_variant<launch_wgmma<128, 2>>;
      break;
    case PrefillVariant::kWgmma64S3:
      k.prefill_attention = launch_variant<launch_wgmma<64, 3>>;
      break;
    case PrefillVariant::kWgmma128S3:
      k.prefill_attention = launch_variant<launch_wgmma<128, 3>>;
      break;
    case PrefillVariant::kWgmma128Ov:
      k.prefill_attention = launch_variant<launch_wgmma128_ov>;
      break;
  }
  return k;
}

}  // namespace strata::cuda::dev
