// The prefill regime of the MoE experts: a grouped GEMM on Hopper's warpgroup tensor cores, one
// CTA per (GEMM tile of one expert's rows, block of weight rows).
//
// As linear_int4_gemm.cu (whose pipeline this follows), the output is computed transposed,
// outᵀ = W · xᵀ: the weights are wgmma's A operand, read from the tile layout (moe_experts.cuh)
// and turned into A fragments in registers (int4 and fp8 dequantized, bf16 as is), and the
// tile's activation rows are the B operand in shared memory (K-major, 128-byte swizzle). x rows
// are gathered by the copies themselves (row_token), so no permuted copy of x is made. A CTA is
// two warpgroups, each warp owning one 16-row weight tile and all BM rows of the GEMM tile:
//   plain (down): the warps take 8 consecutive row tiles (128 weight rows). (Running several
//     row blocks per CTA in one pipeline, for the down projection's short k, spilled the
//     accumulators at 128 registers under every arrangement tried: not done; two CTAs per SM
//     hide each other's pipeline fill instead.)
//   GLU (gate_up): warpgroup 0 takes gate row tiles, warpgroup 1 the matching up tiles; at the
//     end warpgroup 1's accumulators cross through shared memory and warpgroup 0 writes
//     silu(bf16(g)) · bf16(u).
// Pipeline: stages of (x tile, each warp's weight tiles, scales) stream in by cp.async, S - 2
// k-steps (64 columns each) ahead; per step a warpgroup issues the four wgmma of step j, then,
// while they run, waits for step j - 1's wgmma and step j + 1's copies, meets the CTA at one
// barrier, issues step j + S - 1's copies and makes step j + 1's fragments in the other register
// buffer. Two CTAs per SM (<= 128 registers, <= 113 KB shared memory each). (Tiles of 256 rows
// at one CTA an SM, each weight converted once per 256 x rows, ran gate_up 7-22% slower than two
// CTAs of 128 at 8,192 tokens (up to 2.5x at 2,048) in every format but Kimi-K2.5's INT4 at
// 8,192, -1%: H200, moe_bench --tile-rows 256, 2026-12-04; removed.)
// Tiles: the plan lists (expert, first row) per tile of BM rows in expert order; the grid is
// the host's bound on tiles times the row-block groups, tile-major, so an expert's weights are
// re-read by its next tile while still in L2; CTAs past the device's tile count exit at once.
// Short k (XRES: plain, k <= kMoeGemmShortK, int4 / fp8): the down projection of a tp-8 slice
// has k = 256, four k steps, so a CTA of one 128-row block was mostly pipeline fill and drain.
// There the CTA (64 rows: a plan tile of 128 is two sub-tiles) copies all of its x rows' k
// into a region of its own once, and its pipeline runs over gemm_blocks row blocks one after
// the other, k step by k step (element j: block j / steps, k step j % steps): the stages hold
// only weights and scales, the next block's copies are in flight while a block's outputs are
// stored (after wgmma_wait<0>; the sums then restart from zero).
#include <algorithm>

#include "backend/cuda/attention_wgmma.cuh"
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
using int4::cp_async_commit;
using int4::cp_async_wait;

constexpr int kThreads = 256;

