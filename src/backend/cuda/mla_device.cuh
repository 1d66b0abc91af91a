// Device pieces shared by the MLA attention kernels (mla_attention.cu, mla_attention_wgmma.cu):
// the launch with programmatic dependent launch, a block's rows and key range, the page-table
// lookup, raw-row copies (cp.async of 4, 8 or 16 bytes), the decode of 8 row values to bf16,
// the partial / output stores; for the decode kernel (mla_decode.cuh) mbarriers, bulk copies,
// named barriers and fp8 -> f16 pairs in registers.
#pragma once

#include <cstdint>

#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/mla_attention.h"
#include "backend/cuda/tree_mask.cuh"

namespace strata::cuda::mla {

// Launch with the programmatic-stream-serialization attribute (the kernels wait on their
// predecessor before touching memory, so it is always safe).
template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// The rows and keys of one block (p.chunk keys a chunk): `rows` query rows of sequence s starting
// at row0 (row r is token r / heads of the sequence's new tokens), keys [begin, end) of split
// `split`.
// Path tiles (p.tree_paths, deterministic mode with draft trees: the mma kernel, one split): a
// block takes tile_rows heads of one new token (grid.x: tokens x ceil(heads / tile_rows)) and,
// for a tree row, reads its keys in logical path order (tree_mask.cuh path_key: the cached keys,
// then its ancestors and itself at first, first + 1, ...), so its sums run exactly as plain
// decoding of its path runs them (attention.h kTreePathTile, the same for GQA).
struct BlockWork {
  int q0;      // the sequence's first new token (q_indptr[s])
  int q_row0;  // the sequence's first row in q / out (q_indptr[s] · heads)
  int rows;    // the sequence's rows (new tokens · heads); a path tile: up to its token's last
  int row0;    // the block's first row within the sequence
  int kv_len;  // the sequence's keys
  int first;   // keys before the sequence's first new token (kv_len - new tokens)
  int begin, end;
  int nchunks;
  const int32_t* pages;
  uint64_t path_word;  // a path tile's tree word (0: keys in place, causal)

  // false: the tile has no rows (the grid covers the longest sequence). tile_rows: 16 or 64.
  // kPaths: the kernel takes path tiles when p.tree_paths (the mma kernel); false compiles them
  // out (path_word stays 0: the other kernels' code as without them).
  template <bool kPaths = false>
  __device__ __forceinline__ bool init(const MlaAttentionParams& p, int tile_rows) {
    const int s = blockIdx.z;
    q0 = p.q_indptr[s];
    const int n_new = p.q_indptr[s + 1] - q0;
    rows = n_new * p.heads;
    // Tiles in reverse: later rows see more keys (causal chunks), so the longest start first.
    const int tile = int(gridDim.x - 1 - blockIdx.x);
    path_word = 0;
    if (kPaths && p.tree_paths) {
      const int per_token = (p.heads + tile_rows - 1) / tile_rows, token = tile / per_token;
      if (token >= n_new) return false;
      row0 = token * p.heads + (tile % per_token) * tile_rows;
      rows = (token + 1) * p.heads;
      path_word = tree_word(p.tree_mask, q0 + token, true);
    } else {
      row0 = tile * tile_rows;
      if (row0 >= rows) return false;
    }
    q_row0 = q0 * p.heads;
    kv_len = p.kv_lens[s];
    first = kv_len - n_new;
    const int last = min(rows, row0 + tile_rows) - 1;
    const int tile_lim = keys_seen(p, last);  // keys the tile's last row sees (the most)
    begin = int(blockIdx.y) * p.split_len;
    end = min(tile_lim, begin + p.split_len);
    nchunks = end > begin ? (end - begin + p.chunk - 1) / p.chunk : 0;
    pages = p.page_indices + p.page_indptr[s];
    return true;
  }
  // Keys [0, keys_seen(r)) are what row r (< rows) sees: causal within the new tokens, or under
  // decode context parallelism (p.positions) the shard's keys at positions <= the token's.
  __device__ __forceinline__ int keys_seen(const MlaAttentionParams& p, int r) const {
    if (path_word != 0) return first + __popcll(static_cast<unsigned long long>(path_word));
    if (p.positions == nullptr) return first + r / p.heads + 1;
    const int pos = p.positions[q0 + r / p.heads];
    return pos < p.dcp_rank ? 0 : min(kv_len, (pos - p.dcp_rank) / p.dcp_size + 1);
  }
  // Keys row r (within the sequence) may see in this block: [begin, limit(r)). Rows past the
  // sequence's (padding of the tile) see the block's keys; they are never stored.
  __device__ __forceinline__ int limit(const MlaAttentionParams& p, int r) const {
    return r < rows ? min(end, keys_seen(p, r)) : end;
  }
  // Row r's draft-tree word (tree_mask.cuh; 0: causal, also for padding rows past `rows`; a path
  // tile holds its row's keys only: nothing to hide).
  __device__ __forceinline__ uint64_t tree_word_of(const MlaAttentionParams& p, int r) const {
    return tree_word(p.tree_mask, q0 + r / p.heads, r < rows && path_word == 0);
  }
  // The slot of the block's key j (a path tile: its logical key j).
  __device__ __forceinline__ int slot_of(int j, int page_size) const {
    const int row = path_key(path_word, j, first);
    return pages[row / page_size] * page_size + row % page_size;
  }
  // The same with page_shift = log2(page_size) where the page size is a power of two (the
  // caller's, computed once), else -1: shifts instead of an integer division a key.
  __device__ __forceinline__ int slot_of(int j, int page_size, int page_shift) const {
    if (page_shift < 0) return slot_of(j, page_size);
    const int row = path_key(path_word, j, first);
    return (pages[row >> page_shift] << page_shift) + (row & (page_size - 1));
  }
};

// cp.async of W bytes (4, 8: through L1; 16: L2 only), zero-filled when `ok` is false.
template <int W>
__device__ __forceinline__ void cp_async_zfill(uint32_t dst, const void* src, bool ok) {
  if constexpr (W == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(ok ? 16 : 0));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(W),
                 "r"(ok ? W : 0));
  }
}

