// Pieces shared by the two wgmma MLA kernels (mla_attention_wgmma.cu: all threads load between
// block-wide barriers; mla_attention_wgmma_pipe.cu: warpgroup 1 loads, mbarriers per 64-column
// group): bf16 rows of R = 512 + P = 64 values, 64 query rows a block, 64-key chunks, the rows in
// the 128-byte swizzled layout wgmma reads ([9 column groups][64 rows][64], 16-byte piece c of
// row r at c ^ (r % 8)), S = Q·Kᵀ on warpgroup 0 (m64n64, Q and K from shared memory), the online
// softmax of S into P's A fragments, O[:, 256 wg + ...] += P·V (m64n128, V = the first 512
// columns of the same K tile as an MN-major operand).
#pragma once

#include "backend/cuda/attention_wgmma.cuh"
#include "backend/cuda/mla_device.cuh"

namespace strata::cuda::mla_wgmma {

using namespace attn;

constexpr int kThreads = 256;
constexpr int kRows = 64;
constexpr int kChunk = 64;  // keys a stage (p.chunk)
constexpr int kR = 512, kP = 64, kD = kR + kP;
constexpr int kPieces = kD / 8;              // 16-byte pieces of a row
constexpr int kGroups = kD / 64;             // 64-column groups of a row (9)
constexpr int kTileBytes = kChunk * kD * 2;  // = kRows · kD · 2 (Q)

// Byte offset of 16-byte piece c of row r in a swizzled [groups][rows][64] bf16 tile.
__device__ __forceinline__ uint32_t swz(int r, int c, int rows) {
  return uint32_t((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// S (+)= Q·Kᵀ over k-steps [ks0, ks1) (16 columns each; 4 a column group).
__device__ __forceinline__ void qk(float (&sc)[32], uint32_t q_s, uint32_t k_s, int ks0, int ks1) {
#pragma unroll
  for (int ks = ks0; ks < ks1; ++ks) {
    const uint32_t qa = q_s + uint32_t((ks / 4) * kRows * 128 + (ks % 4) * 32);
    const uint32_t kb = k_s + uint32_t((ks / 4) * kChunk * 128 + (ks % 4) * 32);
    wgmma_ss_m64n64k16<0>(sc, make_smem_desc(qa, 16, 1024), make_smem_desc(kb, 16, 1024), ks > 0);
  }
}

// O[:, cols of half h of this warpgroup] += P · V over the chunk: 4 k-steps of 16 keys, two
// n128 halves (groups 4·wg + 2h, + 1; 64-column groups kChunk · 128 bytes apart).
__device__ __forceinline__ void pv(float (&o)[2][64], const uint32_t (&pa)[4][4], uint32_t k_s,
                                   int wg) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kChunk / 16; ++kk) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t v = k_s + uint32_t((4 * wg + 2 * h) * kChunk * 128 + kk * 16 * 128);
      wgmma_rs_m64n128k16<1>(o[h], pa[kk], make_smem_desc(v, kChunk * 128, 1024));
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  reg_fence<64>(o[0]);
  reg_fence<64>(o[1]);
}

__device__ __forceinline__ void rescale(float (&o)[2][64], float c0, float c1) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      o[h][4 * i] *= c0;
      o[h][4 * i + 1] *= c0;
      o[h][4 * i + 2] *= c1;
      o[h][4 * i + 3] *= c1;
    }
}

// Whether every key of the chunk [chunk0, chunk0 + kChunk) is visible to all rows of the warp
// (lim: the thread's rows' causal limits, tw: their tree words, first: the first new key), so
// softmax may skip the mask. Warp-uniform (one vote), so the branch does not diverge.
__device__ __forceinline__ bool chunk_open(int chunk0, const int (&lim)[2], const uint64_t (&tw)[2],
                                           int first) {
  const int end = chunk0 + kChunk;
  const bool mine = end <= lim[0] && end <= lim[1] && ((tw[0] | tw[1]) == 0 || end <= first);
  return __all_sync(0xffffffffu, mine);
}

