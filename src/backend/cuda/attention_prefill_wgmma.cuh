// Paged causal prefill attention on Hopper's warpgroup tensor cores (wgmma, sm_90a), head_dim
// 64 and 128, as a template over the K/V tile (BN keys) and stage count (NS); the product's
// configurations are launched by attention_prefill_wgmma.cu, the others only by bench/cuda/dev
// (each includer gets its own copy: everything here has internal linkage). The work split, tile
// list and semantics are those of the mma.sync kernel before it (bench/cuda/dev: 128 query
// rows = (token, query head of the group) pairs of one KV head per block, K/V tiles gathered
// through the page table by cp.async, page lookups a tile ahead of their copies), but the block
// is two warpgroups of 64 rows, and both products run as wgmma from shared memory: S = Q·Kᵀ with
// Q and K as K-major operands, O += P·V with P from registers (the accumulator of S, rounded to
// bf16) and V as a transposed (MN-major) operand, so no fragment passes through the register
// file by ldmatrix. Q, K and V tiles sit in shared memory in the 128-byte swizzled layout wgmma
// reads: [d / 64][rows][64] bf16, 16-byte piece c of row r stored at piece c ^ (r % 8).
// K/V tiles of 64 or 128 keys, 2 or 3 stages (NS). While one warpgroup runs its softmax the
// other's wgmma keep the tensor cores busy (the two meet at one barrier per tile).
// ptxas serializes wgmma that sit on a path it cannot prove uniform across the warpgroup
// (C7520: 6-7% here), so every warpgroup multiplies every tile, masking what it must not
// see, instead of branching around tiles. NS = kOverlap issues each tile's P·V one tile late, to
// run during the next softmax (FlashAttention-3's intra-warpgroup overlap); ptxas serializes
// that too (C7514: the softmax reads S between the two waits), so it is measured, not used
// (bench/cuda/dev).
// fp8 K/V are staged raw and widened to bf16 into the swizzled tiles (exact).
#pragma once

#include <cfloat>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/attention_wgmma.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/tree_mask.cuh"

