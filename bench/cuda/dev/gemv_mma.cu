// Tensor-core GEMV ("skinny GEMM") for decode batches of a few to 64 rows: out [m, n] =
// x [m, k] · w [n, k]ᵀ (+ bias), optionally with SwiGLU as its epilogue. A development kernel
// (dev_kernels.h): on the H200 (2026-11-30, llama_bench --what gemv, 8B shapes) it streams the big
// layers at only 65-75% of copy bandwidth and lost to the FMA GEMV at m <= 2 and to cuBLAS at
// m >= 4 on one decode step's linears (m = 8: 5.24 ms vs cuBLAS 4.72; m = 32: 10.06 vs 4.79); it
// won only on small-n layers at m <= 8 (o_proj m = 8: 13.3 us vs cuBLAS 16.2).
// Like the FMA GEMV (src/backend/cuda/linear.cu) it reads every weight byte once with 16-byte
// loads, but the multiply runs on the tensor cores: mma.sync m16n8k16 with 16 WEIGHT rows as the A
// operand and xᵀ as B (8 tokens per n-tile, up to 8 n-tiles), so the CUDA cores only issue loads
// and the cost no longer grows with m.
//
// Fragments without shuffles or shared memory: a dot product over k does not change when the
// same permutation of k is applied to both operands. Lane t (g = t / 4, c = t % 4) loads 8
// consecutive bf16 of weight row g at k offset 8c of a 32-element chunk (p0..p3: four bf16 pairs),
// the same 8 of row g + 8 (q0..q3) and of token g's x row (x0..x3). The PTX ISA's m16n8k16 layout
// gives lane (g, c): A regs {row g, k 2c..2c+1}, {row g+8, k 2c..}, {row g, k 2c+8..},
// {row g+8, k 2c+8..}; B regs {k 2c..2c+1, column g}, {k 2c+8.., column g}. So mma #1 with
// a = {p0, q0, p1, q1}, b = {x0, x1} maps mma k 2c+j -> chunk k 8c+j and 2c+8+j -> 8c+2+j for
// every row and column alike, and mma #2 with {p2, q2, p3, q3}, {x2, x3} covers 8c+4..8c+7.
// The accumulator: c0, c1 = (row g, tokens 2c, 2c+1), c2, c3 = (row g + 8, the same tokens).
//
// GLU: a tile's rows 0-7 are gate rows j..j+7 and rows 8-15 the matching up rows, so one lane
// holds gate and up of the same outputs. A GLU launch has as many tiles (inter / 8) as the plain
// launch on the same [2 · inter, k] weight (2 · inter / 16), hence the same k split and the same
// summation order per output: the fused result is bit for bit the plain one + silu_mul (assuming
// the tensor core sums every row of a tile the same way; the parity test checks it).
#include "backend/cuda/common.cuh"
#include "dev_kernels.h"

