// The register GEMV: launch_int4_gemv's default for m <= 8 (linear_int4.h), on the tile layout
// of linear_int4.cu. Weights go straight from global memory into registers (16-byte ld.global
// per lane, several k tiles in flight per warp), as the bf16 GEMV (linear.cu) streams its rows.
//
// ## Why (2026-12-01, H200, m = 1): the mma GEMV (linear_int4.cu) and the stream GEMV
// (linear_int4_stream.cu) read 27-50% of copy bandwidth on the 8B shapes (stream: ~4.3 us plus
// 2.5-2.7 TB/s a launch; a qkv's weights take 3.0 us at copy). A launch has to keep DRAM busy
// through its own start (PDL wait, x) and end (the last loads, the epilogue, the grid's end):
// at ~40-60 KB in flight per SM, ~1.5-2.5 us of idle memory unless the next weights are in flight.
//
// ## This kernel
// - Blocks and warps: one block of W warps (8) per SM; block b owns whole row tiles (SwiGLU:
//   gate/up pairs, the gate tiles then the up tiles), its tiles one stream in [row tile][k tile]
//   order; warp w takes the w-th contiguous W-th of that stream, cut on scale-group boundaries
//   (balanced to one group within a block, to one row tile between blocks: 97% on the 8B
//   shapes). The stream GEMV splits work the same way.
// - Weights: each lane keeps a ring of U (16) k tiles' 16-byte pieces in registers, loaded U
//   tiles ahead of the one it multiplies: the slot just multiplied is refilled at once, so U
//   loads per lane (16 x 16 bytes; 64 KB per SM at 8 warps) are in flight all along, from
//   before the PDL wait to the part's end. Scale words ride in a smaller ring (one per group).
//   No shared memory, barrier or copy engine on the weights' path; ~127 registers.
// - Across launches: the ring is loaded before griddepcontrol.wait (weights are never written
//   by a kernel), and by default the kernel lets its successor launch at once
//   (kInt4TriggerEarly). Its registers (~127 x 256 threads) allow two blocks per SM: the
//   successor's block becomes resident beside this one and loads its first 64 KB per SM while
//   this kernel streams; the one after that becomes resident only as this kernel's blocks exit,
//   so its loads fill the gap between this kernel's last loads and its successor's PDL wait.
//   Trigger point, residency depth (shared-memory padding), warps and U are knobs (the bench
//   sweeps them).
// - x (m <= 8 tokens) is copied into shared memory once per block in mma B-fragment order:
//   lane (t, c) reads its 8 words of a k tile as two 16-byte loads, the two halves of odd
//   tokens swapped so that the 8 lanes of a 16-byte load phase (tokens 2j, 2j + 1) hit
//   different banks; lanes of tokens >= m read token 0 (their output columns are discarded).
//   Except at m = 1 where x arrives whole in shared memory (the bulk copy, or graph mode's norm
//   prologue): there each lane reads its fragments from x's row as it lies (kRawX: 8 four-byte
//   loads a tile instead of 2 sixteen-byte ones, the same wavefronts, conflict-free at one
//   token), so neither a staging pass nor a barrier stands between x's arrival and the first
//   mma. One 8B token's 128 GEMVs (H100, int4_linear_bench --what token) 1.612-1.617 ms against
//   1.762-1.778 (−8.6%: 73.3% of copy); Llama-3.1-8B W4A16 batch-1 steps 2.344-2.377 against
//   2.507-2.537 ms (−6.5%), batch 8 unchanged (session 52).
// - Per tile and lane: one 16-byte load, 2 x 16-byte shared loads of x, 4 x (3 shifts + 4
//   lop3 + 4 fma.bf16x2) nibbles -> (128 + n) - 136 = n - 8 as bf16 pairs (exact; magic_word_
//   signed), 4 mma.m16n8k16 into two group accumulators (even / odd k steps: two dependency
//   chains) from 0; at the group's end acc += scale · (g0 + g1) in float32: ~58 warp
//   instructions per 512-byte tile. At 85% of the H200's copy bandwidth an SM takes a tile every
//   ~37 clocks: ~1.6 instructions per clock of the 4 it can issue. Why the subtraction a word
//   rather than (128 + n) into the mma and −136·Σx per group and token added at the group's
//   start (the stream GEMV's form, and this kernel's until 2026-12-07): those sums are made with
//   x after the PDL wait, on every launch's critical path. One 8B token's 128 GEMVs (H100,
//   int4_linear_bench --what token) 1.810-1.824 ms against 1.902-1.929 (−5%); Llama-3.1-8B W4A16
//   decode steps (rank_step_bench) −2.8% at batch 1, −12.5% at 4, −8.2% at 8 (session 51).
//   gemv_round = 1 instead dequantizes as the mma GEMV does ((nibble − 8) · scale rounded to
//   bf16, 15 instructions per 8 weights): the reference's bits.
// - Rows (gemv_rows 4, Int4RegPlan via RegLaunch::rows): a stream position is one k tile of R = 4
//   row tiles ("super-slots": R consecutive slots of one run, blocks cut in whole super-slots),
//   so the x fragments, the position's address and bookkeeping serve four tiles, and the ring
//   holds U / R positions; rows past the block's last row tile load zeros and are never stored.
//   The experts' default (CudaTunables::moe_int4_reg_rows: T = 32 / 128 −3.5 / −2.1%, H200,
//   2026-12-05); dense 8B shapes lose (too few blocks of whole super-slots): int4_gemv_rows 1.
// - Partial sums per (warp, row tile) go to shared memory; after the block's barrier each
//   output sums its row tile's warps in warp order (deterministic), adds the bias and rounds
//   once (SwiGLU: gate and up rounded to bf16, then silu(g)·u, as launch_silu_mul).
// - Graph mode's merges (int4_norm_fusion.cc): Int4LinearParams::norm (prologue) and ::residual.
// Numerics (gemv_round = 0) as the stream GEMV's: the weights unrounded, (nibble − 8) · scale
// exactly; NMSE ~1.3e-6 against the bf16-rounded weights, below the output's own rounding.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/linear_int4.cuh"
#include "backend/cuda/linear_int4_reg_plan.cuh"
#include "backend/cuda/linear_int4_xstage.cuh"
#include "backend/cuda/norm_prologue.cuh"