namespace strata::cuda {
namespace {

using namespace attn;

constexpr int kRows = kGroupedPrefillRows;  // query rows per block, 64 per warpgroup
constexpr int kThreads = 256;
// The stage count that selects the overlapped schedule (see wgmma_prefill_kernel).
constexpr int kOverlap = 1;

template <int D, int E, int BN, int NS>
struct WLayout {
  static constexpr bool kFp8 = E != kKvBf16;
  static constexpr int kQBytes = kRows * D * 2;
  static constexpr int kTileBytes = BN * D * 2;  // one K or V tile in bf16
  // bf16 tiles: NS stages of K and V (tile t + NS - 1 is copied while tile t is used); fp8: the
  // raw bytes are double-buffered and widened into one bf16 K and V.
  // NS = kOverlap: one tile in flight, K double- and V triple-buffered (P·V of tile t-1 reads
  // its V while tile t+1 lands).
  static constexpr bool kOv = NS == kOverlap && !kFp8;
  static constexpr int kKTiles = kFp8 ? 1 : (kOv ? 2 : NS);
  static constexpr int kVTiles = kFp8 ? 1 : (kOv ? 3 : NS);
  static constexpr int kAhead = kFp8 || kOv ? 1 : NS - 1;  // tiles in flight beyond the one in use
  static constexpr int kSlotStages = kAhead + 1;
  static constexpr int kLdRaw = D + 16;  // fp8 staging bytes per row
  static constexpr int kRawTileBytes = BN * kLdRaw;
  static constexpr int kRawBytes = kFp8 ? 2 * 2 * kRawTileBytes : 0;
  static constexpr int kKOff = kQBytes;
  static constexpr int kVOff = kKOff + kKTiles * kTileBytes;
  static constexpr int kRawOff = kVOff + kVTiles * kTileBytes;
  static constexpr int kSlotOff = kRawOff + kRawBytes;
  static constexpr int kBytes = kSlotOff + kSlotStages * BN * 4 + 1024;  // + alignment slack
  static constexpr int kPieces = D * (kFp8 ? 1 : 2) / 16;  // 16-byte pieces per global row
  static constexpr int kRowStep = kThreads / kPieces;
  static constexpr int kRowsPerThread = BN / kRowStep;
  // Shared-memory offsets of tile t's bf16 K and V.
  __device__ static int k_off(int t) { return kKOff + (t % kKTiles) * kTileBytes; }
  __device__ static int v_off(int t) { return kVOff + (t % kVTiles) * kTileBytes; }
};

// Byte offset of 16-byte piece c (of d) of row r in a swizzled [D / 64][rows][64] bf16 tile.
__device__ __forceinline__ uint32_t swz(int r, int c, int rows) {
  return uint32_t((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

template <int D, int E, int BN, int NS>
__device__ __forceinline__ void w_issue_tile(const AttentionParams& p, char* smem, int t, int kvh,
                                             int tid) {
  using L = WLayout<D, E, BN, NS>;
  constexpr int kEb = L::kFp8 ? 1 : 2;
  const int32_t* slots =
      reinterpret_cast<const int32_t*>(smem + L::kSlotOff) + (t % L::kSlotStages) * BN;
  const int piece = tid % L::kPieces, r0 = tid / L::kPieces;
  const int64_t kdim_bytes = int64_t(p.kv_heads) * D * kEb;
  const int64_t col_bytes = int64_t(kvh) * D * kEb + piece * 16;
  const char* kc = static_cast<const char*>(p.k_cache);
  const char* vc = static_cast<const char*>(p.v_cache);
  uint32_t k_dst, v_dst;
  if constexpr (L::kFp8) {
    k_dst = smem_addr(smem + L::kRawOff + (t & 1) * 2 * L::kRawTileBytes);
    v_dst = k_dst + L::kRawTileBytes;
  } else {
    k_dst = smem_addr(smem + L::k_off(t));
    v_dst = smem_addr(smem + L::v_off(t));
  }
#pragma unroll
  for (int i = 0; i < L::kRowsPerThread; ++i) {
    const int r = r0 + i * L::kRowStep;
    const int slot = slots[r];
    const int64_t off = slot >= 0 ? int64_t(slot) * kdim_bytes + col_bytes : 0;
    const int bytes = slot >= 0 ? 16 : 0;
    uint32_t d;
    if constexpr (L::kFp8)
      d = uint32_t(r * L::kLdRaw + piece * 16);
    else
      d = swz(r, piece, BN);
    cp_async16_zfill(k_dst + d, kc + off, bytes);
    cp_async16_zfill(v_dst + d, vc + off, bytes);
  }
}

template <int D, int E, int BN, int NS>
__device__ __forceinline__ void w_widen_tile(char* smem, int t, int tid) {
  using L = WLayout<D, E, BN, NS>;
  constexpr int kGroups = BN * D / 8;
  const char* raw = smem + L::kRawOff + (t & 1) * 2 * L::kRawTileBytes;
  char* dst = smem + L::kKOff;  // K, then V right after it (kKTiles = 1)
#pragma unroll 4
  for (int i = tid; i < 2 * kGroups; i += kThreads) {
    const int which = i / kGroups, g = i % kGroups;
    const int r = g / (D / 8), c = g % (D / 8);
    float f[8];
    kv_unpack8<E>(raw + which * L::kRawTileBytes + r * L::kLdRaw + c * 8, f);
    *reinterpret_cast<uint4*>(dst + which * L::kTileBytes + swz(r, c, BN)) =
        make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]),
                   pack_bf16x2(f[6], f[7]));
  }
}

template <int N>
__device__ __forceinline__ void wgmma_ss(float* d, uint64_t da, uint64_t db, int scale_d) {
  if constexpr (N == 64)
    wgmma_ss_m64n64k16<0>(d, da, db, scale_d);
  else
    wgmma_ss_m64n128k16<0>(d, da, db, scale_d);
}
template <int N>
__device__ __forceinline__ void wgmma_rs_t(float* d, const uint32_t* a, uint64_t db) {
  if constexpr (N == 64)
    wgmma_rs_m64n64k16<1>(d, a, db);
  else
    wgmma_rs_m64n128k16<1>(d, a, db);
}

// o (the accumulator layout: rows g and g + 8 alternate in pairs) times the rows' factors.
template <int D>
__device__ __forceinline__ void rescale_o(float* o, const float* corr) {
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    o[4 * dt] *= corr[0];
    o[4 * dt + 1] *= corr[0];
    o[4 * dt + 2] *= corr[1];
    o[4 * dt + 3] *= corr[1];
  }
}

// kPaths: the tile list may hold path tiles (AttentionParams::tree_paths, deterministic mode's
// draft trees); false compiles them out, so the default kernel's registers stay as they were
// (compiled in, the path bookkeeping made head_dim 128 over bf16 KV spill 24 bytes instead of 8
// at its 128-register cap; ptxas -v, CUDA 13).
template <int D, int E, int BN, int NS, bool kPaths = false>
__global__ void __launch_bounds__(kThreads, BN == 64 && NS == 2 ? 2 : 1)
    wgmma_prefill_kernel(AttentionParams p) {
  using L = WLayout<D, E, BN, NS>;
  extern __shared__ __align__(128) char smem_raw[];
  // wgmma's swizzle works on address bits: tiles start 1024-byte aligned.
  char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int kvh = int(blockIdx.x) % p.kv_heads;
  const int tile = p.num_tiles - 1 - int(blockIdx.x) / p.kv_heads;  // longest first
  const int group = p.heads / p.kv_heads;
  const int s = p.tiles[2 * tile], tile_q = p.tiles[2 * tile + 1];
  const bool path_tile = kPaths && (tile_q & kTreePathTile) != 0;  // one row, keys in path order
  const int q_start = kPaths ? tile_q & ~kTreePathTile : tile_q;
  const int q0 = p.meta.q_indptr[s], n_new = p.meta.q_indptr[s + 1] - q0;
  const int len = p.meta.kv_lens[s], first = len - n_new;
  // A path tile's key j is KV row path_key(path_word, j, first); every other tile's is row j.
  const uint64_t path_word = kPaths ? tree_word(p.meta.tree_mask, q0 + q_start, path_tile) : 0;
  const int ntok = path_tile ? 1 : min(kRows / group, n_new - q_start);
  const int valid_rows = ntok * group;
  const int pos_base = path_position(path_word, first, q_start);
  const int kv_end = min(len, pos_base + ntok);
  const int n_tiles = (kv_end + BN - 1) / BN;
  const int page_size = p.meta.page_size;
  const int32_t* pages = p.meta.page_indices + p.meta.page_indptr[s];
  int32_t* slots = reinterpret_cast<int32_t*>(smem + L::kSlotOff);

  for (int j = tid; j < L::kSlotStages * BN; j += kThreads) {  // tiles 0 .. kAhead
    const int row = j < kv_end ? path_key(path_word, j, first) : 0;
    slots[j] = j < kv_end ? pages[row / page_size] * page_size + row % page_size : -1;
  }
  const uint32_t q_s = smem_addr(smem);
  for (int i = tid; i < kRows * (D / 8); i += kThreads) {
    const int r = i / (D / 8), c = i % (D / 8);
    const bool ok = r < valid_rows;
    const bf16_bits* src =
        ok ? p.q + (int64_t(q0 + q_start + r / group) * p.heads + kvh * group + r % group) * D +
                 c * 8
           : p.q;
    cp_async16_zfill(q_s + swz(r, c, kRows), src, ok ? 16 : 0);
  }
  __syncthreads();
#pragma unroll
  for (int t = 0; t < L::kAhead; ++t) {  // Q joins tile 0's group
    if (t < n_tiles) w_issue_tile<D, E, BN, NS>(p, smem, t, kvh, tid);
    cp_async_commit();
  }

  // This thread's rows: warpgroup wg, warp's 16 rows, g and g + 8.
  const int wr = wg * 64, g = lane / 4, c2 = (lane % 4) * 2;
  int pos[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) pos[h] = pos_base + (wr + warp * 16 + h * 8 + g) / group;
  const int wg_min_pos = pos_base + wr / group;
  // Draft trees: the rows' ancestor words (0: causal); a tree hides keys below wg_min_pos too.
  // A path tile holds its row's keys only: nothing to hide.
  const bool has_tree = p.meta.tree_mask != nullptr && !path_tile;
  uint64_t tw[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = wr + warp * 16 + h * 8 + g;
    tw[h] = tree_word(p.meta.tree_mask, q0 + q_start + row / group, row < valid_rows && !path_tile);
  }
  const float qk = p.scale_log2 * p.k_scale;

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};

