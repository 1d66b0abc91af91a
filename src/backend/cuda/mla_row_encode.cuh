// The encoding of one MLA cache row on the device: a token's bf16 row [latent (R) | rope (P)]
// into the bytes of its slot, for every row format of mla_attention.h, bit for bit the bytes of
// backend/kv_format.cc's encode_k_row (the parity tests compare them):
//  - values are divided by their part's scale as the CPU does (times 1 / scale, computed on the
//    host in float), skipped for NaN so a NaN keeps its bits as on the host;
//  - bf16 rounds to nearest even with the CPU's NaN rule (core/dtype.h f32_to_bf16), fp8 is
//    fp8.cuh's exact OCP conversion, f32 is stored as is;
//  - FlashMLA tiles: s = amax / 448 over the tile (NaN ignored, 1 for an all-zero tile), values
//    times 1 / s unless s is 1, the float32 s after the latent.
// Used by the latent KV write (mla_kv_write.cu) and the fused attention inputs (mla_inputs.cu),
// so the two store the same bytes for the same row.
#pragma once

#include <cstdint>

#include "backend/cuda/fp8.cuh"
#include "backend/cuda/mla_attention.h"

namespace strata::cuda::mla {

// core/dtype.h's f32_to_bf16, on the device.
__device__ __forceinline__ uint16_t bf16_like_host(float f) {
  const uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x0040u);
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ void store_row_elem(char* dst, int elem, float v) {
  switch (elem) {
    case kMlaBf16:
      *reinterpret_cast<uint16_t*>(dst) = bf16_like_host(v);
      break;
    case kMlaE4M3:
      *reinterpret_cast<uint8_t*>(dst) = float_to_e4m3(v);
      break;
    case kMlaE5M2:
      *reinterpret_cast<uint8_t*>(dst) = float_to_e5m2(v);
      break;
    default:
      *reinterpret_cast<float*>(dst) = v;
      break;
  }
}

// value / scale as the host computes it: value · (1 / scale), NaN untouched.
__device__ __forceinline__ float scaled_like_host(float v, float inv) {
  return inv == 1.0f || isnan(v) ? v : __fmul_rn(v, inv);
}

__device__ __forceinline__ float row_value(const uint16_t* src, int c) {
  return __uint_as_float(uint32_t(src[c]) << 16);
}

// Warp `warp` of `warps` encodes its share of the bf16 row `src` (global or shared memory) into
// `row` (the slot's bytes, f.row_bytes): latent and rope values strided over the warps' lanes, a
// FlashMLA tile per warp (its amax within that warp). Every lane of the `warps` warps calls it;
// `lane` is the calling thread's lane. The bytes do not depend on `warps` (each value's encoding
// and each tile's maximum are the same whichever warp computes them).
__device__ __forceinline__ void encode_row(const uint16_t* src, char* row, const MlaRowFormat& f,
                                           int warp, int warps, int lane) {
  const int first = warp * 32 + lane, step = warps * 32;
  if (!f.flashmla) {
    const float inv = 1.0f / f.latent_scale;  // host: 1.0f / scale, the same IEEE division
    const int eb = mla_elem_bytes(f.latent_elem);
    for (int c = first; c < f.latent; c += step)
      store_row_elem(row + c * eb, f.latent_elem, scaled_like_host(row_value(src, c), inv));
  } else {
    const int tiles = (f.latent + kMlaFlashTile - 1) / kMlaFlashTile;
    for (int tile = warp; tile < tiles; tile += warps) {
      const int b = tile * kMlaFlashTile, n = min(kMlaFlashTile, f.latent - b);
      float amax = 0.0f;
      for (int c = lane; c < n; c += 32) amax = fmaxf(amax, fabsf(row_value(src, b + c)));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const float s = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
      const float inv = s == 1.0f ? 1.0f : __fdiv_rn(1.0f, s);
      for (int c = lane; c < n; c += 32)
        row[b + c] = char(float_to_e4m3(scaled_like_host(row_value(src, b + c), inv)));
      if (lane == 0) *reinterpret_cast<float*>(row + f.latent + 4 * tile) = s;
    }
  }
  const float inv_rope = 1.0f / f.rope_scale;
  const int rb = mla_elem_bytes(f.rope_elem);
  for (int c = first; c < f.rope; c += step)
    store_row_elem(row + f.rope_offset + c * rb, f.rope_elem,
                   scaled_like_host(row_value(src, f.latent + c), inv_rope));
}

}  // namespace strata::cuda::mla