namespace strata::cuda::dev {
namespace {

constexpr int kWarps = 8;  // warps per block
// U: 32-element chunks per k block (2 · U 16-byte weight loads in flight per lane): 4, or 2 or 4
// with 8 n-tiles (the launcher's unroll8: 4 spills a few bytes at 128 registers, 2 does not).

__device__ __forceinline__ void mma16816(float* d, uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One 32-element chunk of k: wa, wb = this lane's 8 weights of tile rows g and g + 8; xp = token
// g's x at the same k (n-tile s adds 8 · s rows); tokens >= m (ntok = m - g) and lanes past k
// (!in) multiply zeros. With two accumulator sets (few n-tiles) the two mmas of a chunk do not
// wait on each other.
template <int NT, int AS>
__device__ __forceinline__ void mma_chunk(float (&acc)[AS][NT][4], const uint4& wa, const uint4& wb,
                                          const bf16_bits* xp, int64_t k, int ntok, bool in) {
#pragma unroll
  for (int s = 0; s < NT; ++s) {
    uint4 xv = make_uint4(0, 0, 0, 0);
    if (in && s * 8 < ntok) xv = __ldg(reinterpret_cast<const uint4*>(xp + s * 8 * k));
    mma16816(acc[0][s], wa.x, wb.x, wa.y, wb.y, xv.x, xv.y);
    mma16816(acc[AS - 1][s], wa.z, wb.z, wa.w, wb.w, xv.z, xv.w);
  }
}

// One warp per 16-row tile, or KS warps per tile each summing interleaved 32 · U-element blocks
// of k (partial sums meet in shared memory), so that small-n layers still keep enough loads in
// flight on every SM. Tiles past the end still take part in __syncthreads.
template <int NT, int KS, bool GLU, int U>
__device__ __forceinline__ void gemv_mma_body(const GemvParams& p) {
  constexpr int kBlockK = 32 * U;
  constexpr int AS = NT <= 2 ? 2 : 1;  // accumulator sets
  __shared__ float red[KS > 1 ? kWarps : 1][NT * 4][32];
  if (p.pdl_early) pdl_trigger();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int part = warp % KS;
  const int64_t tile = int64_t(blockIdx.x) * (kWarps / KS) + warp / KS;
  const int64_t tiles = GLU ? (p.glu_inter + 7) / 8 : (p.n + 15) / 16;
  const bool valid = tile < tiles;
  // This lane's weight rows (tile rows g and g + 8), clamped into the matrix: a clamped row is
  // loaded and multiplied but never stored.
  int64_t r0 = 0, r1 = 0;
  if (valid) {
    if constexpr (GLU) {
      const int64_t j = min(tile * 8 + g, p.glu_inter - 1);
      r0 = j;
      r1 = p.glu_inter + j;
    } else {
      r0 = min(tile * 16 + g, p.n - 1);
      r1 = min(tile * 16 + g + 8, p.n - 1);
    }
  }
  const bf16_bits* w0 = p.w + r0 * p.k + 8 * c;
  const bf16_bits* w1 = p.w + r1 * p.k + 8 * c;
  const bf16_bits* xp = p.x + int64_t(g) * p.k + 8 * c;
  const int ntok = p.m - g;
  pdl_wait();
  if (!p.pdl_early) pdl_trigger();
  float acc[AS][NT][4];
#pragma unroll
  for (int a = 0; a < AS; ++a)
#pragma unroll
    for (int s = 0; s < NT; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[a][s][i] = 0.0f;
  if (valid) {
    const int64_t k_full = p.k - p.k % kBlockK;
    for (int64_t kb = int64_t(part) * kBlockK; kb < k_full; kb += KS * kBlockK) {
      uint4 wa[U], wb[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        wa[u] = __ldcs(reinterpret_cast<const uint4*>(w0 + kb + 32 * u));
        wb[u] = __ldcs(reinterpret_cast<const uint4*>(w1 + kb + 32 * u));
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
        mma_chunk<NT, AS>(acc, wa[u], wb[u], xp + kb + 32 * u, p.k, ntok, true);
    }
    // The tail: 32-element chunks (k % 8 == 0, so a lane's 8 elements are all in or all out).
    for (int64_t kc = k_full + 32 * part; kc < p.k; kc += 32 * KS) {
      const bool in = kc + 8 * c < p.k;
      uint4 wa = make_uint4(0, 0, 0, 0), wb = wa;
      if (in) {
        wa = __ldcs(reinterpret_cast<const uint4*>(w0 + kc));
        wb = __ldcs(reinterpret_cast<const uint4*>(w1 + kc));
      }
      mma_chunk<NT, AS>(acc, wa, wb, xp + kc, p.k, ntok, in);
    }
  }
  if constexpr (AS > 1) {
#pragma unroll
    for (int s = 0; s < NT; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[0][s][i] += acc[AS - 1][s][i];
  }
  if constexpr (KS > 1) {
    if (part != 0) {
#pragma unroll
      for (int s = 0; s < NT; ++s)
#pragma unroll
        for (int i = 0; i < 4; ++i) red[warp][s * 4 + i][lane] = acc[0][s][i];
    }
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int j = 1; j < KS; ++j)
#pragma unroll
      for (int s = 0; s < NT; ++s)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[0][s][i] += red[warp + j][s * 4 + i][lane];
  }
  if (!valid) return;
  if constexpr (GLU) {
    const int64_t j = tile * 8 + g;
    if (j >= p.glu_inter) return;
    const float bg = p.bias ? p.bias[j] : 0.0f;
    const float bu = p.bias ? p.bias[p.glu_inter + j] : 0.0f;
#pragma unroll
    for (int s = 0; s < NT; ++s) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tok = s * 8 + 2 * c + e;
        if (tok >= p.m) continue;
        // The unfused path's roundings: the GEMV stores gate and up in bf16, silu_mul reads them.
        const float gv = bf16_to_float(float_to_bf16(acc[0][s][e] + bg));
        const float uv = bf16_to_float(float_to_bf16(acc[0][s][2 + e] + bu));
        p.out[tok * p.glu_inter + j] = float_to_bf16(gv / (1.0f + __expf(-gv)) * uv);
      }
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = tile * 16 + g + 8 * h;
      if (row >= p.n) continue;
      const float b = p.bias ? p.bias[row] : 0.0f;
#pragma unroll
      for (int s = 0; s < NT; ++s) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int tok = s * 8 + 2 * c + e;
          if (tok < p.m) p.out[tok * p.n + row] = float_to_bf16(acc[0][s][2 * h + e] + b);
        }
      }
    }
  }
}

// Up to 4 n-tiles ptxas keeps the kernel under 85 registers unasked (3 blocks, 24 warps per SM;
// asking for 3 blocks makes it spill). With 8 it would take ~146 (one block): held to 128.
template <int NT, int KS, bool GLU>
__global__ void __launch_bounds__(kWarps * 32) gemv_mma_kernel(GemvParams p) {
  gemv_mma_body<NT, KS, GLU, 4>(p);
}
template <int KS, bool GLU, int U>
__global__ void __launch_bounds__(kWarps * 32, 2) gemv_mma8_kernel(GemvParams p) {
  gemv_mma_body<8, KS, GLU, U>(p);
}

template <int NT, bool GLU, int U8>
void launch_ks(int ks, int64_t tiles, const GemvParams& p, const Launch& launch) {
  const dim3 block(kWarps * 32);
  const dim3 grid(unsigned(ceil_div(tiles, kWarps / ks)));
  if constexpr (NT == 8) {
    if constexpr (U8 == 2) {
      switch (ks) {
        case 1:
          launch_pdl(gemv_mma8_kernel<1, GLU, 2>, grid, block, 0, launch, p);
          break;
        case 2:
          launch_pdl(gemv_mma8_kernel<2, GLU, 2>, grid, block, 0, launch, p);
          break;
        case 4:
          launch_pdl(gemv_mma8_kernel<4, GLU, 2>, grid, block, 0, launch, p);
          break;
        default:
          launch_pdl(gemv_mma8_kernel<8, GLU, 2>, grid, block, 0, launch, p);
          break;
      }
      return;
    }
    switch (ks) {
      case 1:
        launch_pdl(gemv_mma8_kernel<1, GLU, 4>, grid, block, 0, launch, p);
        break;
      case 2:
        launch_pdl(gemv_mma8_kernel<2, GLU, 4>, grid, block, 0, launch, p);
        break;
      case 4:
        launch_pdl(gemv_mma8_kernel<4, GLU, 4>, grid, block, 0, launch, p);
        break;
      default:
        launch_pdl(gemv_mma8_kernel<8, GLU, 4>, grid, block, 0, launch, p);
        break;
    }
  } else {
    switch (ks) {
      case 1:
        launch_pdl(gemv_mma_kernel<NT, 1, GLU>, grid, block, 0, launch, p);
        break;
      case 2:
        launch_pdl(gemv_mma_kernel<NT, 2, GLU>, grid, block, 0, launch, p);
        break;
      case 4:
        launch_pdl(gemv_mma_kernel<NT, 4, GLU>, grid, block, 0, launch, p);
        break;
      default:
        launch_pdl(gemv_mma_kernel<NT, 8, GLU>, grid, block, 0, launch, p);
        break;
    }
  }
}

// PerSm: the k-split target (warps per SM); U8: chunks per weight batch with 8 n-tiles.
template <int NT, int PerSm, int U8>
void launch_gemv_mma_nt(const GemvParams& p, const Launch& launch) {
  // The k split depends on the tile count only (equal for a GLU launch and the plain launch on
  // the same weight): the fewest warps per tile that give every SM ~warps_per_sm warps of loads.
  const int64_t tiles = p.glu_inter > 0 ? ceil_div(p.glu_inter, 8) : ceil_div(p.n, 16);
  int ks = 1;
  while (ks < kWarps && tiles * ks < int64_t(num_sms()) * PerSm) ks *= 2;
  if (p.glu_inter > 0)
    launch_ks<NT, true, U8>(ks, tiles, p, launch);
  else
    launch_ks<NT, false, U8>(ks, tiles, p, launch);
  CUDA_LAUNCH_CHECK();
}

template <int PerSm, int U8>
void launch_gemv_mma(const GemvParams& p, const Launch& launch) {
  if (p.m == 0 || p.n == 0) return;
  CHECK(p.k % 8 == 0 && uintptr_t(p.x) % 16 == 0 && uintptr_t(p.w) % 16 == 0);
  CHECK(p.glu_inter == 0 || p.n == 2 * p.glu_inter);
  CHECK_MSG(p.m <= kGemvMmaMaxRows, "gemv_mma: {} rows (max {})", p.m, kGemvMmaMaxRows);
  if (p.m <= 8)
    launch_gemv_mma_nt<1, PerSm, U8>(p, launch);
  else if (p.m <= 16)
    launch_gemv_mma_nt<2, PerSm, U8>(p, launch);
  else if (p.m <= 32)
    launch_gemv_mma_nt<4, PerSm, U8>(p, launch);
  else
    launch_gemv_mma_nt<8, PerSm, U8>(p, launch);
}

template <int U8>
GemvLauncher gemv_mma_u(int warps_per_sm) {
  switch (warps_per_sm) {
    case 1:
      return launch_gemv_mma<1, U8>;
    case 2:
      return launch_gemv_mma<2, U8>;
    case 4:
      return launch_gemv_mma<4, U8>;
    case 8:
      return launch_gemv_mma<8, U8>;
    case 16:
      return launch_gemv_mma<16, U8>;
    case 24:
      return launch_gemv_mma<24, U8>;
    case 48:
      return launch_gemv_mma<48, U8>;
    default:
      CHECK_MSG(false, "gemv_mma: {} warps per SM (1, 2, 4, 8, 16, 24 or 48)", warps_per_sm);
  }
  return nullptr;
}

}  // namespace

GemvLauncher gemv_mma(int warps_per_sm, int unroll8) {
  CHECK_MSG(unroll8 == 2 || unroll8 == 4, "gemv_mma: unroll8 {} (2 or 4)", unroll8);
  return unroll8 == 2 ? gemv_mma_u<2>(warps_per_sm) : gemv_mma_u<4>(warps_per_sm);
}

DevKernels gemv_mma_kernels(int min_rows, int max_rows, int warps_per_sm) {
  CHECK(min_rows >= 1 && max_rows <= kGemvMmaMaxRows);
  DevKernels k;
  k.gemv = gemv_mma(warps_per_sm);
  k.gemv_min_rows = min_rows;
  k.gemv_max_rows = max_rows;
  return k;
}

}  // namespace strata::cuda::dev
