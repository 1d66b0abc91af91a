// The prefill regime's grouped GEMM with producer warps: one CTA an SM of two consumer
// warpgroups and a warpgroup that only copies, over a pipeline of mbarriers
// (MoeGroupedParams::pipe; moe_gemm_pipe_supported says where; the default, CudaTunables::
// moe_gemm_pipe).
//
// Why (ncu warp-state sampling per SASS instruction, H200, 2026-12-04, the two-CTA kernel of
// moe_experts_gemm.cu at 8,192 tokens): Moonlight's bf16 gate_up spent its warps' stalls waiting
// for their own cp.async groups (27% long scoreboard: three 32 KB stages, copies one k step
// ahead), at the CTA barrier of each k step (9%) and on the x rows' address chain (row offset
// from shared memory -> compare -> address -> cp.async, 14% short scoreboard); DeepSeek-V3's FP8
// gate_up was issue-bound with the x copies' compares and address arithmetic the largest share
// of its samples (27%), beside the conversions. Every warp both copied and multiplied, so each
// k step waited for the slowest warp's copies and nothing ran ahead of the CTA barrier.
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
//  - Paired (Shape<true>, MoeGroupedParams::pipe 2, off by default until measured): a CTA takes
//    two plan tiles of an expert, 256 x rows against 128 weight rows, one m64 block a warpgroup
//    at wgmma n = 64 .. 256 by its rows: each weight converted once per 256 x rows.
// The accumulation order of each output is the two-CTA kernel's (k16 steps in order), so both
// give the same bits (GemmShortKMatchCpu compares them).
// Requires k % 64 == 0 (whole tiles every step: bulk copies do not zero-fill) and plan tiles of
// 128 rows (or dense mode).
#include "backend/cuda/attention_wgmma.cuh"
#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/moe_experts.cuh"

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
using int4::smem_u32;

constexpr int kConsumerThreads = 256;
// A third warpgroup holds the producers (the register file is split per SM sub-partition: a
// block's warps count in fours). setmaxnreg moves the producer group's registers to the
// consumers (Shape: 2 x 224 + 56 registers a thread per sub-partition's three warps; paired,
// whose consumers hold half the fragments and whose producers twice the x rows, 2 x 200 + 104).
constexpr int kThreads = kConsumerThreads + 128;
constexpr int kBM = 128;  // rows of a plan tile
constexpr int kProducerWarps = 4;
constexpr int kFullCount = 32 * kProducerWarps + 1;  // the producers' lanes + one expect_tx
constexpr int kEmptyCount = kConsumerThreads / 32;   // one arrival a consumer warp
constexpr int kSmemMax = 227 * 1024;

__host__ __device__ constexpr int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The CTA's shape. P = false: a plan tile (128 x rows) against 256 weight rows, each consumer
// warpgroup two m64 blocks. P = true (paired tiles): an expert's plan tiles 2i and 2i + 1 (256 x
// rows) against 128 weight rows, each warpgroup one m64 block at wgmma n up to 256, so that a
// weight is converted once per 256 x rows, not 128 (FP8 and INT4 gate_up spend much of their
// issue slots on the conversions: ncu, H200, 2026-12-04).
template <bool P>
struct Shape {
  static constexpr int kXR = P ? 256 : 128;  // x rows a CTA (the largest wgmma n)
  static constexpr int kNB = P ? 1 : 2;      // m64 blocks a consumer warpgroup
  static constexpr int kRowTiles = 8 * kNB;  // weight row tiles a CTA
  static constexpr int kHalf = 4 * kNB;      // SwiGLU: the CTA's gate row tiles
  static constexpr int kXRounds = kXR / 16;  // a producer lane's x rows (4 rows a warp a round)
  static constexpr int kConsumerRegs = P ? 200 : 224, kProducerRegs = P ? 104 : 56;
  static_assert(2 * kConsumerRegs + kProducerRegs <= 512, "the register file, 128 threads each");
};