  uint32_t pa[BN / 16][4];      // P (bf16) as the A operand of P·V
  float corr_prev[2] = {1, 1};  // kOv: tile t-1's rescale of o, applied before its P·V

  for (int t = 0; t < n_tiles; ++t) {
    cp_async_wait<L::kAhead - 1>();  // tile t landed (later tiles may be in flight)
    fence_proxy_async();             // cp.async writes, read next by wgmma (the async proxy)
    __syncthreads();                 // ... for every thread; everyone is done with tile t-1's stage
    if (t + L::kAhead < n_tiles) w_issue_tile<D, E, BN, NS>(p, smem, t + L::kAhead, kvh, tid);
    cp_async_commit();
    // Page lookup of tile t + kAhead + 1, stored at the end of this iteration (latency hidden).
    const int jn = (t + L::kAhead + 1) * BN + tid;
    const int jn_row = jn < kv_end ? path_key(path_word, jn, first) : 0;
    int next_page = 0;
    if (tid < BN && jn < kv_end) next_page = pages[jn_row / page_size];
    if constexpr (L::kFp8) {
      w_widen_tile<D, E, BN, NS>(smem, t, tid);
      fence_proxy_async();
      __syncthreads();
    }
    const uint32_t k_s = smem_addr(smem + L::k_off(t));
    const uint32_t v_s = smem_addr(smem + L::v_off(t));
    const int kv0 = t * BN;

    // Overlap (kOv): P·V runs one tile behind. The P·V of tile t-1 is issued right after
    // S = Q·Kᵀ of tile t and runs on the tensor cores during tile t's softmax (FlashAttention-3's
    // intra-warpgroup overlap); o is rescaled once it completes.
    // Every warpgroup multiplies every tile, also one wholly in its rows' future (masked to
    // nothing) or one with no rows (not stored): a wgmma on a path ptxas cannot prove uniform
    // across the warpgroup is serialized (C7520), which costs far more than the skipped work.
    const bool pending = L::kOv && t > 0;     // P of tile t-1 still waits for its P·V
    if (pending) rescale_o<D>(o, corr_prev);  // to tile t-1's max, before its P·V adds in
    float sc[BN / 2];
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const uint32_t qa = q_s + (ks / 4) * kRows * 128 + wr * 128 + (ks % 4) * 32;
      const uint32_t kb = k_s + (ks / 4) * BN * 128 + (ks % 4) * 32;
      wgmma_ss<BN>(sc, make_smem_desc(qa, 16, 1024), make_smem_desc(kb, 16, 1024), ks > 0);
    }
    wgmma_commit();
    if (pending) {
      const uint32_t v_prev = smem_addr(smem + L::v_off(t - 1));
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
        wgmma_rs_t<D>(o, pa[kk], make_smem_desc(v_prev + kk * 16 * 128, BN * 128, 1024));
      wgmma_commit();
    }
    {
      if (pending)
        wgmma_wait<1>();  // S is ready; the P·V behind it may still run
      else
        wgmma_wait<0>();
      reg_fence<BN / 2>(sc);
      if (kv0 + BN - 1 > wg_min_pos || kv0 + BN > kv_end || has_tree) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
          const int key = kv0 + (i / 4) * 8 + c2 + (i & 1);
          if (key > pos[(i >> 1) & 1] || key >= kv_end || tree_hides(tw[(i >> 1) & 1], key, first))
            sc[i] = -INFINITY;
        }
      }
      float corr[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt)
          mx = fmaxf(mx, fmaxf(sc[4 * nt + 2 * h], sc[4 * nt + 2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[h], mx * qk);
        // A row with no visible key yet keeps -inf: 0 as its reference gives exp2 = 0, not NaN.
        const float ref = m_new == -INFINITY ? 0.0f : m_new;
        corr[h] = fast_exp2(m[h] - ref);
        m[h] = m_new;
        float rs = 0;
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
          sc[4 * nt + 2 * h] = fast_exp2(fmaf(sc[4 * nt + 2 * h], qk, -ref));
          sc[4 * nt + 2 * h + 1] = fast_exp2(fmaf(sc[4 * nt + 2 * h + 1], qk, -ref));
          rs += sc[4 * nt + 2 * h] + sc[4 * nt + 2 * h + 1];
        }
        l[h] = l[h] * corr[h] + rs;
      }
      if (pending) {  // o and pa belong to the previous tile's P·V until it completes
        wgmma_wait<0>();
        reg_fence<D / 2>(o);
      }
      if constexpr (L::kOv) {
        corr_prev[0] = corr[0];
        corr_prev[1] = corr[1];
      } else {
        rescale_o<D>(o, corr);
      }
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        pa[kk][0] = pack_bf16x2(sc[8 * kk + 0], sc[8 * kk + 1]);
        pa[kk][1] = pack_bf16x2(sc[8 * kk + 2], sc[8 * kk + 3]);
        pa[kk][2] = pack_bf16x2(sc[8 * kk + 4], sc[8 * kk + 5]);
        pa[kk][3] = pack_bf16x2(sc[8 * kk + 6], sc[8 * kk + 7]);
      }
      if constexpr (!L::kOv) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
          // V rows kk·16 .. +15 (two 8-row groups 1024 B apart), d halves BN·128 B apart.
          wgmma_rs_t<D>(o, pa[kk], make_smem_desc(v_s + kk * 16 * 128, BN * 128, 1024));
        }
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence<D / 2>(o);
      }
    }
    // Slot stage t % kSlotStages was last read copying tile t and is next read copying tile
    // t + kAhead + 1 (next iteration, after its barrier).
    if (tid < BN)
      slots[(t % L::kSlotStages) * BN + tid] =
          jn < kv_end ? next_page * page_size + jn_row % page_size : -1;
  }
  if (L::kOv) {  // the last tile's P·V (its V is still in place: nothing was prefetched)
    rescale_o<D>(o, corr_prev);
    wgmma_fence();
    const uint32_t v_last = smem_addr(smem + L::v_off(n_tiles - 1));
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
      wgmma_rs_t<D>(o, pa[kk], make_smem_desc(v_last + kk * 16 * 128, BN * 128, 1024));
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence<D / 2>(o);
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inv = sum > 0 ? p.v_scale / sum : 0.0f;
    const int r = wr + warp * 16 + h * 8 + g;
    if (r >= valid_rows) continue;
    bf16_bits* dst =
        p.out + (int64_t(q0 + q_start + r / group) * p.heads + kvh * group + r % group) * D + c2;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<uint32_t*>(dst + dt * 8) =
          pack_bf16x2(o[4 * dt + 2 * h] * inv, o[4 * dt + 2 * h + 1] * inv);
  }
}