__host__ __device__ constexpr int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// XRES (x resident, plain projections with k <= kMoeGemmShortK): x's k steps live in their own
// region for the whole CTA; the stages hold weights (and scales) only.
template <int F, int BM, bool XRES = false>
struct Cfg {
  static constexpr int kTilesPerStep = 64 / moe_tile_k(F);  // weight tiles per warp per k step
  static constexpr int kXBytes = BM * 128;                  // [BM rows][64 k] bf16, swizzled
  static constexpr int kWBytes = 8 * kTilesPerStep * kMoeTileBytes;
  static constexpr int kSBytes = F == kMoeInt4 ? 8 * 64 : F == kMoeFp8 ? 8 * 16 : 0;
  static constexpr int kXSteps = int(kMoeGemmShortK / 64);  // XRES: k steps held
  static constexpr int kXRegion = XRES ? kXSteps * kXBytes : 0;
  static constexpr int kStageBytes = (XRES ? 0 : kXBytes) + kWBytes + kSBytes;
  static constexpr int kBudget = 112 * 1024;  // two CTAs an SM
  static constexpr int kFit = (kBudget - kXRegion) / kStageBytes;
  static constexpr int kStages = kFit > 6 ? 6 : kFit;
  static constexpr int kXOff = 0;  // x stages (or XRES's steps) first: 1024-byte aligned
  static constexpr int kWOff = XRES ? kXRegion : kStages * kXBytes;
  static constexpr int kSOff = kWOff + kStages * kWBytes;
  static constexpr int kRowOff = kSOff + kStages * kSBytes;  // the tile's x row offsets
  static constexpr int kBytes = kRowOff + BM * 4 + 1024;     // + alignment slack
  static_assert(kStages >= 3, "the pipeline needs three stages");
  static_assert(kBytes <= 113 * 1024, "two CTAs per SM");
  static_assert(XRES || kStages * kXBytes >= BM * 256, "the GLU exchange fits the x stages");
};

// One thread's share of a CTA: its copy sources and destinations, fixed but for the pipeline
// element. Element j is k step j of row block nb (one block per CTA), or with XRES k step
// j % steps of row block nb + j / steps (the CTA's blocks one after the other).
template <int F, int BM, bool GLU, bool XRES>
struct Cta {
  using C = Cfg<F, BM, XRES>;
  static constexpr int kXRows = BM / 32;  // x rows this thread copies: r0 + 32·i
  const MoeGroupedParams& p;
  uint32_t smem;       // 1024-byte aligned base (shared address)
  uint32_t x_dst;      // stage offset of (row r0, column x_col), swizzled
  int x_col;           // 8 · (tid % 8)
  const char* w_base;  // the expert's tiles + this lane's 16 bytes
  const char* s_base;  // the expert's scales
  __device__ __forceinline__ static int warp() { return int(threadIdx.x) / 32; }
  __device__ __forceinline__ static int lane() { return int(threadIdx.x) % 32; }
  int kt_count, groups, scale_cols, nb, gshift;
  int steps, len;  // k steps per block; pipeline elements (XRES: blocks · steps)

  __device__ __forceinline__ int block_of(int j) const { return XRES ? nb + j / steps : nb; }
  __device__ __forceinline__ int kstep_of(int j) const { return XRES ? j % steps : j; }
  // Shared address of element j's x tile.
  __device__ __forceinline__ uint32_t x_tile(int j) const {
    return smem + C::kXOff + uint32_t(XRES ? kstep_of(j) : j % C::kStages) * C::kXBytes;
  }

  // This warp's row tile in row block `nb`, or -1 when it has none (past n or inter).
  __device__ __forceinline__ int row_tile(int nb) const {
    if constexpr (GLU) {
      const int gi = nb * 4 + warp() % 4, half = int(p.glu_inter / kMoeTileRows);
      return gi < half ? gi + (warp() >= 4 ? half : 0) : -1;
    } else {
      const int rt = nb * 8 + warp();
      return rt < int(p.w.n / kMoeTileRows) ? rt : -1;
    }
  }