template <int F, bool P>
struct PipeCfg {
  using S = Shape<P>;
  static constexpr int kTilesPerStep = 64 / moe_tile_k(F);  // weight tiles a row tile a k step
  static constexpr int kRowTileBytes = kTilesPerStep * kMoeTileBytes;
  static constexpr int kXBytes = S::kXR * 128;  // [x rows][64 k] bf16, 128-byte swizzle
  static constexpr int kWBytes = S::kRowTiles * kRowTileBytes;
  // int4: per row tile the scale records of the step's groups (one, or two at group 32: 64 B);
  // fp8: the two warpgroups' 128-row blocks' scales of the step's 128-column block.
  static constexpr int kSBytes = F == kMoeInt4 ? S::kRowTiles * 64 : F == kMoeFp8 ? 16 : 0;
  static constexpr int kStage = (kXBytes + kWBytes + kSBytes + 1023) / 1024 * 1024;
  static constexpr int kTail = 2 * 8 * 8 + S::kXR * 4 + 1024;  // barriers, row table, alignment
  static constexpr int kFit = (kSmemMax - kTail) / kStage;
  static constexpr int kStages = kFit > 8 ? 8 : kFit;
  static constexpr int kBarOff = kStages * kStage;  // full[S], then empty[S]
  static constexpr int kRowOff = kBarOff + 2 * 8 * kStages;
  static constexpr int kBytes = kRowOff + S::kXR * 4 + 1024;
  static constexpr int kXchg = S::kNB * (S::kXR / 2) * 128 * 4;  // SwiGLU's up sums, floats
  static_assert(kStages >= 3, "the pipeline needs three stages");
  static_assert(kBytes <= kSmemMax, "one CTA an SM");
  static_assert(kStages * kStage >= kXchg, "the SwiGLU exchange fits the stages");
};

// The CTA's row tile of consumer warpgroup v's block b, warp w (0..3): warpgroup v holds row
// tiles kHalf v .. (SwiGLU: warpgroup 0 the gate tiles, 1 the matching up tiles).
template <bool P>
__device__ __forceinline__ int tile_of(int v, int b, int w) {
  return v * Shape<P>::kHalf + 4 * b + w;
}

// Row tile `t` (0 .. kRowTiles - 1) of the CTA in the weight matrix, or -1 past n (plain) or
// inter (SwiGLU).
template <bool GLU, bool P>
__device__ __forceinline__ int row_tile_of(const MoeGroupedParams& p, int nb, int t) {
  using S = Shape<P>;
  if constexpr (GLU) {
    const int half = int(p.glu_inter / kMoeTileRows), gi = nb * S::kHalf + t % S::kHalf;
    return gi < half ? gi + (t >= S::kHalf ? half : 0) : -1;
  } else {
    const int rt = nb * S::kRowTiles + t;
    return rt < int(p.w.n / kMoeTileRows) ? rt : -1;
  }
}

// Weight units (CTAs) a tile.
template <bool GLU, bool P>
__host__ __device__ inline int64_t units_of(const MoeGroupedParams& p) {
  using S = Shape<P>;
  return GLU ? cdiv(p.glu_inter / kMoeTileRows, S::kHalf)
             : cdiv(p.w.n / kMoeTileRows, S::kRowTiles);
}

