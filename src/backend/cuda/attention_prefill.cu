// Paged causal attention for prefill and mixed batches (ragged, chunked: a chunk's queries also
// attend to the sequence's earlier pages). head_dim 64 and 128 run the grouped wgmma kernel of
// attention_prefill_wgmma.cu; this file keeps the simple kernel for the other head sizes (16, 32)
// and the dispatch. The simple kernel: FlashAttention-2 style on bf16 tensor cores
// (mma.sync m16n8k16, float32 accumulation): a block owns 64 query rows of one head, 4 warps of
// 16 rows; K/V tiles of 64 tokens are gathered from the page table into shared memory; scores,
// the online softmax and P stay in registers (the accumulator layout of S is the A-operand layout
// of P·V). Tiles are scheduled longest-first.
#include <cfloat>

#include "backend/cuda/attention.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/tree_mask.cuh"

namespace strata::cuda {
namespace {

constexpr int kBM = kPrefillTileRows;
constexpr int kBN = 64;
constexpr int kPad = 8;  // bf16 elements of row padding: conflict-free fragment loads

__device__ __forceinline__ void mma_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t ld32(const bf16_bits* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
__device__ __forceinline__ uint32_t ld_pair(const bf16_bits* lo, const bf16_bits* hi) {
  return uint32_t(*lo) | (uint32_t(*hi) << 16);
}

// Eight KV elements of type E at element offset `off` of `base`, as eight bf16 (16 bytes).
template <int E>
__device__ __forceinline__ uint4 load8_bf16(const void* base, int64_t off) {
  if constexpr (E == kKvBf16) {
    return *reinterpret_cast<const uint4*>(static_cast<const bf16_bits*>(base) + off);
  } else {
    float f[8];
    kv_unpack8<E>(static_cast<const uint8_t*>(base) + off, f);
    return pack8(f);  // exact: every e4m3 and e5m2 value is a bf16
  }
}

template <int D>
constexpr int prefill_smem_bytes() {
  return (kBM + 2 * kBN) * (D + kPad) * 2;
}

template <int D, int E>
__global__ void __launch_bounds__(128) prefill_kernel(AttentionParams p) {
  constexpr int LD = D + kPad;
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  extern __shared__ __align__(16) bf16_bits smem[];
  bf16_bits* qs = smem;
  bf16_bits* ks = qs + kBM * LD;
  bf16_bits* vs = ks + kBN * LD;

  const int tile = p.num_tiles - 1 - int(blockIdx.x);
  const int h = blockIdx.y;
  const int s = p.tiles[2 * tile], tile_q = p.tiles[2 * tile + 1];
  const bool path_tile = (tile_q & kTreePathTile) != 0;  // one tree row, keys in path order
  const int q_start = tile_q & ~kTreePathTile;
  const int group = p.heads / p.kv_heads, kvh = h / group;
  const int q0 = p.meta.q_indptr[s], n_new = p.meta.q_indptr[s + 1] - q0;
  const int len = p.meta.kv_lens[s], first_pos = len - n_new;
  // A path tile's key j is KV row path_key(path_word, j, first_pos); every other tile's is row j.
  const uint64_t path_word = tree_word(p.meta.tree_mask, q0 + q_start, path_tile);
  const int rows = path_tile ? 1 : min(kBM, n_new - q_start);
  const int pos_base = path_position(path_word, first_pos, q_start);  // the tile's first row's
  const int kv_end = min(len, pos_base + rows);
  const int page_size = p.meta.page_size;
  const int32_t* pages = p.meta.page_indices + p.meta.page_indptr[s];
  const int64_t kdim = int64_t(p.kv_heads) * D;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int gr = lane / 4, gc = (lane % 4) * 2;

  for (int idx = tid; idx < kBM * kChunks; idx += 128) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rows)
      v = *reinterpret_cast<const uint4*>(p.q + (int64_t(q0 + q_start + r) * p.heads + h) * D + c);
    *reinterpret_cast<uint4*>(qs + r * LD + c) = v;
  }
  __syncthreads();

