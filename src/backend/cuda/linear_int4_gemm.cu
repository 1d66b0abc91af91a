// W4A16 GEMM for any m (prefill, large batches): out [m, n] = x [m, k] · Wᵀ (+ bias) with the
// weight in linear_int4.cu's tile layout, on Hopper's warpgroup tensor cores.
//
// Out transposed, outᵀ = W · xᵀ: the weights are wgmma's A operand, dequantized into registers
// (a lane's 16 bytes of a tile are its A fragments for four k16 steps: one LDS.128 and 15
// instructions per step, no shuffle), and x is the B operand, read by wgmma from shared memory
// (K-major, 128-byte swizzle, as the attention kernels' K tiles). A block is two warpgroups;
// each warp owns one 16-row tile of W and all BM tokens, so no weight is loaded or dequantized
// twice in a block. KW = 1: the warpgroups take 128 different output rows; KW = 2: the same 64
// rows and alternate k tiles, summed in shared memory at the end (twice the blocks, for small
// n · m). Stages of (x tiles, every warp's weight tile and scales) stream in by cp.async, S - 2
// steps ahead of the one being dequantized. Per k step a warpgroup issues the four wgmma of step
// j on one A-fragment buffer and, while they run, waits for step j - 1's wgmma and step j + 1's
// copies, meets the block at one barrier, issues step j + S - 1's copies and dequantizes step
// j + 1 into the other buffer (the loop is unrolled by two so both buffers have fixed registers;
// an odd step count gets a zero-filled step). Two blocks per SM (<= 128 registers, <= 113 KB of
// shared memory each) fill each other's barrier waits. Blocks are rastered in groups of 8 token
// tiles, so a token tile's x stays in L2 while the weights stream past it.

#include "backend/cuda/attention_wgmma.cuh"
#include "backend/cuda/linear_int4.cuh"

namespace strata::cuda {
namespace {

using namespace int4;
using attn::fence_proxy_async;
using attn::make_smem_desc;
using attn::reg_fence;
using attn::wgmma_commit;
using attn::wgmma_fence;
using attn::wgmma_rs_n;
using attn::wgmma_wait;

constexpr int kThreads = 256;
constexpr int kGroupTokenTiles = 8;  // raster group (see above)

template <int BM, int KW>
struct GemmCfg {
  // Stages: as many as fit twice per SM (two blocks of 256 threads).
  static constexpr int kStages = BM == 128 && KW == 2 ? 3 : (BM == 64 && KW == 1 ? 6 : 5);
  static constexpr int kXBytes = KW * BM * 128;       // [KW][BM tokens][64 k] bf16, swizzled
  static constexpr int kWBytes = 8 * kInt4TileBytes;  // each warp's weight tile
  static constexpr int kSBytes = 8 * 2 * 32;          // each warp's (up to) two scale groups
  static constexpr int kWOff = kStages * kXBytes;     // x tiles first: 1024-byte aligned
  static constexpr int kSOff = kWOff + kStages * kWBytes;
  static constexpr int kBytes = kSOff + kStages * kSBytes + 1024;  // + alignment slack
  static constexpr int kRows = KW == 1 ? 128 : 64;                 // output rows per block
  static_assert(KW == 1 || kStages * kXBytes >= BM / 2 * 128 * 4, "split-k sums fit the x stages");
};

// One thread's share of a block: its copy sources and destinations are fixed but for the k
// step, so they are computed once (64-bit index math per copy spilled the BM = 128 kernels).
template <int BM, int KW>
struct GemmBlock {
  using C = GemmCfg<BM, KW>;
  static constexpr int kXPieces = KW * BM * 8 / kThreads;  // 16-byte x copies per thread per step
  static constexpr int kRowSpan = BM / 32;  // x pieces of one k tile: rows r0 + 32·i
  const Int4LinearParams& p;
  uint32_t smem;          // 1024-byte aligned base (shared address)
  const bf16_bits* x0;    // x row tok0 + r0, column 8·(tid % 8)
  int x_rows_ok;          // bit i: row r0 + 32·i is a token (< m)
  int x_col;              // 8·(tid % 8)
  uint32_t x_dst;         // stage offset of piece (q 0, row r0, column x_col), swizzled
  const char* w_src;      // this lane's 16 bytes of the warp's row tile, k tile 0
  const char* s_src;      // this lane's scale piece of the row tile, group 0 (lanes 0-3)
  uint32_t w_dst, s_dst;  // stage offsets
  bool rt_ok, s_lane;     // the row tile exists; this lane copies scales
  int kw, kt_count, gshift;