namespace strata::cuda {
namespace {

using namespace int4;
using namespace int4_reg;

// TPG: k tiles per scale group (group / 64: 1, 2 or 4), 0 for group 32 (two per tile).
// U: k tiles in flight per warp (the register ring). R: row tiles a warp multiplies at each k
// tile (a stream position: R tiles sharing the x fragments and the position's bookkeeping).
// kRawX (m = 1, choose_reg's raw_x): each lane reads its B fragments from x's row as the bulk
// copy or the norm prologue left it in shared memory (8 four-byte loads a tile), so x is not
// staged in fragment order and no barrier follows its arrival.
template <int U, int TPG, bool kRound, int R, bool kRawX = false>
__global__ void __launch_bounds__(kMaxWarps * 32, 1)
    int4_gemv_reg_kernel(Int4LinearParams p, Int4RegPlan pl) {
  constexpr int kUnit = TPG == 0 ? 1 : TPG;  // positions per part unit (a group's, or one)
  constexpr int P = U / R;                   // positions in flight
  constexpr int kScales = TPG == 0 ? 2 * U : U / kUnit;  // scale words in the ring
  static_assert(P * R == U && kUnit <= P && P % kUnit == 0, "the ring holds whole groups");
  // Ring slot of position slot t, row r; its scale words (TPG 0: two, at sci and sci + 1).
  auto rslot = [](int t, int r) { return t * R + r; };
  auto sci = [](int t, int r) { return TPG == 0 ? 2 * (t * R + r) : (t / kUnit) * R + r; };
  extern __shared__ __align__(128) char smem[];
  // The warp index, warp-uniform to the compiler.
  const int warp = __shfl_sync(~0u, int(threadIdx.x) / 32, 0);
  const int tid = int(threadIdx.x), lane = tid % 32, g = lane / 4, c = lane % 4;
  const int nw = int(blockDim.x) / 32, KT = pl.kt;
  int m = int(p.m);  // planned experts mode: the tile's rows, known once its expert is
  const bool glu = p.glu_inter > 0;
  const int gshift = __ffs(p.group) - 1;

  // Experts modes (linear_int4.h): blocks_per_assignment blocks per work item, each a part of the
  // row tiles of the item's expert matrix; an item is an assignment (token t, choice j: x row
  // t = i / x_div, output row i) or a plan tile (up to 8 permuted rows of one expert: x rows
  // row_token[r] or r, output rows r). Blocks never span two items.
  const bool by_ids = pl.experts.ids != nullptr, planned = pl.experts.tiles != nullptr;
  const bool experts = by_ids || planned;
  int bx = int(blockIdx.x), gx = int(gridDim.x), assign = 0;
  if (experts) {
    assign = bx / pl.blocks_per_assignment;
    bx -= assign * pl.blocks_per_assignment;
    gx = pl.blocks_per_assignment;
  }
  const int64_t out_ld = glu ? p.glu_inter : p.n;
  if (by_ids) {
    p.x += int64_t(assign / pl.experts.x_div) * p.k;
    p.out += int64_t(assign) * out_ld;
  }
  // The block's row tiles: slots 0..ns-1 (SwiGLU: nu gate tiles, then their nu up tiles), cut
  // between blocks in whole groups of R.
  const int su = (pl.units + R - 1) / R;
  const int u0 = int(int64_t(bx) * su / gx) * R;
  const int nu = min(int(int64_t(bx + 1) * su / gx) * R, pl.units) - u0;
  const int ns = glu ? 2 * nu : nu;
  // Super-slots: R consecutive slots of one run (gate or plain, then up), h a run; position i
  // of the block's stream is k tile i % KT of super-slot i / KT.
  const int h = (nu + R - 1) / R, L = (glu ? 2 * h : h) * KT, J = glu ? h * KT : L;
  // Super-slot j's first slot, and its real slots (R == 1: j and 1, folded at compile time).
  auto slot_of = [&](int j) { return R == 1 ? j : j < h ? j * R : nu + (j - h) * R; };
  auto rows_of = [&](int j) { return R == 1 ? 1 : min(R, nu - (j < h ? j : j - h) * R); };
  auto tile_of = [&](int j) {  // its first row tile in the matrix
    return j < h ? u0 + j * R : pl.inter_tiles + u0 + (j - h) * R;
  };
  // Global tile of stream position i: i + base0 before J, i + base1 from J (the up run), both
  // offset by the expert's first tile (ebase) in experts mode.
  // 32-bit tile indices (choose_reg: int4_tile_index_fits): an address is one IMAD.WIDE.U32; 64-bit
  // ones cost ~14 instructions a tile for the weight and scale loads (SASS, 2026-12-05).
  const uint32_t base0 = uint32_t(u0 * KT), base1 = uint32_t((pl.inter_tiles + u0 - nu) * KT);
  uint32_t ebase = 0;
  bool valid = true;  // block-uniform: an id outside [0, num_experts) has no expert, no output
  int r0 = 0;         // planned: the tile's first permuted row
  auto find_expert = [&] {  // reads through L2: may precede pdl_wait (ids_early)
    int e;
    if (by_ids) {
      e = __ldcg(pl.experts.ids + assign);
    } else {
      valid = assign < __ldcg(pl.experts.counts + 1);
      e = valid ? __ldcg(pl.experts.tiles + 2 * assign) : 0;
      r0 = valid ? __ldcg(pl.experts.tiles + 2 * assign + 1) : 0;
      if (valid) m = min(m, __ldcg(pl.experts.offsets + e + 1) - r0);  // p.m: tile rows
      valid = valid && m > 0;
    }
    valid = valid && e >= 0 && e < pl.experts.num_experts;
    ebase = valid ? uint32_t(e) * uint32_t(pl.expert_tiles) : 0u;
  };
  if (experts && pl.experts.ids_early) {
    find_expert();
    // A block past the plan's tiles (the grid is sized for the most tiles a step can have) ends
    // before it loads or waits: exiting counts as its trigger, and it holds no SM slot while
    // the predecessor finishes. Block-uniform.
    if (!valid) return;
  }
  // Warp w's part of the stream, [part_start(w), part_start(w + 1)), starts on a scale group's
  // first tile: a group's x sum then matches what a warp accumulates, and position i's place
  // in its group is i % kUnit (KT is a multiple of kUnit).
  auto part_start = [&](int w) { return int(int64_t(w) * (L / kUnit) / nw) * kUnit; };
  const int a = part_start(warp), b = part_start(warp + 1);

  // ---- the weights' loads: position i into ring slots t · R.. (t == (i - a) % P) ----
  // A scale group's scale word is loaded with its last tile (the ring slot of the group's first
  // tile is refilled before the group ends). The scale groups of consecutive row tiles are
  // consecutive (k % group == 0): group (64 · tile) >> log2(group) of the whole weight.
  const uint4* wsrc = static_cast<const uint4*>(p.packed) + lane;
  const uint32_t* ssrc = reinterpret_cast<const uint32_t*>(p.scale) + g;
  uint4 ring[U];
  uint32_t sc[kScales];
  // R > 1: the next load's position as running state (loads come in stream order): its tile of
  // row 0, k tile, super-slot and real rows (the rest load zeros, multiplied but never stored).
  uint32_t l_gt = 0;
  int l_kt = 0, l_j = 0, l_rows = 0;
  auto load_seek = [&](int j, int kt) {
    l_j = j;
    l_kt = kt;
    l_gt = ebase + uint32_t(tile_of(j) * KT + kt);
    l_rows = rows_of(j);
  };
  // Tile gt: its 32 16-byte pieces, and its scale words (group 32: groups 2 gt and 2 gt + 1;
  // else group gt / TPG, loaded with the group's last tile).
  auto load_tile = [&](int t, int r, uint32_t gt, bool real) {  // t, r compile-time once unrolled
    ring[rslot(t, r)] = real ? __ldcs(wsrc + gt * 32u) : make_uint4(0, 0, 0, 0);
    if constexpr (TPG == 0) {
      sc[sci(t, r)] = real ? __ldg(ssrc + gt * 16u) : 0u;
      sc[sci(t, r) + 1] = real ? __ldg(ssrc + gt * 16u + 8) : 0u;
    } else if (t % kUnit == kUnit - 1) {
      sc[sci(t, r)] = real ? __ldg(ssrc + gt / uint32_t(TPG) * 8u) : 0u;
    }
  };
  auto load = [&](auto t_c, int i) {
    constexpr int t = decltype(t_c)::value;
    if (i >= b) return;
    if constexpr (R == 1) {
      load_tile(t, 0, ebase + uint32_t(i) + (i < J ? base0 : base1), true);
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) load_tile(t, r, l_gt + uint32_t(r * KT), r < l_rows);
      ++l_gt;
      if (++l_kt == KT) load_seek(l_j + 1, 0);
    }
  };
  auto load_first = [&] {
    if constexpr (R > 1)
      if (b > a) load_seek(a / KT, a % KT);
    static_for<P>([&](auto t_c) { load(t_c, a + decltype(t_c)::value); });
  };
  if (p.preload) load_first();
  // x_tma: x by one bulk copy right after the wait (the TMA engine, not the ring's load queue:
  // Int4LinearParams::gemv_x_tma); x_norm: each block makes x, norm.x's rms_norm, in that region.
  const bool x_norm = p.norm.x != nullptr, x_tma = pl.off_xraw != 0 && !x_norm;  // block-uniform
  const uint32_t x_bar = smem_addr(smem + pl.off_xrow), x_raw = smem_addr(smem + pl.off_xraw);
  if (x_tma) {
    if (tid == 0) {
      mbar_init(x_bar, 1);
      mbar_init_fence();
    }
    __syncthreads();
  }
  const NormHeld held = x_norm ? norm_prologue_preload(p.norm, p.k) : NormHeld{};
  // Each warp's first and last row-tile slot, for the epilogue (read after the stream's barrier).
  if (tid < nw) {
    const int wa = part_start(tid), wb = part_start(tid + 1), jb = (wb - 1) / KT;
    reinterpret_cast<int2*>(smem + pl.off_span)[tid] =
        wb > wa ? make_int2(slot_of(wa / KT), slot_of(jb) + rows_of(jb) - 1) : make_int2(1, 0);
  }
  if (pl.trigger == kInt4TriggerEarly) pdl_trigger();
  pdl_wait();
  if (x_tma && tid == 0) {
    mbar_arrive_expect_tx(x_bar, uint32_t(p.m * p.k * 2));
    bulk_copy_g2s(x_raw, p.x, uint32_t(p.m * p.k * 2), x_bar);
  }
  if (pl.trigger == kInt4TriggerAfterWait) pdl_trigger();
  if (experts && !pl.experts.ids_early) find_expert();
  if (!valid) return;  // the whole block (its trigger, if any, was issued above)
  if (!p.preload) load_first();
  // Planned: the tile's x rows (gathered through row_token where set) and output rows.
  int* xrow = reinterpret_cast<int*>(smem + pl.off_xrow);
  if (planned) {
    p.out += int64_t(r0) * out_ld;
    if (int(threadIdx.x) < m)
      xrow[threadIdx.x] = pl.experts.row_token ? __ldcg(pl.experts.row_token + r0 + threadIdx.x)
                                               : r0 + int(threadIdx.x);
    __syncthreads();
  }
  if (pl.trigger == kInt4TriggerLate && a + P >= b) pdl_trigger();

