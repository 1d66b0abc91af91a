// Device pieces of the MoE expert kernels (moe_experts_gemv.cu, moe_experts_gemm.cu,
// moe_experts_repack.cu): the tile layouts of the three weight formats and the production of
// mma.m16n8k16 A fragments from a lane's 16 bytes of a tile.
//
// A fragment of one k16 step (lane = 4·g + c; linear_int4.cuh has the full fragment table):
//   a0 = W[g][j], W[g][j+1]      a1 = W[g+8][j], W[g+8][j+1]
//   a2 = W[g][j+8], W[g][j+9]    a3 = W[g+8][j+8], W[g+8][j+9]      with j = 16·s + 2c
// (bf16 pairs, the lower column in the lower half). A lane's 16 bytes of a tile hold exactly its
// fragments of the tile's k16 steps, so every weight load is one coalesced 16-byte load per lane
// of 512 contiguous bytes and needs no shuffle:
//   bf16 (16 x 16, one step):  words a0, a1, a2, a3.
//   fp8  (16 x 32, two steps): step s in words 2s, 2s + 1 as e4m3 bytes
//        word 2s     = W[g][j], W[g][j+1], W[g+8][j], W[g+8][j+1]      (byte 0 first)
//        word 2s + 1 = W[g][j+8], W[g][j+9], W[g+8][j+8], W[g+8][j+9]
//        so each 16-bit half converts (cvt e4m3x2 -> f16x2, exact) to one A register's pair.
//   int4 (16 x 64, four steps): linear_int4's layout (linear_int4.cuh, tile_coords).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/linear_int4.cuh"
#include "backend/cuda/mma_sync.cuh"
#include "backend/cuda/moe_experts.h"

namespace strata::cuda::moe {

// The GEMV kernels' fp8 instance against x staged in f16 (MoeGroupedParams::x_f16): the fp8
// tile layout; fragments are the e4m3 values as f16 (exact, unscaled), the mma is f16, and the
// block scale multiplies each batch's float32 sums (moe_experts_gemv_batch.cuh).
constexpr int kMoeFp8F16 = 3;
template <int F>
constexpr bool kFp8Tiles = F == kMoeFp8 || F == kMoeFp8F16;

// k16 steps per tile.
template <int F>
constexpr int kSteps = F == kMoeInt4  ? 4
                       : kFp8Tiles<F> ? 2
                                      : 1;

// ---- the layouts (host and device: repack kernel, tests) ----
// Tile row and column of element `i` of lane `lane`'s 16 bytes: bf16 i = 0..7 (2 bytes each),
// fp8 i = 0..15 (1 byte each). int4: linear_int4's tile_coords.
__host__ __device__ inline void bf16_tile_coords(int lane, int i, int* row, int* col) {
  const int g = lane / 4, c = lane % 4, word = i / 2, half = i % 2;
  *row = g + 8 * (word & 1);
  *col = 2 * c + 8 * (word >> 1) + half;
}
__host__ __device__ inline void fp8_tile_coords(int lane, int i, int* row, int* col) {
  const int g = lane / 4, c = lane % 4, word = i / 4, q = i % 4;
  const int step = word / 2, upper = word % 2;
  *row = g + 8 * (q >> 1);
  *col = 16 * step + 2 * c + 8 * upper + (q & 1);
}

// ---- fragments ----
// Two e4m3 values (the lower in bits 0-7) times the block scale, each product rounded once to
// bf16 as the CPU twin's dequant_fp8_block does: the fragment's bf16 pair.
__device__ __forceinline__ uint32_t e4m3x2_scaled(uint32_t pair, float scale) {
  const float2 f = e4m3x2_to_float2(uint16_t(pair & 0xffffu));
  const __nv_bfloat162 b = __floats2bfloat162_rn(__fmul_rn(f.x, scale), __fmul_rn(f.y, scale));
  return *reinterpret_cast<const uint32_t*>(&b);
}

// A tile's scales as a lane needs them: int4 the scale words (row g, row g + 8) of the groups of
// steps 0-1 and 2-3 (equal unless group 32); fp8 the block's float (bits); bf16 none.
struct TileScale {
  uint32_t s0, s1;
};

// The A fragment of k16 step `s` of a tile from this lane's 16 bytes `w`.
template <int F>
__device__ __forceinline__ void fragment(const uint4& w, const TileScale& sc, int s, uint32_t* a) {
  if constexpr (F == kMoeBf16) {
    a[0] = w.x;
    a[1] = w.y;
    a[2] = w.z;
    a[3] = w.w;
  } else if constexpr (F == kMoeFp8F16) {
    const uint32_t lo = s == 0 ? w.x : w.z, hi = s == 0 ? w.y : w.w;
    a[0] = e4m3x2_to_f16x2(uint16_t(lo));
    a[1] = e4m3x2_to_f16x2(uint16_t(lo >> 16));
    a[2] = e4m3x2_to_f16x2(uint16_t(hi));
    a[3] = e4m3x2_to_f16x2(uint16_t(hi >> 16));
  } else if constexpr (F == kMoeFp8) {
    const float scale = __uint_as_float(sc.s0);
    const uint32_t lo = s == 0 ? w.x : w.z, hi = s == 0 ? w.y : w.w;
    a[0] = e4m3x2_scaled(lo, scale);
    a[1] = e4m3x2_scaled(lo >> 16, scale);
    a[2] = e4m3x2_scaled(hi, scale);
    a[3] = e4m3x2_scaled(hi >> 16, scale);
  } else {
    uint32_t lo, hi;
    int4::scale_pairs(s < 2 ? sc.s0 : sc.s1, &lo, &hi);
    const uint32_t word = s == 0 ? w.x : s == 1 ? w.y : s == 2 ? w.z : w.w;
    int4::dequant_word(word, lo, hi, a);
  }
}

// 4 bytes global -> shared through L1, zero-filled for bytes = 0 (the GEMMs' fp8 block scale).
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

}  // namespace strata::cuda::moe
