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
// keys_per_tile: 64 or 128.
void launch_wgmma_prefill(const AttentionParams& p, int keys_per_tile, cudaStream_t stream);

// Which kernel serves head_dim 64/128 (tests and benchmarks compare them). kAuto (the default,
// unless STRATA_CUDA_PREFILL names another: mma, wgmma64, wgmma128) takes the fastest measured
// on the H200: wgmma with 128-key tiles for bf16 KV at head_dim 128, 64-key tiles otherwise.
enum class PrefillVariant : int { kMma = 0, kWgmma64 = 1, kWgmma128 = 2, kAuto = 3 };
void set_prefill_variant(PrefillVariant v);
PrefillVariant prefill_variant();
const char* prefill_variant_name(PrefillVariant v);

}  // namespace strata::cuda
