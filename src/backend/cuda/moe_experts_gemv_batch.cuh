// The MoE GEMV kernel's per-warp pieces: batch sizes, batch registers, loading and multiplying one.
#pragma once

#include "backend/cuda/moe_experts.cuh"

// Included by moe_experts_gemv.cu only (through moe_experts_gemv_kernel.cuh), so the unnamed
// namespace keeps these pieces internal to it as they were.
namespace strata::cuda {
namespace {

using namespace moe;

template <int F, int NT, bool GLU>
struct Cfg {
  static constexpr int NM = GLU ? 2 : 1;  // weight matrices per warp (gate and up)
  static constexpr int S = kSteps<F>;     // k16 steps per tile
  static constexpr int TK = 16 * S;       // columns per tile
  // int4 GLU, and int4 at two or four n-tiles, stream through the shared-memory ring (RING,
  // below); int4 plain projections at one n-tile keep the register ring (measured: the ring
  // lost there, e.g. the Kimi rank's short-k down projection at T <= 64,
  // 2026-12-01-moe-int4-decode.md).
  static constexpr bool RING = F == kMoeInt4 && (GLU || NT > 1);
  // x fragments loaded into registers with the weights where the registers allow it (not int4
  // GLU, nor int4 at two n-tiles, nor four n-tiles, nor the ring); elsewhere the x lines of a
  // batch are prefetched into L1 when its weights are loaded, and read from there when it is
  // multiplied.
  static constexpr bool XPRE =
      !RING && ((NT == 1 && !(F == kMoeInt4 && GLU)) || (NT == 2 && F != kMoeInt4));
  // Tiles per batch per matrix (U) and batches in flight (NB register buffers, a ring): what
  // the registers allow at <= 128 per thread (weights, scales and, for XPRE, x of every
  // buffer). ptxas -v at one n-tile, GLU: int4 spilled ~500 bytes with two tiles per batch and
  // x in registers, 44 with three buffers of one tile, none with two (too few bytes in flight:
  // ~1.5 KB per warp), so int4 GLU keeps two tiles per batch and prefetches x into L1; fp8
  // spilled 20 bytes with two buffers of two tiles, none with three of one.
  // RING: two tiles per batch at every NT (the registers hold one batch only).
  static constexpr int U = RING      ? 2
                           : NT == 1 ? (kFp8Tiles<F> && GLU    ? 1
                                        : GLU || F == kMoeInt4 ? 2
                                                               : 4)
                           : NT == 2 ? (GLU || F == kMoeInt4 ? 1 : 2)
                                     : 1;
  static constexpr int NB = NT == 1 && kFp8Tiles<F> && GLU ? 3 : 2;
  static_assert(!kFp8Tiles<F> || 4 % U == 0, "an fp8 batch must lie in one scale block");
  // The ring (RING): each warp's NS stages of one batch each in shared memory (cp.async, a
  // commit group per batch), NS - 1 batches in flight while one is multiplied. The register
  // ring kept only ~1.5 batches (3 KB at one n-tile, 1.5 KB at two) in flight per warp: 24-48 KB
  // per SM, short of the ~100 KB that HBM's latency at full bandwidth asks for. A stage holds
  // the batch's tiles (each lane its own 16 bytes, as loaded before) and each lane's two scale
  // words per tile, so every lane reads back only what it copied: no barrier, no shuffle. x is
  // prefetched into L1 when a stage is issued (XPRE off).
  static constexpr int kStageBytes = NM * U * (kMoeTileBytes + 32 * 8);
  // Two CTAs of 8 warps per SM: ~113 KB each, less the k-split partials (red) and the plan.
  static constexpr int kRingWarpBytes = ((113 << 10) - 8 * (NM * NT * 4) * 32 * 4 - 1024) / 8;
  static constexpr int NS_FIT = kRingWarpBytes / kStageBytes;
  static constexpr int NS = NS_FIT > 8 ? 8 : NS_FIT < 2 ? 2 : NS_FIT;
  static constexpr int kRingBytes = RING ? 8 * NS * kStageBytes : 0;  // dynamic, per CTA
};

template <int F, int NT, bool GLU>
struct Batch {  // this lane's 16 bytes of U consecutive k tiles per matrix, scales, x pairs
  using C = Cfg<F, NT, GLU>;
  uint4 w[C::NM][C::U];
  TileScale s[C::NM][C::U];
  uint32_t x[C::XPRE ? C::U : 1][C::XPRE ? C::S : 1][C::XPRE ? NT : 1][2];
};

template <int F>
__device__ __forceinline__ TileScale load_scale(const void* s, int kt, int gshift, bool group32,
                                                int k) {
  TileScale sc{0, 0};
  if constexpr (F == kMoeInt4) {
    const uint32_t* sp = static_cast<const uint32_t*>(s);
    const uint32_t g0 = (uint32_t(kt) * 64u) >> gshift;
    sc.s0 = __ldg(sp + g0 * 8u);
    // Group 32: the second half tile's group; none where that half lies past k (k % 64 == 32:
    // its k steps are skipped, and the word would be the next row tile's, or past the end).
    sc.s1 = !group32                                 ? sc.s0
            : uint32_t(kt) * 64u + 32u < uint32_t(k) ? __ldg(sp + (g0 + 1u) * 8u)
                                                     : 0u;
  } else if constexpr (kFp8Tiles<F>) {
    sc.s0 = __float_as_uint(__ldg(static_cast<const float*>(s) + uint32_t(kt) / 4u));  // 128 / 32
  }
  return sc;
}

// The fixed facts of one CTA's work, shared by its helpers. Offsets inside one expert's matrix
// are 32-bit (its tiles and scales are far below 2^31 units).
struct Work {
  const uint4* w_base;  // the expert's tiles + this lane's 16 bytes
  const char* s_base;   // the expert's scales (int4: + this lane's scale word)
  int glu_tiles;        // GLU: row tiles of the gate half (the up tile is rt + glu_tiles)
  int kt_count;
  int k;
  int scale_row_words;  // int4: 32-bit scale words per row tile
  int scale_cols;       // fp8: scale blocks per row block
  int gshift;
  bool group32;
};

// Weights and scales of the batch at k tile kt0 of row tile rt (tiles past kt_count and !ok:
// zero, no load).
template <int F, int NT, bool GLU>
__device__ __forceinline__ void load_w(Batch<F, NT, GLU>& b, const Work& wk, int rt, int kt0,
                                       bool ok) {
  using C = Cfg<F, NT, GLU>;
#pragma unroll
  for (int mt = 0; mt < C::NM; ++mt) {
    // Unsigned offsets (non-negative here): a 32-bit offset then one wide multiply-add per
    // address, where signed ones took four instructions each (sign extension, LEA pairs).
    const uint32_t r = uint32_t(rt + (mt ? wk.glu_tiles : 0));
    const uint4* w = wk.w_base + r * uint32_t(wk.kt_count) * 32u;
    const void* sp = nullptr;
    if constexpr (F == kMoeInt4) {
      sp = reinterpret_cast<const uint32_t*>(wk.s_base) + r * uint32_t(wk.scale_row_words);
    } else if constexpr (kFp8Tiles<F>) {
      sp = reinterpret_cast<const float*>(wk.s_base) +
           (r * uint32_t(kMoeTileRows) / uint32_t(kMoeFp8Block)) * uint32_t(wk.scale_cols);
    }
#pragma unroll
    for (int u = 0; u < C::U; ++u) {
      const int kt = kt0 + u;
      if (ok && kt < wk.kt_count) {
        b.w[mt][u] = __ldcs(w + uint32_t(kt) * 32u);
        // fp8: a batch (kt0 % U == 0, U | 4) lies in one 128-column scale block.
        b.s[mt][u] =
            kFp8Tiles<F> && u > 0 ? b.s[mt][0] : load_scale<F>(sp, kt, wk.gshift, wk.group32, wk.k);
      } else {
        b.w[mt][u] = make_uint4(0, 0, 0, 0);
        b.s[mt][u] = TileScale{0, 0};
      }
    }
  }
}

// x pairs of the batch at k tile kt0 (XPRE): xrow[j] is the element offset of n-tile j's row
// 8j + g at column 2c, -1 past the rows; k % 16 == 0, so a k16 step lies inside or past k.
__device__ __forceinline__ void prefetch_l1(const void* p) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p));
}

