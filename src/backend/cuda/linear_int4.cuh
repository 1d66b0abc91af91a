// Device pieces shared by the INT4 linear kernels (linear_int4.cu, linear_int4_gemm.cu, the
// GEMVs of linear_int4_reg.cu and linear_int4_stream.cu): the tile layout's index math, the
// nibble -> bf16 dequantization of one packed word into an mma.m16n8k16 A fragment, thin wrappers
// of mma.sync, cp.async and wgmma, and the GEMVs' epilogue.
//
// Fragment layouts of mma.m16n8k16.row.col (lane = 4·g + c, g = lane / 4, c = lane % 4):
//   A (16×16): a0 = (row g, k 2c, 2c+1), a1 = (row g+8, k 2c, 2c+1), a2 = (row g, k 2c+8, 2c+9),
//              a3 = (row g+8, k 2c+8, 2c+9); the lower k in the lower 16 bits
//   B (16×8):  b0 = (k 2c, 2c+1; column g), b1 = (k 2c+8, 2c+9; column g)
//   C (16×8):  c0, c1 = (row g; columns 2c, 2c+1), c2, c3 = (row g+8; columns 2c, 2c+1)
// wgmma with A in registers uses the same A layout per warp (warp w of the warpgroup: rows
// 16w..16w+15), and its accumulator the C layout per 8-column n tile i in d[4i..4i+3].
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/linear_int4.h"
#include "backend/cuda/mma_sync.cuh"

namespace strata::cuda::int4 {

// ---- the tile layout ----
// Word s (0..3) of lane (g, c) of a tile holds k step s (columns 16s..16s+15 of the tile) as
// nibbles n0..n7 = W[g][j], W[g+8][j], W[g][j+8], W[g+8][j+8], W[g][j+1], W[g+8][j+1],
// W[g][j+9], W[g+8][j+9] with j = 16s + 2c: nibbles i and i + 4 are A register i of the step.
// Returns the tile row (0..15) and column (0..63) of nibble `nib` of word `s` of lane `lane`.
__host__ __device__ inline void tile_coords(int lane, int s, int nib, int* row, int* col) {
  const int g = lane / 4, c = lane % 4;
  const int i = nib % 4, hi = nib / 4;  // A register i; hi: its upper bf16 (the odd column)
  *row = g + 8 * (i & 1);
  *col = 16 * s + 2 * c + 8 * (i >> 1) + hi;
}

// Scales: per row tile and group, 16 bf16 ordered (row g, row g + 8) for g = 0..7, so lane
// (g, c) reads both of its rows' scales as one 32-bit word (index g of the group's 8 words).
__host__ __device__ inline int scale_slot(int tile_row) {
  return 2 * (tile_row % 8) + tile_row / 8;
}

// ---- dequantization ----
__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;  // (a & b) | c
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ uint32_t bf16x2_sub(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// The scale word (row g low, row g + 8 high) as two broadcast pairs.
__device__ __forceinline__ void scale_pairs(uint32_t s, uint32_t* lo, uint32_t* hi) {
  *lo = __byte_perm(s, 0, 0x1010);
  *hi = __byte_perm(s, 0, 0x3232);
}
// One packed word -> the A fragment of its k step: (128 + nibble) as bf16 (exponent bits
// 0x4300 OR'ed over the nibble: 128 has an ulp of 1), minus 136 (exact: -8..7), times the row's
// scale rounded once to bf16 -- the same bits as the CPU twin's round_to_bf16((n - 8) · s).
__device__ __forceinline__ void dequant_word(uint32_t q, uint32_t s_lo, uint32_t s_hi,
                                             uint32_t* a) {
  constexpr uint32_t kMask = 0x000f000fu, kMagic = 0x43004300u, kBias = 0x43084308u;
  a[0] = bf16x2_mul(bf16x2_sub(lop3_and_or(q, kMask, kMagic), kBias), s_lo);
  a[1] = bf16x2_mul(bf16x2_sub(lop3_and_or(q >> 4, kMask, kMagic), kBias), s_hi);
  a[2] = bf16x2_mul(bf16x2_sub(lop3_and_or(q >> 8, kMask, kMagic), kBias), s_lo);
  a[3] = bf16x2_mul(bf16x2_sub(lop3_and_or(q >> 12, kMask, kMagic), kBias), s_hi);
}

// (128 + nibble) as bf16 pairs: A register i of the word's k step (see tile_coords), exact
// (the GEMVs subtract 128 + 8 through −136·Σx per scale group).
__device__ __forceinline__ void magic_word(uint32_t q, uint32_t* a) {
  constexpr uint32_t kMask = 0x000f000fu, kMagic = 0x43004300u;
  a[0] = lop3_and_or(q, kMask, kMagic);
  a[1] = lop3_and_or(q >> 4, kMask, kMagic);
  a[2] = lop3_and_or(q >> 8, kMask, kMagic);
  a[3] = lop3_and_or(q >> 12, kMask, kMagic);
}

// (nibble − 8) exactly as bf16 pairs: magic_word's (128 + nibble) minus 136 (bf16 0x4308) by one
// fma.rn.bf16x2 (· 1 − 136) a word; the mma then sums (nibble − 8)·x itself, with no −136·Σx
// term to stage beside x (the register GEMV, linear_int4_reg.cu).
__device__ __forceinline__ void magic_word_signed(uint32_t q, uint32_t* a) {
  magic_word(q, a);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n"
        : "=r"(a[i])
        : "r"(a[i]), "r"(0x3f803f80u), "r"(0xc308c308u));
}

// f(integral_constant<int, 0>) .. f(integral_constant<int, N - 1>): compile-time ring slots of
// the GEMVs (linear_int4_reg.cu, moe_experts_int4_flat.cu).
template <int N, int I = 0, typename F>
__device__ __forceinline__ void static_for(F&& f) {
  if constexpr (I < N) {
    f(std::integral_constant<int, I>{});
    static_for<N, I + 1>(f);
  }
}

// ---- tensor cores, async copies ----
// (The INT4 kernels' name for mma_sync.cuh's bf16 mma.)
__device__ __forceinline__ void mma16816(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  mma_bf16_16816(d, a, b0, b1);
}
// One 512-byte tile (a lane's 16-byte piece q) times x's B fragments xw[0..7] in round mode:
// each k step's weights (nibble - 8) · scale rounded to bf16 (s0: the scale word of k steps 0-1,
// s1: of steps 2-3), one mma.m16n8k16 each into acc (even steps) and acc1 (odd steps). The
// register GEMV's round mode, the flat down projection and the split gate_up.
__device__ __forceinline__ void mma_tile_round(const uint4& q, uint32_t s0, uint32_t s1,
                                               const uint32_t* xw, float* acc, float* acc1) {
  const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
  uint32_t lo[2], hi[2];
  scale_pairs(s0, &lo[0], &hi[0]);
  scale_pairs(s1, &lo[1], &hi[1]);
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    uint32_t af[4];
    dequant_word(qw[s], lo[s / 2], hi[s / 2], af);
    mma16816(s % 2 ? acc1 : acc, af, xw[2 * s], xw[2 * s + 1]);
  }
}