  // x of k step ks (columns 64·ks ..) into the tile at shared address sx; past the rows or k:
  // zero. (Rows past the tile's end reading x's first row instead, unmasked, with every row's
  // address loaded before the copies, measured slower: bf16 gate_up 476 -> 596 us at 2,048
  // tokens, equal at 8,192 for FP8; most likely every CTA's padding rows reading the same x row:
  // H200, moe_bench, 2026-12-04.)
  __device__ __forceinline__ void issue_x(int ks, uint32_t sx) const {
    const int kk = ks * 64;
    // x row offsets come from shared memory (kept there, not in registers, for the fragments).
    const uint32_t rows_at = smem + C::kRowOff + uint32_t(x_dst / 128) * 4;
#pragma unroll
    for (int i = 0; i < kXRows; ++i) {
      int32_t xrow;
      asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(xrow) : "r"(rows_at + i * 32 * 4));
      const bool ok = xrow >= 0 && kk + x_col < p.w.k;
      const bf16_bits* src = ok ? p.x + xrow + x_col + kk : p.x;
      cp_async16(sx + x_dst + i * 32 * 128, src, ok ? 16 : 0);
    }
  }

  // The copies of element j into stage j % S; anything past the rows, n, k or the elements is
  // zero-filled.
  __device__ __forceinline__ void issue(int j) const {
    const int st = j % C::kStages, ks = kstep_of(j);
    const int kk = ks * 64;
    if constexpr (!XRES) issue_x(ks, x_tile(j));
    // (Without XRES, elements past the k steps are zero through kt >= kt_count; testing j < len
    // there too made ptxas serialize the 64-row plain kernels' wgmma, warning C7515.)
    const int rt = !XRES || j < len ? row_tile(block_of(j)) : -1;
    const uint32_t sw = smem + C::kWOff + uint32_t(st) * C::kWBytes;
#pragma unroll
    for (int t = 0; t < C::kTilesPerStep; ++t) {
      const int kt = ks * C::kTilesPerStep + t;
      const bool ok = rt >= 0 && kt < kt_count;
      // 32-bit: one expert's matrix is far below 2 GB.
      const char* src = ok ? w_base + (rt * kt_count + kt) * kMoeTileBytes : w_base;
      cp_async16(sw + uint32_t((warp() * C::kTilesPerStep + t) * kMoeTileBytes + lane() * 16), src,
                 ok ? 16 : 0);
    }
    const uint32_t ss = smem + C::kSOff + uint32_t(st) * C::kSBytes;
    if constexpr (F == kMoeInt4) {
      // Lanes 0-1: the 32 bytes of the group of k steps 0-1; lanes 2-3: of steps 2-3 (group 32).
      if (lane() < 4) {
        const int grp = (kk >> gshift) + lane() / 2;
        const bool ok = rt >= 0 && kk < p.w.k && (lane() < 2 || p.w.group == 32);
        const char* src = ok ? s_base + ((rt * groups + grp) * 16 + (lane() % 2) * 8) * 2 : s_base;
        cp_async16(ss + uint32_t(warp() * 64 + lane() * 16), src, ok ? 16 : 0);
      }
    } else if constexpr (F == kMoeFp8) {
      if (lane() == 0) {
        const bool ok = rt >= 0 && kk < p.w.k;
        const int idx = (rt * kMoeTileRows / kMoeFp8Block) * scale_cols + kk / kMoeFp8Block;
        cp_async4(ss + uint32_t(warp() * 16), ok ? s_base + idx * 4 : s_base, ok ? 4 : 0);
      }
    }
  }

  // This lane's A fragments of element j's four k16 steps.
  __device__ __forceinline__ void fragments(int j, uint32_t (&a)[4][4]) const {
    const int st = j % C::kStages;
    const uint32_t sw = smem + C::kWOff + uint32_t(st) * C::kWBytes +
                        uint32_t(warp() * C::kTilesPerStep * kMoeTileBytes + lane() * 16);
    const uint32_t ss = smem + C::kSOff + uint32_t(st) * C::kSBytes;
    TileScale sc{0, 0};
    if constexpr (F == kMoeInt4) {
      const uint32_t at = ss + uint32_t(warp() * 64 + (lane() / 4) * 4);
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(sc.s0) : "r"(at));
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(sc.s1) : "r"(at + 32));
      if (p.w.group != 32) sc.s1 = sc.s0;
    } else if constexpr (F == kMoeFp8) {
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(sc.s0) : "r"(ss + uint32_t(warp() * 16)));
    }
