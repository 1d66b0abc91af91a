// MLA absorbed attention on Hopper's warpgroup tensor cores (wgmma, sm_90a) for bf16 rows of
// R = 512 latent + P = 64 rope values: 64 query rows a block (DeepSeek-V3's 128 heads: two blocks
// a token; long chunks of any head count), where the mma.sync kernel (mla_attention.cu) runs out
// of shared-memory bandwidth. Same rows, keys, splits, partials and outputs as that kernel.
//
// Two warpgroups, 64-key chunks, the bf16 rows copied by cp.async straight into the 128-byte
// swizzled layout wgmma reads ([9 column groups][64 rows][64], 16-byte piece c of row r at
// c ^ (r % 8): attention_prefill_wgmma.cu's layout), 2 stages. Per chunk:
//  - warpgroup 0: S = Q·Kᵀ (64×64 over 576 dims, Q and K from shared memory), the mask, the
//    online softmax, P rounded to bf16 in the A-fragment layout; it hands P's fragments and the
//    rows' rescale factors to warpgroup 1 through shared memory (a named barrier), then
//    O[:, 0:256] += P·V with P from registers;
//  - warpgroup 1: waits for P, O[:, 256:512] += P·V.
// V is the first 512 columns of the same K tile read as an MN-major operand, so every key row is
// copied once and serves both products and all 64 rows. Each thread holds 128 float32 of O.
// Shared memory: Q 72 KiB + 2 K stages 144 KiB + P 8 KiB + 1.5 KiB (+1 KiB alignment) = 226.5 KiB.
#include <cfloat>

#include "backend/cuda/mla_wgmma.cuh"

namespace strata::cuda {
namespace {

using namespace attn;
using namespace mla_wgmma;

constexpr int kQOff = 0;
constexpr int kKOff = kQOff + kRows * kD * 2;
constexpr int kPOff = kKOff + 2 * kTileBytes;      // [4 k-steps][4 regs][128 threads] uint32
constexpr int kCorrOff = kPOff + 4 * 4 * 128 * 4;  // [2][128] float: rescale factors, then (m, l)
constexpr int kSlotOff = kCorrOff + 2 * 128 * 4;   // [2][kChunk] int32
constexpr int kSmemBytes = kSlotOff + 2 * kChunk * 4 + 1024;  // + alignment slack
static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
constexpr int kBarP = 1;  // named barrier: warpgroup 0's P and factors are in shared memory

__global__ void __launch_bounds__(kThreads, 1) mla_wgmma_kernel(MlaAttentionParams p) {
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
  const char* cache = static_cast<const char*>(p.cache);
  int32_t* slots = reinterpret_cast<int32_t*>(smem + kSlotOff);
  uint32_t* xp = reinterpret_cast<uint32_t*>(smem + kPOff);
  float* xc = reinterpret_cast<float*>(smem + kCorrOff);
  const uint32_t q_s = smem_addr(smem + kQOff);

  for (int i = tid; i < kRows * kPieces; i += kThreads) {
    const int r = i / kPieces, c = i % kPieces;
    const bool ok = w.row0 + r < w.rows;
    const uint16_t* src = ok ? p.q + int64_t(w.q_row0 + w.row0 + r) * p.q_stride + c * 8 : p.q;
    mla::cp_async_zfill<16>(q_s + swz(r, c, kRows), src, ok);
  }
  for (int i = tid; i < 2 * kChunk; i += kThreads) {
    const int j = w.begin + i;
    slots[i] = j < w.end ? w.slot_of(j, p.page_size) : -1;
  }
  __syncthreads();
  auto issue = [&](int c) {
    const int32_t* st = slots + (c % 2) * kChunk;
    const uint32_t dst = smem_addr(smem + kKOff + (c % 2) * kTileBytes);
    for (int i = tid; i < kChunk * kPieces; i += kThreads) {
      const int r = i / kPieces, piece = i % kPieces;
      const int slot = st[r];
      const char* src = cache + (slot >= 0 ? int64_t(slot) * p.fmt.row_bytes + piece * 16 : 0);
      mla::cp_async_zfill<16>(dst + swz(r, piece, kChunk), src, slot >= 0);
    }
  };
  if (w.nchunks > 0) issue(0);  // Q joins chunk 0's group
  cp_async_commit();

  // Warpgroup 0's rows g and g + 8 of its warp: key limits. Both warpgroups: the running state.
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

  for (int c = 0; c < w.nchunks; ++c) {
    cp_async_wait<0>();
    fence_proxy_async();  // cp.async writes, read next by wgmma (the async proxy)
    __syncthreads();      // chunk c landed; everyone is done with chunk c - 1 and the exchange
    if (c + 1 < w.nchunks) issue(c + 1);
    cp_async_commit();
    const int jn = w.begin + (c + 2) * kChunk + tid;
    int next_slot = -1;
    if (tid < kChunk && jn < w.end) next_slot = w.slot_of(jn, p.page_size);
    const uint32_t k_s = smem_addr(smem + kKOff + (c % 2) * kTileBytes);

    if (wg == 0) {
      float sc[32];
      wgmma_fence();
      qk(sc, q_s, k_s, 0, kD / 16);
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence<32>(sc);
      float corr[2];
      const bool open = chunk_open(w.begin + c * kChunk, lim, tw, w.first);
      softmax(sc, lim, tw, w.first, w.begin + c * kChunk + c2, open, qk_scale, m, l, pa, corr);
#pragma unroll
      for (int kk = 0; kk < kChunk / 16; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j) xp[(kk * 4 + j) * 128 + t128] = pa[kk][j];
      xc[t128] = corr[0];
      xc[128 + t128] = corr[1];
      mla::named_arrive(kBarP, kThreads);
      rescale(o, corr[0], corr[1]);
    } else {
      mla::named_sync(kBarP, kThreads);
#pragma unroll
      for (int kk = 0; kk < kChunk / 16; ++kk)
#pragma unroll
        for (int j = 0; j < 4; ++j) pa[kk][j] = xp[(kk * 4 + j) * 128 + t128];
      rescale(o, xc[t128], xc[128 + t128]);
    }
    pv(o, pa, k_s, wg);
    if (tid < kChunk) slots[(c % 2) * kChunk + tid] = next_slot;
  }
  cp_async_wait<0>();

  // Warpgroup 0 holds the rows' (m, l): hand them to warpgroup 1, then both store their columns.
  __syncthreads();
  if (wg == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
      xc[h * 128 + t128] = l[h];
      reinterpret_cast<float*>(xp)[h * 128 + t128] = m[h];
    }
  }
  __syncthreads();
  float sum[2], mh[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    sum[h] = xc[h * 128 + t128];
    mh[h] = reinterpret_cast<float*>(xp)[h * 128 + t128];
  }
  store_rows(p, w, o, wg, wi, g, c2, mh, sum);
}

}  // namespace

void init_mla_attention_wgmma_kernels() {
  CUDA_CHECK(cudaFuncSetAttribute(mla_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kSmemBytes));
}

void launch_mla_attention_wgmma(const MlaAttentionParams& p, cudaStream_t stream) {
  CHECK_MSG(mla_wgmma_supported(p.fmt) && p.copy_width == 16 && p.chunk == kChunk,
            "MLA wgmma attention: bf16 rows of 512 + 64 values, 16-byte aligned, 64-key chunks");
  mla::launch(mla_wgmma_kernel, dim3(p.row_tiles, p.num_splits, p.num_seqs), dim3(kThreads),
              size_t(kSmemBytes), stream, p);
  CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
