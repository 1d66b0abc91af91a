// The prefill regime's grouped GEMM with producer warps: one CTA an SM of two consumer
// warpgroups and a warpgroup that only copies, over a pipeline of mbarriers
// (MoeGroupedParams::pipe; moe_gemm_pipe_supported says where; the default, CudaTunables::
// moe_gemm_pipe).
//
// Why (ncu per SASS instruction, H200, 2026-12-04, the two-CTA kernel of moe_experts_gemm.cu at
// 8,192 tokens): its warps both copied and multiplied, so they waited on their own cp.async
// groups (Moonlight bf16: 27% long scoreboard), on the CTA barrier of each k step (9%) and on
// the x rows' address chain (DeepSeek-V3 FP8: 27% of the samples, beside the conversions).
//
// This kernel:
//  - 384 threads, one CTA an SM: warps 0-7 are two consumer warpgroups (224 registers a thread
//    by setmaxnreg), warps 8-11 the producers. A CTA takes a plan tile of 128 x rows
//    (the wgmma n) and 256 weight rows: plain, 16 row tiles (warpgroup v rows 128 v ..); SwiGLU,
//    128 outputs, warpgroup 0 their 8 gate row tiles and warpgroup 1 the matching 8 up row tiles.
//    Each warpgroup runs two m64 blocks, so a weight fragment serves 128 x rows and an x tile 256
//    weight rows (the two-CTA kernel: 128 x rows, 128 weight rows).
//  - Stages of one 64-column k step (x tile 16 KB, weights 8-32 KB, scales), as many as fit
//    (bf16 4, fp8 6, int4 8): each producer warp waits on a stage's empty mbarrier (one arrival
//    per consumer warp), then copies its share: 4 row tiles' weights, one bulk copy each (a row
//    tile's k step is contiguous in the tile layout), 32 x rows by cp.async (8 lanes a row,
//    whole 32-byte sectors a copy round; row offsets held in registers for the tile), warp 0
//    the scales by cp.async; each lane arrives on the full mbarrier with its copies
//    (cp.async.mbarrier.arrive.noinc; the bulk bytes as transactions). A single producer warp
//    measured 2x slower than the two-CTA kernel (2026-12-04, ncu: the consumers waited ~70% of
//    their samples at the full mbarrier; the warp's serial copy chain was the bottleneck).
//  - Consumers: wait full, make the A fragments of both blocks (the two-CTA kernel's fragment
//    code: same dequantization, same bits), issue 8 wgmma (2 blocks x 4 k16), then wait for the
//    previous step's wgmma and free its stage. No CTA barrier in the loop.
//  - Epilogue as the two-CTA kernel's: plain outputs stored from the accumulators; SwiGLU's up
//    sums cross to the gate warpgroup through the (then idle) stages.
//  - A tail tile of at most 64 rows (an expert's last) runs wgmma n = 64: half the products of
//    a full tile (Kimi-K2.5's rank at 8,192 tokens averages ~170 rows an expert).
// The accumulation order of each output is the two-CTA kernel's (k16 steps in order), so both
// give the same bits (GemmShortKMatchCpu compares them).
// Requires k % 64 == 0 (whole tiles every step: bulk copies do not zero-fill) and plan tiles of
// 128 rows (or dense mode).
#include "backend/cuda/attention_wgmma.cuh"
#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/moe_experts.cuh"
#include "backend/cuda/moe_experts_gemm_pipe.cuh"

