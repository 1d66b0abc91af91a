// The INT4 experts' decode step by ids as one launch (moe_experts_int4_reg.h): gate_up, a
// grid-wide handoff, then down, for the fewest tokens (T · k <= moe_int4_fused_max_assignments).
//
// ## Why (measured 2026-12-03, H200, one Kimi-K2.5 rank of tp 8 at batch 1)
// By ids the experts are two launches, the split gate_up (moe_experts_int4_gate_up.cu) and the
// flat down (moe_experts_int4_flat.cu): 16.0 us back to back for 24.7 MB, 36% of copy bandwidth
// (ncu, eager: 14.4 + 8.9 us). Down's experts are known as soon as the ids are, yet its weights
// (a third of the bytes) stream only as far as its CTAs find room beside gate_up's, and each
// launch pays its own start and end on the batch-1 critical path.
//
// ## This kernel
// - One CTA of 8 warps an SM (up to 255 registers a thread). Phase 1 is the split gate_up with
//   one CTA a tile pair: tile pairs u = blockIdx.x, + gridDim.x, ...; each warp its contiguous
//   eighth of the pair's k tiles through a ring of 4 (a gate and an up piece each); x of the
//   pair's token staged in shared memory in fragment order; the warps' sums added in warp order;
//   gate and up rounded to bf16, silu(gate) · up stored to act. The same arithmetic in the same
//   order as the split kernel with cluster 1 and 8 warps: the same bits.
// - Down's weights: each warp's share of the flat down stream (the flat kernel's split of all
//   assignments' row tiles over the grid's warps, the same arithmetic) goes into a register ring
//   of 16 pieces (8 with gate_up's ring of 8) right after the first tile pair's loads, before
//   phase 1 runs: at one token (8 assignments, ~14 pieces a warp) every byte of down is in
//   flight while gate_up streams.
// - Handoff: a CTA whose act rows are stored counts itself in on the backend's 64-bit counter
//   (never reset: launch n's CTAs take tickets n · grid .. n · grid + grid - 1 and wait until it
//   reaches (n + 1) · grid), then its threads wait for every CTA. No CTA waits on work that
//   cannot run: the grid is one CTA an SM and every CTA finishes phase 1 before it waits (other
//   kernels beside it, the shared experts' side branch, only delay CTAs, they never depend on
//   this one). The successor is let launch (pdl_trigger) only after the wait, when every CTA of
//   the grid has been resident, so its CTAs cannot take a waiting CTA's place.
// - Phase 2: act rows read through L2 (other CTAs wrote them in this launch), the ring's pieces
//   multiplied and refilled for the rest of the share (two tokens: ~27 pieces a warp), each row
//   tile stored as bf16(0 + (acc + acc1)), as the flat kernel does.
#include "backend/cuda/linear_int4.cuh"
#include "backend/cuda/moe_experts_int4_reg.h"

