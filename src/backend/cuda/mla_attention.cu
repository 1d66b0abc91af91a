// MLA absorbed attention on mma.sync tensor cores (mla_attention.h): the kernel for every row
// format and head count, and the split-KV merge both kernels share.
//
// A block: 16 query rows (the rows of one m16n8k16 tile: 16 heads of a token, or 8 heads of two
// tokens, ...) of one sequence against one split of its keys, 8 warps, one block an SM. Keys come
// in chunks through shared memory and each chunk serves all 16 rows (every head of a token shares
// each page read; more heads than 16 take more blocks over the same keys, which then hit L2:
// grid.x, the row tile, varies fastest). Two ways into the bf16 compute tile [C keys][R + P']:
//  - direct (bf16 rows, 16-byte aligned): cp.async of the rows into the tiles; 48-key chunks in 3
//    stages (two chunks in flight while one is used: 64-key chunks would fit only 2 stages next
//    to Q, one chunk in flight, which leaves HBM idle between chunks);
//  - staged (fp8 plain, rope-split and FlashMLA rows): cp.async of the raw rows (4, 8 or 16 bytes
//    a copy, as the rows' alignment allows) into 3 (or 2) raw stages of 64 keys, then each chunk
//    is decoded to bf16 into the one compute tile (fp8 and bf16 values exactly; FlashMLA tile
//    scales multiplied in); the per-layer scales stay out and multiply the scores (latent and
//    rope parts separately) and the output in float32.
// Per chunk: S = Q·Kᵀ, warp w < C/16 taking keys [16w, 16w + 16) over all R + P' dims (Q and K
// fragments by ldmatrix from shared memory); the chunk's row maxima meet in shared memory, so
// every warp rescales with the same running max; P (bf16) goes to shared memory; O += P·V, warp w
// taking output columns [w·R/8, (w+1)·R/8) (V is the first R columns of the same tile, read by
// ldmatrix.trans). Three barriers a chunk (four when staged). The row sums add over the warps at
// the end. Rows past a sequence's rows are padding (zero q), never stored.
// bench/cuda/mla_emulate.py emulates this kernel lane by lane (numpy) against float64 attention.
#include <algorithm>
#include <cfloat>

#include "backend/cuda/mla_device.cuh"