// kMoeFp8F16: the lane's B fragments of both k16 steps of the 32-column tile at koff, one
// 16-byte load (x staged in the tiles' fragment order, MoeStageF16Params: xrow[j] is then the
// row's offset + 8c); zero past the rows and past k (k % 32 == 0). x is global memory (staged by
// a launch) or shared memory (staged by the CTA, stage_smem): a generic load.
__device__ __forceinline__ uint4 x16_tile(const bf16_bits* x, int32_t xrow, int koff, int k) {
  if (xrow < 0 || koff >= k) return make_uint4(0, 0, 0, 0);
  return *reinterpret_cast<const uint4*>(x + uint32_t(xrow + koff));
}

template <int F, int NT, bool GLU>
__device__ __forceinline__ void load_x(Batch<F, NT, GLU>& b, const bf16_bits* x,
                                       const int32_t* xrow, int kt0, int k) {
  using C = Cfg<F, NT, GLU>;
  if constexpr (!C::XPRE) {  // lanes c = 0 (xrow at the row's column 0): each row's tile lines
    if (threadIdx.x % 4 == 0) {
#pragma unroll
      for (int u = 0; u < C::U; ++u) {
        const int koff = (kt0 + u) * C::TK;
#pragma unroll
        for (int j = 0; j < NT; ++j)
          if (xrow[j] >= 0 && koff < k) {
            prefetch_l1(x + xrow[j] + koff);
            prefetch_l1(x + xrow[j] + koff + C::TK - 1);
          }
      }
    }
  } else if constexpr (F == kMoeFp8F16) {
#pragma unroll
    for (int u = 0; u < C::U; ++u)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint4 v = x16_tile(x, xrow[j], (kt0 + u) * C::TK, k);
        b.x[u][0][j][0] = v.x;
        b.x[u][0][j][1] = v.y;
        b.x[u][1][j][0] = v.z;
        b.x[u][1][j][1] = v.w;
      }
  } else {
#pragma unroll
    for (int u = 0; u < C::U; ++u)
#pragma unroll
      for (int s = 0; s < C::S; ++s) {
        const int koff = (kt0 + u) * C::TK + 16 * s;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const bool ok = xrow[j] >= 0 && koff < k;
          const unsigned int* src =
              reinterpret_cast<const unsigned int*>(x + uint32_t(xrow[j] + koff));
          b.x[u][s][j][0] = ok ? __ldg(src) : 0u;
          b.x[u][s][j][1] = ok ? __ldg(src + 4) : 0u;
        }
      }
  }
}

