// Device helpers of the kernels that scan a row of logits (logit_stats.cu, topk.cu).
#pragma once

#include <cstdint>

#include "backend/cuda/common.cuh"

namespace strata::cuda::logit_row {

// Element i of a row of float32 (F32) or bf16 logits, as float.
template <bool F32>
__device__ __forceinline__ float load(const void* row, int64_t i) {
  if constexpr (F32) {
    return static_cast<const float*>(row)[i];
  } else {
    return bf16_to_float(static_cast<const bf16_bits*>(row)[i]);
  }
}

// (value, index) with the larger value, ties to the lower index.
__device__ __forceinline__ void take_max(float& v, int& i, float v2, int i2) {
  if (v2 > v || (v2 == v && i2 < i)) v = v2, i = i2;
}

}  // namespace strata::cuda::logit_row