namespace strata::cuda {
namespace {

using namespace attn;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 16;

// Shared-memory geometry for R latent + P rope values and C-key chunks (C / 16 warps compute S).
template <int R, int P, int C>
struct Geo {
  static_assert(R % 32 == 0 && P % 8 == 0 && P > 0, "R a multiple of 32, P of 8");
  static_assert(C % 16 == 0 && C / 16 <= kWarps, "chunk");
  static constexpr int kPP = (P + 31) / 32 * 32;  // rope dims padded: k-steps go in pairs
  static constexpr int kD = R + kPP;              // bf16 values per compute row
  static constexpr int kStride = kD * 2 + 16;     // bytes (an odd number of 16-byte units:
                                                  // ldmatrix rows hit distinct banks)
  static constexpr int kPStride = C * 2 + 16;
  static constexpr int kSWarps = C / 16;  // warps computing S, 16 keys each
  static constexpr int kPvWarps = R / 16 < kWarps ? R / 16 : kWarps;
  static constexpr int kPvCols = R / kPvWarps;  // output columns a warp (a multiple of 16)
  static constexpr int kTileBytes = C * kStride;
  // Shared memory: Q, P, the warps' row maxima and sums, the slot table, then the stages.
  static constexpr int kQOff = 0;
  static constexpr int kPOff = kQOff + kRows * kStride;
  static constexpr int kRedOff = kPOff + kRows * kPStride;  // [2][kWarps][kRows] float
  static constexpr int kSlotOff = kRedOff + 2 * kWarps * kRows * 4;
  static constexpr int kMaxStages = 3;
  static constexpr int kTileOff = kSlotOff + kMaxStages * C * 4;
  // Direct: NS compute tiles. Staged: 1 compute tile, then NS raw stages of raw_stride bytes a row.
  static constexpr int direct_bytes(int stages) { return kTileOff + stages * kTileBytes; }
  static constexpr int raw_off() { return kTileOff + kTileBytes; }
  static constexpr int staged_bytes(int stages, int raw_stride) {
    return raw_off() + stages * C * raw_stride;
  }
};

__device__ __forceinline__ float exp2_ftz(float x) { return fast_exp2(x); }

// The kernel. C: keys a chunk; NS: pipeline stages (direct: compute tiles; staged: raw stages).
template <int R, int P, bool kDirect, int C, int NS>
__global__ void __launch_bounds__(kThreads, 1) mla_mma_kernel(MlaAttentionParams p) {
  using G = Geo<R, P, C>;
  static_assert(NS >= 2 && NS <= G::kMaxStages, "stages");
  extern __shared__ __align__(16) char smem[];
  pdl_wait();
  pdl_trigger();
  mla::BlockWork w;
  if (!w.init<true>(p, kRows)) return;  // path tiles too (deterministic mode's draft trees)
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c2 = (lane % 4) * 2;
  const MlaRowFormat& f = p.fmt;
  const int raw_stride = int((f.row_bytes + 15) / 16 * 16);
  int32_t* slots = reinterpret_cast<int32_t*>(smem + G::kSlotOff);
  const char* cache = static_cast<const char*>(p.cache);

  // Q (zero past the rows and past R + P), the slot table of chunks 0 .. NS-1, the padding
  // columns of the direct tiles (never written by the copies).
  for (int i = tid; i < kRows * (G::kD / 8); i += kThreads) {
    const int r = i / (G::kD / 8), c = i % (G::kD / 8);
    *reinterpret_cast<uint4*>(smem + G::kQOff + r * G::kStride + c * 16) =
        mla::q_group(p, w, r, c * 8);
  }
  for (int i = tid; i < NS * C; i += kThreads) {
    const int j = w.begin + i;
    slots[i] = j < w.end ? w.slot_of(j, p.page_size) : -1;
  }
  if constexpr (kDirect && G::kD > R + P) {
    constexpr int kPad = (G::kD - R - P) / 8;
    for (int i = tid; i < NS * C * kPad; i += kThreads) {
      const int r = i / kPad, c = (R + P) / 8 + i % kPad;
      *reinterpret_cast<uint4*>(smem + G::kTileOff + r * G::kStride + c * 16) =
          make_uint4(0, 0, 0, 0);
    }
  }
  __syncthreads();

  // Issues the copies of chunk `c` (slots in table stage c % NS) into its stage.
  auto issue = [&](int c) {
    const int32_t* st = slots + (c % NS) * C;
    if constexpr (kDirect) {
      constexpr int kPieces = (R + P) / 8;  // 16-byte pieces of a bf16 row
      const uint32_t dst = smem_addr(smem + G::kTileOff + (c % NS) * G::kTileBytes);
      for (int i = tid; i < C * kPieces; i += kThreads) {
        const int r = i / kPieces, piece = i % kPieces;
        const int slot = st[r];
        const char* src = cache + (slot >= 0 ? int64_t(slot) * f.row_bytes + piece * 16 : 0);
        mla::cp_async_zfill<16>(dst + uint32_t(r * G::kStride + piece * 16), src, slot >= 0);
      }
    } else {
      const uint32_t dst = smem_addr(smem + G::raw_off() + (c % NS) * C * raw_stride);
      mla::copy_raw_rows_w(p.copy_width, dst, raw_stride, cache, f.row_bytes, st, C, tid, kThreads);
    }
  };
#pragma unroll
  for (int c = 0; c < NS - 1; ++c) {
    if (c < w.nchunks) issue(c);
    cp_async_commit();
  }

  // This thread's rows g and g + 8: their key limits.
  int lim[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) lim[h] = w.limit(p, w.row0 + g + 8 * h);
  uint64_t tw[2];  // draft trees: the rows' ancestor words
#pragma unroll
  for (int h = 0; h < 2; ++h) tw[h] = w.tree_word_of(p, w.row0 + g + 8 * h);
  const float ls = f.latent_scale * p.scale_log2, rs = f.rope_scale * p.scale_log2;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  constexpr int kNt = G::kPvCols / 8;
  float o[kNt][4];
#pragma unroll
  for (int i = 0; i < kNt; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

  float* red_m = reinterpret_cast<float*>(smem + G::kRedOff);
  const uint32_t q_lane =
      smem_addr(smem + G::kQOff) +
      uint32_t(((lane & 7) + ((lane >> 3) & 1) * 8) * G::kStride + (lane >> 4) * 16);
  const uint32_t p_lane =
      smem_addr(smem + G::kPOff) +
      uint32_t(((lane & 7) + ((lane >> 3) & 1) * 8) * G::kPStride + (lane >> 4) * 16);

  for (int c = 0; c < w.nchunks; ++c) {
    cp_async_wait<NS - 2>();
    __syncthreads();  // chunk c landed; every warp is done with chunk c - 1
    if (c + NS - 1 < w.nchunks) issue(c + NS - 1);
    cp_async_commit();
    // Page lookup of chunk c + NS, stored at the end of the iteration (latency hidden).
    const int jn = w.begin + (c + NS) * C + tid;
    int next_slot = -1;
    if (tid < C && jn < w.end) next_slot = w.slot_of(jn, p.page_size);
    const char* tile;
    if constexpr (kDirect) {
      tile = smem + G::kTileOff + (c % NS) * G::kTileBytes;
    } else {
      tile = smem + G::kTileOff;
      const char* raw = smem + G::raw_off() + (c % NS) * C * raw_stride;
      for (int i = tid; i < C * (G::kD / 8); i += kThreads) {
        const int r = i / (G::kD / 8), col = (i % (G::kD / 8)) * 8;
        *reinterpret_cast<uint4*>(smem + G::kTileOff + r * G::kStride + col * 2) =
            mla::row_group_bf16(f, raw + r * raw_stride, col);
      }
      __syncthreads();
    }
    const uint32_t tile_s = smem_addr(tile);
    float sc[2][4];  // S of this warp's keys (n-tiles of 8), -inf where masked

    // S for keys [16 warp, 16 warp + 16) (warps < C / 16; 16 keys a warp halve the re-reads of
    // Q against 8): latent and rope parts in separate accumulators (their scales differ).
    if (warp < G::kSWarps) {
      float sl[2][4] = {}, sr[2][4] = {};
      // Both 8-key n-tiles' fragments of a k-step in one ldmatrix (attention_decode.cu's lanes).
      const uint32_t k_lane =
          tile_s + uint32_t((warp * 16 + (lane >> 4) * 8 + (lane & 7)) * G::kStride +
                            ((lane >> 3) & 1) * 16);
#pragma unroll 4
      for (int kk = 0; kk < R / 16; ++kk) {
        uint32_t b[4], a[4];
        ldmatrix_x4(b, k_lane + kk * 32);
        ldmatrix_x4(a, q_lane + kk * 32);
        mma_bf16_16816(sl[0], a, b[0], b[1]);
        mma_bf16_16816(sl[1], a, b[2], b[3]);
      }
#pragma unroll
      for (int kk = R / 16; kk < G::kD / 16; ++kk) {
        uint32_t b[4], a[4];
        ldmatrix_x4(b, k_lane + kk * 32);
        ldmatrix_x4(a, q_lane + kk * 32);
        mma_bf16_16816(sr[0], a, b[0], b[1]);
        mma_bf16_16816(sr[1], a, b[2], b[3]);
      }
      const int key0 = w.begin + c * C + warp * 16 + c2;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float v = sl[nt][e] * ls + sr[nt][e] * rs;
          const int key = key0 + nt * 8 + (e & 1);
          sc[nt][e] = key < lim[e >> 1] && !tree_hides(tw[e >> 1], key, w.first) ? v : -INFINITY;
        }
        // The chunk's row maxima over the warps.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx =
            fmaxf(fmaxf(sc[0][2 * h], sc[0][2 * h + 1]), fmaxf(sc[1][2 * h], sc[1][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        if (c2 == 0) red_m[warp * kRows + g + 8 * h] = mx;
      }
    }
    __syncthreads();
    float corr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = m[h];
#pragma unroll
      for (int v = 0; v < G::kSWarps; ++v) mx = fmaxf(mx, red_m[v * kRows + g + 8 * h]);
      // A row with no visible key yet keeps -inf: 0 as its reference gives exp2 = 0, not NaN.
      const float ref = mx == -INFINITY ? 0.0f : mx;
      corr[h] = exp2_ftz(m[h] - ref);
      m[h] = mx;
      if (warp < G::kSWarps) {
        float rsum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const uint32_t pk =
              pack_bf16x2(exp2_ftz(sc[nt][2 * h] - ref), exp2_ftz(sc[nt][2 * h + 1] - ref));
          // The sums add the rounded weights P·V multiplies with.
          rsum += __uint_as_float(pk << 16) + __uint_as_float(pk & 0xffff0000u);
          *reinterpret_cast<uint32_t*>(smem + G::kPOff + (g + 8 * h) * G::kPStride +
                                       (warp * 16 + nt * 8 + c2) * 2) = pk;
        }
        l[h] = l[h] * corr[h] + rsum;
      }
    }
    __syncthreads();  // P complete

    if (warp < G::kPvWarps) {
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        o[nt][0] *= corr[0];
        o[nt][1] *= corr[0];
        o[nt][2] *= corr[1];
        o[nt][3] *= corr[1];
      }
      const uint32_t v_lane = tile_s + uint32_t((((lane >> 3) & 1) * 8 + (lane & 7)) * G::kStride +
                                                (lane >> 4) * 16 + warp * G::kPvCols * 2);
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) {
        uint32_t a[4];
        ldmatrix_x4(a, p_lane + ks * 32);
#pragma unroll
        for (int dp = 0; dp < kNt / 2; ++dp) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_lane + ks * 16 * G::kStride + dp * 32);
          mma_bf16_16816(o[2 * dp], a, b[0], b[1]);
          mma_bf16_16816(o[2 * dp + 1], a, b[2], b[3]);
        }
      }
    }
    // Table stage c % NS was last read issuing chunk c and is next read issuing chunk c + NS.
    if (tid < C) slots[(c % NS) * C + tid] = next_slot;
  }
  cp_async_wait<0>();

  // Row sums over the quad, then over the warps.
  float* red_l = red_m + kWarps * kRows;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float s = l[h];
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    if (c2 == 0) red_l[warp * kRows + g + 8 * h] = s;
  }
  __syncthreads();
  if (warp >= G::kPvWarps) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = w.row0 + g + 8 * h;
    if (r >= w.rows) continue;
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < G::kSWarps; ++v) sum += red_l[v * kRows + g + 8 * h];
    const int grow = w.q_row0 + r;
    const float inv = sum > 0.0f ? f.latent_scale / sum : 0.0f;
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt)
      mla::store_pair(p, grow, warp * G::kPvCols + nt * 8 + c2, o[nt][2 * h], o[nt][2 * h + 1],
                      inv);
    if (warp == 0 && c2 == 0) mla::store_ml(p, grow, m[h], sum);
  }
}