// The same tile unrounded, group 32 (the split gate_up's knob): k steps 0-1 are one scale group
// (word s0), 2-3 the other (s1); nx: −136·Σx of each group for the lane's columns (one token in
// every column); each group's sums start there, take (128 + nibble)·x from the mma, and go to acc
// (group 0) and acc1 (group 1) times the rows' scales: two chains a tile.
__device__ __forceinline__ void mma_tile_unrounded_g32(const uint4& q, uint32_t s0, uint32_t s1,
                                                       float2 nx, const uint32_t* xw, float* acc,
                                                       float* acc1) {
  const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
  float g0[4] = {nx.x, nx.x, nx.x, nx.x}, g1[4] = {nx.y, nx.y, nx.y, nx.y};
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    uint32_t af[4];
    magic_word(qw[s], af);
    mma16816(s < 2 ? g0 : g1, af, xw[2 * s], xw[2 * s + 1]);
  }
  auto scale = [](uint32_t sw, const float* g, float* a) {  // rows g (low half), g + 8 (high)
    const float lo = __uint_as_float(sw << 16), hi = __uint_as_float(sw & 0xffff0000u);
    a[0] = fmaf(lo, g[0], a[0]);
    a[1] = fmaf(lo, g[1], a[1]);
    a[2] = fmaf(hi, g[2], a[2]);
    a[3] = fmaf(hi, g[3], a[3]);
  };
  scale(s0, g0, acc);
  scale(s1, g1, acc1);
}

