// The MLA decode kernel's PV warps (mla_decode.cuh): the stage loads (PV warp 0), O += P·V over
// the S warps' P (mla_decode_s_warps.cuh), and the block's output.
#pragma once

#include "backend/cuda/mla_decode_block.cuh"
#include "backend/cuda/mla_decode_mma.cuh"

namespace strata::cuda::mla_decode {

// PV warp pw = b.warp - (the S warps): output columns [128 pw, 128 pw + 128)
// (FlashMLA: tile pw) of the block's 8 NT rows.
template <int NT, int LK, int CVT, bool PROF, int SG = 1>
__device__ __forceinline__ void pv_warps(const MlaAttentionParams& p, const Block& b,
                                         WaitProfile<PROF>& prof) {
  using K = KindTraits<LK, CVT>;
  constexpr bool kFp8 = K::kFp8, kPvHw = K::kPvHw, kVT = K::kVT;
  constexpr int kLatElem = K::kLatElem, kStages0 = K::kStages0;
  constexpr float kConvV = K::kConvV;
  const mla::BlockWork& w = b.w;
  const int warp = b.warp, lane = b.lane, g = b.g, q = b.q;
  const MlaRowFormat& f = p.fmt;
  const int NS = b.NS, nchunks = b.nchunks;
  const StageLayout& lay = b.lay;
  const bool groups = b.groups;
  const int G = b.G, stage_bytes = b.stage_bytes;
  char* const smem = b.smem;
  const uint32_t smem_s = b.smem_s, stage0 = b.stage0;
  const int pw = warp - s_group_count(SG) * kSWarps;
  constexpr int kAll = block_threads(SG);  // the P / final barriers' threads
  // PV warp 0 produces chunk c's rows: single rows, lanes taking keys lane and lane + 32; groups
  // of G = 4 or 8 rows (StageLayout), lane j < 64 / G taking keys G j..G j + G - 1 in one copy.
  // Keys past the block's end copy the first key's row (finite bytes, masked to P = 0), so every
  // stage expects the same bytes (a group holding the end copies its rows one by one). Slots are
  // looked up one chunk ahead of their copies.
  const char* cache = static_cast<const char*>(p.cache);
  const uint32_t rb = uint32_t(f.row_bytes);
  const int ps = p.page_size, pshift = (ps & (ps - 1)) == 0 ? __ffs(ps) - 1 : -1;
  auto slots_of = [&](int c, int64_t* src) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int key = w.begin + c * kChunk + (groups ? G * lane : lane + 32 * i);
      if (key >= w.end) key = w.begin;
      src[i] = c < nchunks && (i == 0 || !groups) ? int64_t(w.slot_of(key, ps, pshift)) * rb : 0;
    }
  };
  const uint64_t policy = mla::l2_evict_first_policy();
  // Chunk c into stage st (c % NS: the callers keep it without a division), known to be free.
  auto produce = [&](int c, int st, const int64_t* src) {
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
          copy(dst + r * rb, cache + int64_t(w.slot_of(key, ps, pshift)) * rb, rb);
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
        const int in_page = pshift >= 0 ? key & (ps - 1) : key % ps;
        if (in_page == 0 || key == c0) {
          const int n = min(min(p.page_size - in_page, w.end - key), c0 + kChunk - key);
          off[i] = int64_t(w.slot_of(key, ps, pshift)) * rb;
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
  // p.early_kv: the stages of chunks of old keys only (below w.first, written by earlier
  // steps) go out before the PDL wait; the rest after it.
  const int first_stages = min(NS, nchunks);
  int early = 0;
  if (p.early_kv) {
    while (early < first_stages && min(w.begin + (early + 1) * kChunk, w.end) <= w.first) ++early;
    if (pw == 0)
      for (int c = 0; c < early; ++c) {
        slots_of(c, next_src);
        produce(c, c, next_src);  // c < NS
      }
    pdl_wait();
    pdl_trigger();
  }
  if (pw == 0) {
    for (int c = early; c < first_stages; ++c) {
      slots_of(c, next_src);
      produce(c, c, next_src);  // c < NS
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
  // Chunk c's stage st = c % NS and its mbarriers' phase (c / NS) & 1, kept by increments: a
  // runtime NS made each an integer division a chunk (ncu, 2026-12-04).
  int st = 0;
  uint32_t phase = 0;
  for (int c = 0; c < nchunks; ++c, st = st + 1 == NS ? 0 : st + 1, phase ^= st == 0 ? 1 : 0) {
    const int buf = c & 1;
    uint64_t t0 = prof.tick();
    mla::named_sync(kBarReady + buf, kAll);
    prof.tock(0, t0);
    if constexpr (kVT) {
      // The S warps freed the stage before P was ready: refill it now (two chunks ahead).
      if (pw == 0 && c + NS < nchunks) {
        t0 = prof.tick();
        mla::mbar_wait(smem_s + kEmptyOff + 8 * st, phase);
        prof.tock(1, t0);
        t0 = prof.tick();
        produce(c + NS, st, next_src);
        prefetch(pf_off, pf_bytes);
        slots_of(c + NS + 1, next_src);
        runs_of(c + NS + 1 + D, pf_off, pf_bytes);
        prof.tock(2, t0);
      }
    } else {
      t0 = prof.tick();
      mla::mbar_wait(smem_s + kFullOff + 8 * st, phase);  // the stage's bytes, visible
      prof.tock(1, t0);
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
    mla::named_arrive(kBarFree + buf, kAll);
    if (!kVT && pw == 0 && c + NS < nchunks) {  // refill once every PV warp is done with it
      t0 = prof.tick();
      mla::mbar_wait(smem_s + kEmptyOff + 8 * st, phase);
      prof.tock(1, t0);
      t0 = prof.tick();
      produce(c + NS, st, next_src);
      prefetch(pf_off, pf_bytes);
      slots_of(c + NS + 1, next_src);
      runs_of(c + NS + 1 + D, pf_off, pf_bytes);
      prof.tock(2, t0);
    }
  }

  // ---- the output: normalized bf16 (no partials: one split) or the unnormalized partial ----
  mla::named_sync(kBarFinal, kAll);
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
  prof.flush(p, lane, kProfPvReady, kProfPvTotal);
}

}  // namespace strata::cuda::mla_decode