// The split merge: out = latent_scale · Σᵢ wᵢ oᵢ / Σᵢ wᵢ lᵢ with wᵢ = 2^(mᵢ - max m); empty splits
// (m = -inf) weigh 0. With lse_out (decode context parallelism) the row goes there in float32,
// followed by its log-sum-exp: (max m + log2 Σᵢ wᵢ lᵢ) · ln 2 (m and the scores are log2-scaled). A
// block: one row, 128 columns (a float4 a lane), min(8, splits) warps taking the splits in turn
// (independent loads in flight), the warps' sums added in shared memory; grid (rows of the longest
// sequence, sequences, R / 128 column blocks). Dynamic shared memory: the splits' weights. (One
// warp a row over all splits and columns took ~120 us for 16 rows x 114 splits: 16 warps on the
// whole GPU, each a chain of dependent loads.)
constexpr int kCombineCols = 128;
__global__ void __launch_bounds__(256) mla_combine_kernel(MlaAttentionParams p) {
  extern __shared__ float wts[];  // [num_splits]
  __shared__ float red[8][kCombineCols];
  __shared__ float stat[2][8];
  pdl_wait();
  pdl_trigger();
  const int s = blockIdx.y, r = blockIdx.x;
  const int q0 = p.q_indptr[s], rows = (p.q_indptr[s + 1] - q0) * p.heads;
  if (r >= rows) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  const int n = p.num_splits, R = p.fmt.latent;
  const int64_t grow = int64_t(q0) * p.heads + r;
  const float* ml = p.partial_ml + grow * n * 2;
  // The lane's first kPre partial rows load with the (m, l) pairs: they need neither the
  // weights nor each other, so the merge waits on one round trip to L2, not two.
  constexpr int kPre = 4;
  const int col = int(blockIdx.z) * kCombineCols + 4 * lane;
  const float* po = p.partial_o + grow * n * R + col;
  float4 pv[kPre];
#pragma unroll
  for (int j = 0; j < kPre; ++j)
    if (col < R && warp + j * nw < n)
      pv[j] = *reinterpret_cast<const float4*>(po + int64_t(warp + j * nw) * R);
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, ml[2 * i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) stat[0][warp] = mx;
  __syncthreads();
  mx = stat[0][0];
  for (int v = 1; v < nw; ++v) mx = fmaxf(mx, stat[0][v]);
  float sum = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float mi = ml[2 * i];
    const float wi = mi == -INFINITY ? 0.0f : exp2f(mi - mx);
    wts[i] = wi;
    sum += wi * ml[2 * i + 1];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) stat[1][warp] = sum;
  __syncthreads();
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (col < R) {
#pragma unroll
    for (int j = 0; j < kPre; ++j) {
      const int i = warp + j * nw;
      if (i < n) {
        const float wi = wts[i];
        acc.x += wi * pv[j].x, acc.y += wi * pv[j].y, acc.z += wi * pv[j].z, acc.w += wi * pv[j].w;
      }
    }
#pragma unroll 4
    for (int i = warp + kPre * nw; i < n; i += nw) {
      const float wi = wts[i];
      const float4 v = *reinterpret_cast<const float4*>(po + int64_t(i) * R);
      acc.x += wi * v.x, acc.y += wi * v.y, acc.z += wi * v.z, acc.w += wi * v.w;
    }
  }
  *reinterpret_cast<float4*>(&red[warp][4 * lane]) = acc;
  __syncthreads();
  if (warp == 0 && col < R) {
    float total = 0.0f;
    for (int v = 0; v < nw; ++v) total += stat[1][v];
    const float inv = total > 0.0f ? p.fmt.latent_scale / total : 0.0f;
    float4 o = *reinterpret_cast<const float4*>(&red[0][4 * lane]);
    for (int v = 1; v < nw; ++v) {
      const float4 x = *reinterpret_cast<const float4*>(&red[v][4 * lane]);
      o.x += x.x, o.y += x.y, o.z += x.z, o.w += x.w;
    }
    if (p.lse_out != nullptr) {
      float* row = p.lse_out + grow * (R + 1);
      row[col] = o.x * inv, row[col + 1] = o.y * inv, row[col + 2] = o.z * inv;
      row[col + 3] = o.w * inv;
      if (blockIdx.z == 0 && lane == 0)
        row[R] = total > 0.0f ? (mx + log2f(total)) * 0.6931471805599453f : -INFINITY;
    } else {
      *reinterpret_cast<uint2*>(p.out + grow * R + col) =
          make_uint2(pack_bf16x2(o.x * inv, o.y * inv), pack_bf16x2(o.z * inv, o.w * inv));
    }
  }
}

