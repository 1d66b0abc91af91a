// An RMSNorm weight's 8 values [8i, 8i + 8) as float, from bf16 or float32 storage: what the
// one-pass vec kernel (norm.cu) reads, and the kernels that give its bits (norm_prologue.cuh).
#pragma once

#include "backend/cuda/common.cuh"

namespace strata::cuda {

__device__ __forceinline__ void norm_weight8(const void* weight, int f32, int64_t i, float* w) {
  if (f32) {
    const float4* wf = static_cast<const float4*>(weight) + 2 * i;
    const float4 a = wf[0], b = wf[1];
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
  } else {
    unpack8(static_cast<const uint4*>(weight)[i], w);
  }
}

}  // namespace strata::cuda