// Warpgroup 0 after S of a chunk (keys from key0 = the chunk's first key + 2 (lane % 4)): the
// mask (keys < lim[h] for the thread's rows g, g + 8 of its warp), the online softmax in log2
// units (qk = score scale), P rounded to bf16 as the A fragments of P·V (the row sums add the
// rounded weights), the rows' rescale factors.
// Draft trees: tw[h] the rows' ancestor words (tree_mask.cuh), first the sequence's first new key.
// `open` (warp-uniform, chunk_open): every key of the chunk is visible to the warp's rows, so the
// mask is skipped. At 128 heads the kernel is bound by this loop's instructions: the per-score
// causal and tree tests cost 368 -> 234 TFLOP/s when they ran on every chunk (2026-12-02).
__device__ __forceinline__ void softmax(float (&sc)[32], const int (&lim)[2],
                                        const uint64_t (&tw)[2], int first, int key0, bool open,
                                        float qk, float (&m)[2], float (&l)[2],
                                        uint32_t (&pa)[4][4], float (&corr)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
    if (open) {
#pragma unroll
      for (int i = 0; i < kChunk / 4; ++i) {
        float& s = sc[4 * (i / 2) + 2 * h + i % 2];
        s *= qk;
        mx = fmaxf(mx, s);
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < kChunk / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& s = sc[4 * nt + 2 * h + e];
          const int key = key0 + nt * 8 + e;
          s = key < lim[h] && !tree_hides(tw[h], key, first) ? s * qk : -INFINITY;
          mx = fmaxf(mx, s);
        }
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[h], mx);
    // A row with no visible key yet keeps -inf: 0 as its reference gives exp2 = 0, not NaN.
    const float ref = m_new == -INFINITY ? 0.0f : m_new;
    corr[h] = fast_exp2(m[h] - ref);
    m[h] = m_new;
    float rs = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kChunk / 8; ++nt) {
      const int e0 = 4 * nt + 2 * h;
      const uint32_t pk = pack_bf16x2(fast_exp2(sc[e0] - ref), fast_exp2(sc[e0 + 1] - ref));
      sc[e0] = __uint_as_float(pk << 16);  // the rounded weights: sums match P·V's
      sc[e0 + 1] = __uint_as_float(pk & 0xffff0000u);
      rs += sc[e0] + sc[e0 + 1];
    }
    l[h] = l[h] * corr[h] + rs;
  }
#pragma unroll
  for (int kk = 0; kk < kChunk / 16; ++kk) {
    pa[kk][0] = pack_bf16x2(sc[8 * kk + 0], sc[8 * kk + 1]);
    pa[kk][1] = pack_bf16x2(sc[8 * kk + 2], sc[8 * kk + 3]);
    pa[kk][2] = pack_bf16x2(sc[8 * kk + 4], sc[8 * kk + 5]);
    pa[kk][3] = pack_bf16x2(sc[8 * kk + 6], sc[8 * kk + 7]);
  }
}

// The output of 64 rows: warpgroup wg's columns [256 wg, 256 wg + 256) of the thread's rows
// (rows 16 wi + g, + 8 within the block), with the rows' (m, l) already gathered.
__device__ __forceinline__ void store_rows(const MlaAttentionParams& p, const mla::BlockWork& w,
                                           const float (&o)[2][64], int wg, int wi, int g, int c2,
                                           const float (&mh)[2], const float (&sum)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = w.row0 + wi * 16 + g + 8 * h;
    if (r >= w.rows) continue;
    const int grow = w.q_row0 + r;
    const float inv = sum[h] > 0.0f ? p.fmt.latent_scale / sum[h] : 0.0f;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int nt = 0; nt < 16; ++nt)
        mla::store_pair(p, grow, wg * 256 + half * 128 + nt * 8 + c2, o[half][4 * nt + 2 * h],
                        o[half][4 * nt + 2 * h + 1], inv);
    if (wg == 0 && c2 == 0) mla::store_ml(p, grow, mh[h], sum[h]);
  }
}

}  // namespace strata::cuda::mla_wgmma
