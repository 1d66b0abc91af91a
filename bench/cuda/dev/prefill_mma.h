// The mma.sync prefill attention kernel (prefill_mma.cu), a development variant: head_dim 64 and
// 128 with grouped rows (grouped_prefill_supported), the tile list of CudaBackend's prefill.
#pragma once

#include "backend/cuda/attention.h"

namespace strata::cuda::dev {

void init_mma_prefill_kernels();
void launch_mma_prefill(const AttentionParams& p, const Launch& launch);

}  // namespace strata::cuda::dev