template <int F, bool GLU, bool P>
__device__ __forceinline__ void produce(const MoeGroupedParams& p, int64_t e, int nb, uint32_t smem,
                                        int steps) {
  using C = PipeCfg<F, P>;
  using S = Shape<P>;
  constexpr int kRowTiles = S::kRowTiles;
  const int lane = int(threadIdx.x) % 32, pw = int(threadIdx.x) / 32 - kConsumerThreads / 32;
  const uint32_t full0 = smem + C::kBarOff, empty0 = full0 + 8 * C::kStages;
  // Lane t < kRowTiles: row tile t's weights (one bulk copy a step, by producer warp t / (kRowTiles
  // / 4)); the valid row tiles' bytes (every producer warp computes the sum; warp 0 expects them).
  const int rt = lane < kRowTiles ? row_tile_of<GLU, P>(p, nb, lane) : -1;
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
  const int s_rt = F == kMoeInt4
                       ? (lane / 2 < kRowTiles ? row_tile_of<GLU, P>(p, nb, lane / 2) : -1)
                       : row_tile_of<GLU, P>(p, nb, tile_of<P>(lane & 1, 0, 0));
  // x: this warp's kXR / 4 rows, (kXR / 4) pw + 4 i + lane / 8 (i < kXRounds), 16-byte piece c =
  // lane % 8 of each (a copy round moves 4 whole 128-byte row steps, whole sectors). Their
  // element offsets are read from the table once; a row past the tile's end copies 0 bytes (bit
  // i of x_ok clear).
  constexpr int kXRounds = S::kXRounds;
  const int c = lane % 8, xr0 = (S::kXR / 4) * pw + lane / 8;
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
  uint32_t phase = 0;  // (j / stages) & 1
  for (int j = 0; j < steps; ++j) {
    if (j >= C::kStages) mbar_wait(empty0 + 8 * st, phase ^ 1);  // element j - S's release
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
      // Warp 0's lane v < 2: the scale of warpgroup v's 128-row block (row tile 8 v's block).
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
    if (++st == C::kStages) st = 0, phase ^= 1;
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy outlives its thread
}

// Consumer warp `warp` (0..7; warpgroup v = warp / 4): the A fragments of step j's stage for its
// row tiles (blocks b < kNB: row tile tile_of(v, b, warp % 4)).
template <int F, bool P>
__device__ __forceinline__ void fragments(const MoeGroupedParams& p, uint32_t stage, int warp,
                                          uint32_t (&a)[Shape<P>::kNB][4][4]) {
  using C = PipeCfg<F, P>;
  const int lane = int(threadIdx.x) % 32, v = warp / 4;
  const uint32_t ss = stage + C::kXBytes + C::kWBytes;
#pragma unroll
  for (int b = 0; b < Shape<P>::kNB; ++b) {
    const int t = tile_of<P>(v, b, warp % 4);
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
template <int F, bool P, int N>
__device__ __forceinline__ void mainloop(const MoeGroupedParams& p, uint32_t smem, int warp,
                                         int steps,
                                         float (&acc)[Shape<P>::kNB][Shape<P>::kXR / 2]) {
  using C = PipeCfg<F, P>;
  constexpr int kNB = Shape<P>::kNB;
  const int lane = int(threadIdx.x) % 32;
  const uint32_t full0 = smem + C::kBarOff, empty0 = full0 + 8 * C::kStages;
  uint32_t a0[kNB][4][4], a1[kNB][4][4];
  int st = 0;
  uint32_t phase = 0;
  auto stage_of = [&](int s) { return smem + uint32_t(s) * C::kStage; };
  mbar_wait(full0, 0);
  fence_proxy_async();  // the producer's cp.async (generic proxy) before wgmma reads x
  fragments<F, P>(p, stage_of(0), warp, a0);
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
      fragments<F, P>(p, stage_of(st), warp, nxt);
    }
  };
  for (int j = 0; j < steps; j += 2) {
    step(j, a0, a1);
    if (j + 1 < steps) step(j + 1, a1, a0);
  }
  wgmma_wait<0>();
}

template <int F, bool GLU, bool P>
__global__ void __launch_bounds__(kThreads, 1) moe_gemm_pipe_kernel(MoeGroupedParams p) {
  using C = PipeCfg<F, P>;
  using S = Shape<P>;
  constexpr int kXR = S::kXR, kNB = S::kNB;
  extern __shared__ __align__(128) char smem_raw[];
  if (p.pdl_early) pdl_trigger();
  const int tid = int(threadIdx.x);
  const int warp = __shfl_sync(~0u, tid / 32, 0), lane = tid % 32;
  const int units = int(units_of<GLU, P>(p));
  const int64_t tile = int64_t(blockIdx.x) / units;
  const int nb = int(int64_t(blockIdx.x) % units);
  pdl_wait();
  if (!p.pdl_early) pdl_trigger();

  int64_t e = 0;
  int row0, rows;  // < 2^31: the launcher checks rows · k
  if (p.offsets != nullptr) {
    if (tile >= p.counts[1]) return;  // the whole CTA
    e = p.tiles[2 * tile];
    row0 = p.tiles[2 * tile + 1];
    // Paired: an expert's odd plan tile is its even neighbour's second half.
    if (P && ((row0 - p.offsets[e]) / kBM) % 2 == 1) return;
    rows = min(kXR, p.offsets[e + 1] - row0);
    if (rows <= 0) return;
  } else {
    if (tile * kXR >= p.rows) return;
    row0 = int(tile * kXR);
    rows = int(min(int64_t(kXR), p.rows - row0));
  }
  uint32_t smem = smem_u32(smem_raw);
  smem += (1024 - (smem & 1023)) & 1023;  // the swizzle works on address bits
  char* smem_g = smem_raw + (smem - smem_u32(smem_raw));
  const uint32_t full0 = smem + C::kBarOff, empty0 = full0 + 8 * C::kStages;
  if (tid == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(full0 + 8 * s, kFullCount);
      mbar_init(empty0 + 8 * s, kEmptyCount);
    }
    mbar_init_fence();
  }
  if (tid < kXR) {  // element offset of the CTA's x row tid, -1 past its rows
    const int64_t xr =
        tid < rows ? (p.row_token ? int64_t(p.row_token[row0 + tid]) : row0 + tid) : -1;
    reinterpret_cast<int32_t*>(smem_g + C::kRowOff)[tid] = xr >= 0 ? int32_t(xr * p.w.k) : -1;
  }
  __syncthreads();
  const int steps = int(p.w.k / 64);
  if (warp >= kConsumerThreads / 32) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(S::kProducerRegs));
    produce<F, GLU, P>(p, e, nb, smem, steps);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(S::kConsumerRegs));

  // ---- consumers ----
  float acc[kNB][kXR / 2];