  // ---- x into shared memory in B-fragment order (linear_int4_xstage.cuh; odd tokens' halves
  // swapped: the 8 lanes of a 16-byte phase, tokens 2j and 2j + 1, hit different banks).
  {
    if (x_tma) mbar_wait(x_bar, 0);
    if (x_norm)
      norm_prologue_rows(p.norm, m, p.k, const_cast<bf16_bits*>(p.x), smem + pl.off_xraw, held);
    if constexpr (!kRawX) {
      uint32_t* xs = reinterpret_cast<uint32_t*>(smem);
      stage_x_fragments<4, true, false>(xs, nullptr, m, p.k, p.group, gshift, [&](int q, int kc) {
        if (x_tma || x_norm) return lds128(x_raw + uint32_t(q) * 16u);
        const int64_t row = planned ? xrow[q / kc] : q / kc;
        return __ldg(reinterpret_cast<const uint4*>(p.x + row * p.k) + q % kc);
      });
      zero_x_padding(xs, m, p.k, KT);
      __syncthreads();
    }
  }

  // ---- the stream ----
  // This lane's x words of k tile 0, half 0 (shared-memory address; half 1 is 64 bytes away in
  // the same 128-byte block: address ^ 64); lanes of tokens >= m read token 0.
  const int tok = g < m ? g : 0;
  if (smem_addr(smem) % 128 != 0) __trap();  // the halves' XOR needs 128-byte blocks
  const uint32_t x_lane =
      kRawX ? x_raw + c * 4 : smem_addr(smem) + tok * 128 + c * 16 + (tok & 1) * 64;
  const uint32_t x_kt = kRawX ? 128 : m * 128;
  float* part = reinterpret_cast<float*>(smem + pl.off_part) + warp * pl.slots * 16 * m;
  // Accumulators per row r of the position: R == 1 two chains (acc: even k steps, acc1: odd),
  // R > 1 one (the R rows are independent chains already).
  constexpr int kChains = R == 1 ? 2 : 1;
  float acc[R][4] = {}, acc1[1][4] = {};  // acc1: R == 1 only
  auto acc_odd = [&](int r) -> float* { return kChains == 2 ? acc1[0] : acc[r]; };
  // g0 (even k steps) and g1 (odd steps; R > 1: g0 too) start a scale group at 0 and sum
  // (nibble − 8)·x over it; acc takes their sum times the rows' scales at its end.
  float g0[R][4], g1[1][4];
  int cj = KT > 0 ? a / KT : 0;  // the super-slot being multiplied
  const int span0 = slot_of(cj);
  auto flush = [&]() {  // acc -> this warp's partial sums of super-slot cj's real slots
    const int s0 = slot_of(cj) - span0, nr = rows_of(cj);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float* dst = part + (s0 + r) * 16 * m;
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (r < nr && 2 * c + e < m) {
          dst[g * m + 2 * c + e] = acc[r][e] + (kChains == 2 ? acc1[0][e] : 0.0f);
          dst[(g + 8) * m + 2 * c + e] = acc[r][2 + e] + (kChains == 2 ? acc1[0][2 + e] : 0.0f);
        }
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][i] = acc1[0][i] = 0.0f;
    }
  };
  int kt = KT > 0 ? a % KT : 0;      // the k tile of the position being multiplied
  uint32_t xp = x_lane + kt * x_kt;  // its x
  // Multiplies ring slots t · R.. (position i, k tile kt), then refills them with position i + P.
  auto step = [&](auto t_c, int i) {
    constexpr int t = decltype(t_c)::value;
    uint32_t xw[8];
    if constexpr (kRawX) {  // step s: k 16s + 2c (bytes 32s + 4c) and k + 8 (16 bytes on)
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        xw[2 * s] = lds32(xp + 32 * s);
        xw[2 * s + 1] = lds32(xp + 32 * s + 16);
      }
    } else {
      const uint4 xa = lds128(xp), xb = lds128(xp ^ 64);
      xw[0] = xa.x, xw[1] = xa.y, xw[2] = xa.z, xw[3] = xa.w;
      xw[4] = xb.x, xw[5] = xb.y, xw[6] = xb.z, xw[7] = xb.w;
    }
    if constexpr (kRound) {
#pragma unroll
      for (int r = 0; r < R; ++r)
        mma_tile_round(ring[rslot(t, r)], sc[sci(t, r)], sc[TPG == 0 ? sci(t, r) + 1 : sci(t, r)],
                       xw, acc[r], acc_odd(r));
    } else {
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        if (TPG == 0 ? s % 2 == 0 : s == 0 && t % kUnit == 0) {  // a group's first k step
#pragma unroll
          for (int e = 0; e < 4; ++e) {
#pragma unroll
            for (int r = 0; r < R; ++r) g0[r][e] = 0.0f;
            g1[0][e] = 0.0f;
          }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint4& q = ring[rslot(t, r)];
          const uint32_t qs = s == 0 ? q.x : s == 1 ? q.y : s == 2 ? q.z : q.w;
          uint32_t af[4];
          magic_word_signed(qs, af);
          mma16816(kChains == 2 && s % 2 ? g1[0] : g0[r], af, xw[2 * s], xw[2 * s + 1]);
        }
        if (TPG == 0 ? s % 2 == 1 : s == 3 && t % kUnit == kUnit - 1) {  // its last
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const uint32_t sw = sc[TPG == 0 ? sci(t, r) + s / 2 : sci(t, r)];
            const float s_lo = __uint_as_float(sw << 16), s_hi = __uint_as_float(sw & 0xffff0000u);
            auto gsum = [&](int e) { return kChains == 2 ? g0[r][e] + g1[0][e] : g0[r][e]; };
            acc[r][0] = fmaf(s_lo, gsum(0), acc[r][0]);
            acc[r][1] = fmaf(s_lo, gsum(1), acc[r][1]);
            acc[r][2] = fmaf(s_hi, gsum(2), acc[r][2]);
            acc[r][3] = fmaf(s_hi, gsum(3), acc[r][3]);
          }
        }
      }
    }
    load(t_c, i + P);
    xp += x_kt;
    if (++kt == KT) {  // the super-slot's end
      kt = 0;
      xp = x_lane;
      flush();
      ++cj;
    }
  };
  for (int i0 = a; i0 < b; i0 += P) {
    static_for<P>([&](auto t_c) {
      const int i = i0 + decltype(t_c)::value;
      if (i < b) step(t_c, i);
    });
    // This round refilled positions up to i0 + 2P - 1: the last load is issued once that
    // reaches b - 1 (the trigger counts once per block).
    if (pl.trigger == kInt4TriggerLate && i0 + 2 * P >= b) pdl_trigger();
  }
  if (KT > 0 && b > a && b % KT != 0) flush();  // the part ends inside a row tile
  __syncthreads();

  gemv_epilogue(p, pl, smem, tid, nw, m, glu, u0, nu, ns);
}