template <int D, int E, int BN, int NS, bool kPaths = false>
void w_launch(const AttentionParams& p, const Launch& launch) {
  wgmma_prefill_kernel<D, E, BN, NS, kPaths>
      <<<p.num_tiles * p.kv_heads, kThreads, WLayout<D, E, BN, NS>::kBytes, launch.stream>>>(p);
  CUDA_LAUNCH_CHECK();
}

template <int D, int BN, int NS, bool kPaths = false>
void w_launch_d(const AttentionParams& p, const Launch& launch) {
  if (p.kv_elem == kKvE4M3)
    w_launch<D, kKvE4M3, BN, 2, kPaths>(p, launch);
  else if (p.kv_elem == kKvE5M2)
    w_launch<D, kKvE5M2, BN, 2, kPaths>(p, launch);
  else
    w_launch<D, kKvBf16, BN, NS, kPaths>(p, launch);
}

template <int D, int E, int BN, int NS, bool kPaths = false>
void w_set_limit() {
  static_assert(WLayout<D, E, BN, NS>::kBytes <= 227 * 1024, "shared memory per block");
  CUDA_CHECK(cudaFuncSetAttribute(wgmma_prefill_kernel<D, E, BN, NS, kPaths>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  WLayout<D, E, BN, NS>::kBytes));
}

}  // namespace
}  // namespace strata::cuda