#pragma unroll
    for (int t = 0; t < C::kTilesPerStep; ++t) {
      uint4 q;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(q.x), "=r"(q.y), "=r"(q.z), "=r"(q.w)
                   : "r"(sw + uint32_t(t * kMoeTileBytes)));
#pragma unroll
      for (int s = 0; s < kSteps<F>; ++s) fragment<F>(q, sc, s, a[t * kSteps<F> + s]);
    }
    reg_fence(a);
  }

  // Element j with its fragments `cur` ready: issue its wgmma; while they run, wait for element
  // j - 1's wgmma (its stage and `nxt` are then free) and element j + 1's copies, meet the CTA
  // at one barrier, issue element j + S - 1's copies and make element j + 1's fragments in
  // `nxt`.
  __device__ __forceinline__ void step(int j, int count, float* acc, uint32_t (&cur)[4][4],
                                       uint32_t (&nxt)[4][4]) const {
    wgmma_fence();
    const uint32_t xb = x_tile(j);
#pragma unroll
    for (int s = 0; s < 4; ++s) wgmma_rs_n<BM>(acc, cur[s], make_smem_desc(xb + 32 * s, 16, 1024));
    wgmma_commit();
    if (j + 1 < count) {
      wgmma_wait<1>();
      cp_async_wait<C::kStages - 3>();  // committed: elements 0 .. j + S - 2; j + 1 landed
      fence_proxy_async();
      __syncthreads();
      issue(j + C::kStages - 1);
      cp_async_commit();
      fragments(j + 1, nxt);
    }
  }
};

