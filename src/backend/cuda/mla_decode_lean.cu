// The lean MLA decode kernel (mla_attention.h kMlaDecodeLean; CudaTunables::mla_lean_max_rows):
// up to 16 query rows of one sequence a block, bf16 rows of R = 512 latent + P = 64 rope values,
// four warps with no roles. Why: at batch 1 the decode kernel (mla_decode.cuh) is its blocks'
// fixed latency — a block's first chunk ~9K cycles whether or not its keys load (mla_bench --what
// batch1, H200, 2026-12-04), a warp-specialized pipeline built to stream batch 64's keys. Here a
// block copies its keys before its PDL wait (all but the step's new rows, which the previous
// kernel writes), then per 64-key chunk:
//  - S = Q·Kᵀ: warp w the chunk's keys 16w.. 16w + 15 (two n8 tiles), the 36 k-steps (latent and
//    rope: one scale for both) in two chains a tile; Q and K from shared memory by ldmatrix (rows
//    padded to 1,168 bytes: 8 consecutive rows fall on distinct banks);
//  - the rows' maxima over the warps through shared memory, P = 2^(s - m) rounded to bf16 into
//    shared memory, the sums of the rounded values (as the decode kernel's bf16 path);
//  - O += P·V: warp w the columns 128w.. 128w + 127 (16 n8 tiles, V by ldmatrix.trans).
// The output is the decode kernel's: normalized bf16 rows with one split, else unnormalized
// partial rows and (m, l) for the split merge (mla_combine_kernel).
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/mla_attention.h"
#include "backend/cuda/mla_device.cuh"