namespace strata::cuda {
namespace {

using namespace moe;
using attn::fence_proxy_async;
using attn::make_smem_desc;
using attn::reg_fence;
using attn::wgmma_commit;
using attn::wgmma_fence;
using attn::wgmma_rs_n;
using attn::wgmma_wait;
using int4::cp_async16;

using namespace moe_pipe;

// The producer warps' copies of the CTA's item; its x row offsets come from the shared-memory
// table.
template <int F, bool GLU>
__device__ __forceinline__ void produce(const MoeGroupedParams& p, const PipeItem& it,
                                        uint32_t smem, int steps) {
  using C = PipeCfg<F>;
  const int64_t e = it.e;
  const int nb = it.nb;
  const int lane = int(threadIdx.x) % 32, pw = int(threadIdx.x) / 32 - kConsumerThreads / 32;
  const uint32_t full0 = smem + C::kBarOff, empty0 = full0 + 8 * C::kStages;
  // Lane t < kRowTiles: row tile t's weights (one bulk copy a step, by producer warp t / (kRowTiles
  // / 4)); the valid row tiles' bytes (every producer warp computes the sum; warp 0 expects them).
  const int rt = lane < kRowTiles ? row_tile_of<GLU>(p, nb, lane) : -1;
  const bool my_rt = rt >= 0 && lane / (kRowTiles / 4) == pw;
  const int kt_count = int(moe_k_tiles(F, p.w.k));
  const char* w_src = static_cast<const char*>(p.w.values) + e * p.w.values_stride +
                      int64_t(rt < 0 ? 0 : rt) * kt_count * kMoeTileBytes;
  const uint32_t w_bytes = uint32_t(__popc(__ballot_sync(~0u, rt >= 0))) * C::kRowTileBytes;
  const char* s_base = static_cast<const char*>(p.w.scales) + e * p.w.scales_stride;
  const int groups = F == kMoeInt4 ? int(int4_scale_groups(p.w.k, p.w.group)) : 0;
  const int gshift = __ffs(p.w.group) - 1;
  const int scale_cols = int(cdiv(p.w.k, kMoeFp8Block));
  // The scale copies' row tile (fixed for the CTA): int4 row tile lane / 2 (two lanes a record,
  // lanes below 2 kRowTiles); fp8 lane v < 2 warpgroup v's first row tile (its 128-row block).
  const int s_rt = F == kMoeInt4 ? (lane / 2 < kRowTiles ? row_tile_of<GLU>(p, nb, lane / 2) : -1)
                                 : row_tile_of<GLU>(p, nb, tile_of(lane & 1, 0, 0));
  // x: this warp's kXR / 4 rows, (kXR / 4) pw + 4 i + lane / 8 (i < kXRounds), 16-byte piece c =
  // lane % 8 of each (a copy round moves 4 whole 128-byte row steps, whole sectors). Their
  // element offsets are read once from the table; a row past the item's end copies 0 bytes (bit
  // i of x_ok clear).
  const int c = lane % 8, xr0 = (kXR / 4) * pw + lane / 8;
  int32_t x_off[kXRounds];
  uint32_t x_ok = 0;
#pragma unroll
  for (int i = 0; i < kXRounds; ++i) {
    int32_t off;
    asm volatile("ld.shared.s32 %0, [%1];\n"
                 : "=r"(off)
                 : "r"(smem + C::kRowOff + uint32_t(xr0 + 4 * i) * 4));
    x_off[i] = off >= 0 ? off + c * 8 : 0;
    x_ok |= off >= 0 ? 1u << i : 0u;
  }
  int st = 0;
  uint32_t phase = 0;
  bool filled = false;  // every stage used once
  for (int j = 0; j < steps; ++j) {
    if (filled) mbar_wait(empty0 + 8 * st, phase ^ 1);  // the stage's previous use released
    const uint32_t stage = smem + uint32_t(st) * C::kStage, full = full0 + 8 * st;
    // Another warp's bulk bytes may land before this expect_tx: the transaction count may go
    // negative within a phase, which cannot complete before warp 0's lanes arrive below.
    if (pw == 0 && lane == 0) mbar_arrive_expect_tx(full, w_bytes);
    __syncwarp();
    if (my_rt)
      bulk_copy_g2s(stage + C::kXBytes + uint32_t(lane) * C::kRowTileBytes,
                    w_src + int64_t(j) * C::kRowTileBytes, C::kRowTileBytes, full);
    const uint32_t ss = stage + C::kXBytes + C::kWBytes;
    if constexpr (F == kMoeInt4) {
      // Warp 0: row tile t = lane / 2's record(s) of the step's group(s), 32 bytes (64 at group
      // 32, k % 64 == 0: both groups exist), lanes 2t and 2t + 1 one 32-byte sector a round.
      if (pw == 0 && lane / 2 < kRowTiles) {
        const int grp = (j * 64) >> gshift, rounds = p.w.group == 32 ? 2 : 1;
        const char* src = s_base + (int64_t(s_rt < 0 ? 0 : s_rt) * groups + grp) * 32;
        for (int q = 0; q < rounds; ++q) {
          const int piece = 2 * q + lane % 2;
          cp_async16(ss + uint32_t((lane / 2) * 64 + piece * 16),
                     s_rt >= 0 ? src + piece * 16 : s_base, s_rt >= 0 ? 16 : 0);
        }
      }
    } else if constexpr (F == kMoeFp8) {
      // Warp 0's lane j < 2: scale slot j, the 128-row block of row tile s_rt (above).
      if (pw == 0 && lane < 2) {
        const int idx = (s_rt * kMoeTileRows / kMoeFp8Block) * scale_cols + j * 64 / kMoeFp8Block;
        cp_async4(ss + uint32_t(lane * 4), s_rt >= 0 ? s_base + idx * 4 : s_base,
                  s_rt >= 0 ? 4 : 0);
      }
    }
    // x, 128-byte swizzle as the consumers' descriptors read it.
    const auto* xj = p.x + j * 64;
#pragma unroll
    for (int i = 0; i < kXRounds; ++i) {
      const int r = xr0 + 4 * i;
      cp_async16(stage + uint32_t(r * 128 + ((c ^ (r & 7)) << 4)), xj + x_off[i],
                 (x_ok >> i) & 1 ? 16 : 0);
    }
    cp_async_arrive_noinc(full);
    if (++st == C::kStages) st = 0, phase ^= 1, filled = true;
  }
}

// Consumer warp `warp` (0..7; warpgroup v = warp / 4): the A fragments of step j's stage for its
// row tiles (blocks b < kNB: row tile tile_of(v, b, warp % 4)).
template <int F>
__device__ __forceinline__ void fragments(const MoeGroupedParams& p, uint32_t stage, int warp,
                                          uint32_t (&a)[kNB][4][4]) {
  using C = PipeCfg<F>;
  const int lane = int(threadIdx.x) % 32, v = warp / 4;
  const uint32_t ss = stage + C::kXBytes + C::kWBytes;
#pragma unroll
  for (int b = 0; b < kNB; ++b) {
    const int t = tile_of(v, b, warp % 4);
    TileScale sc{0, 0};
    if constexpr (F == kMoeInt4) {
      const uint32_t at = ss + uint32_t(t * 64 + (lane / 4) * 4);
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(sc.s0) : "r"(at));
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(sc.s1) : "r"(at + 32));
      if (p.w.group != 32) sc.s1 = sc.s0;
    } else if constexpr (F == kMoeFp8) {
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(sc.s0) : "r"(ss + uint32_t(v * 4)));
    }
    const uint32_t w = stage + C::kXBytes + uint32_t(t * C::kRowTileBytes + lane * 16);
#pragma unroll
    for (int tt = 0; tt < C::kTilesPerStep; ++tt) {
      uint4 q;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(q.x), "=r"(q.y), "=r"(q.z), "=r"(q.w)
                   : "r"(w + uint32_t(tt * kMoeTileBytes)));
#pragma unroll
      for (int s = 0; s < kSteps<F>; ++s) fragment<F>(q, sc, s, a[b][tt * kSteps<F> + s]);
    }
    reg_fence(a[b]);
  }
}