template <int F, int BM, bool GLU, bool XRES>
__global__ void __launch_bounds__(kThreads, 2) moe_gemm_kernel(MoeGroupedParams p) {
  using C = Cfg<F, BM, XRES>;
  extern __shared__ __align__(128) char smem_raw[];
  if (p.pdl_early) pdl_trigger();
  const int tid = int(threadIdx.x);
  Cta<F, BM, GLU, XRES> b{p};
  // Row blocks: GLU 64 outputs (4 gate + 4 up tiles), plain 128 weight rows (8 tiles); a CTA
  // takes one, or with XRES gemm_blocks consecutive ones.
  const int blocks = int(GLU ? cdiv(p.glu_inter / kMoeTileRows, 4) : cdiv(p.w.n / kMoeTileRows, 8));
  const int per = XRES ? p.gemm_blocks : 1;
  const int64_t units = cdiv(blocks, per);
  // XRES (BM 64) splits a plan tile of tile_rows rows into tile_rows / 64 sub-tiles.
  const int sub = XRES && p.offsets != nullptr ? p.tile_rows / BM : 1;
  const int64_t tile = int64_t(blockIdx.x) / units / sub;
  const int sub_row = int(int64_t(blockIdx.x) / units % sub) * BM;
  b.nb = int(int64_t(blockIdx.x) % units) * per;
  pdl_wait();
  if (!p.pdl_early) pdl_trigger();

  // This CTA's expert and its permuted rows [row0, row0 + rows).
  int64_t e = 0;
  int row0, rows;  // < 2^31: the launcher checks rows · k
  if (p.offsets != nullptr) {
    if (tile >= p.counts[1]) return;  // the whole CTA
    e = p.tiles[2 * tile];
    row0 = p.tiles[2 * tile + 1] + sub_row;
    rows = min(BM, p.offsets[e + 1] - row0);
    if (rows <= 0) return;  // a sub-tile past the segment's end
  } else {
    if (tile * BM >= p.rows) return;
    row0 = int(tile * BM);
    rows = int(min(int64_t(BM), p.rows - row0));
  }

  b.smem = smem_addr(smem_raw);
  b.smem += (1024 - (b.smem & 1023)) & 1023;  // the swizzle works on address bits
  const int r0 = tid / 8;
  b.x_col = 8 * (tid % 8);
  b.x_dst = uint32_t(r0 * 128 + (((tid % 8) ^ (r0 & 7)) << 4));
  if (tid < BM) {  // element offset of the tile's x row tid, -1 past its rows
    const int64_t xr =
        tid < rows ? (p.row_token ? int64_t(p.row_token[row0 + tid]) : row0 + tid) : -1;
    reinterpret_cast<int32_t*>(smem_raw + (b.smem - smem_addr(smem_raw)) + C::kRowOff)[tid] =
        xr >= 0 ? int32_t(xr * p.w.k) : -1;
  }
  __syncthreads();
  b.kt_count = int(moe_k_tiles(F, p.w.k));
  b.w_base = static_cast<const char*>(p.w.values) + e * p.w.values_stride + b.lane() * 16;
  b.s_base = static_cast<const char*>(p.w.scales) + e * p.w.scales_stride;
  b.groups = F == kMoeInt4 ? int(int4_scale_groups(p.w.k, p.w.group)) : 0;
  b.scale_cols = int(cdiv(p.w.k, kMoeFp8Block));
  b.gshift = __ffs(p.w.group) - 1;
  b.steps = int(cdiv(p.w.k, 64));
  b.len = (XRES ? min(per, blocks - b.nb) : 1) * b.steps;
  const int len2 = b.len + (b.len & 1);  // even: the loop below is unrolled by two

  if constexpr (XRES) {  // all of x's k steps, in the first commit group
    for (int s = 0; s < b.steps; ++s) b.issue_x(s, b.x_tile(s));
  }
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    b.issue(s);
    cp_async_commit();
  }
  float acc[BM / 2];
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) acc[i] = 0.0f;
  const int g = b.lane() / 4, c = b.lane() % 4;
  // Plain: row block nb's outputs from acc.
  auto store_plain = [&](int nb) {
    const int rt = b.row_tile(nb);
    if (rt < 0) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t col = int64_t(rt) * kMoeTileRows + g + 8 * h;
#pragma unroll
      for (int i = 0; i < BM / 8; ++i)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
          const int64_t r = 8 * i + 2 * c + e2;
          if (r < rows) p.out[(row0 + r) * p.w.n + col] = float_to_bf16(acc[4 * i + 2 * h + e2]);
        }
    }
  };
  // XRES: after element j, the last k step of a block that is not the CTA's last: its outputs
  // (the next block's copies are in flight meanwhile), then a fresh sum.
  auto block_end = [&](int j) {
    if constexpr (XRES) {
      if (j + 1 < b.len && (j + 1) % b.steps == 0) {
        wgmma_wait<0>();
        reg_fence<BM / 2>(acc);
        store_plain(b.block_of(j));
#pragma unroll
        for (int i = 0; i < BM / 2; ++i) acc[i] = 0.0f;
      }
    }
  };
  // Two fragment buffers in turn (the loop is unrolled by two so that both have fixed
  // registers); an odd element count gets one zero-filled element more.
  uint32_t a0[4][4], a1[4][4];
  cp_async_wait<C::kStages - 2>();  // element 0 (and XRES's x) landed
  fence_proxy_async();
  __syncthreads();
  b.fragments(0, a0);
  for (int j = 0; j < len2; j += 2) {
    b.step(j, len2, acc, a0, a1);
    block_end(j);
    b.step(j + 1, len2, acc, a1, a0);
    block_end(j + 1);
  }
  wgmma_wait<0>();
  reg_fence<BM / 2>(acc);
  cp_async_wait<0>();  // the zero-filled copies past the last element
  if constexpr (!GLU) {
    store_plain(b.block_of(b.len - 1));
  } else {  // warpgroup 1's up sums join warpgroup 0's gate sums
    char* smem = smem_raw + (b.smem - smem_addr(smem_raw));
    float* xchg = reinterpret_cast<float*>(smem);
    const int t = tid % 128;
    __syncthreads();
    if (tid >= 128) {
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) xchg[i * 128 + t] = acc[i];
    }
    __syncthreads();
    if (tid >= 128) return;
    const int rt = b.row_tile(b.nb);  // a gate tile
    if (rt < 0) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t col = int64_t(rt) * kMoeTileRows + g + 8 * h;
