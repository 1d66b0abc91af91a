// RMSNorm and fused residual-add + RMSNorm (norm.cu).
#pragma once

#include "backend/cuda/launch.h"

namespace strata::cuda {

struct RmsNormParams {
  const bf16_bits* x;   // [rows, dim]
  bf16_bits* residual;  // [rows, dim] or null: residual += x first, then norm(residual)
  const void* weight;   // [dim], bf16 or f32 (weight_f32)
  bf16_bits* out;       // [rows, dim]; may alias x
  int64_t rows;
  int64_t row_stride;  // elements from one row of x / out to the next; 0: dim (contiguous)
  int dim;
  float eps;
  int weight_f32;
  int pdl_early;  // trigger the next kernel before waiting on the previous (common.cuh)
};
void launch_rms_norm(const RmsNormParams& p, const Launch& launch);

}  // namespace strata::cuda