  uint32_t qa[D / 16][4];
  const int wr = warp * 16;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    qa[kk][0] = ld32(qs + (wr + gr) * LD + kk * 16 + gc);
    qa[kk][1] = ld32(qs + (wr + gr + 8) * LD + kk * 16 + gc);
    qa[kk][2] = ld32(qs + (wr + gr) * LD + kk * 16 + gc + 8);
    qa[kk][3] = ld32(qs + (wr + gr + 8) * LD + kk * 16 + gc + 8);
  }
  float o[D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0, l1 = 0;
  const int pos0 = pos_base + wr + gr, pos1 = pos0 + 8;
  // Draft trees: the rows' ancestor words (0: causal; a path tile has nothing to hide).
  const uint64_t tw0 =
      tree_word(p.meta.tree_mask, q0 + q_start + wr + gr, wr + gr < rows && !path_tile);
  const uint64_t tw1 =
      tree_word(p.meta.tree_mask, q0 + q_start + wr + gr + 8, wr + gr + 8 < rows && !path_tile);
  const int warp_last_pos = pos_base + wr + 15;
  const float qk_scale = p.scale_log2 * p.k_scale;

  for (int kv0 = 0; kv0 < kv_end; kv0 += kBN) {
    __syncthreads();  // the previous tile is consumed
    for (int idx = tid; idx < kBN * kChunks; idx += 128) {
      const int r = idx / kChunks, c = (idx % kChunks) * 8;
      const int j = kv0 + r;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
      if (j < kv_end) {
        const int row = path_key(path_word, j, first_pos);
        const int64_t slot = int64_t(pages[row / page_size]) * page_size + row % page_size;
        const int64_t off = slot * kdim + int64_t(kvh) * D + c;
        kv = load8_bf16<E>(p.k_cache, off);
        vv = load8_bf16<E>(p.v_cache, off);
      }
      *reinterpret_cast<uint4*>(ks + r * LD + c) = kv;
      *reinterpret_cast<uint4*>(vs + r * LD + c) = vv;
    }
    __syncthreads();
    if (kv0 > warp_last_pos) continue;  // every key of this tile is in this warp's future

    float sc[kBN / 8][4];
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt) {
        const bf16_bits* kr = ks + (nt * 8 + gr) * LD + kk * 16 + gc;
        mma_bf16(sc[nt], qa[kk], ld32(kr), ld32(kr + 8));
      }
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kv0 + nt * 8 + gc + (e & 1);
        const int pos = e < 2 ? pos0 : pos1;
        float v = sc[nt][e] * qk_scale;
        if (key > pos || key >= kv_end || tree_hides(e < 2 ? tw0 : tw1, key, first_pos))
          v = -INFINITY;
        sc[nt][e] = v;
      }
      mx0 = fmaxf(mx0, fmaxf(sc[nt][0], sc[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(sc[nt][2], sc[nt][3]));
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // A row with no visible key yet keeps -inf: use 0 as its reference so exp2 gives 0, not NaN.
    const float ref0 = mn0 == -INFINITY ? 0.0f : mn0, ref1 = mn1 == -INFINITY ? 0.0f : mn1;
    const float c0 = exp2f(m0 - ref0), c1 = exp2f(m1 - ref1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0, rs1 = 0;
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt) {
      sc[nt][0] = exp2f(sc[nt][0] - ref0);
      sc[nt][1] = exp2f(sc[nt][1] - ref0);
      sc[nt][2] = exp2f(sc[nt][2] - ref1);
      sc[nt][3] = exp2f(sc[nt][3] - ref1);
      rs0 += sc[nt][0] + sc[nt][1];
      rs1 += sc[nt][2] + sc[nt][3];
    }
    l0 = l0 * c0 + rs0;
    l1 = l1 * c1 + rs1;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][0] *= c0;
      o[dt][1] *= c0;
      o[dt][2] *= c1;
      o[dt][3] *= c1;
    }
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t a[4];
      a[0] = pack2(sc[2 * kk][0], sc[2 * kk][1]);
      a[1] = pack2(sc[2 * kk][2], sc[2 * kk][3]);
      a[2] = pack2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
      a[3] = pack2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
      const bf16_bits* v0 = vs + (kk * 16 + gc) * LD + gr;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const bf16_bits* vp = v0 + dt * 8;
        const uint32_t b0 = ld_pair(vp, vp + LD);
        const uint32_t b1 = ld_pair(vp + 8 * LD, vp + 9 * LD);
        mma_bf16(o[dt], a, b0, b1);
      }
    }
  }