// 16 bytes from shared memory (a lane's x fragments of the GEMVs).
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
// 8 bytes from shared memory as two floats (a lane's pair of x sums of the register GEMV).
__device__ __forceinline__ float2 lds64f(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}
// 4 bytes from shared memory (a scale word the split gate_up's TMA path staged).
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
// 16 bytes global -> shared, bypassing L1; bytes = 0 writes 16 zero bytes instead.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The epilogue of the register and stream GEMVs (linear_int4_reg.cu, linear_int4_stream.cu): the
// block's slots are row tiles u0.. (nu of them; ns = 2 nu with SwiGLU: gate slots, then up);
// output (token t, slot r, row i) sums slot r's partials (float [warp][slot - span start][16][m]
// at pl.off_part) over the nw warps whose slot span (int2 at pl.off_span) holds r, in warp
// order, plus the bias; with SwiGLU, gate and up each rounded to bf16 first (as an unfused
// linear's output), then silu(gate) · up. A __syncthreads must precede it.
template <class Plan>
__device__ __forceinline__ void gemv_epilogue(const Int4LinearParams& p, const Plan& pl,
                                              const char* smem, int tid, int nw, int m, bool glu,
                                              int u0, int nu, int ns) {
  const float* parts = reinterpret_cast<const float*>(smem + pl.off_part);
  const int2* span = reinterpret_cast<const int2*>(smem + pl.off_span);
  auto slot_sum = [&](int r, int i, int t) {
    float v = 0.0f;
    for (int w = 0; w < nw; ++w) {
      const int2 sp = span[w];
      if (sp.x <= r && r <= sp.y) v += parts[((w * pl.slots + r - sp.x) * 16 + i) * m + t];
    }
    return v;
  };
  const int so = glu ? nu : ns, outs = so * 16 * m;
  for (int o = tid; o < outs; o += int(blockDim.x)) {
    const int t = o / (so * 16), r = (o / 16) % so, i = o % 16;
    const int64_t row = int64_t(u0 + r) * kInt4TileRows + i;
    if (glu) {
      const float bg = p.bias ? p.bias[row] : 0.0f, bu = p.bias ? p.bias[p.glu_inter + row] : 0.0f;
      const float gv = bf16_to_float(float_to_bf16(slot_sum(r, i, t) + bg));
      const float uv = bf16_to_float(float_to_bf16(slot_sum(r + nu, i, t) + bu));
      p.out[t * p.glu_inter + row] = float_to_bf16(gv / (1.0f + __expf(-gv)) * uv);
    } else if (row < p.n) {
      const bf16_bits o = float_to_bf16(slot_sum(r, i, t) + (p.bias ? p.bias[row] : 0.0f));
      p.out[t * p.n + row] = o;
      if (p.residual != nullptr) {  // add_rms_norm's update: bf16(x + residual)
        bf16_bits* res = p.residual + t * p.n + row;
        *res = float_to_bf16(bf16_to_float(o) + bf16_to_float(*res));
      }
    }
  }
}

// The scale words a lane needs for 512-byte tile gt of a row-tile kernel (TPG as below): group 32
// its two words (k steps 0-1, 2-3) into s[0], s[1]; else its group's one word into s[0]. ssrc:
// the scales as words, offset by the lane's row g. Index: int64_t, or uint32_t where the launch
// holds fewer than 2^27 tiles (int4_tile_index_fits): the address is then one IMAD.WIDE.U32.
template <int TPG, typename Index>
__device__ __forceinline__ void load_tile_scales(const uint32_t* ssrc, Index gt, uint32_t* s) {
  if constexpr (TPG == 0) {
    s[0] = __ldg(ssrc + gt * Index(16));
    s[1] = __ldg(ssrc + gt * Index(16) + 8);
  } else {
    s[0] = __ldg(ssrc + gt / Index(TPG) * Index(8));
  }
}
// Whether every 512-byte tile of `matrices` matrices of `tiles` tiles each has a 32-bit index
// whose 16-byte pieces (32 a tile) still fit 32 bits: the GEMVs' tile indices (2^27 tiles: 64
// GiB of packed weights; one Kimi-K2.5 layer's experts are ~1 GiB at tp 8).
inline bool int4_tile_index_fits(int64_t tiles, int64_t matrices) {
  return tiles >= 0 && matrices >= 1 && tiles * matrices < (int64_t(1) << 27);
}

// Calls f(integral_constant KT, integral_constant TPG) for a row tile of kt 512-byte tiles (k =
// 64 kt: 1, 2 or 4) and the scales' group (TPG: k tiles a group, 1, 2 or 4 for 64, 128 or 256;
// 0 for group 32), the template arguments of the kernels that hold a row tile a warp
// (moe_experts_int4_flat.cu, moe_experts_int4_down_combine.cu); false where off that grid.
template <typename F>
bool with_row_tile_kernel(int kt, int group, F&& f) {
  auto by_tpg = [&](auto kt_c) {
    switch (group) {
      case 32:
        f(kt_c, std::integral_constant<int, 0>{});
        return true;
      case 64:
        f(kt_c, std::integral_constant<int, 1>{});
        return true;
      case 128:
        f(kt_c, std::integral_constant<int, 2>{});
        return true;
      case 256:
        f(kt_c, std::integral_constant<int, 4>{});
        return true;
      default:
        return false;
    }
  };
  switch (kt) {
    case 1:
      return by_tpg(std::integral_constant<int, 1>{});
    case 2:
      return by_tpg(std::integral_constant<int, 2>{});
    case 4:
      return by_tpg(std::integral_constant<int, 4>{});
    default:
      return false;
  }
}

}  // namespace strata::cuda::int4

namespace strata::cuda {
// The stream GEMV (linear_int4_stream.cu), where forced (gemv_kernel) or where the register
// GEMV does not fit; init sets its kernels' shared-memory limit on the current device.
void launch_int4_gemv_stream(const Int4LinearParams& p, cudaStream_t stream);
void init_int4_gemv_stream_kernels();
// The register GEMV (linear_int4_reg.cu): launch_int4_gemv's default for m <= 8 where
// int4_gemv_reg_fits.
void launch_int4_gemv_reg(const Int4LinearParams& p, cudaStream_t stream,
                          const Int4RegExperts* experts = nullptr);
void init_int4_gemv_reg_kernels();
}  // namespace strata::cuda