#pragma unroll
  for (int b = 0; b < kNB; ++b)
#pragma unroll
    for (int i = 0; i < kXR / 2; ++i) acc[b][i] = 0.0f;
  // wgmma n by the CTA's rows (CTA-uniform): a tail of <= 64 rows does half a tile's products;
  // paired, 192 or 256 above 128 rows.
  if (rows <= 64)
    mainloop<F, P, 64>(p, smem, warp, steps, acc);
  else if (!P || rows <= 128)
    mainloop<F, P, 128>(p, smem, warp, steps, acc);
  else if (rows <= 192)
    mainloop<F, P, (P ? 192 : 128)>(p, smem, warp, steps, acc);
  else
    mainloop<F, P, (P ? 256 : 128)>(p, smem, warp, steps, acc);
#pragma unroll
  for (int b = 0; b < kNB; ++b) reg_fence<kXR / 2>(acc[b]);

  // acc[b][4 i + 2 h + e2]: weight row 16 (row tile) + g + 8 h, x row 8 i + 2 c + e2.
  const int g = lane / 4, c = lane % 4, v = warp / 4;
  if constexpr (!GLU) {
#pragma unroll
    for (int b = 0; b < kNB; ++b) {
      const int rt = row_tile_of<false, P>(p, nb, tile_of<P>(v, b, warp % 4));
      if (rt < 0) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t col = int64_t(rt) * kMoeTileRows + g + 8 * h;
#pragma unroll
        for (int i = 0; i < kXR / 8; ++i)
#pragma unroll
          for (int e2 = 0; e2 < 2; ++e2) {
            const int r = 8 * i + 2 * c + e2;
            if (r < rows)
              p.out[(row0 + r) * p.w.n + col] = float_to_bf16(acc[b][4 * i + 2 * h + e2]);
          }
      }
    }
  } else {  // warpgroup 1's up sums join warpgroup 0's gate sums through the idle stages
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
      const int rt = row_tile_of<true, P>(p, nb, tile_of<P>(0, b, warp % 4));  // a gate tile
      if (rt < 0) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t col = int64_t(rt) * kMoeTileRows + g + 8 * h;
#pragma unroll
        for (int i = 0; i < kXR / 8; ++i)
#pragma unroll
          for (int e2 = 0; e2 < 2; ++e2) {
            const int r = 8 * i + 2 * c + e2;
            const int at = 4 * i + 2 * h + e2;
            if (r < rows)
              p.out[(row0 + r) * p.glu_inter + col] = float_to_bf16(
                  silu(round_bf16(acc[b][at])) * round_bf16(xchg[(b * (kXR / 2) + at) * 128 + t]));
          }
      }
    }
  }
}