#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  const float inv0 = l0 > 0 ? p.v_scale / l0 : 0.0f, inv1 = l1 > 0 ? p.v_scale / l1 : 0.0f;
  const int r0 = wr + gr, r1 = r0 + 8;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    if (r0 < rows)
      *reinterpret_cast<uint32_t*>(p.out + (int64_t(q0 + q_start + r0) * p.heads + h) * D + dt * 8 +
                                   gc) = pack2(o[dt][0] * inv0, o[dt][1] * inv0);
    if (r1 < rows)
      *reinterpret_cast<uint32_t*>(p.out + (int64_t(q0 + q_start + r1) * p.heads + h) * D + dt * 8 +
                                   gc) = pack2(o[dt][2] * inv1, o[dt][3] * inv1);
  }
}

template <int D>
void launch_p(const AttentionParams& p, const Launch& launch) {
  const dim3 grid(p.num_tiles, p.heads);
  if (p.kv_elem == kKvE4M3)
    prefill_kernel<D, kKvE4M3><<<grid, 128, prefill_smem_bytes<D>(), launch.stream>>>(p);
  else if (p.kv_elem == kKvE5M2)
    prefill_kernel<D, kKvE5M2><<<grid, 128, prefill_smem_bytes<D>(), launch.stream>>>(p);
  else
    prefill_kernel<D, kKvBf16><<<grid, 128, prefill_smem_bytes<D>(), launch.stream>>>(p);
  CUDA_LAUNCH_CHECK();
}

template <int D>
void set_smem_limit() {
  for (auto* k :
       {prefill_kernel<D, kKvBf16>, prefill_kernel<D, kKvE4M3>, prefill_kernel<D, kKvE5M2>})
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    prefill_smem_bytes<D>()));
}

}  // namespace

bool prefill_attention_supported(int head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

bool grouped_prefill_supported(int head_dim, int group) {
  return (head_dim == 64 || head_dim == 128) && group >= 1 && group <= kGroupedPrefillRows;
}

int prefill_tile_tokens(int head_dim, int group) {
  return grouped_prefill_supported(head_dim, group) ? kGroupedPrefillRows / group
                                                    : kPrefillTileRows;
}

void init_prefill_attention_kernels() {
  init_wgmma_prefill_kernels();
  set_smem_limit<16>();
  set_smem_limit<32>();
  set_smem_limit<64>();
  set_smem_limit<128>();
}

void launch_prefill_attention(const AttentionParams& p, const Launch& launch) {
  if (p.num_tiles == 0) return;
  if (grouped_prefill_supported(p.head_dim, p.heads / p.kv_heads)) {
    launch_wgmma_prefill(p, launch);
    return;
  }
  switch (p.head_dim) {
    case 16:
      launch_p<16>(p, launch);
      break;
    case 32:
      launch_p<32>(p, launch);
      break;
    case 64:
      launch_p<64>(p, launch);
      break;
    case 128:
      launch_p<128>(p, launch);
      break;
    default:
      CHECK_MSG(false, "prefill attention: head_dim {}", p.head_dim);
  }
}

}  // namespace strata::cuda