  // Copies of k step j (k tiles KW·j .. KW·j + KW - 1) into stage j % S; anything past m, n or k
  // is zero-filled.
  __device__ __forceinline__ void issue(int j) const {
    const uint32_t st = smem + uint32_t(j % C::kStages) * C::kXBytes;
#pragma unroll
    for (int it = 0; it < kXPieces; ++it) {
      const int q = it / kRowSpan, ri = it % kRowSpan;
      const int kk = (j * KW + q) * kInt4TileK;
      const bool ok = ((x_rows_ok >> ri) & 1) && kk + x_col < p.k;
      const bf16_bits* src = x0 + int64_t(32 * ri) * p.k + kk;
      cp_async16(st + x_dst + q * BM * 128 + ri * 32 * 128, ok ? src : p.x, ok ? 16 : 0);
    }
    const int kt = j * KW + kw;
    const bool wok = rt_ok && kt < kt_count;
    const uint32_t ws = smem + C::kWOff + uint32_t(j % C::kStages) * C::kWBytes;
    cp_async16(ws + w_dst, wok ? w_src + int64_t(kt) * kInt4TileBytes : p.packed, wok ? 16 : 0);
    if (s_lane) {
      const bool sok = wok && (s_dst % 64 < 32 || p.group == 32);  // lanes 2-3: group 32 only
      const uint32_t ss = smem + C::kSOff + uint32_t(j % C::kStages) * C::kSBytes;
      const int64_t grp = (int64_t(kt) * kInt4TileK) >> gshift;
      cp_async16(ss + s_dst, sok ? s_src + grp * 32 : static_cast<const void*>(p.scale),
                 sok ? 16 : 0);
    }
  }

  // This lane's A fragments of k step j's four k16 steps.
  __device__ __forceinline__ void dequant(int j, uint32_t (&a)[4][4], int warp, int lane) const {
    const int st = j % C::kStages, g = lane / 4;
    uint4 q;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(q.x), "=r"(q.y), "=r"(q.z), "=r"(q.w)
                 : "r"(smem + C::kWOff + st * C::kWBytes + warp * kInt4TileBytes + lane * 16));
    uint32_t s0, s1;
    const uint32_t ss = smem + C::kSOff + st * C::kSBytes + warp * 64 + g * 4;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(s0) : "r"(ss));
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(s1) : "r"(ss + 32));
    if (p.group != 32) s1 = s0;
    uint32_t lo0, hi0, lo1, hi1;
    scale_pairs(s0, &lo0, &hi0);
    scale_pairs(s1, &lo1, &hi1);
    dequant_word(q.x, lo0, hi0, a[0]);
    dequant_word(q.y, lo0, hi0, a[1]);
    dequant_word(q.z, lo1, hi1, a[2]);
    dequant_word(q.w, lo1, hi1, a[3]);
    reg_fence(a);
  }

  // Step j: its A fragments `cur` are ready. Issue its wgmma; while they run, wait for step
  // j - 1's wgmma (its stage and the other fragment buffer `nxt` are then free) and for step
  // j + 1's copies, meet at the barrier, issue step j + S - 1's copies into step j - 1's stage
  // and dequantize step j + 1 into `nxt`.
  __device__ __forceinline__ void step(int j, int steps, float* acc, uint32_t (&cur)[4][4],
                                       uint32_t (&nxt)[4][4], int warp, int lane) const {
    wgmma_fence();
    const uint32_t xb = smem + uint32_t(j % C::kStages) * C::kXBytes + kw * BM * 128;
#pragma unroll
    for (int s = 0; s < 4; ++s) wgmma_rs_n<BM>(acc, cur[s], make_smem_desc(xb + 32 * s, 16, 1024));
    wgmma_commit();
    if (j + 1 < steps) {
      wgmma_wait<1>();
      cp_async_wait<C::kStages - 3>();  // committed: steps 0 .. j + S - 2; step j + 1 landed
      fence_proxy_async();
      __syncthreads();
      issue(j + C::kStages - 1);
      cp_async_commit();
      dequant(j + 1, nxt, warp, lane);
    }
  }
};