namespace strata::cuda {
namespace {

using namespace int4;

constexpr int kWarps = 8;
// The register rings (Int4FusedExpertsParams::ring): gate_up's k tiles in flight a warp (a gate
// and an up piece each) and down's pieces a lane, 4 + 16 (default) or 8 + 8: ~230 registers.
constexpr int kDownRingFor(int gu_ring) { return gu_ring == 4 ? 16 : 8; }
constexpr int kMaxXBytes = 48 * 1024;  // x of one token in fragment order: hidden / 64 · 128

__device__ __forceinline__ unsigned long long ld_acquire_u64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// KT: down's k tiles a row tile (inter / 64: 1, 2 or 4); G32: group 32 (two scale words a
// tile), else one word a tile (group >= 64); kGuRing: gate_up's ring (4 or 8).
template <int KT, bool G32, int kGuRing>
__global__ void __launch_bounds__(kWarps * 32, 1)
    int4_fused_experts_kernel(Int4FusedExpertsParams p) {
  constexpr int kDownRing = kDownRingFor(kGuRing);
  static_assert(kDownRing % KT == 0, "a ring round holds whole row tiles");
  __shared__ float red[kWarps][32];  // a warp's sums: gate rows 0..15, then up rows 0..15
  extern __shared__ __align__(128) char xs_raw[];  // x of one token, fragment order
  const int tid = int(threadIdx.x), lane = tid % 32, g = lane / 4, c = lane % 4;
  const int warp = __shfl_sync(~0u, tid / 32, 0);
  const int inter_tiles = int(p.inter / kInt4TileRows), KG = int(p.hidden / kInt4TileK);
  const int units = p.assignments * inter_tiles;
  const int k0 = warp * KG / kWarps, k1 = (warp + 1) * KG / kWarps;  // the warp's gate_up k tiles
  const int gshift = __ffs(p.group) - 1;
  auto scale_at = [&](const uint32_t* s, int64_t tile, int half) {  // a tile's k half's word
    if constexpr (G32) return __ldg(s + tile * 16 + half * 8);
    return __ldg(s + ((tile * kInt4TileK) >> gshift) * 8);
  };

  // ---- down's share: row tiles [du0, du1) of all assignments', positions [da, db) ----
  const int64_t warps = int64_t(gridDim.x) * kWarps, gw = int64_t(blockIdx.x) * kWarps + warp;
  const int64_t total = int64_t(p.assignments) * p.down_row_tiles;
  const int64_t du0 = gw * total / warps, du1 = (gw + 1) * total / warps;
  const int64_t da = du0 * KT, db = du1 * KT, per_item = int64_t(p.down_row_tiles) * KT;
  const uint4* dw = static_cast<const uint4*>(p.down_packed) + lane;
  const uint32_t* ds = reinterpret_cast<const uint32_t*>(p.down_scale) + g;
  auto expert_of = [&](int item) {  // an id out of range stores nothing (enter_item): clamped
    return min(max(__ldcg(p.ids + item), 0), p.num_experts - 1);  // so as never to read past
  };
  uint4 ring[kDownRing];
  uint32_t dsc[kDownRing * 2];
  int l_item = 0;
  int64_t l_end = 0, l_delta = 0;
  auto load_down = [&](auto t_c, int64_t i) {
    constexpr int t = decltype(t_c)::value;
    if (i < db) {
      if (i >= l_end) {  // warp-uniform: the next item
        ++l_item;
        l_end += per_item;
        l_delta = int64_t(expert_of(l_item)) * p.down_expert_tiles - l_item * per_item;
      }
      const int64_t gt = i + l_delta;
      ring[t] = __ldcs(dw + gt * 32);
      dsc[2 * t] = scale_at(ds, gt, 0);
      if constexpr (G32) dsc[2 * t + 1] = scale_at(ds, gt, 1);
    }
  };
  bool down_loaded = false;
  auto prefill_down = [&] {
    if (da < db) {
      l_item = int(da / per_item);
      l_end = (l_item + 1) * per_item;
      l_delta = int64_t(expert_of(l_item)) * p.down_expert_tiles - l_item * per_item;
      static_for<kDownRing>([&](auto t_c) { load_down(t_c, da + decltype(t_c)::value); });
    }
    down_loaded = true;
  };

  pdl_wait();  // ids (route) and x are complete from here

  // ---- phase 1: gate_up, one tile pair at a time ----
  const uint4* gw_src = static_cast<const uint4*>(p.gu_packed) + lane;
  const uint32_t* gs_src = reinterpret_cast<const uint32_t*>(p.gu_scale) + g;
  uint32_t* xs = reinterpret_cast<uint32_t*>(xs_raw);
  const uint32_t x_lane = smem_u32(xs_raw) + c * 16;
  int staged = -1;  // the token whose x is in shared memory
  for (int u = int(blockIdx.x); u < units; u += int(gridDim.x)) {
    const int a = u / inter_tiles, r = u % inter_tiles, token = a / p.x_div;
    const int e = __ldcg(p.ids + a);
    const bool valid = e >= 0 && e < p.num_experts;  // block-uniform
    const int64_t gbase = int64_t(valid ? e : 0) * p.gu_expert_tiles + int64_t(r) * KG;
    const int64_t ubase = gbase + int64_t(inter_tiles) * KG;
    uint4 rg[kGuRing], ru[kGuRing];
    uint32_t sg[2 * kGuRing], su[2 * kGuRing];
    auto load_gu = [&](auto t_c, int kt) {
      constexpr int t = decltype(t_c)::value;
      if (valid && kt < k1) {
        rg[t] = __ldcs(gw_src + (gbase + kt) * 32);
        ru[t] = __ldcs(gw_src + (ubase + kt) * 32);
        sg[2 * t] = scale_at(gs_src, gbase + kt, 0);
        su[2 * t] = scale_at(gs_src, ubase + kt, 0);
        if constexpr (G32) {
          sg[2 * t + 1] = scale_at(gs_src, gbase + kt, 1);
          su[2 * t + 1] = scale_at(gs_src, ubase + kt, 1);
        }
      }
    };
    static_for<kGuRing>([&](auto t_c) { load_gu(t_c, k0 + decltype(t_c)::value); });
    if (!down_loaded) prefill_down();
    if (token != staged) {  // x into shared memory (the split kernel's fragment order)
      __syncthreads();      // the previous tile pair's reads are done
      const uint4* xsrc = reinterpret_cast<const uint4*>(p.x + int64_t(token) * p.hidden);
      for (int q = tid; q < KG * 8; q += kWarps * 32) {
        const uint4 v = __ldg(xsrc + q);
        const int k0e = q * 8, kt = k0e / kInt4TileK, col = k0e % kInt4TileK;
        const int s = col / 16, bb = (col % 16) / 8;
        uint32_t* dst = xs + kt * 32 + (s / 2) * 16 + 2 * (s % 2) + bb;
        dst[0] = v.x;
        dst[4] = v.y;
        dst[8] = v.z;
        dst[12] = v.w;
      }
      staged = token;
      __syncthreads();
    }
    float ag[4] = {0, 0, 0, 0}, ag1[4] = {0, 0, 0, 0}, au[4] = {0, 0, 0, 0}, au1[4] = {0, 0, 0, 0};
    if (valid) {
      for (int kt0 = k0; kt0 < k1; kt0 += kGuRing)
        static_for<kGuRing>([&](auto t_c) {
          constexpr int t = decltype(t_c)::value;
          const int kt = kt0 + t;
          if (kt < k1) {
            const uint32_t xp = x_lane + uint32_t(kt) * 128;
            const uint4 xa = lds128(xp), xb = lds128(xp + 64);
            const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
            mma_tile_round(rg[t], sg[2 * t], sg[G32 ? 2 * t + 1 : 2 * t], xw, ag, ag1);
            mma_tile_round(ru[t], su[2 * t], su[G32 ? 2 * t + 1 : 2 * t], xw, au, au1);
            load_gu(t_c, kt + kGuRing);
          }
        });
    }
    if (c == 0) {  // column 0 (the one token) of rows g and g + 8
      red[warp][g] = ag[0] + ag1[0];
      red[warp][g + 8] = ag[2] + ag1[2];
      red[warp][16 + g] = au[0] + au1[0];
      red[warp][24 + g] = au[2] + au1[2];
    }
    __syncthreads();
    if (valid && tid < kInt4TileRows) {  // the unfused linear's roundings
      float gate = 0.0f, up = 0.0f;
      for (int w = 0; w < kWarps; ++w) gate += red[w][tid];
      for (int w = 0; w < kWarps; ++w) up += red[w][16 + tid];
      const float gv = bf16_to_float(float_to_bf16(gate)), uv = bf16_to_float(float_to_bf16(up));
      p.act[int64_t(a) * p.inter + int64_t(r) * kInt4TileRows + tid] =
          float_to_bf16(gv / (1.0f + __expf(-gv)) * uv);
    }
    __syncthreads();  // red is free for the next tile pair
  }
  if (!down_loaded) prefill_down();

  // ---- the handoff: every CTA's act rows stored and visible ----
  if (tid == 0) {
    __threadfence();
    const unsigned long long ticket = atomicAdd(p.sync, 1ull);
    const unsigned long long target = (ticket / gridDim.x + 1) * gridDim.x;
    // A correct handoff waits microseconds; a wait past ~1 s means a CTA can never arrive (the
    // grid not resident at once): fail the launch loudly rather than hang the stream.
    for (uint32_t spins = 0; ld_acquire_u64(p.sync) < target; ++spins) {
      if (spins == (1u << 25)) __trap();
      __nanosleep(40);
    }
    __threadfence();
  }
  __syncthreads();
  pdl_trigger();  // every CTA has been resident: the successor cannot take a waiting one's place

  // ---- phase 2: down, the flat kernel's stream over the ring ----
  if (da >= db) return;
  uint32_t xf[KT * 8];
  int c_item = -1, m = 0, rt = 0;
  int64_t c_end = 0;
  bf16_bits* out = p.out;
  auto enter_item = [&](int64_t i) {  // warp-uniform
    c_item = int(i / per_item);
    c_end = (c_item + 1) * per_item;
    rt = int((i - c_item * per_item) / KT);
    const int e = __ldcg(p.ids + c_item);
    m = e >= 0 && e < p.num_experts ? 1 : 0;
    out = p.out + int64_t(c_item) * p.hidden;
    const uint32_t* xr = reinterpret_cast<const uint32_t*>(p.act + int64_t(c_item) * p.inter);
#pragma unroll
    for (int s = 0; s < 4 * KT; ++s) {  // lane (g, c): k 16s + 2c (b0) and + 8 (b1)
      xf[2 * s] = __ldcg(xr + 8 * s + c);
      xf[2 * s + 1] = __ldcg(xr + 8 * s + c + 4);
    }
  };
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  auto step = [&](auto t_c, int64_t i) {
    constexpr int t = decltype(t_c)::value, kt = t % KT;
    if (kt == 0 && i >= c_end) enter_item(i);
    mma_tile_round(ring[t], dsc[2 * t], dsc[G32 ? 2 * t + 1 : 2 * t], xf + kt * 8, acc, acc1);
    load_down(t_c, i + kDownRing);
    if (kt == KT - 1) {  // the row tile's end: rows g and g + 8 of the one token (c == 0)
      const int64_t row = int64_t(rt) * kInt4TileRows + g;
      if (c == 0 && m > 0) {
        if (row < p.hidden) out[row] = float_to_bf16(0.0f + (acc[0] + acc1[0]));
        if (row + 8 < p.hidden) out[row + 8] = float_to_bf16(0.0f + (acc[2] + acc1[2]));
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[q] = acc1[q] = 0.0f;
      ++rt;
    }
  };
  for (int64_t i0 = da; i0 < db; i0 += kDownRing)
    static_for<kDownRing>([&](auto t_c) {
      const int64_t i = i0 + decltype(t_c)::value;
      if (i < db) step(t_c, i);
    });
}

template <typename F>
bool with_kernel(int kt, int group, int ring, F&& f) {
  auto by_group = [&](auto kt_c) {
    constexpr int KT = decltype(kt_c)::value;
    if (ring == 8)
      group == 32 ? f(int4_fused_experts_kernel<KT, true, 8>)
                  : f(int4_fused_experts_kernel<KT, false, 8>);
    else
      group == 32 ? f(int4_fused_experts_kernel<KT, true, 4>)
                  : f(int4_fused_experts_kernel<KT, false, 4>);
    return true;
  };
  switch (kt) {
    case 1:
      return by_group(std::integral_constant<int, 1>{});
    case 2:
      return by_group(std::integral_constant<int, 2>{});
    case 4:
      return by_group(std::integral_constant<int, 4>{});
    default:
      return false;
  }
}

}  // namespace

bool int4_fused_experts_fits(int64_t hidden, int64_t inter, int group) {
  const int64_t kt = inter / kInt4TileK;
  return hidden > 0 && hidden % kInt4TileK == 0 && hidden / kInt4TileK * 128 <= kMaxXBytes &&
         inter % kInt4TileK == 0 && (kt == 1 || kt == 2 || kt == 4) &&
         (group == 32 || group == 64 || group == 128 || group == 256) && hidden % group == 0 &&
         inter % group == 0;
}

bool launch_int4_fused_experts(const Int4FusedExpertsParams& p, cudaStream_t stream) {
  if (!int4_fused_experts_fits(p.hidden, p.inter, p.group) || p.assignments < 1 || p.x_div < 1 ||
      p.num_experts < 1 || p.sync == nullptr || p.down_row_tiles != int4_row_tiles(p.hidden) ||
      (p.ring != 0 && p.ring != 4 && p.ring != 8))
    return false;
  const size_t smem = size_t(p.hidden / kInt4TileK * 128);
  const bool ok = with_kernel(int(p.inter / kInt4TileK), p.group, p.ring, [&](auto kernel) {
    // One CTA an SM: the handoff needs every CTA resident at once (see the design note).
    launch_pdl(kernel, dim3(unsigned(num_sms())), dim3(kWarps * 32), smem, Launch{stream}, p);
  });
  CUDA_LAUNCH_CHECK();
  return ok;
}

}  // namespace strata::cuda
