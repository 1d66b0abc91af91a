// The MLA decode kernel's register pieces: ldmatrix, f16 mma, P's 16 bits, fp8 -> f16 pairs.
#pragma once

#include <cuda_fp16.h>

#include "backend/cuda/mla_decode_layout.cuh"
#include "backend/cuda/mma_sync.cuh"

namespace strata::cuda::mla_decode {

__device__ __forceinline__ void ldmatrix_x2(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}
template <bool kF16>
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  if constexpr (kF16)
    mma_f16_16816(c, a, b0, b1);
  else
    mma_bf16_16816(c, a, b0, b1);
}
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float2 unpack_f16x2(uint32_t v) {
  __half2 h;
  memcpy(&h, &v, 4);
  return __half22float2(h);
}
// One probability as the 16 bits P is stored in (f16 or bf16, round to nearest) and back.
template <bool kF16>
__device__ __forceinline__ uint16_t p_bits(float x) {
  if constexpr (kF16) return __half_as_ushort(__float2half_rn(x));
  return uint16_t(pack_bf16x2(x, 0.0f));
}
template <bool kF16>
__device__ __forceinline__ float p_value(uint16_t b) {
  if constexpr (kF16) return __half2float(__ushort_as_half(b));
  return __uint_as_float(uint32_t(b) << 16);
}

// Four fp8 bytes of one key (values d..d+3 of a k-step, a lane's) as the key's two A registers of
// that k-step: Pairs02 (integer e4m3, e5m2): lo = values (d, d+2), hi = (d+1, d+3); else (the
// conversion unit) lo = (d, d+1), hi = (d+2, d+3). The Q loader pairs its values the same way.
template <int Elem, bool kHw>
__device__ __forceinline__ void key_pairs(uint32_t w, uint32_t& lo, uint32_t& hi) {
  if constexpr (Elem == kMlaE5M2) {
    mla::e5m2x4_to_f16x2(w, lo, hi);
  } else if constexpr (kHw) {
    lo = mla::e4m3x2_to_f16x2_hw(w & 0xffffu);
    hi = mla::e4m3x2_to_f16x2_hw(w >> 16);
  } else {
    mla::e4m3x4_to_f16x2_int(w, lo, hi);
  }
}
// Two keys' bytes of values 4c..4c+3 (k0, k1) as the A registers of PV's Vᵀ tile: lo = value
// 4c + 2h of (k0, k1), hi = value 4c + 2h + 1 of (k0, k1).
template <int Elem, bool kHw>
__device__ __forceinline__ void value_pairs(uint32_t k0, uint32_t k1, int h, uint32_t& lo,
                                            uint32_t& hi) {
  if constexpr (Elem == kMlaE4M3 && kHw) {
    const uint32_t t = __byte_perm(k0, k1, h ? 0x7362 : 0x5140);  // [k0.x, k1.x, k0.y, k1.y]
    lo = mla::e4m3x2_to_f16x2_hw(t & 0xffffu);
    hi = mla::e4m3x2_to_f16x2_hw(t >> 16);
  } else {
    const uint32_t t = __byte_perm(k0, k1, h ? 0x7632 : 0x5410);  // [k0.x, k0.y, k1.x, k1.y]
    if constexpr (Elem == kMlaE5M2)
      mla::e5m2x4_to_f16x2(t, lo, hi);
    else
      mla::e4m3x4_to_f16x2_int(t, lo, hi);
  }
}

}  // namespace strata::cuda::mla_decode