template <int R, int P, bool kDirect, int C, int NS>
void launch_rp(const MlaAttentionParams& p, cudaStream_t stream) {
  const int smem = mla_mma_smem_bytes(p.fmt, C, NS);
  CHECK_MSG(smem <= kMlaMaxSmem, "MLA attention: {} bytes of shared memory", smem);
  mla::launch(mla_mma_kernel<R, P, kDirect, C, NS>, dim3(p.row_tiles, p.num_splits, p.num_seqs),
              dim3(kThreads), size_t(smem), stream, p);
  CUDA_LAUNCH_CHECK();
}

// The plan's variant (mla_plan.cc): bf16 rows direct (48 keys × 3 stages, or 64 × 2), the other
// formats staged (64 keys, 3 or 2 raw stages).
template <int R, int P>
void launch_mma(const MlaAttentionParams& p, cudaStream_t stream) {
  if (mla_mma_direct(p.fmt)) {
    CHECK_MSG(p.copy_width == 16, "MLA attention: bf16 rows must be 16-byte aligned");
    if (p.chunk == 48 && p.stages == 3) return launch_rp<R, P, true, 48, 3>(p, stream);
    CHECK_MSG(p.chunk == 64 && p.stages == 2, "MLA attention: chunk {} stages {}", p.chunk,
              p.stages);
    return launch_rp<R, P, true, 64, 2>(p, stream);
  }
  CHECK_MSG(p.chunk == 64 && p.copy_width > 0, "MLA attention: chunk {} copy width {}", p.chunk,
            p.copy_width);
  if (p.stages == 3) return launch_rp<R, P, false, 64, 3>(p, stream);
  launch_rp<R, P, false, 64, 2>(p, stream);
}