namespace strata::cuda {
namespace {

using attn::cp_async16_zfill;
using attn::fast_exp2;
using attn::ldmatrix_x4;
using attn::ldmatrix_x4_trans;
using attn::pack_bf16x2;
using attn::smem_addr;

constexpr int kR = 512, kP = 64, kW = kR + kP;
constexpr int kRows = 16, kChunk = 64, kWarps = 4;
constexpr int kRowBytes = 2 * kW;               // 1,152
constexpr int kStride = kRowBytes + 16;         // 1,168: 292 words, 4 banks apart a row
constexpr int kPStride = 2 * kChunk + 16;       // P rows: 144 bytes
constexpr int kQOff = 0;                        // Q [16 rows]
constexpr int kKOff = kQOff + kRows * kStride;  // two stages of 64 keys
constexpr int kStageBytes = kChunk * kStride;
constexpr int kPOff = kKOff + 2 * kStageBytes;     // P [16 rows][64 keys] bf16
constexpr int kRedOff = kPOff + kRows * kPStride;  // [2: max, sum][warps][rows] floats
constexpr int kSmemBytes = kRedOff + 2 * kWarps * kRows * 4;
static_assert(kSmemBytes <= kMlaMaxSmem, "the lean decode kernel's shared memory");

// Copies keys [j0, j1) of the block's sequence into stage rows [j0 - base, ..) (16 bytes a copy,
// the block's threads in turn); keys past the sequence's pages are never asked for.
__device__ __forceinline__ void copy_keys(const MlaAttentionParams& p, const mla::BlockWork& w,
                                          uint32_t stage, int base, int j0, int j1) {
  constexpr int kPieces = kRowBytes / 16;  // 72
  const char* cache = static_cast<const char*>(p.cache);
  for (int i = int(threadIdx.x); i < (j1 - j0) * kPieces; i += kWarps * 32) {
    const int j = j0 + i / kPieces, piece = i % kPieces;
    const int64_t slot = w.slot_of(j, p.page_size);
    cp_async16_zfill(stage + uint32_t((j - base) * kStride + piece * 16),
                     cache + slot * kRowBytes + piece * 16, 16);
  }
}

// Zeros into stage rows [r0, kChunk): a chunk's rows past the block's keys (P is 0 there, and
// 0 times a stale NaN would not be).
__device__ __forceinline__ void zero_rows(const MlaAttentionParams& p, uint32_t stage, int r0) {
  constexpr int kPieces = kRowBytes / 16;
  for (int i = int(threadIdx.x); i < (kChunk - r0) * kPieces; i += kWarps * 32)
    cp_async16_zfill(stage + uint32_t((r0 + i / kPieces) * kStride + (i % kPieces) * 16), p.cache,
                     0);
}

__global__ void __launch_bounds__(kWarps * 32, 1) mla_decode_lean_kernel(MlaAttentionParams p) {
  extern __shared__ __align__(128) char smem[];
  mla::BlockWork w;
  if (!w.init(p, kRows)) {
    pdl_wait();
    pdl_trigger();
    return;
  }
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
  const uint32_t s0 = smem_addr(smem);
  const uint32_t q_s = s0 + kQOff, k_s = s0 + kKOff, p_s = s0 + kPOff;
  float* red = reinterpret_cast<float*>(smem + kRedOff);
  // Stage of chunk i: i & 1. Before the wait: the first two chunks' keys written by earlier steps
  // (those before w.first); after it, their new rows, Q, and every later chunk.
  auto chunk_keys = [&](int i, int* j0, int* j1) {
    *j0 = w.begin + i * kChunk;
    *j1 = min(w.end, *j0 + kChunk);
  };
  for (int i = 0; i < min(2, w.nchunks); ++i) {
    int j0, j1;
    chunk_keys(i, &j0, &j1);
    const uint32_t stage = k_s + uint32_t((i & 1) * kStageBytes);
    copy_keys(p, w, stage, j0, j0, min(j1, max(j0, w.first)));
    zero_rows(p, stage, j1 - j0);
  }
  pdl_wait();
  pdl_trigger();
  for (int i = 0; i < min(2, w.nchunks); ++i) {
    int j0, j1;
    chunk_keys(i, &j0, &j1);
    const int from = min(j1, max(j0, w.first));
    if (from < j1) copy_keys(p, w, k_s + uint32_t((i & 1) * kStageBytes), j0, from, j1);
  }
  // Q: the block's rows (zeros past the sequence's), 16 bytes a copy.
  for (int i = tid; i < kRows * (kRowBytes / 16); i += kWarps * 32) {
    const int r = i / (kRowBytes / 16), piece = i % (kRowBytes / 16);
    const bool ok = w.row0 + r < w.rows;
    const bf16_bits* src = p.q + int64_t(w.q_row0 + w.row0 + (ok ? r : 0)) * p.q_stride + piece * 8;
    cp_async16_zfill(q_s + uint32_t(r * kStride + piece * 16), src, ok ? 16 : 0);
  }
  attn::cp_async_commit();

  const float scale = p.fmt.latent_scale * p.scale_log2;
  // This thread's rows g and g + 8: their key limits, running maxima and sums.
  const int lim0 = w.limit(p, w.row0 + g), lim1 = w.limit(p, w.row0 + g + 8);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  // ldmatrix addresses: A rows (Q, P) l % 16, column half l / 16; B rows (K) of two n8 tiles:
  // key (l & 7) + 8 (l >> 4), column half (l >> 3) & 1; V (trans): key (l & 7) + 8 ((l >> 3) & 1),
  // column half l >> 4.
  const uint32_t qa = q_s + uint32_t((lane % 16) * kStride + (lane / 16) * 16);
  const int kb_row = 16 * warp + (lane & 7) + 8 * (lane >> 4), kb_col = ((lane >> 3) & 1) * 16;
  const uint32_t pa = p_s + uint32_t((lane % 16) * kPStride + (lane / 16) * 16);
  const int v_row = (lane & 7) + 8 * ((lane >> 3) & 1), v_col = 2 * (128 * warp) + (lane >> 4) * 16;

  for (int ci = 0; ci < w.nchunks; ++ci) {
    attn::cp_async_wait<0>();
    __syncthreads();  // the chunk's keys (and Q) in shared memory, for every warp
    const uint32_t st = k_s + uint32_t((ci & 1) * kStageBytes);
    const int key0 = w.begin + ci * kChunk;
    // ---- S for this warp's 16 keys: two n8 tiles, two chains each ----
    float acc[2][2][4] = {};
    const uint32_t kb = st + uint32_t(kb_row * kStride + kb_col);
#pragma unroll 6
    for (int ks = 0; ks < kW / 16; ++ks) {
      uint32_t a[4], b[4];
      ldmatrix_x4(a, qa + ks * 32);
      ldmatrix_x4(b, kb + ks * 32);
      mma_bf16_16816(acc[0][ks & 1], a, b[0], b[1]);
      mma_bf16_16816(acc[1][ks & 1], a, b[2], b[3]);
    }
    // Scores (log2 units), masked: element e of tile t is row g + 8 (e >> 1), key 8t + 2c + (e &
    // 1).
    float sc[2][4];
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + 16 * warp + 8 * t + 2 * c + (e & 1);
        sc[t][e] = (acc[t][0][e] + acc[t][1][e]) * scale;
        if (key >= (e >> 1 ? lim1 : lim0)) sc[t][e] = -INFINITY;
      }
      // The rows' maxima over the chunk: the quad, then the warps through shared memory.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v = fmaxf(fmaxf(sc[0][2 * h], sc[0][2 * h + 1]), fmaxf(sc[1][2 * h], sc[1][2 * h + 1]));
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
      if (c == 0) red[warp * kRows + g + 8 * h] = v;
    }
    __syncthreads();
    float corr[2], ref[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v = m[h];
#pragma unroll
      for (int u = 0; u < kWarps; ++u) v = fmaxf(v, red[u * kRows + g + 8 * h]);
      // A row with no visible key yet keeps -inf: 0 as its reference gives exp2 = 0, not NaN.
      ref[h] = v == -INFINITY ? 0.0f : v;
      corr[h] = fast_exp2(m[h] - ref[h]);
      m[h] = v;
    }
    // P in bf16 (the rounded values are what P·V multiplies, and what the sums add).
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t pk =
            pack_bf16x2(fast_exp2(sc[t][2 * h] - ref[h]), fast_exp2(sc[t][2 * h + 1] - ref[h]));
        rs[h] += __uint_as_float(pk << 16) + __uint_as_float(pk & 0xffff0000u);
        *reinterpret_cast<uint32_t*>(smem + kPOff + (g + 8 * h) * kPStride +
                                     2 * (16 * warp + 8 * t + 2 * c)) = pk;
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      rs[h] += __shfl_xor_sync(0xffffffffu, rs[h], 1);
      rs[h] += __shfl_xor_sync(0xffffffffu, rs[h], 2);
      if (c == 0) red[(kWarps + warp) * kRows + g + 8 * h] = rs[h];
    }
    __syncthreads();  // P and the sums written
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float s = 0.0f;
#pragma unroll
      for (int u = 0; u < kWarps; ++u) s += red[(kWarps + u) * kRows + g + 8 * h];
      l[h] = l[h] * corr[h] + s;
    }
    // ---- O = O · corr + P·V over this warp's 128 columns ----
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[j][0] *= corr[0], o[j][1] *= corr[0];
      o[j][2] *= corr[1], o[j][3] *= corr[1];
    }
