// FP8 KV cache values on the device: the exact OCP conversions the CPU reference uses
// (core/dtype.h), so a K/V row quantized here is bit for bit the row the CPU backend stores.
//
// Encoding (float -> fp8): round to nearest, ties to even, saturating: finite values and
// infinities beyond the largest finite value become ±max (448 for e4m3fn, 57344 for e5m2); NaN
// becomes the canonical S.1111.111; zero and values that round to zero keep their sign. Done in
// integer arithmetic on the float's bits (one rounding, no intermediate format), so it is the
// same function on the host (tests) and the device.
// Decoding (fp8 -> float) is exact: e4m3 through the hardware's e4m3x2 -> f16x2 conversion (every
// e4m3 value is an f16), e5m2 is the top byte of an f16.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define STRATA_HD __host__ __device__ __forceinline__
#else
#define STRATA_HD inline
#endif

namespace strata::cuda {

// KV element type of a layer, as the kernels see it.
enum KvElem : int { kKvBf16 = 0, kKvE4M3 = 1, kKvE5M2 = 2 };

STRATA_HD uint32_t float_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

// float -> fp8 with `M` mantissa bits and exponent bias `B`; `max_code` is the largest finite
// code (0x7e for e4m3fn, 0x7b for e5m2). Both formats' NaN is S.1111111 (0x7f).
template <int M, int B>
STRATA_HD uint8_t encode_fp8(float f, uint32_t max_code) {
  const uint32_t bits = float_bits(f);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t a = bits & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(sign | 0x7fu);      // NaN
  if (a == 0x7f800000u) return uint8_t(sign | max_code);  // ±inf saturates
  const int e = int(a >> 23) - 127;                       // unbiased exponent
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;      // 24-bit significand
  constexpr int kEmin = 1 - B;                            // smallest normal exponent
  const int eq = e < kEmin ? kEmin : e;                   // binade whose quantum applies
  // value = mant · 2^(e-23); quantum = 2^(eq-M): q = value / quantum, rounded half to even.
  int shift = 23 - M + (eq - e);
  if (shift > 31) shift = 31;  // everything below half the smallest subnormal rounds to 0
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  // Codes are monotonic in the value: a carry out of the mantissa moves to the next binade.
  uint32_t code = (uint32_t(eq - kEmin) << M) + q;
  if (code > max_code) code = max_code;
  return uint8_t(sign | code);
}

STRATA_HD uint8_t float_to_e4m3(float f) { return encode_fp8<3, 7>(f, 0x7eu); }
STRATA_HD uint8_t float_to_e5m2(float f) { return encode_fp8<2, 15>(f, 0x7bu); }

#ifdef __CUDACC__
// Two e4m3 values (low byte first) to an f16 pair (bits; exact: every e4m3 value is an f16).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t v) {
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(v));
  return h2;
}
// Two fp8 values (low byte first) to two floats.
__device__ __forceinline__ float2 e4m3x2_to_float2(uint16_t v) {
  const uint32_t h2 = e4m3x2_to_f16x2(v);
  __half2 h;
  std::memcpy(&h, &h2, 4);
  return __half22float2(h);
}
__device__ __forceinline__ float2 e5m2x2_to_float2(uint16_t v) {
  const uint32_t h2 = (uint32_t(v) & 0xffu) << 8 | (uint32_t(v) & 0xff00u) << 16;
  __half2 h;
  std::memcpy(&h, &h2, 4);
  return __half22float2(h);
}
// Eight KV values of element type E from `bytes` (16 bytes for bf16, 8 for fp8) to floats.
template <int E>
__device__ __forceinline__ void kv_unpack8(const void* bytes, float* f) {
  if constexpr (E == kKvBf16) {
    const uint4 v = *reinterpret_cast<const uint4*>(bytes);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
    const uint2 v = *reinterpret_cast<const uint2*>(bytes);
    const uint32_t w[2] = {v.x, v.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint16_t pair = uint16_t(w[i] >> (16 * j));
        const float2 x = E == kKvE4M3 ? e4m3x2_to_float2(pair) : e5m2x2_to_float2(pair);
        f[4 * i + 2 * j] = x.x;
        f[4 * i + 2 * j + 1] = x.y;
      }
    }
  }
}
#endif

// Bytes of one KV element.
STRATA_HD int kv_elem_bytes(int e) { return e == kKvBf16 ? 2 : 1; }

}  // namespace strata::cuda