#pragma unroll
      for (int i = 0; i < BM / 8; ++i)
#pragma unroll
        for (int e2 = 0; e2 < 2; ++e2) {
          const int64_t r = 8 * i + 2 * c + e2;
          const int at = 4 * i + 2 * h + e2;
          if (r < rows)
            p.out[(row0 + r) * p.glu_inter + col] =
                float_to_bf16(silu(round_bf16(acc[at])) * round_bf16(xchg[at * 128 + t]));
        }
    }
  }
}

// Whether the x-resident variant's shared memory fits (without instantiating its Cfg).
constexpr bool xres_fits(int f, int bm) {
  const int x_region = int(kMoeGemmShortK / 64) * bm * 128;
  const int stage = 8 * (64 / moe_tile_k(f)) * kMoeTileBytes + (f == kMoeInt4  ? 8 * 64
                                                                : f == kMoeFp8 ? 8 * 16
                                                                               : 0);
  const int fit = (112 * 1024 - x_region) / stage;
  const int stages = fit > 6 ? 6 : fit;
  return stages >= 3 && x_region + stages * stage + bm * 4 + 1024 <= 113 * 1024;
}

template <int F, int BM, bool GLU, bool XRES>
void set_limit() {
  CUDA_CHECK(cudaFuncSetAttribute(moe_gemm_kernel<F, BM, GLU, XRES>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  Cfg<F, BM, XRES>::kBytes));
}
template <int F>
void set_limits_format() {
  set_limit<F, 64, false, false>();
  set_limit<F, 64, true, false>();
  set_limit<F, 128, false, false>();
  set_limit<F, 128, true, false>();
  if constexpr (xres_fits(F, 64)) set_limit<F, 64, false, true>();
}

// Whether launch_moe_gemm takes the x-resident variant for these parameters.
// (always with 64-row tiles: at 128 its accumulators and the per-block epilogue spilled ~900
// bytes; a plan tile of 128 rows is two sub-tiles).
template <int F>
bool use_xres(const MoeGroupedParams& p) {
  return xres_fits(F, 64) && p.glu_inter == 0 && p.w.k <= kMoeGemmShortK && p.gemm_blocks >= 0;
}

template <int F, int BM, bool GLU, bool XRES>
void launch_cfg(const MoeGroupedParams& p_in, cudaStream_t stream) {
  MoeGroupedParams p = p_in;
  int64_t units = GLU ? cdiv(p.glu_inter / kMoeTileRows, 4) : cdiv(p.w.n / kMoeTileRows, 8);
  if constexpr (XRES) {
    if (p.gemm_blocks == 0) p.gemm_blocks = moe_gemm_blocks(p);
    units = cdiv(units, p.gemm_blocks);
  }
  const int64_t tiles = p.offsets ? p.max_tiles * (XRES ? p.tile_rows / BM : 1) : cdiv(p.rows, BM);
  const int64_t ctas = tiles * units;
  if (ctas == 0) return;
  CHECK_MSG(ctas < (int64_t(1) << 31), "moe gemm: {} CTAs", ctas);
  launch_pdl(moe_gemm_kernel<F, BM, GLU, XRES>, dim3(unsigned(ctas)), dim3(kThreads),
             Cfg<F, BM, XRES>::kBytes, Launch{stream}, p);
  CUDA_LAUNCH_CHECK();
}