// The consumers' k loop with wgmma n = N: 128, or 64 for a tail tile of at most 64 rows (its
// sums are acc[b][0 .. 31], the n = 128 layout's first 8 columns; the rest stay zero). Per step
// j with fragments `cur`: its wgmma; then step j - 1's are done (its stage is freed and `nxt`
// may be rewritten) and step j + 1's fragments go into `nxt`. (One loop with both shapes behind
// a branch made ptxas inject warpgroup arrives around every wgmma.)
template <int F, int N>
__device__ __forceinline__ void mainloop(const MoeGroupedParams& p, uint32_t smem, int warp,
                                         int steps, float (&acc)[kNB][kXR / 2]) {
  using C = PipeCfg<F>;
  const int lane = int(threadIdx.x) % 32;
  const uint32_t full0 = smem + C::kBarOff, empty0 = full0 + 8 * C::kStages;
  uint32_t a0[kNB][4][4], a1[kNB][4][4];
  auto stage_of = [&](int s) { return smem + uint32_t(s) * C::kStage; };
  int st = 0;
  uint32_t phase = 0;
  mbar_wait(full0 + 8 * st, phase);
  fence_proxy_async();  // the producer's cp.async (generic proxy) before wgmma reads x
  fragments<F>(p, stage_of(st), warp, a0);
  auto step = [&](int j, uint32_t(&cur)[kNB][4][4], uint32_t(&nxt)[kNB][4][4]) {
    const uint32_t xb = stage_of(st);
    wgmma_fence();
#pragma unroll
    for (int b = 0; b < kNB; ++b)
#pragma unroll
      for (int s = 0; s < 4; ++s)
        wgmma_rs_n<N>(acc[b], cur[b][s], make_smem_desc(xb + 32 * s, 16, 1024));
    wgmma_commit();
    wgmma_wait<1>();
    if (j > 0) {  // step j - 1's stage: both warpgroups' reads of it are done once all 8 arrive
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * (st == 0 ? C::kStages - 1 : st - 1));
    }
    if (++st == C::kStages) st = 0, phase ^= 1;
    if (j + 1 < steps) {
      mbar_wait(full0 + 8 * st, phase);
      fence_proxy_async();
      fragments<F>(p, stage_of(st), warp, nxt);
    }
  };
  for (int j = 0; j < steps; j += 2) {
    step(j, a0, a1);
    if (j + 1 < steps) step(j + 1, a1, a0);
  }
  wgmma_wait<0>();
}