// Copies `n` raw rows (slots from `slots`, -1: zeros) of row_bytes into smem rows `stride` apart,
// W bytes per copy, threads [0, threads) taking copies in turn.
template <int W>
__device__ __forceinline__ void copy_raw_rows(uint32_t dst, int stride, const char* cache,
                                              int64_t row_bytes, const int32_t* slots, int n,
                                              int tid, int threads) {
  const int per_row = int(row_bytes / W);
  for (int i = tid; i < n * per_row; i += threads) {
    const int r = i / per_row, piece = i - r * per_row;
    const int slot = slots[r];
    const char* src = cache + (slot >= 0 ? int64_t(slot) * row_bytes + piece * W : 0);
    cp_async_zfill<W>(dst + uint32_t(r * stride + piece * W), src, slot >= 0);
  }
}
__device__ __forceinline__ void copy_raw_rows_w(int width, uint32_t dst, int stride,
                                                const char* cache, int64_t row_bytes,
                                                const int32_t* slots, int n, int tid, int threads) {
  if (width == 16)
    copy_raw_rows<16>(dst, stride, cache, row_bytes, slots, n, tid, threads);
  else if (width == 8)
    copy_raw_rows<8>(dst, stride, cache, row_bytes, slots, n, tid, threads);
  else
    copy_raw_rows<4>(dst, stride, cache, row_bytes, slots, n, tid, threads);
}

__device__ __forceinline__ uint32_t ld32(const char* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Eight values of element type `elem` at `src` (4-byte aligned) as floats (exact: every fp8 and
// bf16 value is a float).
__device__ __forceinline__ void decode8(int elem, const char* src, float* f) {
  if (elem == kMlaBf16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t w = ld32(src + 4 * i);
      f[2 * i] = __uint_as_float(w << 16);
      f[2 * i + 1] = __uint_as_float(w & 0xffff0000u);
    }
  } else if (elem == kMlaF32) {
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = __uint_as_float(ld32(src + 4 * i));
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t w = ld32(src + 4 * i);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint16_t pair = uint16_t(w >> (16 * j));
        const float2 x = elem == kMlaE4M3 ? e4m3x2_to_float2(pair) : e5m2x2_to_float2(pair);
        f[4 * i + 2 * j] = x.x;
        f[4 * i + 2 * j + 1] = x.y;
      }
    }
  }
}

