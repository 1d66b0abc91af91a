// The tensor-core prefill attention kernel for head_dim 64 and 128 (attention_prefill_fa.cu);
// attention_prefill.cu's launch_prefill_attention dispatches to it.
#pragma once

#include "backend/cuda/kernels.h"

namespace strata::cuda {

// Query rows of one block: (token, query head of the group) pairs, so a tile of the dispatcher's
// list spans kFaPrefillRows / group tokens.
constexpr int kFaPrefillRows = 128;
bool fa_prefill_supported(int head_dim, int group);
void init_fa_prefill_kernels();
void launch_fa_prefill(const AttentionParams& p, cudaStream_t stream);

}  // namespace strata::cuda