// The outputs this thread holds for row tile rt: acc[.][at], at = 4 i + 2 h + e2, is weight row
// 16 rt + g + 8 h (column `col` of the output) and x row 8 i + 2 c + e2 (lane = 4 g + c); `put`
// gets (x row, col, at) for the rows below `rows`.
template <typename Put>
__device__ __forceinline__ void for_outputs(int rt, int rows, Put&& put) {
  const int lane = int(threadIdx.x) % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t col = int64_t(rt) * kMoeTileRows + g + 8 * h;
#pragma unroll
    for (int i = 0; i < kXR / 8; ++i)
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2) {
        const int r = 8 * i + 2 * c + e2;
        if (r < rows) put(r, col, 4 * i + 2 * h + e2);
      }
  }
}

// The item's outputs from the accumulators: plain, or SwiGLU with the up sums crossing from
// warpgroup 1 through the then idle stages.
template <bool GLU>
__device__ __forceinline__ void store_outputs(const MoeGroupedParams& p, const PipeItem& it,
                                              char* smem_g, const float (&acc)[kNB][kXR / 2]) {
  const int tid = int(threadIdx.x), warp = tid / 32, v = warp / 4;
  const int64_t row0 = it.row0;
  if constexpr (!GLU) {
#pragma unroll
    for (int b = 0; b < kNB; ++b) {
      const int rt = row_tile_of<false>(p, it.nb, tile_of(v, b, warp % 4));
      if (rt < 0) continue;
      for_outputs(rt, it.rows, [&](int r, int64_t col, int at) {
        p.out[(row0 + r) * p.w.n + col] = float_to_bf16(acc[b][at]);
      });
    }
  } else {
    float* xchg = reinterpret_cast<float*>(smem_g);
    const int t = tid % 128;
    named_sync(1, kConsumerThreads);  // every consumer's last wgmma has read its stage
    if (v == 1) {
#pragma unroll
      for (int b = 0; b < kNB; ++b)
#pragma unroll
        for (int i = 0; i < kXR / 2; ++i) xchg[(b * (kXR / 2) + i) * 128 + t] = acc[b][i];
    }
    named_sync(2, kConsumerThreads);
    if (v == 1) return;
#pragma unroll
    for (int b = 0; b < kNB; ++b) {
      const int rt = row_tile_of<true>(p, it.nb, tile_of(0, b, warp % 4));  // a gate tile
      if (rt < 0) continue;
      for_outputs(rt, it.rows, [&](int r, int64_t col, int at) {
        p.out[(row0 + r) * p.glu_inter + col] = float_to_bf16(
            silu(round_bf16(acc[b][at])) * round_bf16(xchg[(b * (kXR / 2) + at) * 128 + t]));
      });
    }
  }
}

// The consumers' work: wgmma n by the item's rows (CTA-uniform): a tail of <= 64 rows does half
// a tile's products. (Narrower tails here, n = the rows rounded up to 16, measured neutral in
// the kernel and 2-4% slower through the backend, 2026-12-04: only the weight-stationary down
// projection takes p.narrow_tails.)
template <int F, bool GLU>
__device__ __forceinline__ void consume(const MoeGroupedParams& p, const PipeItem& it,
                                        uint32_t smem, char* smem_g, int warp, int steps) {
  float acc[kNB][kXR / 2];
#pragma unroll
  for (int b = 0; b < kNB; ++b)
#pragma unroll
    for (int i = 0; i < kXR / 2; ++i) acc[b][i] = 0.0f;
  const int rows = it.rows;
  if (rows <= 64)
    mainloop<F, 64>(p, smem, warp, steps, acc);
  else
    mainloop<F, 128>(p, smem, warp, steps, acc);
#pragma unroll
  for (int b = 0; b < kNB; ++b) reg_fence<kXR / 2>(acc[b]);
  store_outputs<GLU>(p, it, smem_g, acc);
}