template <typename K>
void set_limit(K kernel) {
  CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMlaMaxSmem));
}
template <int R, int P>
void set_limits() {
  set_limit(mla_mma_kernel<R, P, true, 48, 3>);
  set_limit(mla_mma_kernel<R, P, true, 64, 2>);
  set_limit(mla_mma_kernel<R, P, false, 64, 3>);
  set_limit(mla_mma_kernel<R, P, false, 64, 2>);
}

template <int R, int P>
int smem_rp(const MlaRowFormat& f, int chunk, int stages) {
  const int raw_stride = int((f.row_bytes + 15) / 16 * 16);
  if (chunk == 48) return mla_mma_direct(f) ? Geo<R, P, 48>::direct_bytes(stages) : 1 << 30;
  return mla_mma_direct(f) ? Geo<R, P, 64>::direct_bytes(stages)
                           : Geo<R, P, 64>::staged_bytes(stages, raw_stride);
}

}  // namespace

bool mla_mma_direct(const MlaRowFormat& f) {
  return f.latent_elem == kMlaBf16 && f.rope_elem == kMlaBf16 && !f.flashmla &&
         f.row_bytes == 2 * int64_t(f.latent + f.rope);
}

int mla_mma_smem_bytes(const MlaRowFormat& f, int chunk, int stages) {
  const int R = f.latent, P = f.rope;
  if (R == 512 && P == 64) return smem_rp<512, 64>(f, chunk, stages);
  if (R == 128 && P == 32) return smem_rp<128, 32>(f, chunk, stages);
  if (R == 32 && P == 8) return smem_rp<32, 8>(f, chunk, stages);
  return 1 << 30;
}