template <int BM, int KW>
__global__ void __launch_bounds__(kThreads, 2) int4_gemm_kernel(Int4LinearParams p) {
  using C = GemmCfg<BM, KW>;
  extern __shared__ __align__(128) char smem_raw[];
  if (p.pdl_early) pdl_trigger();
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int wg = warp / 4, wi = warp % 4;
  const int kt_count = int(int4_k_tiles(p.k));
  const int64_t rt_count = int4_row_tiles(p.n), groups = int4_scale_groups(p.k, p.group);
  // Raster: groups of kGroupTokenTiles token tiles, token tile fastest within a group.
  const int64_t m_tiles = (p.m + BM - 1) / BM;
  const int64_t n_blocks = (rt_count + C::kRows / 16 - 1) / (C::kRows / 16);
  const int64_t bid = blockIdx.x, per_group = int64_t(kGroupTokenTiles) * n_blocks;
  const int64_t first = bid / per_group * kGroupTokenTiles;
  const int64_t in_group = min(int64_t(kGroupTokenTiles), m_tiles - first);
  const int64_t m_tile = first + bid % per_group % in_group, n_block = bid % per_group / in_group;
  const int64_t tok0 = m_tile * BM;
  const int64_t rt = n_block * (C::kRows / 16) + (KW == 1 ? wg * 4 : 0) + wi;

  GemmBlock<BM, KW> b{p};
  // The swizzle works on address bits: stages start 1024-byte aligned.
  b.smem = smem_addr(smem_raw);
  b.smem += (1024 - (b.smem & 1023)) & 1023;
  const int r0 = tid / 8;
  b.x_col = 8 * (tid % 8);
  b.x0 = p.x + (tok0 + r0) * p.k + b.x_col;
  b.x_rows_ok = 0;
#pragma unroll
  for (int i = 0; i < GemmBlock<BM, KW>::kRowSpan; ++i)
    b.x_rows_ok |= int(tok0 + r0 + 32 * i < p.m) << i;
  b.x_dst = uint32_t(r0 * 128 + (((tid % 8) ^ (r0 & 7)) << 4));
  b.rt_ok = rt < rt_count;
  b.w_src = static_cast<const char*>(p.packed) + rt * kt_count * kInt4TileBytes + lane * 16;
  b.w_dst = uint32_t(warp * kInt4TileBytes + lane * 16);
  // Scale lanes 0-1: the group of k steps 0-1, lanes 2-3: of steps 2-3 (group 32 only).
  b.s_lane = lane < 4;
  b.s_src =
      reinterpret_cast<const char*>(p.scale) + (rt * groups + lane / 2) * 32 + (lane % 2) * 16;
  b.s_dst = uint32_t(warp * 64 + lane * 16);
  b.kw = KW == 1 ? 0 : wg;
  b.kt_count = kt_count;
  b.gshift = __ffs(p.group) - 1;
  const int steps = (kt_count + KW - 1) / KW;

  pdl_wait();
  if (!p.pdl_early) pdl_trigger();
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    b.issue(s);
    cp_async_commit();
  }
  float acc[BM / 2];
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) acc[i] = 0.0f;
  // Two fragment buffers in turn (the loop is unrolled by two so that both have fixed
  // registers); an odd step count gets one zero-filled step more.
  uint32_t a0[4][4], a1[4][4];
  cp_async_wait<C::kStages - 2>();  // step 0 landed
  fence_proxy_async();
  __syncthreads();
  b.dequant(0, a0, warp, lane);
  const int steps2 = steps + (steps & 1);
  for (int j = 0; j < steps2; j += 2) {
    b.step(j, steps2, acc, a0, a1, warp, lane);
    b.step(j + 1, steps2, acc, a1, a0, warp, lane);
  }
  wgmma_wait<0>();
  reg_fence<BM / 2>(acc);
  cp_async_wait<0>();  // the zero-filled copies past the last step
  char* smem = smem_raw + (b.smem - smem_addr(smem_raw));

  if constexpr (KW == 2) {  // warpgroup 1's partial sums join warpgroup 0's
    __syncthreads();
    float* red = reinterpret_cast<float*>(smem);
    const int t = tid % 128;
    if (wg == 1) {
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) red[i * 128 + t] = acc[i];
    }
    __syncthreads();
    if (wg == 1) return;
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) acc[i] += red[i * 128 + t];
  }
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = rt * kInt4TileRows + g + 8 * h;
    if (row >= p.n) continue;
    const float bias = p.bias ? p.bias[row] : 0.0f;
