// The pipelined wgmma MLA kernel (mla_attention.h, kMlaWgmmaPipe): the tiles, products and
// softmax of the wgmma kernel (mla_wgmma.cuh, mla_attention_wgmma.cu) with the block-wide
// barriers taken out of the loop. There, every chunk starts with all 256 threads issuing the next
// chunk's 4,608 cp.async and a __syncthreads, so warpgroup 0's S = Q·Kᵀ of chunk c + 1 waits for
// warpgroup 1's half of P·V of chunk c and for the copies to be issued (128 heads: 39% of the
// bf16 GEMM rate on an H200). Here:
//  - warpgroup 1 is also the loader: after its P·V of chunk c, once both warpgroups are done with
//    the stage (an empty mbarrier, one arrival per warp), it copies chunk c + 2 into it, column
//    group by column group (64 rows x 128 bytes), each group's copies tracked by their own full
//    mbarrier (cp.async.mbarrier.arrive.noinc: completes when the 128 threads' copies landed);
//  - warpgroup 0 waits per column group, so S of a chunk starts on its first group while the
//    rest land, and runs S of chunk c + 1 while warpgroup 1 still multiplies P·V of chunk c and
//    loads; P goes through one shared buffer (P-ready / P-free named barriers);
//  - Q is copied by warpgroup 1 with the first chunks (its own mbarrier).
// Shared memory as the wgmma kernel's (Q 72 KiB, 2 K stages 144 KiB, P 8 KiB, factors 1 KiB) plus
// 21 mbarriers. Diagnostics (p.diag, benchmarks): 1 copies without products, 2 products without
// copies. Where a sequence's two row tiles can pair (128 heads, one new token, pages of a multiple
// of 16), they run as a cluster of 2 fed by multicast TMA copies (below: "the row-tile pairs").
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cfloat>

#include "backend/cuda/cluster.cuh"
#include "backend/cuda/mla_wgmma.cuh"

namespace strata::cuda {
namespace {

using namespace attn;
using namespace mla_wgmma;

constexpr int kQOff = 0;
constexpr int kKOff = kQOff + kRows * kD * 2;
constexpr int kPOff = kKOff + 2 * kTileBytes;      // [4 k-steps][4 regs][128 threads] uint32
constexpr int kCorrOff = kPOff + 4 * 4 * 128 * 4;  // [2][128] float: rescale factors, then (m, l)
constexpr int kFullOff = kCorrOff + 2 * 128 * 4;   // [2 stages][kGroups] mbarriers
constexpr int kEmptyOff = kFullOff + 2 * kGroups * 8;  // [2 stages]
constexpr int kQBarOff = kEmptyOff + 2 * 8;
constexpr int kSmemBytes = kQBarOff + 8 + 1024;  // + alignment slack
static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
// Named barriers (0 is __syncthreads).
constexpr int kBarP = 1;      // warpgroup 0's P and factors written (0 arrives, 1 syncs)
constexpr int kBarPFree = 2;  // warpgroup 1 has read them (1 arrives, 0 syncs)
constexpr int kBarFinal = 3;  // warpgroup 0's row sums and maxima written
constexpr int kBarTail = 4;   // MC: warpgroup 0's zeros of a last chunk's rows past the end

// ---- the row-tile pairs (MC; launch_mla_attention_wgmma_pipe picks them) ----
// A sequence's two 64-row tiles (128 heads, one new token) as a cluster of 2 whose K column
// groups come by TMA tensor copies multicast to both CTAs: rank r issues its half of a chunk's 9
// groups, each group as 64 / P boxes of P consecutive slots (P = 64, 32 or 16: the page size's
// largest such divisor), landing in the 128-byte-swizzled layout the cp.async path writes (swz),
// so L2 serves each row once to both tiles, and one thread issues a chunk's copies where 128
// threads issued 36 cp.async each. Why (H100, 2026-12-06, batch 64 x 4,096, 128 heads): the copies
// alone took 0.178 ms of the unpaired kernel's 0.201 (the products alone 0.147), and 0.136 with
// one tile's L2 reads gone; the pairs run 0.170-0.173 ms against 0.200-0.203 in the same
// processes (-15%), the same bits (bench/results/2026-12-06-session38.md).
// Keys past a sequence's end in its last chunk arrive as whatever the slots hold
// (TMA does not zero-fill them as cp.async did): warpgroup 0 zeroes those rows before any product
// reads the chunk, so a masked key's V never meets P = 0 as NaN · 0.
// The barriers' protocol (both CTAs' arrivals, the cluster barriers, the tail's zeros) is model
// checked by bench/cuda/mla_sync_model.py (wgmma_pairs_kernel), with the broken forms it catches.
__device__ __forceinline__ void tma_mc_2d(uint32_t dst, const CUtensorMap* map, int x, int y,
                                          uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar), "h"(mask)
      : "memory");
}

