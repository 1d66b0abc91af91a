// The MLA decode kernel's S warps (mla_decode.cuh): scores of the stage's keys, the softmax's row
// maxima and sums, and P for the PV warps (mla_decode_pv_warps.cuh).
#pragma once

#include <cfloat>

#include "backend/cuda/mla_decode_block.cuh"
#include "backend/cuda/mla_decode_mma.cuh"

namespace strata::cuda::mla_decode {

// S warp b.warp of group grp = b.warp / kSWarps: keys [16 warp, 16 warp + 16) of each chunk (warp
// = b.warp % kSWarps), scores of NT n-tiles of 8 rows, of which it owns NO (the softmax, P, the
// sums): rows [rb, rb + 8 NO).
//
// Two groups (SG, MlaAttentionParams::s_groups), 12 warps a block, at 16 rows. Why: there the S
// warps set the chunk's pace -- the PV warps waited for P in 27% of their samples (ncu, H200,
// 2026-12-04) while 8-row blocks, half the S work a warp, read 88-91% of copy against 16 rows'
// 82-86%; and over fp8 rows the S warps also convert every value.
//  - kSRows: each group 8 rows (NT = NO = 1). Every row's scores, maxima, P and sums are computed
//    as with one group (the same mma chains, the 4 warps' maxima in the same order): the same
//    bits. Both groups read (and convert) every key; the V tile (kVT) is written by group 0.
//  - kSDims: each group half of every key's dims -- latent k-steps [16 grp, 16 grp + 16) (FlashMLA:
//    tiles 2 grp, 2 grp + 1), rope k-steps [2 grp, 2 grp + 2) -- for all 16 rows (NT = 2), so each
//    value is read and converted once (and written to the V tile by its group); the groups trade
//    the partial scores of each other's 8 rows through shared memory (kXchgBytes, two buffers)
//    and each then owns 8 rows (NO = 1). A score is group 0's part + group 1's (other sums than
//    one group's: not the same bits).
template <int NT, int LK, int CVT, bool PROF, int SG = kSOne>
__device__ __forceinline__ void s_warps(const MlaAttentionParams& p, const Block& b,
                                        WaitProfile<PROF>& prof) {
  constexpr bool kDims = SG == kSDims;
  static_assert(SG == kSOne || (SG == kSRows && NT == 1) || (kDims && NT == 2), "S form");
  constexpr int NO = kDims ? 1 : NT;  // n-tiles owned
  // Q k-steps held (latent kQL, then the rope's) and the first global latent / rope k-step.
  constexpr int kQL = kDims ? kR / 32 : kR / 16, kQS = kQL + (kDims ? kP / 32 : kP / 16);
  using K = KindTraits<LK, CVT>;
  constexpr bool kFp8 = K::kFp8, kSHw = K::kSHw, kVT = K::kVT, kPairs02 = K::kPairs02;
  constexpr int kLatElem = K::kLatElem, kStages0 = K::kStages0;
  constexpr float kConvS = K::kConvS;
  const mla::BlockWork& w = b.w;
  const int lane = b.lane, g = b.g, q = b.q;
  // warp: its index in the group (one group: b.warp, and grp 0 known to the compiler).
  const int grp = SG == kSOne ? 0 : b.warp / kSWarps;
  const int warp = SG == kSOne ? b.warp : b.warp % kSWarps;
  const int rb = 8 * NO * grp;    // the first row owned
  const int rq = kDims ? 0 : rb;  // the first row scored
  const int kl0 = kDims ? kQL * grp : 0, kr0 = kDims ? (kQS - kQL) * grp : 0;
  constexpr int kAll = block_threads(SG);  // the P / final barriers' threads
  const int bar_max = grp == 0 ? kBarMax : kBarMax1;
  const bool vt_writer = SG != kSRows || grp == 0;  // kVT: stores V tile values and scales
  const MlaRowFormat& f = p.fmt;
  const int NS = b.NS, nchunks = b.nchunks;
  const StageLayout& lay = b.lay;
  const int stage_bytes = b.stage_bytes;
  char* const smem = b.smem;
  const uint32_t smem_s = b.smem_s, stage0 = b.stage0;
  const int rope_elem = f.rope_elem;
  const bool rope_f16 = rope_elem != kMlaBf16;
  if (p.early_kv) {  // q is the previous kernel's output (mla_decode_kernel.cuh)
    pdl_wait();
    pdl_trigger();
  }
  // Q of rows rq + 8 nt + g as B fragments: global k-steps 0..31 the latent, 32..35 the rope; held:
  // i < kQL latent k-step kl0 + i, then rope k-step kr0 + i - kQL.
  bool qok[NT];
  const uint16_t* qrow[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int r = rq + 8 * nt + g;
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
  uint32_t qf[kQS][NT][2];
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
    for (int i = 0; i < kQS; ++i) {
      qf[i][nt][0] = qf[i][nt][1] = 0u;
      if (!qok[nt]) continue;
      const bool rope = i >= kQL;
      const int ks = rope ? kR / 16 + kr0 + i - kQL : kl0 + i;
      const uint16_t* at = qrow[nt] + 16 * ks;
      if ((!rope && !kFp8) || (rope && !rope_f16)) {  // bf16 pairs (2c, 2c+1), (2c+8, 2c+9)
        qf[i][nt][0] = *reinterpret_cast<const uint32_t*>(at + 2 * q);
        qf[i][nt][1] = *reinterpret_cast<const uint32_t*>(at + 8 + 2 * q);
      } else {
        f16_pairs(at + 4 * q, qs[nt], rope || kPairs02, qf[i][nt]);
      }
    }
  }
  // Score factors of this lane's accumulator rows rq + 8 nt + 2q + e (the row's lanes hold its
  // qs); the limits and tree words of the rows it owns, rb + 8 nt + 2q + e.
  const float ls = f.latent_scale * p.scale_log2 * kConvS;
  const float rs = f.rope_scale * p.scale_log2 * (rope_elem == kMlaE4M3 ? 256.0f : 1.0f);
  float lat_f[NT][2], rope_f[NT][2];
  int lim[NO][2];
  uint64_t tw[NO][2];  // draft trees: the rows' ancestor words
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float inv = 1.0f / __shfl_sync(0xffffffffu, qs[nt], 4 * (2 * q + e));
      lat_f[nt][e] = kFp8 ? ls * inv : ls;
      rope_f[nt][e] = rope_f16 ? rs * inv : rs;
    }
#pragma unroll
  for (int nt = 0; nt < NO; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      lim[nt][e] = w.limit(p, w.row0 + rb + 8 * nt + 2 * q + e);
      tw[nt][e] = w.tree_word_of(p, w.row0 + rb + 8 * nt + 2 * q + e);
    }
  // A chunk below every one of this lane's rows' limits, with no draft tree among them, needs no
  // mask: all but a split's last chunk or two in decode. (The per-element test, tree word
  // included, was ~120 of the S warps' ~500 instructions a chunk at 16 rows, and the PV warps
  // wait for the S warps: ncu, H200, 2026-12-04.)
  int lim_min = lim[0][0];
  bool trees = false;
#pragma unroll
  for (int nt = 0; nt < NO; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      lim_min = min(lim_min, lim[nt][e]);
      trees = trees || tw[nt][e] != 0;
    }