// The x B fragment pair of k16 step (u, s) at column koff and n-tile j: from the batch's
// registers (XPRE) or through L1; zero past the rows and past k.
template <int F, int NT, bool GLU>
__device__ __forceinline__ void x_pair(const Batch<F, NT, GLU>& cur, const bf16_bits* x,
                                       const int32_t* xrow, int nt, int u, int s, int j, int koff,
                                       int k, uint32_t* xb) {
  if constexpr (Cfg<F, NT, GLU>::XPRE) {
    xb[0] = cur.x[u][s][j][0];
    xb[1] = cur.x[u][s][j][1];
  } else {
    const bool ok = j < nt && xrow[j] >= 0 && koff < k;
    const unsigned int* src = reinterpret_cast<const unsigned int*>(x + uint32_t(xrow[j] + koff));
    xb[0] = ok ? __ldg(src) : 0u;
    xb[1] = ok ? __ldg(src + 4) : 0u;
  }
}

// kMoeFp8F16: one batch (U tiles of one 128-column scale block per matrix) into float32 sums
// of e4m3 · f16 x, then acc += sums · the block's scale. x holds 16-bit f16 bits here. Steps
// past k are multiplied too, not branched around: their weights are zero (the repack's zero
// columns, load_w's zero tiles) and so is their x (x_pair, load_x). An n-tile past nt (NT > 1)
// is skipped (NT = 1: nt is 1).
template <int NT, bool GLU>
__device__ __forceinline__ void mma_batch_f16(float (&acc)[Cfg<kMoeFp8F16, NT, GLU>::NM][NT][4],
                                              const Batch<kMoeFp8F16, NT, GLU>& cur,
                                              const bf16_bits* x, const int32_t* xrow, int nt,
                                              int kt0, int k) {
  using C = Cfg<kMoeFp8F16, NT, GLU>;
  uint32_t xb[C::U][C::S][NT][2];
#pragma unroll
  for (int u = 0; u < C::U; ++u)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if constexpr (C::XPRE) {
#pragma unroll
        for (int s = 0; s < C::S; ++s) {
          xb[u][s][j][0] = cur.x[u][s][j][0];
          xb[u][s][j][1] = cur.x[u][s][j][1];
        }
      } else {
        const uint4 v =
            NT == 1 || j < nt ? x16_tile(x, xrow[j], (kt0 + u) * C::TK, k) : make_uint4(0, 0, 0, 0);
        xb[u][0][j][0] = v.x;
        xb[u][0][j][1] = v.y;
        xb[u][1][j][0] = v.z;
        xb[u][1][j][1] = v.w;
      }
    }
    // Four n-tiles: per matrix the batch's fragments once, then each n-tile's sums, four
    // registers at a time (all n-tiles' sums at once spilled). Fewer: per k16 step its
    // fragment, into every n-tile's sums (holding a batch's fragments spilled at four tiles a
    // batch).
