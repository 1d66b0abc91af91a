// The planned INT4 experts' down projection as one flat stream (moe_experts_int4_reg.h): every
// warp of the grid takes an equal, contiguous share of all the plan's row tiles, across expert
// boundaries, from the plan's tile count on the device.
//
// ## Why (measured 2026-12-03, H200, one Kimi-K2.5 rank of tp 8 at batch 128, ncu)
// The register GEMV's planned mode (linear_int4_reg.cu) gives each plan tile (an expert's up to
// 4 rows) its own blocks: the down projection (k = 256, 448 row tiles an expert) ran 2,560
// blocks of up to 128 row tiles (~230 KB each), 185 us a layer for ~420 MB: 54% of copy
// bandwidth against gate_up's 84% (234 us, 840 MB, blocks of ~900 KB). A block that short pays
// its start (expert lookup, ring fill, x copy, barrier) and its end (partial sums through shared
// memory, barrier, epilogue) on a fifth of its life, and the grid is sized for the most tiles a
// step can have, so blocks past the plan's tiles queue behind the real ones.
//
// ## This kernel (k = 64·KT with KT <= 4: an expert slice of up to 256 inputs, tp-sharded MoE)
// - Grid: two blocks of 8 warps per SM. Warp w of W takes row tiles [w·R/W, (w+1)·R/W) of the
//   R = items · row_tiles of the step. Items: the plan's tiles (their count read before the PDL
//   wait: the plan is complete once gate_up has triggered, as the register GEMV's ids_early),
//   or by ids the assignments themselves (one row each, x and y rows in assignment order: the
//   few-token steps). No warp waits for another: no shared memory, no barrier.
// - A row tile is KT consecutive 512-byte tiles of one expert; a warp's stream runs through its
//   row tiles in order, changing expert (and x, and output rows) at item boundaries. Each lane
//   keeps a ring of U = 8 16-byte pieces in flight (with their scale words), refilled as soon
//   as a piece is multiplied, from before the PDL wait (weights are never written by a kernel).
// - x: the tile's up to 8 act rows (the plan's permuted rows, written by gate_up), as mma
//   B fragments in registers (KT · 8 words a lane), loaded at each item change.
// - Per 512-byte tile: dequantized as every MoE kernel and the CPU twin ((nibble − 8) · scale
//   rounded to bf16), 4 mma.m16n8k16 into two accumulators (even / odd k steps), and at the row
//   tile's end bf16(0 + (acc + acc1)) stored straight to y: the register GEMV's arithmetic for a
//   row tile held by one warp (its epilogue sums a row tile's warps from 0 in warp order).
#include "backend/cuda/linear_int4.cuh"
#include "backend/cuda/moe_experts_int4_reg.h"

