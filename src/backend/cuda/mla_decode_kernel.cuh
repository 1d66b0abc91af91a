// The MLA decode kernel itself (its design: mla_decode.cuh): the S warps, then the PV warps.
#pragma once

#include <cfloat>

#include "backend/cuda/mla_decode_layout.cuh"
#include "backend/cuda/mla_decode_mma.cuh"

namespace strata::cuda::mla_decode {

// PROF: the wait profile (p.prof, benchmarks) compiled in; the product's kernels (PROF false)
// carry none of its code.
template <int NT, int LK, int CVT, bool PROF>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_kernel(MlaAttentionParams p) {
  constexpr bool kFp8 = LK != kBf16;
  constexpr int kLatElem = LK == kBf16 ? kMlaBf16 : LK == kE5M2 ? kMlaE5M2 : kMlaE4M3;
  constexpr bool kE4 = kLatElem == kMlaE4M3;
  constexpr bool kSHw = kE4 && CVT != kCvtInt;  // S warps convert e4m3 by the conversion unit
  constexpr bool kPvHw = kE4 && CVT == kCvtHw;
  constexpr float kConvS = kE4 && !kSHw ? 256.0f : 1.0f;  // integer e4m3 reads value · 2^-8
  constexpr bool kVT = kE4 && CVT == kCvtTile;  // V through the shared f16 tile (kVTileBytes)
  constexpr float kConvV = kE4 && !kPvHw && !kVT ? 256.0f : 1.0f;
  static_assert(kSWarps == kPvWarps, "either role's warps free a stage (one arrival each)");
  constexpr int kStages0 = kStageOff + (kVT ? kVTileAreaBytes : 0);
  constexpr bool kPairs02 = !kSHw;
  constexpr int kRows = 8 * NT;
  extern __shared__ __align__(128) char smem[];
  pdl_wait();
  pdl_trigger();
  mla::BlockWork w;
  if (!w.init(p, kRows)) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // p.prof (benchmarks): cycles of the waits below, summed by lane 0 of each warp at its end.
  constexpr bool prof = PROF;
  const uint64_t t_start = prof ? clock64() : 0;
  uint64_t tw[3] = {0, 0, 0};
  auto tick = [&]() -> uint64_t { return prof ? clock64() : 0; };
  auto tock = [&](int k, uint64_t since) {
    if (prof) tw[k] += clock64() - since;
  };
  auto prof_flush = [&](int first, int total) {
    if (!prof || lane != 0) return;
    for (int k = 0; k < 3; ++k)
      atomicAdd(reinterpret_cast<unsigned long long*>(p.prof + first + k),
                (unsigned long long)tw[k]);
    atomicAdd(reinterpret_cast<unsigned long long*>(p.prof + total),
              (unsigned long long)(clock64() - t_start));
  };
  const int g = lane / 4, q = lane % 4;
  const MlaRowFormat& f = p.fmt;
  const int NS = p.stages;
  const StageLayout lay(f.row_bytes, row_group_log2(p.row_groups, p.page_size));
  const bool groups = lay.group_log2 != 0;
  const int G = lay.group_rows();
  const int stage_bytes = lay.stage_bytes();
  const uint32_t smem_s = smem_addr(smem);
  const uint32_t stage0 = smem_s + kStages0;
  if (tid == 0) {
    for (int s = 0; s < NS; ++s) {
      mla::mbar_init(smem_s + kFullOff + 8 * s, 1);          // the producer's arrival
      mla::mbar_init(smem_s + kEmptyOff + 8 * s, kPvWarps);  // one per PV (V tile: S) warp
    }
    mla::mbar_init_fence();
  }
  __syncthreads();
  const int nchunks = w.nchunks;

  if (warp < kSWarps) {
    // ---- S warps: keys [16 warp, 16 warp + 16) of each chunk ----
    const int rope_elem = f.rope_elem;
    const bool rope_f16 = rope_elem != kMlaBf16;
    // Q of rows 8 nt + g as B fragments: k-steps 0..31 the latent, 32..35 the rope.
    bool qok[NT];
    const uint16_t* qrow[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int r = 8 * nt + g;
      qok[nt] = w.row0 + r < w.rows;
      qrow[nt] = p.q + int64_t(w.q_row0 + w.row0 + (qok[nt] ? r : 0)) * p.q_stride;
    }
    // The f16 parts' power-of-two scale of each row (a quad holds a row's values).
    float qs[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float amax = 0.0f;
      if (qok[nt]) {
        auto scan = [&](const uint16_t* at) {
          const uint2 v = *reinterpret_cast<const uint2*>(at);
          amax = fmaxf(amax, fmaxf(fmaxf(fabsf(__uint_as_float(v.x << 16)),
                                         fabsf(__uint_as_float(v.x & 0xffff0000u))),
                                   fmaxf(fabsf(__uint_as_float(v.y << 16)),
                                         fabsf(__uint_as_float(v.y & 0xffff0000u)))));
        };
        if constexpr (kFp8) {
#pragma unroll 8
          for (int ks = 0; ks < kR / 16; ++ks) scan(qrow[nt] + 16 * ks + 4 * q);
        }
        if (rope_f16)
#pragma unroll
          for (int ks = 0; ks < kP / 16; ++ks) scan(qrow[nt] + kR + 16 * ks + 4 * q);
      }
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      int e = 0;
      frexpf(amax, &e);
      qs[nt] = amax > 0.0f ? ldexpf(1.0f, min(15 - e, 100)) : 1.0f;  // (finite for tiny rows)
    }
    uint32_t qf[kR / 16 + kP / 16][NT][2];
    // Values d..d+3 of a row as f16 pairs (scaled), paired as key_pairs pairs the keys' values.
    auto f16_pairs = [&](const uint16_t* at, float s, bool pairs02, uint32_t* b) {
      const uint2 v = *reinterpret_cast<const uint2*>(at);
      const float x0 = __uint_as_float(v.x << 16) * s, x1 = __uint_as_float(v.x & 0xffff0000u) * s;
      const float x2 = __uint_as_float(v.y << 16) * s, x3 = __uint_as_float(v.y & 0xffff0000u) * s;
      b[0] = pairs02 ? pack_f16x2(x0, x2) : pack_f16x2(x0, x1);
      b[1] = pairs02 ? pack_f16x2(x1, x3) : pack_f16x2(x2, x3);
    };
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int ks = 0; ks < kR / 16 + kP / 16; ++ks) {
        qf[ks][nt][0] = qf[ks][nt][1] = 0u;
        if (!qok[nt]) continue;
        const bool rope = ks >= kR / 16;
        const uint16_t* at = qrow[nt] + 16 * ks;
        if ((!rope && !kFp8) || (rope && !rope_f16)) {  // bf16 pairs (2c, 2c+1), (2c+8, 2c+9)
          qf[ks][nt][0] = *reinterpret_cast<const uint32_t*>(at + 2 * q);
          qf[ks][nt][1] = *reinterpret_cast<const uint32_t*>(at + 8 + 2 * q);
        } else {
          f16_pairs(at + 4 * q, qs[nt], rope || kPairs02, qf[ks][nt]);
        }
      }
    }
    // Score factors of this lane's accumulator rows 8 nt + 2q + e (the row's lanes hold its qs).
    const float ls = f.latent_scale * p.scale_log2 * kConvS;
    const float rs = f.rope_scale * p.scale_log2 * (rope_elem == kMlaE4M3 ? 256.0f : 1.0f);
    float lat_f[NT][2], rope_f[NT][2];
    int lim[NT][2];
    uint64_t tw[NT][2];  // draft trees: the rows' ancestor words
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float inv = 1.0f / __shfl_sync(0xffffffffu, qs[nt], 4 * (2 * q + e));
        lat_f[nt][e] = kFp8 ? ls * inv : ls;
        rope_f[nt][e] = rope_f16 ? rs * inv : rs;
        lim[nt][e] = w.limit(p, w.row0 + 8 * nt + 2 * q + e);
        tw[nt][e] = w.tree_word_of(p, w.row0 + 8 * nt + 2 * q + e);
      }

    float m[NT][2], l[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) m[nt][0] = m[nt][1] = -INFINITY, l[nt][0] = l[nt][1] = 0.0f;
    // This warp's tile (t = warp): the lane's ldmatrix row, the rows g and g + 8 of its
    // accumulators (their keys and, FlashMLA, where their scales lie).
    const int lrow = lay.tile_row(warp, (lane & 7) + ((lane >> 3) & 1) * 8) + (lane >> 4) * 16;
    const int srow0 = lay.tile_row(warp, g), srow1 = lay.tile_row(warp, g + 8);
    const int gkey0 = lay.key(warp, g), gkey1 = lay.key(warp, g + 8);
    float* red = reinterpret_cast<float*>(smem + kRedOff);
    float* corr_s = reinterpret_cast<float*>(smem + kCorrOff);
    const int rope_off = f.rope_offset;
    // V tile (kVT): this lane's rows vr0 = 16 warp + g and vr0 + 8 take the f16 values 32 j + 4 q..
    // + 3 (unit u = 4 j + q / 2) and 32 j + 16 + 4 q.. (u + 2) at ((u ^ swizzle(g)) << 4) + 8 (q &
    // 1). With x the unit's low 3 bits after the swizzle, that is vo[.] + 64 (j & ~1): x for even j
    // and x ^ 4 for odd j (bit 2 of 4 j), so every store is a base register plus an immediate.
    const int vr0 = 16 * warp + g, vswz = vtile_swizzle(g);
    int vo[4];
    {
      const int xa = (q >> 1) ^ vswz, xb = (2 | (q >> 1)) ^ vswz, half = 8 * (q & 1);
      vo[0] = (xa << 4) + half, vo[1] = ((xa ^ 4) << 4) + half;
      vo[2] = (xb << 4) + half, vo[3] = ((xb ^ 4) << 4) + half;
    }

    for (int c = 0; c < nchunks; ++c) {
      const int st = c % NS, buf = c & 1;
      uint64_t t0 = tick();
      mla::mbar_wait(smem_s + kFullOff + 8 * st, (c / NS) & 1);
      tock(0, t0);
      const uint32_t st_s = stage0 + st * stage_bytes;
      const char* st_p = smem + kStages0 + st * stage_bytes;
      const uint32_t krow = st_s + lrow;
      // V tile `buf` (and P buffer `buf`) were last read by the PV warps at chunk c - 2.
      t0 = tick();
      if (kVT && c >= 2) mla::named_sync(kBarFree + buf, (kSWarps + kPvWarps) * 32);
      tock(2, t0);
      char* vt = smem + kStageOff + buf * kVTileBytes + vr0 * kVRowBytes;  // row vr0
      float* vscale = reinterpret_cast<float*>(smem + kVScaleOff + buf * kVScaleBytes);
      // Values of row vr0 (+ 8 rows: row8) at offset vo[k] + 64 (j & ~1) (see vo).
      auto store_v = [&](int j, int k, int row8, uint32_t lo, uint32_t hi) {
        *reinterpret_cast<uint2*>(vt + row8 * kVRowBytes + vo[k] + 64 * (j & ~1)) =
            make_uint2(lo, hi);
      };
      float acc[NT][4], accr[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[nt][i] = accr[nt][i] = 0.0f;

      const bool math = p.diag != 1 && p.diag != 4;  // diag 1: loads only; 4: no S math
      if (!math) {
      } else if constexpr (!kFp8) {
        float a2[2][NT][4] = {};  // two accumulators: half the dependent-mma chain
#pragma unroll
        for (int ks = 0; ks < kR / 16; ++ks) {
          uint32_t a[4];
          ldmatrix_x4(a, krow + ks * 32);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
            mma16816<false>(a2[ks & 1][nt], a, qf[ks][nt][0], qf[ks][nt][1]);
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[nt][i] = a2[0][nt][i] + a2[1][nt][i];
      } else {
        // 32 bytes a row (two k-steps) per ldmatrix: matrices (keys 0-7 | 8-15) x (bytes 0-15 |
        // 16-31); FlashMLA: each 128-value tile (4 of them) scaled by its key's tile scale.
        constexpr int kTiles = LK == kFlash ? kR / kMlaFlashTile : 1;
        constexpr int kPerTile = (kR / 32) / kTiles;
        constexpr int kChains = LK == kFlash ? 1 : 2;  // FlashMLA: chains of 8 per tile anyway
#pragma unroll
        for (int t = 0; t < kTiles; ++t) {
          float a2[kChains][NT][4] = {};
#pragma unroll
          for (int jj = 0; jj < kPerTile; ++jj) {
            const int j = t * kPerTile + jj;
            uint32_t r[4], a0[4], a1[4];
            ldmatrix_x4(r, krow + j * 32);
            key_pairs<kLatElem, kSHw>(r[0], a0[0], a0[2]);
            key_pairs<kLatElem, kSHw>(r[1], a0[1], a0[3]);
            key_pairs<kLatElem, kSHw>(r[2], a1[0], a1[2]);
            key_pairs<kLatElem, kSHw>(r[3], a1[1], a1[3]);
            if constexpr (kVT) {  // values 32 j + 4 q.. (a0) and 32 j + 16 + 4 q.. (a1)
              store_v(j, j & 1, 0, a0[0], a0[2]);
              store_v(j, j & 1, 8, a0[1], a0[3]);
              store_v(j, 2 + (j & 1), 0, a1[0], a1[2]);
              store_v(j, 2 + (j & 1), 8, a1[1], a1[3]);
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              mma16816<true>(a2[0][nt], a0, qf[2 * j][nt][0], qf[2 * j][nt][1]);
              mma16816<true>(a2[kChains - 1][nt], a1, qf[2 * j + 1][nt][0], qf[2 * j + 1][nt][1]);
            }
          }
          float s0 = 1.0f, s1 = 1.0f;  // the tile's rows (keys) g and g + 8
          if constexpr (LK == kFlash) {
            s0 = *reinterpret_cast<const float*>(st_p + srow0 + kR + 4 * t);
            s1 = *reinterpret_cast<const float*>(st_p + srow1 + kR + 4 * t);
            if (kVT && q == t) vscale[4 * vr0 + t] = s0, vscale[4 * (vr0 + 8) + t] = s1;
          }
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              float v = a2[0][nt][i];
              if constexpr (kChains == 2) v += a2[1][nt][i];
              acc[nt][i] += (i < 2 ? s0 : s1) * v;
            }
        }
      }
      // The rope part: bf16 (4 k-steps) or fp8 (2 ldmatrix of 32 bytes), in its own accumulator.
      if (!math) {
      } else if (rope_elem == kMlaBf16) {
#pragma unroll
        for (int ks = 0; ks < kP / 16; ++ks) {
          uint32_t a[4];
          ldmatrix_x4(a, krow + rope_off + ks * 32);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
            mma16816<false>(accr[nt], a, qf[kR / 16 + ks][nt][0], qf[kR / 16 + ks][nt][1]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kP / 32; ++j) {
          uint32_t r[4], a0[4], a1[4];
          ldmatrix_x4(r, krow + rope_off + j * 32);
          if (rope_elem == kMlaE4M3) {
            key_pairs<kMlaE4M3, false>(r[0], a0[0], a0[2]);
            key_pairs<kMlaE4M3, false>(r[1], a0[1], a0[3]);
            key_pairs<kMlaE4M3, false>(r[2], a1[0], a1[2]);
            key_pairs<kMlaE4M3, false>(r[3], a1[1], a1[3]);
          } else {
            key_pairs<kMlaE5M2, false>(r[0], a0[0], a0[2]);
            key_pairs<kMlaE5M2, false>(r[1], a0[1], a0[3]);
            key_pairs<kMlaE5M2, false>(r[2], a1[0], a1[2]);
            key_pairs<kMlaE5M2, false>(r[3], a1[1], a1[3]);
          }
          const int k0 = kR / 16 + 2 * j;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            mma16816<true>(accr[nt], a0, qf[k0][nt][0], qf[k0][nt][1]);
            mma16816<true>(accr[nt], a1, qf[k0 + 1][nt][0], qf[k0 + 1][nt][1]);
          }
        }
      }

      if constexpr (kVT) {  // the S warps are done with the stage (the PV warps never read it)
        __syncwarp();
        if (lane == 0) mla::mbar_arrive(smem_s + kEmptyOff + 8 * st);
      }
      // Scores (log2 units), masked; accumulator element i is the tile's row g + 8 (i >> 1) (key
      // gkey0 or gkey1), query row 2q + (i & 1).
      const int key0 = w.begin + c * kChunk;
      float sc[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int e = i & 1;
          const float v = acc[nt][i] * lat_f[nt][e] + accr[nt][i] * rope_f[nt][e];
          const int key = key0 + (i >> 1 ? gkey1 : gkey0);
          sc[nt][i] = key < lim[nt][e] && !tree_hides(tw[nt][e], key, w.first) ? v : -INFINITY;
        }
        // The warp's row maxima (over its 16 keys: the two halves, then the 8 lanes of a column).
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float mx = fmaxf(sc[nt][e], sc[nt][2 + e]);
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
          if (g == 0) red[(buf * kSWarps + warp) * kMaxRows + 8 * nt + 2 * q + e] = mx;
        }
      uint64_t t1 = tick();
      mla::named_sync(kBarMax, kSWarps * 32);
      tock(1, t1);
      float ref[NT][2], corr[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float mx = m[nt][e];
#pragma unroll
          for (int v = 0; v < kSWarps; ++v)
            mx = fmaxf(mx, red[(buf * kSWarps + v) * kMaxRows + 8 * nt + 2 * q + e]);
          // A row with no visible key yet keeps -inf: 0 as its reference gives exp2 = 0, not NaN.
          ref[nt][e] = mx == -INFINITY ? 0.0f : mx;
          corr[nt][e] = fast_exp2(m[nt][e] - ref[nt][e]);
          m[nt][e] = mx;
        }
      // P buffer `buf` was last read by the PV warps at chunk c - 2.
      t1 = tick();
      if (!kVT && c >= 2) mla::named_sync(kBarFree + buf, (kSWarps + kPvWarps) * 32);
      tock(2, t1);
      char* pb = smem + kPOff + buf * kMaxRows * kPStride;
      constexpr float kBoost = kFp8 ? 8.0f : 0.0f;  // f16 P: times 2^8
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float rsum = 0.0f;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint16_t b = p_bits<kFp8>(fast_exp2(sc[nt][2 * h + e] - ref[nt][e] + kBoost));
            rsum += p_value<kFp8>(b);  // the rounded weights P·V multiplies with
            *reinterpret_cast<uint16_t*>(pb + (8 * nt + 2 * q + e) * kPStride +
                                         (16 * warp + g + 8 * h) * 2) = b;
          }
          l[nt][e] = l[nt][e] * corr[nt][e] + rsum;
          if (warp == 0 && g == 0) corr_s[buf * kMaxRows + 8 * nt + 2 * q + e] = corr[nt][e];
        }
      mla::named_arrive(kBarReady + buf, (kSWarps + kPvWarps) * 32);
    }
    // The PV warps' last two P-free arrivals, then the row sums and maxima.
    for (int c = max(0, nchunks - 2); c < nchunks; ++c)
      mla::named_sync(kBarFree + (c & 1), (kSWarps + kPvWarps) * 32);
    float* lsum = reinterpret_cast<float*>(smem + kLsumOff);
    float* mrow = reinterpret_cast<float*>(smem + kMOff);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float s = l[nt][e];
        s += __shfl_xor_sync(0xffffffffu, s, 4);
        s += __shfl_xor_sync(0xffffffffu, s, 8);
        s += __shfl_xor_sync(0xffffffffu, s, 16);
        if (g == 0) {
          lsum[warp * kMaxRows + 8 * nt + 2 * q + e] = s;
          if (warp == 0) mrow[8 * nt + 2 * q + e] = m[nt][e];
        }
      }
    mla::named_arrive(kBarFinal, (kSWarps + kPvWarps) * 32);
    prof_flush(kProfSFull, kProfSTotal);
    return;
  }

  // ---- PV warps: output columns [128 pw, 128 pw + 128) (FlashMLA: tile pw) ----
  const int pw = warp - kSWarps;
  // PV warp 0 produces chunk c's rows: single rows, lanes taking keys lane and lane + 32; groups
  // of G = 4 or 8 rows (StageLayout), lane j < 64 / G taking keys G j..G j + G - 1 in one copy.
  // Keys past the block's end copy the first key's row (finite bytes, masked to P = 0), so every
  // stage expects the same bytes (a group holding the end copies its rows one by one). Slots are
  // looked up one chunk ahead of their copies.
  const char* cache = static_cast<const char*>(p.cache);
  const uint32_t rb = uint32_t(f.row_bytes);
  auto slots_of = [&](int c, int64_t* src) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int key = w.begin + c * kChunk + (groups ? G * lane : lane + 32 * i);
      if (key >= w.end) key = w.begin;
      src[i] = c < nchunks && (i == 0 || !groups) ? int64_t(w.slot_of(key, p.page_size)) * rb : 0;
    }
  };
  const uint64_t policy = mla::l2_evict_first_policy();
  auto produce = [&](int c, const int64_t* src) {  // into its stage, known to be free
    const int st = c % NS;
    const uint32_t full = smem_s + kFullOff + 8 * st;
    if (p.diag == 2) {  // math without loads: the stage keeps what it holds
      if (lane == 0) mla::mbar_arrive(full);
      return;
    }
    if (lane == 0) mla::mbar_arrive_expect_tx(full, kChunk * rb);
    __syncwarp();
    auto copy = [&](uint32_t dst, const char* from, uint32_t bytes) {
      if (p.evict_first)
        mla::bulk_copy_g2s_hint(dst, from, bytes, full, policy);
      else
        mla::bulk_copy_g2s(dst, from, bytes, full);
    };
    const uint32_t stage = stage0 + st * stage_bytes;
    if (!groups) {
#pragma unroll
      for (int i = 0; i < 2; ++i) copy(stage + (lane + 32 * i) * lay.gs, cache + src[i], rb);
    } else if (lane < lay.groups()) {
      const int k0 = w.begin + c * kChunk + G * lane;
      const uint32_t dst = stage + lane * lay.gs;
      if (k0 + G - 1 < w.end) {
        copy(dst, cache + src[0], G * rb);
      } else {
        for (int r = 0; r < G; ++r) {
          const int key = k0 + r < w.end ? k0 + r : w.begin;
          copy(dst + r * rb, cache + int64_t(w.slot_of(key, p.page_size)) * rb, rb);
        }
      }
    }
  };
  // L2 prefetch, p.l2_prefetch (D) chunks ahead of the stage loads (kMlaDecodeL2Prefetch says
  // why): chunk c's rows as runs of consecutive slots (a page's keys within the chunk), one
  // prefetch a run by the lane holding its first key; chunks NS..NS+D-1 after the first NS
  // stage loads, then chunk c + NS + D with the stage load of chunk c + NS. Runs are looked up
  // one refill ahead, as the slots are.
  const int D = p.diag == 2 ? 0 : p.l2_prefetch;
  auto runs_of = [&](int c, int64_t* off, uint32_t* bytes) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c0 = w.begin + c * kChunk, key = c0 + lane + 32 * i;
      bytes[i] = 0;
      off[i] = 0;
      if (D > 0 && c < nchunks && key < w.end) {
        const int in_page = key % p.page_size;
        if (in_page == 0 || key == c0) {
          const int n = min(min(p.page_size - in_page, w.end - key), c0 + kChunk - key);
          off[i] = int64_t(w.slot_of(key, p.page_size)) * rb;
          bytes[i] = uint32_t(n) * rb;
        }
      }
    }
  };
  auto prefetch = [&](const int64_t* off, const uint32_t* bytes) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (bytes[i] > 0) mla::bulk_prefetch_l2(cache + off[i], bytes[i]);
  };
  int64_t next_src[2];  // PV warp 0: the slots of chunk c + NS
  int64_t pf_off[2];    // and the runs of chunk c + NS + D
  uint32_t pf_bytes[2];
  if (pw == 0) {
    for (int c = 0; c < min(NS, nchunks); ++c) {
      slots_of(c, next_src);
      produce(c, next_src);
    }
    for (int c = NS; c < NS + D; ++c) {
      runs_of(c, pf_off, pf_bytes);
      prefetch(pf_off, pf_bytes);
    }
    slots_of(NS, next_src);
    runs_of(NS + D, pf_off, pf_bytes);
  }
  float o[8][NT][4];
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) o[j][nt][0] = o[j][nt][1] = o[j][nt][2] = o[j][nt][3] = 0.0f;
  float gscale = 0.0f;  // FlashMLA: o_true = gscale · o
  // Offsets in a stage of tile 0's rows this lane reads (tile ks: + ks · tstep): the ldmatrix.trans
  // row (bf16), rows 2q + {0, 1, 8, 9} (fp8 values, FlashMLA scales).
  const int vrow_off = lay.tile_row(0, (lane & 7) + (lane >> 4) * 8);
  int qrow_off[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) qrow_off[i] = lay.tile_row(0, 2 * q + (i & 1) + 8 * (i >> 1));
  const float* corr_s = reinterpret_cast<const float*>(smem + kCorrOff);
  for (int c = 0; c < nchunks; ++c) {
    const int st = c % NS, buf = c & 1;
    uint64_t t0 = tick();
    mla::named_sync(kBarReady + buf, (kSWarps + kPvWarps) * 32);
    tock(0, t0);
    if constexpr (kVT) {
      // The S warps freed the stage before P was ready: refill it now (two chunks ahead).
      if (pw == 0 && c + NS < nchunks) {
        t0 = tick();
        mla::mbar_wait(smem_s + kEmptyOff + 8 * st, (c / NS) & 1);
        tock(1, t0);
        t0 = tick();
        produce(c + NS, next_src);
        prefetch(pf_off, pf_bytes);
        slots_of(c + NS + 1, next_src);
        runs_of(c + NS + 1 + D, pf_off, pf_bytes);
        tock(2, t0);
      }
    } else {
      t0 = tick();
      mla::mbar_wait(smem_s + kFullOff + 8 * st, (c / NS) & 1);  // the stage's bytes, visible
      tock(1, t0);
    }
    const uint32_t st_s = stage0 + st * stage_bytes;
    const char* st_p = smem + kStages0 + st * stage_bytes;
    const float* vscale = reinterpret_cast<const float*>(smem + kVScaleOff + buf * kVScaleBytes);
    float fac[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) fac[nt][e] = corr_s[buf * kMaxRows + 8 * nt + 2 * q + e];
    // FlashMLA: tile pw's scale of tile ks's rows 2q + {0, 1, 8, 9}, over the chunk's largest.
    float sv[kChunk / 16][4];
    if constexpr (LK == kFlash) {
      float smax = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kChunk / 16; ++ks)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          sv[ks][i] = kVT ? vscale[4 * (16 * ks + 2 * q + (i & 1) + 8 * (i >> 1)) + pw]
                          : *reinterpret_cast<const float*>(st_p + qrow_off[i] + ks * lay.tstep +
                                                            kR + 4 * pw);
          smax = fmaxf(smax, sv[ks][i]);
        }
      smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, 1));
      smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, 2));
      const float inv = 1.0f / smax;
