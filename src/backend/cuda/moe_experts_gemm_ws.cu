// The prefill regime's short-k plain projection (the down projection of a tp-8 expert slice:
// k = 256, n = hidden) with the weights stationary: one CTA per (expert, block of 128 weight
// rows) dequantizes its block once, into the A fragments of wgmma (warp w of warpgroup v holds
// weight rows 64 v + 16 w .. + 15 over all of k: 64 registers at k = 256), and runs them against
// every 64-row tile of the expert's rows in turn (wgmma m64n64k16, x from shared memory).
//
// Why (moe_bench --what kernels, H200, 2026-12-04): the x-resident path (moe_experts_gemm.cu)
// dequantizes each weight once per 64-row x tile: at k = 256 the conversions of a block cost
// about as much as its tensor work, so DeepSeek-V3's FP8 down projection at 8,192 tokens ran at
// 18% of the bf16 GEMM rate (Kimi-K2.5's INT4 20%) while gate_up, k = 7,168, ran at 44%. Here a
// weight is converted once per (expert, block). The fragments stay in registers rather than in
// shared memory: with A in shared memory every wgmma re-reads it (2 KB a warpgroup a k16 step),
// which at n = 32 or 64 x rows is as much shared-memory bandwidth as the tensor cores leave.
//
// Shared memory: two x tiles [k / 64 atoms][64 rows][128 B] (32 KB each at k = 256) and a 16 KB
// output tile, two CTAs an SM. Tile t + 1's copies fly while tile t is computed (the first while
// the block is dequantized). Outputs cross the output tile and leave as whole 16-byte row
// pieces: at 8,192 tokens the down projection's outputs (T · k rows of hidden) are ~1 GB, and
// storing bf16 pairs straight from the accumulators (half a 32-byte sector a store) instead,
// with a third x tile in the output tile's place, took DeepSeek-V3's 764 us against 710 and
// Kimi-K2.5's 888 against 751 (moe_bench sweep, H200, 2026-12-04; that form has left the code).
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/attention_wgmma.cuh"
#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/moe_experts.cuh"

