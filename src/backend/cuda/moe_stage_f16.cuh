// Rows of x in f16 for the FP8 experts' GEMV (moe_stage_f16.cu says why nothing is lost): the
// row's power of two and the fragment order, shared by the staging kernel (moe_stage_f16.cu) and
// the GEMV's own staging into shared memory (moe_experts_gemv_kernel.cuh, stage_rows).
//
// A row is staged as k / 8 pieces of 16 bytes: piece i holds the 8 values of mma lane column
// c = i % 4 of the 32 columns at 32 (i / 4), i.e. columns 2c, 2c + 1, 2c + 8, 2c + 9, 16 + 2c,
// 17 + 2c, 24 + 2c, 25 + 2c: the 32-bit words stage_word(i) + 0, 4, 8, 12 of the bf16 row.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace strata::cuda::moe {

// 2^e with e in [-126, 127] (a normal float).
__device__ __forceinline__ float pow2f(int e) { return __uint_as_float(uint32_t(e + 127) << 23); }

// The largest |x| of two bf16 values (a 32-bit word) folded into m, as bf16 bits: magnitudes
// compare as integers (NaN above +inf).
__device__ __forceinline__ uint32_t abs_max_bits(uint32_t m, uint32_t w) {
  return max(m, max(w & 0x7fffu, (w >> 16) & 0x7fffu));
}

// The row's exponent e from its largest |x| (bf16 bits): x · 2^e puts that largest in
// [2^14, 2^15) (f16's top binade is [2^15, 65504]: nothing overflows). A zero or non-finite row
// keeps e = 0 (inf and NaN then reach the outputs as the bf16 path would give them).
__device__ __forceinline__ int stage_exponent(uint32_t max_bits) {
  if (max_bits == 0 || max_bits >= 0x7f80u) return 0;
  return min(126, max(-126, 14 - ilogbf(__uint_as_float(max_bits << 16))));
}

// The first of piece i's four source words (32-bit word index into the bf16 row).
__device__ __forceinline__ uint32_t stage_word(uint32_t i) { return (i / 4u) * 16u + i % 4u; }

// Piece i from its four source words, scaled by 2^e and rounded to f16.
__device__ __forceinline__ uint4 stage_piece(const uint32_t (&w)[4], float scale) {
  uint32_t h[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __half2 f = __floats2half2_rn(__uint_as_float(w[j] << 16) * scale,
                                        __uint_as_float(w[j] & 0xffff0000u) * scale);
    h[j] = *reinterpret_cast<const uint32_t*>(&f);
  }
  return make_uint4(h[0], h[1], h[2], h[3]);
}

}  // namespace strata::cuda::moe