#pragma unroll
  for (int mt = 0; mt < C::NM; ++mt) {
    const float scale = __uint_as_float(cur.s[mt][0].s0);
    if constexpr (NT == 4) {
      uint32_t a[C::U][C::S][4];
#pragma unroll
      for (int u = 0; u < C::U; ++u)
#pragma unroll
        for (int s = 0; s < C::S; ++s) fragment<kMoeFp8F16>(cur.w[mt][u], cur.s[mt][u], s, a[u][s]);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if (j >= nt) continue;
        float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int u = 0; u < C::U; ++u)
#pragma unroll
          for (int s = 0; s < C::S; ++s)
            mma_f16_16816(sum, a[u][s], xb[u][s][j][0], xb[u][s][j][1]);
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][j][i] = fmaf(sum[i], scale, acc[mt][j][i]);
      }
    } else {
      float sum[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) sum[j][i] = 0.0f;
#pragma unroll
      for (int u = 0; u < C::U; ++u)
#pragma unroll
        for (int s = 0; s < C::S; ++s) {
          uint32_t a[4];
          fragment<kMoeFp8F16>(cur.w[mt][u], cur.s[mt][u], s, a);
#pragma unroll
          for (int j = 0; j < NT; ++j)
            if (NT == 1 || j < nt) mma_f16_16816(sum[j], a, xb[u][s][j][0], xb[u][s][j][1]);
        }
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][j][i] = fmaf(sum[j][i], scale, acc[mt][j][i]);
    }
  }
}