// Every instantiation: ring sizes 8 and 16 (8 only for group 32, whose two scale words per
// tile would spill at 16) x tiles per group (0: group 32, 1, 2, 4) x the rounded-weight variant,
// each with one row tile a position, and with four (rows 4) for ring 8 up to group 128; and
// the raw-x form (m = 1) of ring 8, unrounded, one row tile a position.
template <typename F>
void for_each_kernel(int unroll, int tpg, bool round, int rows, bool raw_x, F&& f) {
  auto by_round = [&](auto u_c, auto tpg_c) {
    constexpr int U = decltype(u_c)::value, TPG = decltype(tpg_c)::value;
    if constexpr (U == 8) {
      if (raw_x && !round && rows == 1) return f(int4_gemv_reg_kernel<U, TPG, false, 1, true>);
    }
    if constexpr (U == 8 && TPG <= 2) {
      if (rows == 4)
        return round ? f(int4_gemv_reg_kernel<U, TPG, true, 4>)
                     : f(int4_gemv_reg_kernel<U, TPG, false, 4>);
    }
    round ? f(int4_gemv_reg_kernel<U, TPG, true, 1>) : f(int4_gemv_reg_kernel<U, TPG, false, 1>);
  };
  auto by_tpg = [&](auto u_c) {
    switch (tpg) {
      case 1:
        by_round(u_c, std::integral_constant<int, 1>{});
        break;
      case 2:
        by_round(u_c, std::integral_constant<int, 2>{});
        break;
      default:
        by_round(u_c, std::integral_constant<int, 4>{});
        break;
    }
  };
  if (tpg == 0)
    by_round(std::integral_constant<int, 8>{}, std::integral_constant<int, 0>{});
  else if (unroll == 8)
    by_tpg(std::integral_constant<int, 8>{});
  else
    by_tpg(std::integral_constant<int, 16>{});
}

}  // namespace