// Slots a box: the largest of 64, 32, 16 that divides the page size (0: none, no pairs).
__host__ __device__ constexpr int mc_box_rows(int page_size) {
  return page_size % 64 == 0 ? 64 : page_size % 32 == 0 ? 32 : page_size % 16 == 0 ? 16 : 0;
}

template <bool MC>
__device__ __forceinline__ void pipe_body(const MlaAttentionParams& p, const CUtensorMap* tmap) {
  extern __shared__ __align__(128) char smem_raw[];
  // wgmma's swizzle works on address bits: tiles start 1024-byte aligned.
  char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  pdl_wait();
  pdl_trigger();
  mla::BlockWork w;
  if (!w.init(p, kRows)) return;
  const int tid = threadIdx.x, lane = tid % 32;
  // The warpgroup as a value every thread of a warp provably shares.
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  const int t128 = tid % 128, wi = t128 / 32, g = lane / 4, c2 = (lane % 4) * 2;
  uint32_t* xp = reinterpret_cast<uint32_t*>(smem + kPOff);
  float* xc = reinterpret_cast<float*>(smem + kCorrOff);
  const uint32_t q_s = smem_addr(smem + kQOff);
  const uint32_t full0 = smem_addr(smem + kFullOff), empty0 = smem_addr(smem + kEmptyOff);
  const uint32_t qbar = smem_addr(smem + kQBarOff);
  const uint32_t rank = MC ? cluster_rank() : 0, peer = rank ^ 1;
  if (tid == 0) {
    // MC: one arrival (the loader's expect_tx) a group; both CTAs' warps free a stage.
    for (int i = 0; i < 2 * kGroups; ++i) mla::mbar_init(full0 + 8 * i, MC ? 1 : 128);
    for (int s = 0; s < 2; ++s) mla::mbar_init(empty0 + 8 * s, (MC ? 2 : 1) * kThreads / 32);
    mla::mbar_init(qbar, 128);
    mla::mbar_init_fence();
  }
  if constexpr (MC)
    cluster_sync();  // the peer's barriers exist before any copy or arrival reaches them
  else
    __syncthreads();
  // A warp is done with stage s: its (and, MC, the peer's) empty barrier.
  auto free_stage = [&](int s) {
    if (lane != 0) return;
    mla::mbar_arrive(empty0 + 8 * s);
    if constexpr (MC) mbar_arrive_remote(cluster_map(empty0 + 8 * s, peer));
  };
  const int nchunks = w.nchunks;
  const bool math = p.diag != 1, loads = p.diag != 2;

  if (wg == 1) {
    // ---- warpgroup 1: the loads, then O[:, 256:512] ----
    // Thread t copies pieces 4 (t % 2) .. + 3 of each column group of row t / 2 of a chunk.
    const char* cache = static_cast<const char*>(p.cache);
    const int r = t128 >> 1, half = t128 & 1;
    auto load_chunk = [&](int c) {
      if constexpr (MC) {
        if (t128 != 0) return;
        const int s = c & 1, box = mc_box_rows(p.page_size);
        for (int j = 0; j < kGroups; ++j)
          mla::mbar_arrive_expect_tx(full0 + 8 * (s * kGroups + j), kChunk * 128);
        const int j0 = rank == 0 ? 0 : kGroups / 2 + 1, j1 = rank == 0 ? kGroups / 2 + 1 : kGroups;
        const uint32_t dst = smem_addr(smem + kKOff + s * kTileBytes);
        for (int b = 0; b < kChunk / box; ++b) {
          // A box wholly past the sequence's end copies the chunk's first box again (its page
          // table has no entry there; the bytes must still arrive, and its rows are zeroed).
          const int key = w.begin + c * kChunk + b * box;
          const int slot = w.slot_of(key < w.end ? key : w.begin + c * kChunk, p.page_size);
          for (int j = j0; j < j1; ++j)
            tma_mc_2d(dst + j * kChunk * 128 + b * box * 128, tmap, j * 64, slot,
                      full0 + 8 * (s * kGroups + j), uint16_t(3));
        }
        return;
      }
      const int key = w.begin + c * kChunk + r;
      const bool ok = key < w.end;
      const char* row = ok ? cache + int64_t(w.slot_of(key, p.page_size)) * p.fmt.row_bytes : cache;
      const uint32_t dst = smem_addr(smem + kKOff + (c & 1) * kTileBytes);
#pragma unroll
      for (int j = 0; j < kGroups; ++j) {
        if (loads) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int piece = 8 * j + 4 * half + i;
            mla::cp_async_zfill<16>(dst + swz(r, piece, kChunk), row + (ok ? piece * 16 : 0), ok);
          }
        }
        cp_async_arrive_noinc(full0 + 8 * ((c & 1) * kGroups + j));
      }
    };
    if (nchunks > 0) {
      const bool ok = w.row0 + r < w.rows;
      const uint16_t* src = ok ? p.q + int64_t(w.q_row0 + w.row0 + r) * p.q_stride : p.q;
      for (int c = half; c < kPieces; c += 2)
        mla::cp_async_zfill<16>(q_s + swz(r, c, kRows), src + (ok ? c * 8 : 0), ok);
      cp_async_arrive_noinc(qbar);
      load_chunk(0);
      if (nchunks > 1) load_chunk(1);
    }
    float o[2][64];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 64; ++i) o[h][i] = 0.0f;
    uint32_t pa[4][4];
    for (int c = 0; c < nchunks; ++c) {
      const int s = c & 1;
      const uint32_t par = (c >> 1) & 1;
      mla::named_sync(kBarP, kThreads);
#pragma unroll
      for (int kk = 0; kk < kChunk / 16; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j) pa[kk][j] = xp[(kk * 4 + j) * 128 + t128];
      const float c0 = xc[t128], c1 = xc[128 + t128];
      mla::named_arrive(kBarPFree, kThreads);
      rescale(o, c0, c1);
      // V's columns 256..511 (groups 4..7): every loader thread's copies of them landed.
      for (int j = 4; j < 8; ++j) mla::mbar_wait(full0 + 8 * (s * kGroups + j), par);
      fence_proxy_async();
      if (math) pv(o, pa, smem_addr(smem + kKOff + s * kTileBytes), 1);
      __syncwarp();
      free_stage(s);
      if (c + 2 < nchunks) {  // refill the stage once all 8 warps are done with chunk c
        if constexpr (MC)
          mbar_wait_cluster(empty0 + 8 * s, par);
        else
          mla::mbar_wait(empty0 + 8 * s, par);
        load_chunk(c + 2);
      }
    }
    mla::named_sync(kBarFinal, kThreads);
    float sum[2], mh[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sum[h] = xc[h * 128 + t128];
      mh[h] = reinterpret_cast<float*>(xp)[h * 128 + t128];
    }
    store_rows(p, w, o, 1, wi, g, c2, mh, sum);
    if constexpr (MC) cluster_sync();  // no CTA leaves while the peer may still reach into it
    return;
  }

  // ---- warpgroup 0: S, the softmax, P to warpgroup 1, O[:, 0:256] ----
  int lim[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) lim[h] = w.limit(p, w.row0 + wi * 16 + g + 8 * h);
  uint64_t tw[2];  // draft trees: the rows' ancestor words