// Multiplies one batch into acc (n-tiles j < nt only).
template <int F, int NT, bool GLU>
__device__ __forceinline__ void mma_batch(float (&acc)[Cfg<F, NT, GLU>::NM][NT][4],
                                          const Batch<F, NT, GLU>& cur, const bf16_bits* x,
                                          const int32_t* xrow, int nt, int kt0, int k) {
  using C = Cfg<F, NT, GLU>;
  if constexpr (F == kMoeFp8F16) {
    mma_batch_f16<NT, GLU>(acc, cur, x, xrow, nt, kt0, k);
  } else {
#pragma unroll
    for (int u = 0; u < C::U; ++u) {
#pragma unroll
      for (int s = 0; s < C::S; ++s) {
        const int koff = (kt0 + u) * C::TK + 16 * s;
        if (koff >= k) continue;  // uniform over the warp
        uint32_t xb[NT][2];
#pragma unroll
        for (int j = 0; j < NT; ++j) x_pair(cur, x, xrow, nt, u, s, j, koff, k, xb[j]);
#pragma unroll
        for (int mt = 0; mt < C::NM; ++mt) {
          uint32_t a[4];
          fragment<F>(cur.w[mt][u], cur.s[mt][u], s, a);
#pragma unroll
          for (int j = 0; j < NT; ++j)
            if (NT == 1 || j < nt) int4::mma16816(acc[mt][j], a, xb[j][0], xb[j][1]);
        }
      }
    }
  }
}

// ---- the int4 shared-memory ring (Cfg::RING) ----
extern __shared__ uint4 moe_gemv_ring[];

__device__ __forceinline__ void ring_cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void ring_cp4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void ring_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void ring_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Issues this lane's copies of the batch at k tile kt0 of row tile rt into the stage at `slot`
// (a shared address): tile (mt, u) at slot + (mt·U + u)·512 + lane·16, its scale words s0, s1 at
// slot + NM·U·512 + (mt·U + u)·256 + lane·8. Tiles past kt_count are not copied (their k steps
// are skipped by mma_batch). One commit group, empty when !ok.
template <int F, int NT, bool GLU>
__device__ __forceinline__ void ring_issue(uint32_t slot, const Work& wk, int rt, int kt0,
                                           bool ok) {
  using C = Cfg<F, NT, GLU>;
  if (ok) {
    const int lane = int(threadIdx.x) % 32;
#pragma unroll
    for (int mt = 0; mt < C::NM; ++mt) {
      const int r = rt + (mt ? wk.glu_tiles : 0);
      const uint4* w = wk.w_base + r * wk.kt_count * 32;
      const uint32_t* sp = reinterpret_cast<const uint32_t*>(wk.s_base) + r * wk.scale_row_words;
#pragma unroll
      for (int u = 0; u < C::U; ++u) {
        const int kt = kt0 + u;
        if (kt >= wk.kt_count) continue;
        ring_cp16(slot + uint32_t((mt * C::U + u) * kMoeTileBytes + lane * 16), w + kt * 32);
        const int g0 = (kt * 64) >> wk.gshift;
        const uint32_t sdst =
            slot + uint32_t(C::NM * C::U * kMoeTileBytes + (mt * C::U + u) * 256 + lane * 8);
        ring_cp4(sdst, sp + g0 * 8);
        // (Not past k: load_scale says why; the stage's word then goes unread.)
        if (wk.group32 && kt * 64 + 32 < wk.k) ring_cp4(sdst + 4, sp + (g0 + 1) * 8);
      }
    }
  }
  ring_commit();
}

// The batch of the stage at `slot` (generic pointer), as load_w would have loaded it.
template <int F, int NT, bool GLU>
__device__ __forceinline__ void ring_take(Batch<F, NT, GLU>& b, const char* slot, bool group32) {
  using C = Cfg<F, NT, GLU>;
  const int lane = int(threadIdx.x) % 32;
#pragma unroll
  for (int mt = 0; mt < C::NM; ++mt)
#pragma unroll
    for (int u = 0; u < C::U; ++u) {
      b.w[mt][u] =
          *reinterpret_cast<const uint4*>(slot + (mt * C::U + u) * kMoeTileBytes + lane * 16);
      const uint2 sc = *reinterpret_cast<const uint2*>(slot + C::NM * C::U * kMoeTileBytes +
                                                       (mt * C::U + u) * 256 + lane * 8);
      b.s[mt][u] = TileScale{sc.x, group32 ? sc.y : sc.x};
    }
}

}  // namespace
}  // namespace strata::cuda