namespace strata::cuda {
namespace {

using namespace moe;
using attn::fence_proxy_async;
using attn::make_smem_desc;
using attn::pack_bf16x2;
using attn::reg_fence;
using attn::wgmma_commit;
using attn::wgmma_fence;
using attn::wgmma_rs_n;
using attn::wgmma_wait;
using int4::cp_async16;
using int4::cp_async_commit;
using int4::cp_async_wait;

constexpr int kThreads = 256;
constexpr int kRows = 128;  // weight rows a CTA (two warpgroups of m64)
constexpr int kTok = 64;    // x rows a tile (wgmma n)

// KA: 64-column k atoms (k = 64 · KA). The output tile: a warpgroup's 64 weight rows x 64 x rows,
// [x row][128 B] with 16-byte units XOR-swizzled by x row % 8.
template <int KA>
struct WsCfg {
  static constexpr int kXBufs = 2;  // x tiles in flight
  static constexpr int kXAtom = kTok * 128;
  static constexpr int kXBuf = KA * kXAtom;
  static constexpr int kOutBytes = 2 * kTok * 128;
  static constexpr int kOutOff = kXBufs * kXBuf;
  static constexpr int kBytes = kOutOff + kOutBytes + 1024;  // + alignment slack
  static_assert(kBytes <= 113 * 1024, "two CTAs per SM");
};

// This lane's A fragments of warp `warp`'s row tile of the block (16 rows, all of k): each lane's
// 16 bytes of a weight tile give its fragments of the tile's k16 steps (moe_experts.cuh).
template <int F, int KA>
__device__ __forceinline__ void dequant_block(const MoeGroupedParams& p, int64_t e, int nb,
                                              uint32_t (&a)[4 * KA][4]) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4;
  const int rt = nb * (kRows / kMoeTileRows) + warp;
  constexpr int kTiles = KA * 64 / moe_tile_k(F);
  if (rt * kMoeTileRows >= p.w.n) {  // past n: zeros (those outputs are never stored)
#pragma unroll
    for (int i = 0; i < 4 * KA; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) a[i][j] = 0;
    return;
  }
  const char* wv = static_cast<const char*>(p.w.values) + e * p.w.values_stride +
                   int64_t(rt) * kTiles * kMoeTileBytes + lane * 16;
  const char* sv = static_cast<const char*>(p.w.scales) + e * p.w.scales_stride;
  const int groups = F == kMoeInt4 ? int(int4_scale_groups(p.w.k, p.w.group)) : 0;
  const int gshift = __ffs(p.w.group) - 1;
  const int scale_cols = int((p.w.k + kMoeFp8Block - 1) / kMoeFp8Block);
  constexpr int kBatch = kTiles < 4 ? kTiles : 4;  // 16-byte loads in flight a lane
#pragma unroll
  for (int t0 = 0; t0 < kTiles; t0 += kBatch) {
    uint4 q[kBatch];
    TileScale sc[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int kt = t0 + b;
      q[b] = __ldg(reinterpret_cast<const uint4*>(wv + kt * kMoeTileBytes));
      sc[b] = TileScale{0, 0};
      if constexpr (F == kMoeFp8) {
        const int64_t at = int64_t(rt / (kMoeFp8Block / kMoeTileRows)) * scale_cols +
                           kt * moe_tile_k(F) / kMoeFp8Block;
        sc[b].s0 = __ldg(reinterpret_cast<const uint32_t*>(sv) + at);
      } else if constexpr (F == kMoeInt4) {
        const int grp = (kt * 64) >> gshift;
        const uint32_t* rec =
            reinterpret_cast<const uint32_t*>(sv + (int64_t(rt) * groups + grp) * 32) + g;
        sc[b].s0 = __ldg(rec);
        sc[b].s1 = p.w.group == 32 ? __ldg(rec + 8) : sc[b].s0;
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
#pragma unroll
      for (int s = 0; s < kSteps<F>; ++s) fragment<F>(q[b], sc[b], s, a[(t0 + b) * kSteps<F> + s]);
  }
}

// The x rows [r, r + 64) ∩ [.., r_end) of the expert into the tile at
// x_smem: thread t copies rows t / 8 and t / 8 + 32, 16-byte unit t % 8 of each k atom; rows
// past r_end are zero.
template <int KA>
__device__ __forceinline__ void issue_x(const MoeGroupedParams& p, int r, int r_end,
                                        uint32_t x_smem) {
  const int tid = int(threadIdx.x), chunk = tid % 8;
#pragma unroll
  for (int i = 0; i < kTok / 32; ++i) {
    const int row = tid / 8 + 32 * i, pr = r + row;
    const bool ok = pr < r_end;
    const bf16_bits* src = p.x + (ok ? int64_t(pr) : 0) * p.w.k + chunk * 8;
#pragma unroll
    for (int a = 0; a < KA; ++a)
      cp_async16(x_smem + uint32_t(a * kTok * 128 + row * 128 + ((chunk ^ (row & 7)) << 4)),
                 ok ? src + a * 64 : p.x, ok ? 16 : 0);
  }
}

// A tile's products at wgmma n = N: x rows 0 .. N - 1 of the tile at xb, their sums acc[0 ..
// N / 2 - 1] (the n = 64 layout's first N / 8 columns; the rest stay as they are).
template <int N, int KA>
__device__ __forceinline__ void tile_mma(float (&acc)[kTok / 2], const uint32_t (&a)[4 * KA][4],
                                         uint32_t xb) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4 * KA; ++ks)
    wgmma_rs_n<N>(
        acc, a[ks],
        make_smem_desc(xb + uint32_t((ks / 4) * WsCfg<KA>::kXAtom + (ks % 4) * 32), 16, 1024));
  wgmma_commit();
  wgmma_wait<0>();
}

// Where the kernel runs an expert's short last tile narrower (p.narrow_tails): fp8 and int4 at
// k = 256 (the tp-8 slices of DeepSeek-V3 and Kimi-K2.5), at n = 32 for tails of up to 32 rows.
// More wgmma shapes in the loop (n = 16 / 32 / 48 by the tail's rows, as until 2026-12-05), or
// the narrow tile at k = 128 or in bf16, make ptxas serialize the kernel's wgmma (see
// bench/cuda/ptxas_check.sh). H100, 8,192 tokens, the down projection: the serialized four-shape
// tails 704-716 us (DeepSeek-V3) / 773-776 us (Kimi-K2.5), this rule 695-699 / 744-749 us, no
// narrow tile 696-706 / 752-759 us (2,048 tokens: all within +-2%; 2026-12-05-session32.md).
template <int F, int KA>
constexpr bool kNarrowTail = (F != kMoeBf16) && KA == 4;

template <int F, int KA>
__global__ void __launch_bounds__(kThreads, 2) moe_gemm_ws_kernel(MoeGroupedParams p) {
  using C = WsCfg<KA>;
  constexpr int kXBufs = C::kXBufs;
  extern __shared__ __align__(128) char smem_raw[];
  if (p.pdl_early) pdl_trigger();
  const int blocks = int((p.w.n + kRows - 1) / kRows);
  const int64_t e = int64_t(blockIdx.x) / blocks;
  const int nb = int(int64_t(blockIdx.x) % blocks);
  // (Dequantizing before pdl_wait would only help the first wave: thousands of CTAs.)
  pdl_wait();
  if (!p.pdl_early) pdl_trigger();
  const int r_begin = p.offsets[e], r_end = p.offsets[e + 1];
  if (r_end <= r_begin) return;
  uint32_t xs = smem_addr(smem_raw);
  xs += (1024 - (xs & 1023)) & 1023;  // the swizzle works on address bits
  // The first x tiles' copies fly while the block is dequantized.
#pragma unroll
  for (int b = 0; b < kXBufs - 1; ++b) {
    if (r_begin + b * kTok < r_end)
      issue_x<KA>(p, r_begin + b * kTok, r_end, xs + uint32_t(b * C::kXBuf));
    cp_async_commit();
  }
  uint32_t a[4 * KA][4];
  dequant_block<F, KA>(p, e, nb, a);
#pragma unroll
  for (int i = 0; i < 4 * KA; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int wg = warp / 4, g = lane / 4, c = lane % 4;
  // This thread's output column (weight row) of h = 0; h = 1 is 8 further.
  const int64_t col0 = int64_t(nb) * kRows + 64 * wg + 16 * (warp % 4) + g;
  int buf = 0;
  for (int r = r_begin; r < r_end; r += kTok, buf = buf + 1 == kXBufs ? 0 : buf + 1) {
    // Tile t + kXBufs - 1's copies go out now, into the buffer tile t - 1 freed.
    const int ahead = r + (kXBufs - 1) * kTok;
    if (ahead < r_end) {
      const int ab = buf == 0 ? kXBufs - 1 : buf - 1;
      issue_x<KA>(p, ahead, r_end, xs + uint32_t(ab * C::kXBuf));
    }
    cp_async_commit();
    cp_async_wait<kXBufs - 1>();  // this tile landed (the next ones may still fly)
    fence_proxy_async();          // X's cp.async before wgmma reads it
    __syncthreads();
    const uint32_t xb = xs + uint32_t(buf * C::kXBuf);
    float acc[kTok / 2];
#pragma unroll
    for (int i = 0; i < kTok / 2; ++i) acc[i] = 0.0f;
    // An expert's last tile of at most 32 rows at wgmma n = 32 (p.narrow_tails; kNarrowTail).
    const int left = r_end - r;
    const int n = !p.narrow_tails || left >= kTok ? kTok : (left + 15) / 16 * 16;
    if (!kNarrowTail<F, KA> || n > 32)
      tile_mma<64, KA>(acc, a, xb);
    else
      tile_mma<32, KA>(acc, a, xb);
    reg_fence<kTok / 2>(acc);
    __syncthreads();  // both warpgroups are done with this buffer: the next iteration refills it
    // acc[4 i + 2 h + e2]: weight row col0 + 8 h, x row r + 8 i + 2 c + e2. Lanes g and g ^ 1
    // swap one value each so that a lane stores two adjacent weight rows of one x row.
    const bool odd = g & 1;
    const uint32_t stage = xs + uint32_t(C::kOutOff + wg * kTok * 128);
#pragma unroll
    for (int i = 0; i < kTok / 8; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float v0 = acc[4 * i + 2 * h], v1 = acc[4 * i + 2 * h + 1];
        const float got = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
        const int t = 8 * i + 2 * c + (odd ? 1 : 0);  // x row in the tile
        const int64_t col = col0 + 8 * h - (odd ? 1 : 0);
        const uint32_t pair = odd ? pack_bf16x2(got, v1) : pack_bf16x2(v0, got);
        const int f = int(col - (int64_t(nb) * kRows + 64 * wg));  // 0..63, even
        const int unit = (f >> 3) ^ (t & 7);
        asm volatile(
            "st.shared.u32 [%0], %1;\n" ::"r"(stage + uint32_t(t * 128 + unit * 16 + (f & 7) * 2)),
            "r"(pair)
            : "memory");
      }
    // The warpgroup's 64 x 64 tile leaves in 16-byte row pieces.
    named_sync(1 + wg, 128);
    const int wt = int(threadIdx.x) % 128;
    const int64_t f0 = int64_t(nb) * kRows + 64 * wg;
#pragma unroll
    for (int q = 0; q < kTok * 8 / 128; ++q) {
      const int piece = wt + 128 * q, t = piece / 8, u = piece % 8;
      if (r + t < r_end && f0 + 8 * u < p.w.n) {
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(stage + uint32_t(t * 128 + ((u ^ (t & 7)) << 4))));
        *reinterpret_cast<uint4*>(p.out + (r + t) * p.w.n + f0 + 8 * u) = v;
      }
    }
  }
  cp_async_wait<0>();  // no copy outlives the CTA
}

template <int F>
void set_limits_ws() {
  CUDA_CHECK(cudaFuncSetAttribute(moe_gemm_ws_kernel<F, 2>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, WsCfg<2>::kBytes));
  CUDA_CHECK(cudaFuncSetAttribute(moe_gemm_ws_kernel<F, 4>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, WsCfg<4>::kBytes));
}
template <int F>
void launch_ws_format(const MoeGroupedParams& p, cudaStream_t stream) {
  const int64_t ctas = int64_t(p.num_experts) * ((p.w.n + kRows - 1) / kRows);
  CHECK_MSG(ctas < (int64_t(1) << 31), "moe gemm ws: {} CTAs", ctas);
  if (p.w.k == 256)
    launch_pdl(moe_gemm_ws_kernel<F, 4>, dim3(unsigned(ctas)), dim3(kThreads), WsCfg<4>::kBytes,
               Launch{stream}, p);
  else
    launch_pdl(moe_gemm_ws_kernel<F, 2>, dim3(unsigned(ctas)), dim3(kThreads), WsCfg<2>::kBytes,
               Launch{stream}, p);
  CUDA_LAUNCH_CHECK();
}

}  // namespace

