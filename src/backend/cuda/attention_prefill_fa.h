// The tensor-core prefill attention kernels for head_dim 64 and 128: mma.sync
// (attention_prefill_fa.cu) and wgmma (attention_prefill_wgmma.cu); attention_prefill.cu's
// launch_prefill_attention dispatches to them.
#pragma once

#include "backend/cuda/kernels.h"

namespace strata::cuda {

// Query rows of one block: (token, query head of the group) pairs, so a tile of the dispatcher's
// list spans kFaPrefillRows / group tokens.
constexpr int kFaPrefillRows = 128;
bool fa_prefill_supported(int head_dim, int group);
void init_fa_prefill_kernels();
void launch_fa_prefill(const AttentionParams& p, cudaStream_t stream);
void init_wgmma_prefill_kernels();
// keys_per_tile: 64 or 128; stages (bf16 KV; 2 or 3): K/V tiles in shared memory, so
// stages - 1 tiles are in flight while one is used (fp8 KV: always 2); stages = 1 selects the
// overlapped schedule: P·V one tile behind (attention_prefill_wgmma.cu).
void launch_wgmma_prefill(const AttentionParams& p, int keys_per_tile, int stages,
                          cudaStream_t stream);

// Which kernel serves head_dim 64/128 (tests and benchmarks compare them): mma.sync, or wgmma
// with 64- or 128-key tiles, 2 or 3 (s3) K/V stages, or P·V one tile behind (ov). kAuto
// (the default, unless STRATA_CUDA_PREFILL names another: mma, wgmma64, wgmma128, wgmma64s3,
// wgmma128s3, wgmma128ov) takes the fastest measured on the H200: wgmma64 (2 blocks per SM),
// wgmma64s3 for bf16 KV at head_dim 64.
enum class PrefillVariant : int {
  kMma = 0, kWgmma64 = 1, kWgmma128 = 2, kWgmma64S3 = 3, kWgmma128S3 = 4, kWgmma128Ov = 5,
  kAuto = 6
};
inline constexpr PrefillVariant kPrefillVariants[] = {
    PrefillVariant::kMma, PrefillVariant::kWgmma64, PrefillVariant::kWgmma128,
    PrefillVariant::kWgmma64S3, PrefillVariant::kWgmma128S3, PrefillVariant::kWgmma128Ov};
void set_prefill_variant(PrefillVariant v);
PrefillVariant prefill_variant();
const char* prefill_variant_name(PrefillVariant v);

}  // namespace strata::cuda
