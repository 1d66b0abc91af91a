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
  // 1: the row kernel (16-byte chunks) loads bf16 weights before its PDL wait: model parameters,
  // which no kernel writes (CudaTunables::norm_weight_preload)
  int weight_preload;
  int pad_;  // 0 (no padding bytes)
};
void launch_rms_norm(const RmsNormParams& p, const Launch& launch);

// An rms_norm that the kernel reading its output runs as a prologue (graph mode merges the norm
// launch just recorded into the decode GEMV after it: norm_prologue.cc, the device side
// norm_prologue.cuh). x null: no prologue.
struct NormPrologue {
  const bf16_bits* x;  // the norm's input [m, k]
  const void* weight;  // [k], bf16 or f32 (weight_f32)
  float eps;
  int weight_f32;
};

// The kernel launch_rms_norm runs for `p`. Their sums of squares run in different orders, so a
// fused kernel that must give launch_rms_norm's bits follows the one it would take
// (mla_inputs.cu): kVecOnePass, dim % 8 == 0 and 256 < dim <= 8192 with 16-byte aligned rows:
// thread i holds values [8i, 8i + 8) and sums them in order, the warps' sums (xor butterfly)
// added in warp order; kWarp, dim <= 256 otherwise: one warp, lane l holds values l + 32j for
// j = 0..7 in order, the xor butterfly; kVecMultiPass and kBlock: the others.
enum class RmsNormKernel { kVecOnePass, kVecMultiPass, kWarp, kBlock };
RmsNormKernel rms_norm_kernel_for(const RmsNormParams& p);

}  // namespace strata::cuda
