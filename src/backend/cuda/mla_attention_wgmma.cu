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

#include "backend/cuda/attention_wgmma.cuh"
#include "backend/cuda/mla_device.cuh"

namespace strata::cuda {
namespace {

using namespace attn;

constexpr int kThreads = 256;
constexpr int kRows = 64;
constexpr int kChunk = 64;  // keys a stage (p.chunk)
constexpr int kR = 512, kP = 64, kD = kR + kP;
constexpr int kPieces = kD / 8;              // 16-byte pieces of a row
constexpr int kTileBytes = kChunk * kD * 2;  // = kRows · kD · 2 (Q)
constexpr int kQOff = 0;
constexpr int kKOff = kQOff + kRows * kD * 2;
constexpr int kPOff = kKOff + 2 * kTileBytes;      // [4 k-steps][4 regs][128 threads] uint32
constexpr int kCorrOff = kPOff + 4 * 4 * 128 * 4;  // [2][128] float: rescale factors, then (m, l)
constexpr int kSlotOff = kCorrOff + 2 * 128 * 4;   // [2][kChunk] int32
constexpr int kSmemBytes = kSlotOff + 2 * kChunk * 4 + 1024;  // + alignment slack
static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");

// Byte offset of 16-byte piece c of row r in a swizzled [groups][rows][64] bf16 tile.
__device__ __forceinline__ uint32_t swz(int r, int c, int rows) {
  return uint32_t((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
constexpr int kBarP = 1;  // named barrier: warpgroup 0's P and factors are in shared memory

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
  const float qk = p.fmt.latent_scale * p.scale_log2;  // plain bf16 rows: one scale
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
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks) {
        const uint32_t qa = q_s + uint32_t((ks / 4) * kRows * 128 + (ks % 4) * 32);
        const uint32_t kb = k_s + uint32_t((ks / 4) * kChunk * 128 + (ks % 4) * 32);
        wgmma_ss_m64n64k16<0>(sc, make_smem_desc(qa, 16, 1024), make_smem_desc(kb, 16, 1024),
                              ks > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence<32>(sc);
      const int key0 = w.begin + c * kChunk + c2;
      float corr[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kChunk / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& s = sc[4 * nt + 2 * h + e];
            s = key0 + nt * 8 + e < lim[h] ? s * qk : -INFINITY;
            mx = fmaxf(mx, s);
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
#pragma unroll
        for (int j = 0; j < 4; ++j) xp[(kk * 4 + j) * 128 + t128] = pa[kk][j];
      }
      xc[t128] = corr[0];
      xc[128 + t128] = corr[1];
      bar_arrive(kBarP, kThreads);
      rescale(o, corr[0], corr[1]);
    } else {
      bar_sync(kBarP, kThreads);
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
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = xc[h * 128 + t128], mh = reinterpret_cast<float*>(xp)[h * 128 + t128];
    const int r = w.row0 + wi * 16 + g + 8 * h;
    if (r >= w.rows) continue;
    const int grow = w.q_row0 + r;
    const float inv = sum > 0.0f ? p.fmt.latent_scale / sum : 0.0f;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int nt = 0; nt < 16; ++nt)
        mla::store_pair(p, grow, wg * 256 + half * 128 + nt * 8 + c2, o[half][4 * nt + 2 * h],
                        o[half][4 * nt + 2 * h + 1], inv);
    if (wg == 0 && c2 == 0) mla::store_ml(p, grow, mh, sum);
  }
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