void init_mla_attention_kernels() {
  set_limits<512, 64>();
  set_limits<128, 32>();
  set_limits<32, 8>();
  init_mla_attention_wgmma_kernels();
  init_mla_attention_wgmma_pipe_kernels();
  init_mla_decode_kernels();
}

void launch_mla_attention(const MlaAttentionParams& p, cudaStream_t stream) {
  if (p.num_seqs == 0 || p.row_tiles == 0) return;
  CHECK_MSG(p.num_splits == 1 || (p.partial_o && p.partial_ml), "MLA attention: no scratch");
  CHECK_MSG(p.lse_out == nullptr || p.partial_o, "MLA attention: lse_out needs the partials");
  CHECK_MSG(p.merge_counters == nullptr ||
                (p.kernel == kMlaDecode && p.partial_o && p.lse_out == nullptr &&
                 p.num_splits <= kMlaFusedMergeMaxSplits),
            "MLA attention: the fused merge is the decode kernel's, up to {} splits into bf16 out",
            kMlaFusedMergeMaxSplits);
  if (p.kernel == kMlaWgmma) {
    launch_mla_attention_wgmma(p, stream);
  } else if (p.kernel == kMlaWgmmaPipe) {
    launch_mla_attention_wgmma_pipe(p, stream);
  } else if (p.kernel == kMlaDecode) {
    launch_mla_decode(p, stream);
  } else {
    CHECK_MSG(p.tile_rows == kRows, "MLA attention: the mma kernel takes {} rows a block", kRows);
    const int R = p.fmt.latent, P = p.fmt.rope;
    if (R == 512 && P == 64)
      launch_mma<512, 64>(p, stream);
    else if (R == 128 && P == 32)
      launch_mma<128, 32>(p, stream);
    else if (R == 32 && P == 8)
      launch_mma<32, 8>(p, stream);
    else
      CHECK_MSG(false, "MLA attention: kv_lora_rank {} rope {} not built", R, P);
  }
  if (p.partial_o != nullptr && p.merge_counters == nullptr) {
    const int warps = std::min(8, p.num_splits);
    const int col_blocks = (p.fmt.latent + kCombineCols - 1) / kCombineCols;
    mla::launch(mla_combine_kernel, dim3(p.row_tiles * p.tile_rows, p.num_seqs, col_blocks),
                dim3(warps * 32), size_t(p.num_splits) * 4, stream, p);
    CUDA_LAUNCH_CHECK();
  }
}

}  // namespace strata::cuda