// Columns [col, col + 8) of a raw row as bf16 (16 bytes): latent values (times their FlashMLA
// tile scale), rope values, or zeros past R + P. The per-layer scales stay out (applied to the
// scores and the output in float32), so fp8 and bf16 values convert exactly; FlashMLA values
// times their tile scale and f32 rope values round to bf16.
__device__ __forceinline__ uint4 row_group_bf16(const MlaRowFormat& f, const char* raw, int col) {
  float v[8];
  if (col < f.latent) {
    decode8(f.latent_elem, raw + col * mla_elem_bytes(f.latent_elem), v);
    if (f.flashmla) {
      const float s = __uint_as_float(ld32(raw + f.latent + 4 * (col / kMlaFlashTile)));
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] *= s;
    }
  } else if (col < f.latent + f.rope) {
    decode8(f.rope_elem, raw + f.rope_offset + (col - f.latent) * mla_elem_bytes(f.rope_elem), v);
  } else {
    return make_uint4(0, 0, 0, 0);
  }
  return make_uint4(attn::pack_bf16x2(v[0], v[1]), attn::pack_bf16x2(v[2], v[3]),
                    attn::pack_bf16x2(v[4], v[5]), attn::pack_bf16x2(v[6], v[7]));
}

// Query row group: columns [col, col + 8) of row r of the block (zeros past the sequence's rows
// or past R + P).
__device__ __forceinline__ uint4 q_group(const MlaAttentionParams& p, const BlockWork& w, int r,
                                         int col) {
  if (w.row0 + r >= w.rows || col >= p.fmt.latent + p.fmt.rope) return make_uint4(0, 0, 0, 0);
  return *reinterpret_cast<const uint4*>(p.q + int64_t(w.q_row0 + w.row0 + r) * p.q_stride + col);
}

// A row's result: normalized bf16 into `out` (no partials: one split), else the unnormalized
// partial.
// `cols` values from column `col` (even), as pairs.
__device__ __forceinline__ float* partial_row(const MlaAttentionParams& p, int grow) {
  return p.partial_o + (int64_t(grow) * p.num_splits + blockIdx.y) * p.fmt.latent;
}
__device__ __forceinline__ void store_pair(const MlaAttentionParams& p, int grow, int col, float a,
                                           float b, float inv) {
  if (p.partial_o == nullptr) {
    *reinterpret_cast<uint32_t*>(p.out + int64_t(grow) * p.fmt.latent + col) =
        attn::pack_bf16x2(a * inv, b * inv);
  } else {
    *reinterpret_cast<float2*>(partial_row(p, grow) + col) = make_float2(a, b);
  }
}
__device__ __forceinline__ void store_ml(const MlaAttentionParams& p, int grow, float m, float l) {
  if (p.partial_o != nullptr)
    *reinterpret_cast<float2*>(p.partial_ml + (int64_t(grow) * p.num_splits + blockIdx.y) * 2) =
        make_float2(m, l);
}

// ---- the decode kernel's pipeline (mla_decode.cu): mbarriers, bulk copies, named barriers
// (bulk_copy.cuh) ----
using cuda::bulk_copy_g2s;
using cuda::bulk_copy_g2s_hint;
using cuda::bulk_prefetch_l2;
using cuda::l2_evict_first_policy;
using cuda::mbar_arrive;
using cuda::mbar_arrive_expect_tx;
using cuda::mbar_init;
using cuda::mbar_init_fence;
using cuda::mbar_wait;
using cuda::named_arrive;
using cuda::named_sync;

// ---- fp8 -> f16 pairs in registers (mla_decode.cu) ----
// Four e4m3 bytes w = [b0 b1 b2 b3] (b0 lowest) as two f16x2 of value · 2^-8, with integer ops:
// sign | (x & 0x7f) << 7 reads the e4m3 exponent as an f16 one (bias 15 instead of 7), subnormals
// included (f16 subnormals are 2^-8 times e4m3's). lo = (b0, b2), hi = (b1, b3). No NaN (e4m3fn's
// 0x7f reads 1.875 · 2^-8; the writer never stores it).
__device__ __forceinline__ void e4m3x4_to_f16x2_int(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = ((w << 7) & 0x3f803f80u) | ((w << 8) & 0x80008000u);
  hi = ((w >> 1) & 0x3f803f80u) | (w & 0x80008000u);
}
// e5m2 is the top byte of an f16 (same bias): exact. lo = (b0, b2), hi = (b1, b3).
__device__ __forceinline__ void e5m2x4_to_f16x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = (w << 8) & 0xff00ff00u;
  hi = w & 0xff00ff00u;
}
// Two e4m3 bytes (low byte first) as an exact f16x2 by the conversion unit.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2_hw(uint32_t pair16) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(uint16_t(pair16)));
  return r;
}

}  // namespace strata::cuda::mla
