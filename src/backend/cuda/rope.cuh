// One rotary pair on the device, HF semantics: the float32 angle position · inv_freq, cos and sin
// times attention_factor (YaRN), both results rounded to bf16. rope.cu, the fused q/k/v split
// (qkv_rope.cu) and the fused MLA inputs (mla_inputs.cu) share it, so every fused launch rounds
// exactly where the separate rope does. The products and sums are explicitly rounded
// (__fmul_rn / __fsub_rn / __fadd_rn): left to the compiler, a · c − b · s contracts into an FMA
// one way at one call site and another way at the next, and the fused and separate launches
// then differed in the last bit (CudaFusedParity.QkvRopeKvWrite, 2026-12-02).
#pragma once

#include <cstdint>

#include "backend/cuda/common.cuh"

namespace strata::cuda {

// The rotation of pair `inv_freq` at `position`: cos and sin of the float32 angle, times
// attention_factor.
__device__ __forceinline__ void rope_cos_sin(int32_t position, float inv_freq,
                                             float attention_factor, float* c, float* s) {
  const float angle = __fmul_rn(float(position), inv_freq);
  sincosf(angle, s, c);  // accurate range reduction: positions reach 1e5+ radians
  *c = __fmul_rn(*c, attention_factor);
  *s = __fmul_rn(*s, attention_factor);
}

// (a, b) rotated by (c, s) of rope_cos_sin, in float32 before its rounding.
__device__ __forceinline__ void rope_rotate(float a, float b, float c, float s, float* r0,
                                            float* r1) {
  *r0 = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  *r1 = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

// (a, b) are dims (i, i + half) of a head (neox) or (2i, 2i + 1) (interleaved); the rotated
// pair in float32, before its rounding.
__device__ __forceinline__ void rope_pair_f32(float a, float b, int32_t position, float inv_freq,
                                              float attention_factor, float* r0, float* r1) {
  float c, s;
  rope_cos_sin(position, inv_freq, attention_factor, &c, &s);
  rope_rotate(a, b, c, s, r0, r1);
}

// The same pair rounded to bf16.
__device__ __forceinline__ void rope_pair(float a, float b, int32_t position, float inv_freq,
                                          float attention_factor, bf16_bits* o0, bf16_bits* o1) {
  float r0, r1;
  rope_pair_f32(a, b, position, inv_freq, attention_factor, &r0, &r1);
  *o0 = float_to_bf16(r0);
  *o1 = float_to_bf16(r1);
}

}  // namespace strata::cuda