// One CTA a plan tile x weight unit (blockIdx.x), or in dense mode kXR rows.
template <int F, bool GLU>
__global__ void __launch_bounds__(kThreads, 1) moe_gemm_pipe_kernel(MoeGroupedParams p) {
  using C = PipeCfg<F>;
  extern __shared__ __align__(128) char smem_raw[];
  if (p.pdl_early) pdl_trigger();
  const int tid = int(threadIdx.x);
  const int warp = __shfl_sync(~0u, tid / 32, 0);
  const int units = int(units_of<GLU>(p));
  pdl_wait();
  if (!p.pdl_early) pdl_trigger();

  PipeItem it{};
  if (!item_of<GLU>(p, int64_t(blockIdx.x), units, it)) return;  // the whole CTA
  uint32_t smem = smem_addr(smem_raw);
  smem += (1024 - (smem & 1023)) & 1023;  // the swizzle works on address bits
  char* smem_g = smem_raw + (smem - smem_addr(smem_raw));
  const uint32_t full0 = smem + C::kBarOff, empty0 = full0 + 8 * C::kStages;
  if (tid == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(full0 + 8 * s, kFullCount);
      mbar_init(empty0 + 8 * s, kEmptyCount);
    }
    mbar_init_fence();
  }
  if (tid < kXR)  // the table of the item's x row offsets
    reinterpret_cast<int32_t*>(smem_g + C::kRowOff)[tid] = x_row_offset(p, it, tid);
  __syncthreads();
  const int steps = int(p.w.k / 64);
  if (warp >= kConsumerThreads / 32) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    produce<F, GLU>(p, it, smem, steps);
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy outlives its thread
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  consume<F, GLU>(p, it, smem, smem_g, warp, steps);
}

// Plan mode: a CTA a plan tile x weight unit; dense: a CTA kXR rows x weight unit.
template <int F, bool GLU>
void launch_pipe(const MoeGroupedParams& p, cudaStream_t stream) {
  const int64_t tiles = p.offsets ? p.max_tiles : cdiv(p.rows, kXR);
  const int64_t ctas = tiles * units_of<GLU>(p);
  if (ctas == 0) return;
  CHECK_MSG(ctas < (int64_t(1) << 31), "moe gemm pipe: {} CTAs", ctas);
  launch_pdl(moe_gemm_pipe_kernel<F, GLU>, dim3(unsigned(ctas)), dim3(kThreads), PipeCfg<F>::kBytes,
             Launch{stream}, p);
  CUDA_LAUNCH_CHECK();
}

template <int F>
void launch_format(const MoeGroupedParams& p, cudaStream_t stream) {
  return p.glu_inter > 0 ? launch_pipe<F, true>(p, stream) : launch_pipe<F, false>(p, stream);
}

template <int F>
void set_limits_format() {
  for (auto* k : {moe_gemm_pipe_kernel<F, false>, moe_gemm_pipe_kernel<F, true>})
    CUDA_CHECK(
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, PipeCfg<F>::kBytes));
}

}  // namespace

bool moe_gemm_pipe_supported(const MoeGroupedParams& p) {
  return (p.offsets == nullptr || p.tile_rows == kBM) && p.w.k % 64 == 0 && p.w.k > 0 &&
         p.rows * p.w.k < (int64_t(1) << 31) &&
         (p.w.format != kMoeInt4 || p.w.group % 64 == 0 || p.w.group == 32);
}

void init_moe_gemm_pipe_kernels() {
  set_limits_format<kMoeBf16>();
  set_limits_format<kMoeFp8>();
  set_limits_format<kMoeInt4>();
}

void launch_moe_gemm_pipe(const MoeGroupedParams& p, cudaStream_t stream) {
  CHECK_MSG(moe_gemm_pipe_supported(p), "moe gemm pipe: k {} tile_rows {} format {} group {}",
            p.w.k, p.tile_rows, p.w.format, p.w.group);
  switch (p.w.format) {
    case kMoeBf16:
      return launch_format<kMoeBf16>(p, stream);
    case kMoeFp8:
      return launch_format<kMoeFp8>(p, stream);
    default:
      return launch_format<kMoeInt4>(p, stream);
  }
}

}  // namespace strata::cuda