#pragma unroll
    for (int ks = 0; ks < kChunk / 16; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, pa + ks * 32);
      const uint32_t vb = st + uint32_t((16 * ks + v_row) * kStride + v_col);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vb + j * 32);
        mma_bf16_16816(o[2 * j], a, b[0], b[1]);
        mma_bf16_16816(o[2 * j + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp done with the stage, P and the maxima before they are reused
    if (ci + 2 < w.nchunks) {  // past the wait: the whole chunk at once
      int j0, j1;
      chunk_keys(ci + 2, &j0, &j1);
      copy_keys(p, w, st, j0, j0, j1);
      zero_rows(p, st, j1 - j0);
      attn::cp_async_commit();
    }
  }
  attn::cp_async_wait<0>();  // an empty split's copies (its loop never waited)
  // ---- the output: element e of tile j is row g + 8 (e >> 1), column 128w + 8j + 2c + (e & 1)
  // ----
  const bool one = p.partial_o == nullptr;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = w.row0 + g + 8 * h;
    if (r >= w.rows) continue;
    const int64_t grow = w.q_row0 + r;
    const float inv = one ? (l[h] > 0.0f ? p.fmt.latent_scale / l[h] : 0.0f) : 1.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int col = 128 * warp + 8 * j + 2 * c;
      mla::store_pair(p, int(grow), col, o[j][2 * h], o[j][2 * h + 1], inv);
    }
    if (warp == 0 && c == 0) mla::store_ml(p, int(grow), m[h], l[h]);
  }
}

}  // namespace

void init_mla_decode_lean_kernel() {
  CUDA_CHECK(cudaFuncSetAttribute(mla_decode_lean_kernel,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
}

void launch_mla_decode_lean(const MlaAttentionParams& p, cudaStream_t stream) {
  CHECK_MSG(p.tile_rows == kRows && p.chunk == kChunk && mla_lean_supported(p.fmt) &&
                p.tree_mask == nullptr && p.positions == nullptr && p.merge_counters == nullptr,
            "MLA lean decode: rows {} chunk {}", p.tile_rows, p.chunk);
  mla::launch(mla_decode_lean_kernel, dim3(p.row_tiles, p.num_splits, p.num_seqs),
              dim3(kWarps * 32), size_t(kSmemBytes), stream, p);
  CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