template <int F>
void launch_format(const MoeGroupedParams& p, cudaStream_t stream) {
  const bool glu = p.glu_inter > 0;
  if (use_xres<F>(p)) {
    if constexpr (xres_fits(F, 64)) launch_cfg<F, 64, false, true>(p, stream);
  } else if (p.tile_rows == 64) {
    glu ? launch_cfg<F, 64, true, false>(p, stream) : launch_cfg<F, 64, false, false>(p, stream);
  } else {
    glu ? launch_cfg<F, 128, true, false>(p, stream) : launch_cfg<F, 128, false, false>(p, stream);
  }
}

}  // namespace

int moe_gemm_blocks(const MoeGroupedParams& p) {
  // Up to 8 blocks per CTA while the grid keeps >= 6 CTAs per SM (three waves of two), so that
  // the last wave's imbalance stays small.
  const int64_t blocks = cdiv(p.w.n / kMoeTileRows, 8);
  const int64_t tiles = p.offsets ? p.max_tiles * std::max(1, p.tile_rows / 64) : cdiv(p.rows, 64);
  int per = 8;
  while (per > 1 && tiles * cdiv(blocks, per) < 6 * int64_t(num_sms())) per /= 2;
  return per;
}

void init_moe_gemm_kernels() {
  set_limits_format<kMoeBf16>();
  set_limits_format<kMoeFp8>();
  set_limits_format<kMoeInt4>();
  init_moe_gemv_kernels();  // the int4 GEMV's ring, before any graph capture as well
  init_moe_gemm_ws_kernels();
  init_moe_gemm_pipe_kernels();
}

void launch_moe_gemm(const MoeGroupedParams& p, cudaStream_t stream) {
  const char* why = nullptr;
  CHECK_MSG(moe_weight_shape_ok(p.w.format, p.w.n, p.w.k, p.w.group, &why), "moe gemm: {}", why);
  CHECK_MSG(p.glu_inter == 0 || (p.w.n == 2 * p.glu_inter && p.glu_inter % kMoeTileRows == 0),
            "moe gemm: SwiGLU needs n = 2 · inter, inter % 16 == 0 (n {}, inter {})", p.w.n,
            p.glu_inter);
  // fp8: a 128-row scale block must not straddle the gate and up halves.
  CHECK_MSG(p.glu_inter == 0 || p.w.format != kMoeFp8 || p.glu_inter % kMoeFp8Block == 0,
            "moe gemm: fp8 gate_up needs inter % 128 == 0 (inter {})", p.glu_inter);
  CHECK_MSG(p.tile_rows == 64 || p.tile_rows == 128, "moe gemm: tile_rows {}", p.tile_rows);
  CHECK_MSG(p.rows * p.w.k < (int64_t(1) << 31),
            "moe gemm: x of {} x {} too large (32-bit offsets)", p.rows, p.w.k);
  CHECK(uintptr_t(p.x) % 16 == 0 && uintptr_t(p.w.values) % 16 == 0 && p.w.values_stride % 16 == 0);
  // Scales are copied in 16-byte pieces (int4) or one float at a time (fp8).
  const int salign = p.w.format == kMoeInt4 ? 16 : 4;
  CHECK(p.w.format == kMoeBf16 ||
        (uintptr_t(p.w.scales) % salign == 0 && p.w.scales_stride % salign == 0));
  static PerDeviceOnce limits;  // the kernels' shared-memory limits
  limits.run(init_moe_gemm_kernels);
  if (p.weight_stationary && moe_gemm_ws_supported(p)) return launch_moe_gemm_ws(p, stream);
  if (p.pipe && moe_gemm_pipe_supported(p)) return launch_moe_gemm_pipe(p, stream);
  switch (p.w.format) {
    case kMoeBf16:
      launch_format<kMoeBf16>(p, stream);
      break;
    case kMoeFp8:
      launch_format<kMoeFp8>(p, stream);
      break;
    default:
      launch_format<kMoeInt4>(p, stream);
      break;
  }
}

}  // namespace strata::cuda