#pragma unroll
      for (int ks = 0; ks < kChunk / 16; ++ks)
#pragma unroll
        for (int i = 0; i < 4; ++i) sv[ks][i] *= inv;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) fac[nt][0] *= gscale * inv, fac[nt][1] *= gscale * inv;
      gscale = smax;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        o[j][nt][0] *= fac[nt][0];
        o[j][nt][1] *= fac[nt][1];
        o[j][nt][2] *= fac[nt][0];
        o[j][nt][3] *= fac[nt][1];
      }
    const uint32_t p_s = smem_s + kPOff + buf * kMaxRows * kPStride +
                         ((lane & 7) + (lane >> 4) * 8) * kPStride + ((lane >> 3) & 1) * 16;
#pragma unroll
    for (int ks = 0; ks < kChunk / 16; ++ks) {
      if (p.diag == 1 || p.diag == 3) break;  // loads only; 3: no PV math
      // Pᵀ fragments: n-tile nt = rows 8 nt..8 nt+7, b0 tile ks's rows (keys) 2q, +1, b1 + 8.
      uint32_t pb[NT][2];
      if constexpr (NT == 2) {
        uint32_t r[4];
        ldmatrix_x4(r, p_s + ks * 32);
        pb[0][0] = r[0], pb[0][1] = r[1], pb[1][0] = r[2], pb[1][1] = r[3];
      } else {
        uint32_t r[2];
        ldmatrix_x2(r, p_s + ks * 32);
        pb[0][0] = r[0], pb[0][1] = r[1];
      }
      if constexpr (LK == kFlash) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            const float2 x = unpack_f16x2(pb[nt][b]);
            pb[nt][b] = pack_f16x2(x.x * sv[ks][2 * b], x.y * sv[ks][2 * b + 1]);
          }
      }
      if constexpr (kVT) {
        // Vᵀ from the V tile as from bf16 rows: tile row 16 ks + (lane & 7) + (lane >> 4) · 8,
        // unit 16 pw + 2 j + ((lane >> 3) & 1), swizzled by the row's (lane & 7).
        const uint32_t v_s = smem_s + kStageOff + buf * kVTileBytes +
                             (16 * ks + (lane & 7) + (lane >> 4) * 8) * kVRowBytes + pw * 256;
        const int x = ((lane >> 3) & 1) ^ vtile_swizzle(lane & 7);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          uint32_t a[4];
          ldmatrix_x4_trans(a, v_s + (((2 * j) ^ x) << 4));
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mma16816<true>(o[j][nt], a, pb[nt][0], pb[nt][1]);
        }
      } else if constexpr (!kFp8) {
        // Vᵀ by ldmatrix.trans: m-tile j = columns 128 pw + 16 j + {g, g + 8}.
        const uint32_t v_s = st_s + vrow_off + ks * lay.tstep + pw * 256 + ((lane >> 3) & 1) * 16;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          uint32_t a[4];
          ldmatrix_x4_trans(a, v_s + j * 32);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mma16816<false>(o[j][nt], a, pb[nt][0], pb[nt][1]);
        }
      } else {
        // Tile ks's rows (keys) {2q, 2q+1, 2q+8, 2q+9}, bytes [128 pw + 16 g, + 16): m-tile
        // j = 2 cc + h is columns 128 pw + 16 g + 2 j (as "row g") and + 1 ("row g + 8").
        uint4 kv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          kv[i] = *reinterpret_cast<const uint4*>(st_p + qrow_off[i] + ks * lay.tstep + 128 * pw +
                                                  16 * g);
        const uint32_t w0[4] = {kv[0].x, kv[0].y, kv[0].z, kv[0].w};
        const uint32_t w1[4] = {kv[1].x, kv[1].y, kv[1].z, kv[1].w};
        const uint32_t w2[4] = {kv[2].x, kv[2].y, kv[2].z, kv[2].w};
        const uint32_t w3[4] = {kv[3].x, kv[3].y, kv[3].z, kv[3].w};
#pragma unroll
        for (int cc = 0; cc < 4; ++cc)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t a[4];
            value_pairs<kLatElem, kPvHw>(w0[cc], w1[cc], h, a[0], a[1]);
            value_pairs<kLatElem, kPvHw>(w2[cc], w3[cc], h, a[2], a[3]);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
              mma16816<true>(o[2 * cc + h][nt], a, pb[nt][0], pb[nt][1]);
          }
      }
    }
    __syncwarp();
    if (!kVT && lane == 0) mla::mbar_arrive(smem_s + kEmptyOff + 8 * st);  // done with it
    mla::named_arrive(kBarFree + buf, (kSWarps + kPvWarps) * 32);
    if (!kVT && pw == 0 && c + NS < nchunks) {  // refill once every PV warp is done with it
      t0 = tick();
      mla::mbar_wait(smem_s + kEmptyOff + 8 * st, (c / NS) & 1);
      tock(1, t0);
      t0 = tick();
      produce(c + NS, next_src);
      prefetch(pf_off, pf_bytes);
      slots_of(c + NS + 1, next_src);
      runs_of(c + NS + 1 + D, pf_off, pf_bytes);
      tock(2, t0);
    }
  }

  // ---- the output: normalized bf16 (no partials: one split) or the unnormalized partial ----
  mla::named_sync(kBarFinal, (kSWarps + kPvWarps) * 32);
  const float* lsum = reinterpret_cast<const float*>(smem + kLsumOff);
  const float* mrow = reinterpret_cast<const float*>(smem + kMOff);
  const float ofac = kConvV * (LK == kFlash ? gscale : 1.0f);
  constexpr float kUnboost = kFp8 ? 1.0f / 256.0f : 1.0f;  // the S warps' kBoost, undone
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int row = 8 * nt + 2 * q + e, r = w.row0 + row;
      if (r >= w.rows) continue;
      float sum = 0.0f;