namespace strata::cuda {
namespace {

using namespace int4;

constexpr int kWarps = 8;
constexpr int kRing = 8;  // 16-byte pieces in flight per lane

// TPG: k tiles per scale group (1, 2 or 4 for groups 64, 128, 256), 0 for group 32.
template <int KT, int TPG>
__global__ void __launch_bounds__(kWarps * 32, 2) int4_flat_down_kernel(Int4FlatDownParams p) {
  static_assert(kRing % KT == 0, "a ring round holds whole row tiles");
  const int lane = int(threadIdx.x) % 32, g = lane / 4, c = lane % 4;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  const int64_t gw = int64_t(blockIdx.x) * kWarps + __shfl_sync(~0u, int(threadIdx.x) / 32, 0);
  const int items = p.ids ? p.max_tiles : min(__ldcg(p.counts + 1), p.max_tiles);
  const int64_t total = int64_t(items) * p.row_tiles;
  // The warp's row tiles [u0, u1) and positions (512-byte tiles) [a, b) of the flat stream.
  const int64_t u0 = gw * total / warps, u1 = (gw + 1) * total / warps;
  pdl_trigger();  // the combine waits for this grid's completion anyway
  if (u0 >= u1) return;
  // Positions and tile indices are 32-bit (launch_int4_flat_down: int4_tile_index_fits for the
  // experts, and the stream's positions under 2^31): addresses are one IMAD.WIDE.U32 each.
  const int a = int(u0 * KT), b = int(u1 * KT), per_item = p.row_tiles * KT;
  auto raw_expert = [&](int item) { return __ldcg(p.ids ? p.ids + item : p.tiles + 2 * item); };
  auto expert_of = [&](int item) {  // an id out of range stores nothing (enter_item): clamped
    return min(max(raw_expert(item), 0), p.num_experts - 1);  // only so as never to read past
  };

  // ---- the loads: position i into ring slot t; gt = i + delta within the current item ----
  const uint4* wsrc = static_cast<const uint4*>(p.packed) + lane;
  const uint32_t* ssrc = reinterpret_cast<const uint32_t*>(p.scale) + g;
  constexpr int kScales = TPG == 0 ? 2 : 1;
  uint4 ring[kRing];
  uint32_t sc[kRing * kScales];
  const uint32_t expert_tiles = uint32_t(p.expert_tiles);
  int l_item = a / per_item;
  int l_end = (l_item + 1) * per_item;
  // gt - i within the current item (wraps modulo 2^32; the sum is the tile's index)
  uint32_t l_delta = uint32_t(expert_of(l_item)) * expert_tiles - uint32_t(l_item * per_item);
  auto load = [&](auto t_c, int i) {
    constexpr int t = decltype(t_c)::value;
    if (i < b) {
      if (i >= l_end) {  // warp-uniform: the next item
        ++l_item;
        l_end += per_item;
        l_delta = uint32_t(expert_of(l_item)) * expert_tiles - uint32_t(l_item * per_item);
      }
      const uint32_t gt = uint32_t(i) + l_delta;
      ring[t] = __ldcs(wsrc + gt * 32u);
      load_tile_scales<TPG>(ssrc, gt, sc + kScales * t);
    }
  };
  static_for<kRing>([&](auto t_c) { load(t_c, a + decltype(t_c)::value); });
  pdl_wait();  // act (gate_up's output) is complete and visible from here

  // ---- the multiplies: item state (x fragments, output rows) changes at item boundaries ----
  uint32_t xf[KT * 8];
  int c_item = -1, m = 0, rt = 0, c_end = 0;
  bf16_bits* out = p.out;
  auto enter_item = [&](int i) {  // warp-uniform
    c_item = i / per_item;
    c_end = (c_item + 1) * per_item;
    rt = (i - c_item * per_item) / KT;
    int r0;
    if (p.ids) {  // by ids: one row, the assignment's own
      const int e = raw_expert(c_item);
      r0 = c_item;
      m = e >= 0 && e < p.num_experts ? 1 : 0;
    } else {
      const int e = expert_of(c_item);
      r0 = __ldcg(p.tiles + 2 * c_item + 1);
      m = max(0, min(p.tile_rows, __ldcg(p.offsets + e + 1) - r0));
    }
    out = p.out + int64_t(r0) * p.n;
    // Lane (g, c): token g (token 0 for g >= m: its columns are never stored), k 16s + 2c
    // (b0) and + 8 (b1) of each k step s.
    const uint32_t* xr =
        reinterpret_cast<const uint32_t*>(p.x + int64_t(r0 + (g < m ? g : 0)) * p.k);
#pragma unroll
    for (int s = 0; s < 4 * KT; ++s) {
      xf[2 * s] = __ldg(xr + 8 * s + c);
      xf[2 * s + 1] = __ldg(xr + 8 * s + c + 4);
    }
  };
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  auto step = [&](auto t_c, int i) {
    constexpr int t = decltype(t_c)::value, kt = t % KT;
    if (kt == 0 && i >= c_end) enter_item(i);
    mma_tile_round(ring[t], sc[TPG == 0 ? 2 * t : t], sc[TPG == 0 ? 2 * t + 1 : t], xf + kt * 8,
                   acc, acc1);
    load(t_c, i + kRing);
    if (kt == KT - 1) {  // the row tile's end: rows g and g + 8, tokens 2c and 2c + 1
      const int64_t row = int64_t(rt) * kInt4TileRows + g;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (2 * c + e < m) {
          bf16_bits* o = out + int64_t(2 * c + e) * p.n;
          if (row < p.n) o[row] = float_to_bf16(0.0f + (acc[e] + acc1[e]));
          if (row + 8 < p.n) o[row + 8] = float_to_bf16(0.0f + (acc[2 + e] + acc1[2 + e]));
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[r] = acc1[r] = 0.0f;
      ++rt;
    }
  };
  for (int i0 = a; i0 < b; i0 += kRing)
    static_for<kRing>([&](auto t_c) {
      const int i = i0 + decltype(t_c)::value;
      if (i < b) step(t_c, i);
    });
}

}  // namespace

bool int4_flat_down_fits(int64_t k, int group, int tile_rows) {
  const int64_t kt = k / kInt4TileK;
  return k % kInt4TileK == 0 && (kt == 1 || kt == 2 || kt == 4) && tile_rows >= 1 &&
         tile_rows <= 8 && (group == 32 || group == 64 || group == 128 || group == 256) &&
         k % group == 0 && (group == 32 || group / kInt4TileK <= kt);
}

bool launch_int4_flat_down(const Int4FlatDownParams& p, cudaStream_t stream) {
  if (!int4_flat_down_fits(p.k, p.group, p.tile_rows) || p.max_tiles < 1 || p.ctas_per_sm < 0 ||
      p.ctas_per_sm > 2 || !int4_tile_index_fits(p.expert_tiles, p.num_experts) ||
      int64_t(p.max_tiles) * p.row_tiles * (p.k / kInt4TileK) + kRing >= (int64_t(1) << 31))
    return false;
  const int per_sm = p.ctas_per_sm > 0 ? p.ctas_per_sm : 2;
  const dim3 grid(unsigned(per_sm * num_sms())), block(unsigned(kWarps * 32));
  const bool ok = with_row_tile_kernel(int(p.k / kInt4TileK), p.group, [&](auto kt, auto tpg) {
    launch_pdl(int4_flat_down_kernel<decltype(kt)::value, decltype(tpg)::value>, grid, block, 0,
               Launch{stream}, p);
  });
  CUDA_LAUNCH_CHECK();
  return ok;
}

}  // namespace strata::cuda