#pragma unroll
  for (int h = 0; h < 2; ++h) tw[h] = w.tree_word_of(p, w.row0 + wi * 16 + g + 8 * h);
  const float qk_scale = p.fmt.latent_scale * p.scale_log2;  // plain bf16 rows: one scale
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[2][64];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 64; ++i) o[h][i] = 0.0f;
  uint32_t pa[4][4];
  if (nchunks > 0) mla::mbar_wait(qbar, 0);
  for (int c = 0; c < nchunks; ++c) {
    const int s = c & 1;
    const uint32_t par = (c >> 1) & 1;
    const uint32_t k_s = smem_addr(smem + kKOff + s * kTileBytes);
    float sc[32];
    if (MC && w.begin + (c + 1) * kChunk > w.end) {
      // The last chunk's keys past the end (TMA copied the slots' bytes, not zeros): zero their
      // rows here, in this CTA's copy, before S reads them and before warpgroup 1 reads V (its
      // P·V of this chunk follows this warpgroup's P-ready arrival below).
      for (int j = 0; j < kGroups; ++j) mla::mbar_wait(full0 + 8 * (s * kGroups + j), par);
      const int valid = w.end - (w.begin + c * kChunk);
      char* tile = smem + kKOff + s * kTileBytes;
      for (int i = t128; i < (kChunk - valid) * kPieces; i += 128) {
        const int r = valid + i / kPieces, piece = i % kPieces;
        *reinterpret_cast<uint4*>(tile + swz(r, piece, kChunk)) = make_uint4(0, 0, 0, 0);
      }
      fence_proxy_async();  // the zeros, before the wgmma (async proxy) reads of this warpgroup
      mla::named_sync(kBarTail, 128);
    }
    if (math) {
#pragma unroll
      for (int j = 0; j < kGroups; ++j) {  // each column group as soon as it landed
        mla::mbar_wait(full0 + 8 * (s * kGroups + j), par);
        fence_proxy_async();
        wgmma_fence();  // (between batches on the same accumulators, as CUTLASS's mainloops do)
        qk(sc, q_s, k_s, 4 * j, 4 * j + 4);
      }
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence<32>(sc);
    } else {
      for (int j = 0; j < kGroups; ++j) mla::mbar_wait(full0 + 8 * (s * kGroups + j), par);
#pragma unroll
      for (int i = 0; i < 32; ++i) sc[i] = 0.0f;
    }
    float corr[2];
    const bool open = chunk_open(w.begin + c * kChunk, lim, tw, w.first);
    softmax(sc, lim, tw, w.first, w.begin + c * kChunk + c2, open, qk_scale, m, l, pa, corr);
    if (c > 0) mla::named_sync(kBarPFree, kThreads);  // warpgroup 1 has read chunk c - 1's
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) xp[(kk * 4 + j) * 128 + t128] = pa[kk][j];
    xc[t128] = corr[0];
    xc[128 + t128] = corr[1];
    mla::named_arrive(kBarP, kThreads);
    rescale(o, corr[0], corr[1]);
    if (math) pv(o, pa, k_s, 0);
    __syncwarp();
    free_stage(s);
  }
  // Warpgroup 1's last P-free arrival, then the rows' (m, l) for it; both store their columns.
  if (nchunks > 0) mla::named_sync(kBarPFree, kThreads);
  float sum[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    sum[h] = l[h] + __shfl_xor_sync(0xffffffffu, l[h], 1);
    sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
    xc[h * 128 + t128] = sum[h];
    reinterpret_cast<float*>(xp)[h * 128 + t128] = m[h];
  }
  mla::named_arrive(kBarFinal, kThreads);
  store_rows(p, w, o, 0, wi, g, c2, m, sum);
  if constexpr (MC) cluster_sync();
}