#pragma unroll
    for (int i = 0; i < BM / 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t tok = tok0 + 8 * i + 2 * c + e;
        if (tok < p.m) p.out[tok * p.n + row] = float_to_bf16(acc[4 * i + 2 * h + e] + bias);
      }
  }
}

template <int BM, int KW>
void set_limit() {
  static_assert(GemmCfg<BM, KW>::kBytes <= 113 * 1024, "two blocks per SM");
  CUDA_CHECK(cudaFuncSetAttribute(int4_gemm_kernel<BM, KW>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  GemmCfg<BM, KW>::kBytes));
}

template <int BM, int KW>
void launch_cfg(const Int4LinearParams& p, cudaStream_t stream) {
  using C = GemmCfg<BM, KW>;
  const int64_t blocks = ceil_div(p.m, BM) * ceil_div(int4_row_tiles(p.n), C::kRows / 16);
  launch_pdl(int4_gemm_kernel<BM, KW>, dim3(unsigned(blocks)), dim3(kThreads), C::kBytes,
             Launch{stream}, p);
  CUDA_LAUNCH_CHECK();
}

}  // namespace

void init_int4_linear_kernels() {
  init_int4_gemv_stream_kernels();
  init_int4_gemv_reg_kernels();
  set_limit<64, 1>();
  set_limit<64, 2>();
  set_limit<128, 1>();
  set_limit<128, 2>();
}

void launch_int4_gemm(const Int4LinearParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return;
  CHECK_MSG(p.glu_inter == 0, "int4 gemm: no SwiGLU epilogue (run silu_mul on its output)");
  CHECK_MSG(int4_group_supported(p.group) && p.k % p.group == 0,
            "int4 gemm: group {} must be a power of two >= 32 dividing k = {}", p.group, p.k);
  CHECK(uintptr_t(p.x) % 16 == 0 && uintptr_t(p.packed) % 16 == 0 && uintptr_t(p.scale) % 16 == 0);
  CHECK(p.gemm_tokens == 0 || p.gemm_tokens == 64 || p.gemm_tokens == 128);
  CHECK(p.gemm_ksplit >= 0 && p.gemm_ksplit <= 2);
  static PerDeviceOnce limits;  // the kernels' shared-memory limits
  limits.run(init_int4_linear_kernels);
  const int bm = p.gemm_tokens ? p.gemm_tokens : (p.m <= 64 ? 64 : 128);
  int kw = p.gemm_ksplit;
  if (kw == 0) {  // split k when splitting rows alone leaves SMs idle
    const int64_t blocks = ceil_div(p.m, bm) * ceil_div(int4_row_tiles(p.n), 8);
    kw = blocks < num_sms() ? 2 : 1;
  }
  if (bm == 64)
    kw == 1 ? launch_cfg<64, 1>(p, stream) : launch_cfg<64, 2>(p, stream);
  else
    kw == 1 ? launch_cfg<128, 1>(p, stream) : launch_cfg<128, 2>(p, stream);
}

}  // namespace strata::cuda