  float m[NO][2], l[NO][2];
#pragma unroll
  for (int nt = 0; nt < NO; ++nt) m[nt][0] = m[nt][1] = -INFINITY, l[nt][0] = l[nt][1] = 0.0f;
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

  // st = c % NS and the phase (c / NS) & 1 by increments (no integer division a chunk).
  int st = 0;
  uint32_t phase = 0;
  for (int c = 0; c < nchunks; ++c, st = st + 1 == NS ? 0 : st + 1, phase ^= st == 0 ? 1 : 0) {
    const int buf = c & 1;
    uint64_t t0 = prof.tick();
    mla::mbar_wait(smem_s + kFullOff + 8 * st, phase);
    prof.tock(0, t0);
    const uint32_t st_s = stage0 + st * stage_bytes;
    const char* st_p = smem + kStages0 + st * stage_bytes;
    const uint32_t krow = st_s + lrow;
    // V tile `buf` (and P buffer `buf`) were last read by the PV warps at chunk c - 2.
    t0 = prof.tick();
    if (kVT && c >= 2) mla::named_sync(kBarFree + buf, kAll);
    prof.tock(2, t0);
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
      for (int i = 0; i < kQL; ++i) {
        uint32_t a[4];
        ldmatrix_x4(a, krow + (kl0 + i) * 32);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          mma16816<false>(a2[i & 1][nt], a, qf[i][nt][0], qf[i][nt][1]);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[nt][i] = a2[0][nt][i] + a2[1][nt][i];
    } else {
      // 32 bytes a row (two k-steps) per ldmatrix: matrices (keys 0-7 | 8-15) x (bytes 0-15 |
      // 16-31); FlashMLA: each 128-value tile (4 of them) scaled by its key's tile scale.
      // kSDims: this group's half (FlashMLA: tiles 2 grp, 2 grp + 1; e4m3: ldmatrix 8 grp..).
      constexpr int kTiles = LK == kFlash ? kR / kMlaFlashTile : 1;
      constexpr int kPerTile = (kR / 32) / kTiles;
      constexpr int kChains = LK == kFlash ? 1 : 2;  // FlashMLA: chains of 8 per tile anyway
      constexpr int kOwnTiles = kDims && kTiles > 1 ? kTiles / 2 : kTiles;
      constexpr int kOwnPerTile = kDims && kTiles == 1 ? kPerTile / 2 : kPerTile;
#pragma unroll
      for (int tt = 0; tt < kOwnTiles; ++tt) {
        const int t = (kDims && kTiles > 1 ? kOwnTiles * grp : 0) + tt;
        float a2[kChains][NT][4] = {};
#pragma unroll
        for (int jj = 0; jj < kOwnPerTile; ++jj) {
          const int j = t * kPerTile + (kDims && kTiles == 1 ? kOwnPerTile * grp : 0) + jj;
          const int qi = 2 * (tt * kOwnPerTile + jj);  // its first k-step held (2 j - kl0)
          uint32_t r[4], a0[4], a1[4];
          ldmatrix_x4(r, krow + j * 32);
          key_pairs<kLatElem, kSHw>(r[0], a0[0], a0[2]);
          key_pairs<kLatElem, kSHw>(r[1], a0[1], a0[3]);
          key_pairs<kLatElem, kSHw>(r[2], a1[0], a1[2]);
          key_pairs<kLatElem, kSHw>(r[3], a1[1], a1[3]);
          if (kVT && vt_writer) {  // values 32 j + 4 q.. (a0) and 32 j + 16 + 4 q.. (a1)
            store_v(j, j & 1, 0, a0[0], a0[2]);
            store_v(j, j & 1, 8, a0[1], a0[3]);
            store_v(j, 2 + (j & 1), 0, a1[0], a1[2]);
            store_v(j, 2 + (j & 1), 8, a1[1], a1[3]);
          }
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            mma16816<true>(a2[0][nt], a0, qf[qi][nt][0], qf[qi][nt][1]);
            mma16816<true>(a2[kChains - 1][nt], a1, qf[qi + 1][nt][0], qf[qi + 1][nt][1]);
          }
        }
        float s0 = 1.0f, s1 = 1.0f;  // the tile's rows (keys) g and g + 8
        if constexpr (LK == kFlash) {
          s0 = *reinterpret_cast<const float*>(st_p + srow0 + kR + 4 * t);
          s1 = *reinterpret_cast<const float*>(st_p + srow1 + kR + 4 * t);
          if (kVT && vt_writer && q == t) vscale[4 * vr0 + t] = s0, vscale[4 * (vr0 + 8) + t] = s1;
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
    // The rope part: bf16 (4 k-steps) or fp8 (2 ldmatrix of 32 bytes), in its own accumulator
    // (kSDims: the group's half, k-steps kr0, kr0 + 1).
    if (!math) {
    } else if (rope_elem == kMlaBf16) {
#pragma unroll
      for (int i = kQL; i < kQS; ++i) {
        uint32_t a[4];
        ldmatrix_x4(a, krow + rope_off + (kr0 + i - kQL) * 32);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma16816<false>(accr[nt], a, qf[i][nt][0], qf[i][nt][1]);
      }
    } else {
#pragma unroll
      for (int jj = 0; jj < (kQS - kQL) / 2; ++jj) {
        const int j = kr0 / 2 + jj, k0 = kQL + 2 * jj;
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
    const bool open = !trees && key0 + kChunk <= lim_min;
    float part[NT][4], sc[NO][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = i & 1;
        part[nt][i] = acc[nt][i] * lat_f[nt][e] + accr[nt][i] * rope_f[nt][e];
      }
    if constexpr (kDims) {
      // The other group's rows' partial scores out, this group's in (buffer `buf`: the other
      // group read buffer buf of chunk c - 2 before it reached the trade of chunk c - 1).
      // (Selects, not part[grp]: a register array indexed at run time would go to local memory.)
      float4* xchg = reinterpret_cast<float4*>(smem + kStages0 + NS * stage_bytes);
      const bool g0 = grp == 0;
      xchg[((buf * 2 + grp) * kSWarps + warp) * 32 + lane] =
          g0 ? make_float4(part[1][0], part[1][1], part[1][2], part[1][3])
             : make_float4(part[0][0], part[0][1], part[0][2], part[0][3]);
      uint64_t tx = prof.tick();
      mla::named_sync(kBarXchg, 2 * kSWarps * 32);
      prof.tock(1, tx);
      const float4 in = xchg[((buf * 2 + 1 - grp) * kSWarps + warp) * 32 + lane];
      // Group 0's part first, in either group: one sum a score.
      sc[0][0] = g0 ? part[0][0] + in.x : in.x + part[1][0];
      sc[0][1] = g0 ? part[0][1] + in.y : in.y + part[1][1];
      sc[0][2] = g0 ? part[0][2] + in.z : in.z + part[1][2];
      sc[0][3] = g0 ? part[0][3] + in.w : in.w + part[1][3];
    } else {
#pragma unroll
      for (int nt = 0; nt < NO; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) sc[nt][i] = part[nt][i];
    }
    if (!open) {
#pragma unroll
      for (int nt = 0; nt < NO; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int e = i & 1, key = key0 + (i >> 1 ? gkey1 : gkey0);
          if (key >= lim[nt][e] || tree_hides(tw[nt][e], key, w.first)) sc[nt][i] = -INFINITY;
        }
    }
    // The warp's row maxima (over its 16 keys: the two halves, then the 8 lanes of a column).
#pragma unroll
    for (int nt = 0; nt < NO; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float mx = fmaxf(sc[nt][e], sc[nt][2 + e]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        if (g == 0) red[(buf * kSWarps + warp) * kMaxRows + rb + 8 * nt + 2 * q + e] = mx;
      }
    uint64_t t1 = prof.tick();
    mla::named_sync(bar_max, kSWarps * 32);
    prof.tock(1, t1);
    float ref[NO][2], corr[NO][2];
#pragma unroll
    for (int nt = 0; nt < NO; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float mx = m[nt][e];
#pragma unroll
        for (int v = 0; v < kSWarps; ++v)
          mx = fmaxf(mx, red[(buf * kSWarps + v) * kMaxRows + rb + 8 * nt + 2 * q + e]);
        // A row with no visible key yet keeps -inf: 0 as its reference gives exp2 = 0, not NaN.
        ref[nt][e] = mx == -INFINITY ? 0.0f : mx;
        corr[nt][e] = fast_exp2(m[nt][e] - ref[nt][e]);
        m[nt][e] = mx;
      }
    // P buffer `buf` was last read by the PV warps at chunk c - 2.
    t1 = prof.tick();
    if (!kVT && c >= 2) mla::named_sync(kBarFree + buf, kAll);
    prof.tock(2, t1);
    char* pb = smem + kPOff + buf * kMaxRows * kPStride;
    constexpr float kBoost = kFp8 ? 8.0f : 0.0f;  // f16 P: times 2^8
#pragma unroll
    for (int nt = 0; nt < NO; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float rsum = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint16_t b = p_bits<kFp8>(fast_exp2(sc[nt][2 * h + e] - ref[nt][e] + kBoost));
          rsum += p_value<kFp8>(b);  // the rounded weights P·V multiplies with
          *reinterpret_cast<uint16_t*>(pb + (rb + 8 * nt + 2 * q + e) * kPStride +
                                       (16 * warp + g + 8 * h) * 2) = b;
        }
        l[nt][e] = l[nt][e] * corr[nt][e] + rsum;
        if (warp == 0 && g == 0) corr_s[buf * kMaxRows + rb + 8 * nt + 2 * q + e] = corr[nt][e];
      }
    mla::named_arrive(kBarReady + buf, kAll);
  }
  // The PV warps' last two P-free arrivals, then the row sums and maxima.
  for (int c = max(0, nchunks - 2); c < nchunks; ++c) mla::named_sync(kBarFree + (c & 1), kAll);
  float* lsum = reinterpret_cast<float*>(smem + kLsumOff);
  float* mrow = reinterpret_cast<float*>(smem + kMOff);
#pragma unroll
  for (int nt = 0; nt < NO; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float s = l[nt][e];
      s += __shfl_xor_sync(0xffffffffu, s, 4);
      s += __shfl_xor_sync(0xffffffffu, s, 8);
      s += __shfl_xor_sync(0xffffffffu, s, 16);
      if (g == 0) {
        lsum[warp * kMaxRows + rb + 8 * nt + 2 * q + e] = s;
        if (warp == 0) mrow[rb + 8 * nt + 2 * q + e] = m[nt][e];
      }
    }
  mla::named_arrive(kBarFinal, kAll);
  prof.flush(p, lane, kProfSFull, kProfSTotal);
}

}  // namespace strata::cuda::mla_decode