#pragma unroll
      for (int v = 0; v < kSWarps; ++v) sum += lsum[v * kMaxRows + row];
      const int64_t grow = w.q_row0 + r;
      const bool one = p.partial_o == nullptr;
      const float inv = one ? (sum > 0.0f ? f.latent_scale * ofac / sum : 0.0f) : ofac * kUnboost;
      if constexpr (!kFp8 || kVT) {  // the ldmatrix.trans accumulators: columns 16 j + g (+ 8)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int col = 128 * pw + 16 * j + g + 8 * hh;
            const float v = o[j][nt][2 * hh + e] * inv;
            if (one)
              p.out[grow * kR + col] = float_to_bf16(v);
            else
              mla::partial_row(p, int(grow))[col] = v;
          }
      } else {
        const int col = 128 * pw + 16 * g;  // 16 consecutive columns: m-tile j gives 2j, 2j + 1
        if (one) {
          uint32_t pk[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) pk[j] = pack_bf16x2(o[j][nt][e] * inv, o[j][nt][2 + e] * inv);
          uint4* dst = reinterpret_cast<uint4*>(p.out + grow * kR + col);
          dst[0] = make_uint4(pk[0], pk[1], pk[2], pk[3]);
          dst[1] = make_uint4(pk[4], pk[5], pk[6], pk[7]);
        } else {
          float4* dst = reinterpret_cast<float4*>(mla::partial_row(p, int(grow)) + col);
#pragma unroll
          for (int j = 0; j < 4; ++j)
            dst[j] = make_float4(o[2 * j][nt][e] * inv, o[2 * j][nt][2 + e] * inv,
                                 o[2 * j + 1][nt][e] * inv, o[2 * j + 1][nt][2 + e] * inv);
        }
      }
      // The sums of fp8 rows add P · 2^8 (kBoost): partials and sums are stored times 2^-8, so
      // that max + log2(sum) is the row's log-sum-exp (DCP's lse_out); a power of two, so the
      // split merge's result keeps its bits.
      if (pw == 0 && g == 0) mla::store_ml(p, int(grow), mrow[row], sum * kUnboost);
    }
  prof_flush(kProfPvReady, kProfPvTotal);
}

}  // namespace strata::cuda::mla_decode