void init_int4_gemv_reg_kernels() {
  for (int u : {8, 16})
    for (int tpg : {0, 1, 2, 4})
      for (bool round : {false, true})
        for (int rows : {1, 4})
          for (bool raw_x : {false, true})
            for_each_kernel(u, tpg, round, rows, raw_x, [](auto kernel) {
              CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              kSmemMax));
            });
}

void launch_int4_gemv_reg(const Int4LinearParams& p, cudaStream_t stream,
                          const Int4RegExperts* experts) {
  RegLaunch r;
  CHECK_MSG(choose_reg(p, experts, &r),
            "int4 register gemv: m {} k {} group {} warps {} unroll {} trigger {} does not fit",
            p.m, p.k, p.group, p.gemv_warps, p.gemv_unroll, p.gemv_trigger);
  static PerDeviceOnce limits;  // the kernels' shared-memory limits
  limits.run(init_int4_gemv_reg_kernels);
  const dim3 grid(unsigned(r.grid)), block(unsigned(r.warps * 32));
  const int tpg = p.group == 32 ? 0 : p.group / kInt4TileK;
  for_each_kernel(r.unroll, tpg, r.round, r.rows, r.raw_x, [&](auto kernel) {
    launch_pdl(kernel, grid, block, r.smem, Launch{stream}, p, r.pl);
  });
  CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
