// One rotary pair on the device, HF semantics: the float32 angle position · inv_freq, cos and sin
// times attention_factor (YaRN), both results rounded to bf16. rope.cu and the fused MLA inputs
// (mla_inputs.cu) share it, so the fused launch rounds exactly where the separate rope does.
#pragma once

#include <cstdint>

#include "backend/cuda/common.cuh"

namespace strata::cuda {

// (a, b) are dims (i, i + half) of a head (neox) or (2i, 2i + 1) (interleaved).
__device__ __forceinline__ void rope_pair(float a, float b, int32_t position, float inv_freq,
                                          float attention_factor, bf16_bits* o0, bf16_bits* o1) {
  const float angle = float(position) * inv_freq;
  float s, c;
  sincosf(angle, &s, &c);  // accurate range reduction: positions reach 1e5+ radians
  c *= attention_factor;
  s *= attention_factor;
  *o0 = float_to_bf16(a * c - b * s);
  *o1 = float_to_bf16(b * c + a * s);
}

}  // namespace strata::cuda