bool moe_gemm_ws_supported(const MoeGroupedParams& p) {
  // (x in the plan's row order, as the down projection reads act: row_token is not taken.)
  return p.offsets != nullptr && p.num_experts > 0 && p.glu_inter == 0 && p.row_token == nullptr &&
         (p.w.k == 128 || p.w.k == 256) && p.w.n % kMoeTileRows == 0 &&
         (p.w.format != kMoeInt4 || p.w.group % 64 == 0 || p.w.group == 32);
}

void init_moe_gemm_ws_kernels() {
  set_limits_ws<kMoeBf16>();
  set_limits_ws<kMoeFp8>();
  set_limits_ws<kMoeInt4>();
}

void launch_moe_gemm_ws(const MoeGroupedParams& p, cudaStream_t stream) {
  CHECK_MSG(moe_gemm_ws_supported(p), "moe gemm ws: n {} k {} format {} group {}", p.w.n, p.w.k,
            p.w.format, p.w.group);
  switch (p.w.format) {
    case kMoeBf16:
      return launch_ws_format<kMoeBf16>(p, stream);
    case kMoeFp8:
      return launch_ws_format<kMoeFp8>(p, stream);
    default:
      return launch_ws_format<kMoeInt4>(p, stream);
  }
}

}  // namespace strata::cuda