__global__ void __launch_bounds__(kThreads, 1) mla_wgmma_pipe_kernel(MlaAttentionParams p) {
  pipe_body<false>(p, nullptr);
}
__global__ void __launch_bounds__(kThreads, 1)
    mla_wgmma_pipe_mc_kernel(MlaAttentionParams p, const __grid_constant__ CUtensorMap tmap) {
  pipe_body<true>(p, &tmap);
}

// The layer's cache as a 2D tensor (slots x 576 bf16 values; 128-byte swizzled boxes of 64 values
// x mc_box_rows slots). The slot count is not known here: 2^28, past any pool (no copy reads
// beyond the slots the page table names).
CUtensorMap cache_tensor_map(const MlaAttentionParams& p) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                cudaEnableDefault, &q));
    CHECK(fn != nullptr && q == cudaDriverEntryPointSuccess);
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(kD), cuuint64_t(1) << 28};
  const cuuint64_t strides[1] = {cuuint64_t(p.fmt.row_bytes)};
  const cuuint32_t box[2] = {64, cuuint32_t(mc_box_rows(p.page_size))}, estr[2] = {1, 1};
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(p.cache), dims, strides,
             box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CHECK_MSG(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled: {}", int(r));
  return map;
}

}  // namespace

void init_mla_attention_wgmma_pipe_kernels() {
  CUDA_CHECK(cudaFuncSetAttribute(mla_wgmma_pipe_kernel,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  CUDA_CHECK(cudaFuncSetAttribute(mla_wgmma_pipe_mc_kernel,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
}

void launch_mla_attention_wgmma_pipe(const MlaAttentionParams& p, cudaStream_t stream) {
  CHECK_MSG(mla_wgmma_supported(p.fmt) && p.copy_width == 16 && p.chunk == kChunk,
            "MLA wgmma attention: bf16 rows of 512 + 64 values, 16-byte aligned, 64-key chunks");
  // The pairs where both tiles of a pair hold rows of every sequence (128 heads, one new token:
  // a CTA of a pair never leaves early while the other waits at a cluster barrier), pages of a
  // multiple of 16 slots, no draft-tree paths, no diagnostics.
  const bool pairs = p.multicast && p.heads == 128 && p.row_tiles == 2 &&
                     mc_box_rows(p.page_size) > 0 && p.tree_paths == 0 && p.diag == 0 &&
                     uintptr_t(p.cache) % 16 == 0;
  if (pairs) {
    launch_pdl_cluster(mla_wgmma_pipe_mc_kernel, dim3(p.row_tiles, p.num_splits, p.num_seqs),
                       dim3(kThreads), size_t(kSmemBytes), Launch{stream}, 2, p,
                       cache_tensor_map(p));
  } else {
    mla::launch(mla_wgmma_pipe_kernel, dim3(p.row_tiles, p.num_splits, p.num_seqs), dim3(kThreads),
                size_t(kSmemBytes), stream, p);
  }
  CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