template <int F, bool GLU, bool P>
void launch_pipe(const MoeGroupedParams& p, cudaStream_t stream) {
  using C = PipeCfg<F, P>;
  // Plan mode: a CTA a plan tile (paired: the odd tiles' CTAs leave at once); dense: a CTA kXR
  // rows.
  const int64_t tiles = p.offsets ? p.max_tiles : cdiv(p.rows, Shape<P>::kXR);
  const int64_t ctas = tiles * units_of<GLU, P>(p);
  if (ctas == 0) return;
  CHECK_MSG(ctas < (int64_t(1) << 31), "moe gemm pipe: {} CTAs", ctas);
  launch_pdl(moe_gemm_pipe_kernel<F, GLU, P>, dim3(unsigned(ctas)), dim3(kThreads), C::kBytes,
             Launch{stream}, p);
  CUDA_LAUNCH_CHECK();
}

template <int F, bool P>
void set_limits_pipe() {
  for (auto* k : {moe_gemm_pipe_kernel<F, false, P>, moe_gemm_pipe_kernel<F, true, P>})
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    PipeCfg<F, P>::kBytes));
}

template <int F, bool P>
void launch_format(const MoeGroupedParams& p, cudaStream_t stream) {
  return p.glu_inter > 0 ? launch_pipe<F, true, P>(p, stream) : launch_pipe<F, false, P>(p, stream);
}

}  // namespace

bool moe_gemm_pipe_supported(const MoeGroupedParams& p) {
  return (p.offsets == nullptr || p.tile_rows == kBM) && p.w.k % 64 == 0 && p.w.k > 0 &&
         p.rows * p.w.k < (int64_t(1) << 31) &&
         (p.w.format != kMoeInt4 || p.w.group % 64 == 0 || p.w.group == 32);
}

void init_moe_gemm_pipe_kernels() {
  set_limits_pipe<kMoeBf16, false>();
  set_limits_pipe<kMoeFp8, false>();
  set_limits_pipe<kMoeInt4, false>();
  set_limits_pipe<kMoeBf16, true>();
  set_limits_pipe<kMoeFp8, true>();
  set_limits_pipe<kMoeInt4, true>();
}

void launch_moe_gemm_pipe(const MoeGroupedParams& p, cudaStream_t stream) {
  CHECK_MSG(moe_gemm_pipe_supported(p), "moe gemm pipe: k {} tile_rows {} format {} group {}",
            p.w.k, p.tile_rows, p.w.format, p.w.group);
  const bool paired = p.pipe == 2;
  switch (p.w.format) {
    case kMoeBf16:
      return paired ? launch_format<kMoeBf16, true>(p, stream)
                    : launch_format<kMoeBf16, false>(p, stream);
    case kMoeFp8:
      return paired ? launch_format<kMoeFp8, true>(p, stream)
                    : launch_format<kMoeFp8, false>(p, stream);
    default:
      return paired ? launch_format<kMoeInt4, true>(p, stream)
                    : launch_format<kMoeInt4, false>(p, stream);
  }
}

}  // namespace strata::cuda
