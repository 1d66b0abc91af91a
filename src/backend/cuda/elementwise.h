// Element-wise ops (elementwise.cu): add, SwiGLU's silu·mul, and the conversion and fill kernels
// of uploads and benchmarks. Memory-bound; float math, bf16 storage.
#pragma once

#include "backend/cuda/launch.h"

namespace strata::cuda {

struct AddParams {  // out = a + b
  const bf16_bits* a;
  const bf16_bits* b;
  bf16_bits* out;
  int64_t n;
};
void launch_add(const AddParams& p, const Launch& launch);

struct SiluMulParams {  // out[r, i] = silu(x[r, i]) · x[r, inter + i]
  const bf16_bits* x;   // [rows, 2 · inter]
  bf16_bits* out;       // [rows, inter]
  int64_t rows;
  int64_t inter;
};
void launch_silu_mul(const SiluMulParams& p, const Launch& launch);

// Not recorded (uploads and benchmarks run them outside a step).
struct ConvertParams {  // dst = src, f32 -> bf16
  const float* src;
  bf16_bits* dst;
  int64_t n;
};
void launch_f32_to_bf16(const ConvertParams& p, cudaStream_t stream);
// Fills n bf16 values with uniform random values in [-scale, scale] (benchmarks' weights).
void launch_fill_random_bf16(bf16_bits* dst, int64_t n, uint64_t seed, float scale,
                             cudaStream_t stream);

}  // namespace strata::cuda
