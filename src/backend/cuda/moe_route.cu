// MoE routing kernels: the router's float32 GEMV (decode) and the expert choice. See
// moe_route.h for the semantics; the CPU twin is backend/cpu/moe.cc.
//
// Router GEMV: 16 gate rows per tile, mma.m16n8k16 with the gate rows as A and up to 4 n-tiles
// of 8 tokens as B, fragments straight from 16-byte loads of the row-major weight through the
// k permutation of linear_mma.cu (a dot product does not change when both operands' k are
// permuted alike): lane (g, c) loads 8 consecutive bf16 of rows g and g + 8 and of token g at
// offset 8c of a 32-column chunk; mma #1 takes their pairs 0-1, mma #2 pairs 2-3. A CTA (8
// warps, interleaved chunks, 4 chunks in flight per warp) covers 1 / splits of H for one row
// tile; its warps' sums meet in shared memory in warp order, the CTAs' sums in scratch, added in
// split order by whichever CTA of the tile finishes last (a counter per tile, reset by that CTA).
// So the logits do not depend on scheduling.
//
// Route: one warp per token, its scores and choice values in registers (lane l: experts l + 32q;
// all loads issued at once: the old loop of dependent loads cost ~10 us at E = 256..384) and
// in shared memory for the group stage. Top-k is k rounds of a warp arg-max under (value desc,
// id asc), the CPU twin's partial_sort order. (The two as one launch, the router's last CTAs
// routing, was measured slower than two launches and left the product: bench/results/
// 2026-12-03-session15.md and -session16.md.)
#include <algorithm>
#include <climits>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/moe_route.h"

namespace strata::cuda {
namespace {

__device__ __forceinline__ void mma16816(float* d, uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

constexpr int kRouterWarps = 8;
constexpr int kRouterUnroll = 4;  // 32-column chunks in flight per warp

// One CTA's share of the router GEMV, its PDL entry included: at the start, or with p.preload
// after each warp has issued its first batch of weight loads (weights are never written by a
// kernel, so they may stream while the predecessor finishes; x, the scratch and the counters are
// touched only after the entry).
template <int NT>
__device__ __forceinline__ void router_tile(const MoeRouterParams& p) {
  bool entered = !p.preload;
  if (entered) pdl_enter(p.pdl_early);
  __shared__ float red[kRouterWarps][NT * 4][32];
  __shared__ int is_last;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int g = lane / 4, c = lane % 4;
  const int64_t rt = blockIdx.y, split = blockIdx.x, splits = gridDim.x;
  const int64_t chunks = p.hidden / 32, per = (chunks + splits - 1) / splits;
  const int64_t ch0 = split * per, ch1 = min(chunks, ch0 + per);
  const int64_t row_a = rt * 16 + g, row_b = row_a + 8;
  const bf16_bits* wa = row_a < p.experts ? p.w + row_a * p.hidden + 8 * c : nullptr;
  const bf16_bits* wb = row_b < p.experts ? p.w + row_b * p.hidden + 8 * c : nullptr;
  const bf16_bits* xr[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j)
    xr[j] = 8 * j + g < p.tokens ? p.x + (8 * j + g) * p.hidden + 8 * c : nullptr;
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
  for (int64_t ch = ch0 + warp; ch < ch1; ch += kRouterWarps * kRouterUnroll) {
    uint4 va[kRouterUnroll], vb[kRouterUnroll];
#pragma unroll
    for (int u = 0; u < kRouterUnroll; ++u) {
      const int64_t col = (ch + kRouterWarps * u) * 32;
      const bool in = ch + kRouterWarps * u < ch1;
      va[u] = in && wa ? __ldcs(reinterpret_cast<const uint4*>(wa + col)) : make_uint4(0, 0, 0, 0);
      vb[u] = in && wb ? __ldcs(reinterpret_cast<const uint4*>(wb + col)) : make_uint4(0, 0, 0, 0);
    }
    if (!entered) {
      pdl_enter(p.pdl_early);
      entered = true;
    }
#pragma unroll
    for (int u = 0; u < kRouterUnroll; ++u) {
      const int64_t col = (ch + kRouterWarps * u) * 32;
      if (ch + kRouterWarps * u >= ch1) break;  // uniform over the warp
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint4 xv =
            xr[j] ? __ldg(reinterpret_cast<const uint4*>(xr[j] + col)) : make_uint4(0, 0, 0, 0);
        mma16816(acc[j], va[u].x, vb[u].x, va[u].y, vb[u].y, xv.x, xv.y);
        mma16816(acc[j], va[u].z, vb[u].z, va[u].w, vb[u].w, xv.z, xv.w);
      }
    }
  }
  if (!entered) pdl_enter(p.pdl_early);  // a warp without chunks
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][j * 4 + i][lane] = acc[j][i];
  __syncthreads();
  // Warp 0 adds the warps' sums in order; (j, i) is (row g + 8·(i / 2), token 8j + 2c + i % 2).
  if (warp == 0) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float v = red[0][j * 4 + i][lane];
        for (int w = 1; w < kRouterWarps; ++w) v += red[w][j * 4 + i][lane];
        const int64_t row = rt * 16 + g + 8 * (i / 2), tok = 8 * j + 2 * c + i % 2;
        if (row >= p.experts || tok >= p.tokens) continue;
        if (splits == 1)
          p.out[tok * p.experts + row] = v;
        else
          p.partials[(split * p.tokens + tok) * p.experts + row] = v;
      }
  }
  if (splits == 1) return;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(p.counters + rt, 1) == splits - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  // The last CTA of this row tile: the splits' sums in split order.
  for (int i = int(threadIdx.x); i < 16 * int(p.tokens); i += kRouterWarps * 32) {
    const int64_t row = rt * 16 + i % 16, tok = i / 16;
    if (row >= p.experts) continue;
    float v = 0.0f;
    for (int64_t s = 0; s < splits; ++s)
      v += __ldcg(p.partials + (s * p.tokens + tok) * p.experts + row);
    p.out[tok * p.experts + row] = v;
  }
  if (threadIdx.x == 0) p.counters[rt] = 0;
}

template <int NT>
__global__ void __launch_bounds__(kRouterWarps * 32) moe_router_kernel(MoeRouterParams p) {
  router_tile<NT>(p);
}

// ---- route ----
constexpr int kRouteWarps = 4;

// (v1, i1) ranks before (v2, i2): larger value, then lower id.
__device__ __forceinline__ bool better(float v1, int i1, float v2, int i2) {
  return v1 > v2 || (v1 == v2 && i1 < i2);
}
// NaN ranks as -inf here, so a row of NaN logits still picks valid (the lowest) ids.
__device__ __forceinline__ float rank_value(float v) { return v != v ? -INFINITY : v; }
// The warp's best (value, id) pair; every lane returns it.
__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

// Lane l owns experts l + 32·q, q < Q = ceil(E / 32) <= QMAX: their logits, scores and choice
// values live in registers (loops over q are unrolled to QMAX with a q < Q guard, so every
// load of a token's logits and bias is issued at once); scores also go to shared memory for the
// group stage and the weights, which index them by expert.
// Token t's route by one warp (every lane calls it; warp-synchronous, no CTA barrier), with
// 2·E floats of shared memory of its own at `score_s`.
// The lane's experts' bias (0 without one): a weight, never written by a kernel, so the route
// loads it before its PDL wait (at batch 1 it is the only load that may miss L2).
template <int QMAX>
__device__ __forceinline__ void load_route_bias(const MoeRouteParams& p, int lane,
                                                float (&bias)[QMAX]) {
  const int experts = p.num_experts, nq = (experts + 31) / 32;
#pragma unroll
  for (int q = 0; q < QMAX; ++q) {
    const int e = lane + 32 * q;
    bias[q] = q < nq && e < experts && p.bias != nullptr ? __ldg(p.bias + e) : 0.0f;
  }
}

template <int QMAX>
__device__ __forceinline__ void route_token(const MoeRouteParams& p, int64_t t, int lane,
                                            const float (&bias)[QMAX], float* score_s) {
  const int experts = p.num_experts, nq = (experts + 31) / 32;
  float* choice_s = score_s + experts;
  const float* logits = p.logits + t * experts;

  float sc[QMAX], ch[QMAX];
#pragma unroll
  for (int q = 0; q < QMAX; ++q) {
    const int e = lane + 32 * q;
    sc[q] = q < nq && e < experts ? __ldg(logits + e) : 0.0f;
    ch[q] = bias[q];
  }
  if (p.scoring == kMoeSigmoid) {
#pragma unroll
    for (int q = 0; q < QMAX; ++q) sc[q] = 1.0f / (1.0f + expf(-sc[q]));
  } else {
    float mx = -INFINITY;
#pragma unroll
    for (int q = 0; q < QMAX; ++q)
      if (q < nq && lane + 32 * q < experts) mx = fmaxf(mx, sc[q]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0.0;
#pragma unroll
    for (int q = 0; q < QMAX; ++q)
      if (q < nq && lane + 32 * q < experts) {
        sc[q] = expf(sc[q] - mx);
        sum += double(sc[q]);
      }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
    for (int q = 0; q < QMAX; ++q) sc[q] = float(double(sc[q]) / sum);
  }
  // choice = score + bias (bias 0 without one); past E: -inf, which never wins over an expert.
#pragma unroll
  for (int q = 0; q < QMAX; ++q) {
    const int e = lane + 32 * q;
    if (q < nq && e < experts) {
      ch[q] = sc[q] + ch[q];
      score_s[e] = sc[q];
      choice_s[e] = ch[q];
    } else {
      ch[q] = -INFINITY;
    }
  }
  __syncwarp();

  if (p.num_groups > 1 && p.topk_groups < p.num_groups) {
    const int per = experts / p.num_groups;
    float gs = -INFINITY;
    if (lane < p.num_groups) {
      const float* cg = choice_s + lane * per;
      if (p.group_score == kMoeGroupMax) {
        gs = cg[0];
        for (int i = 1; i < per; ++i) gs = cg[i] > gs ? cg[i] : gs;
      } else {  // the sum of the two best (ranked as the CPU's top_k_indices)
        int b1 = 0, b2 = -1;
        for (int i = 1; i < per; ++i) {
          if (better(cg[i], i, cg[b1], b1)) {
            b2 = b1;
            b1 = i;
          } else if (b2 < 0 || better(cg[i], i, cg[b2], b2)) {
            b2 = i;
          }
        }
        gs = b2 >= 0 ? cg[b1] + cg[b2] : cg[b1];
      }
    }
    uint32_t keep = 0;
    bool picked = lane >= p.num_groups;
    for (int r = 0; r < p.topk_groups; ++r) {
      float v = picked ? -INFINITY : rank_value(gs);
      int i = picked ? INT_MAX : lane;
      warp_best(v, i);
      keep |= 1u << i;  // i < num_groups: an unpicked lane always beats the sentinel
      if (i == lane) picked = true;
    }
    // Experts of the other groups can never be picked (transformers 5 masks them to -inf).
#pragma unroll
    for (int q = 0; q < QMAX; ++q) {
      const int e = lane + 32 * q;
      if (q < nq && e < experts && !((keep >> (e / per)) & 1u)) ch[q] = -INFINITY;
    }
  }

  // Top-k: k rounds of the warp's best untaken expert, ranked (value desc, id asc); lanes
  // without experts (e >= E) offer (-inf, INT_MAX), which every expert beats.
  uint32_t taken = 0;
  int my_id = 0;
  for (int j = 0; j < p.top_k; ++j) {
    float v = -INFINITY;
    int i = INT_MAX;
#pragma unroll
    for (int q = 0; q < QMAX; ++q) {
      const int e = lane + 32 * q;
      if (q < nq && e < experts && !((taken >> q) & 1u)) {
        const float cv = rank_value(ch[q]);
        if (better(cv, e, v, i)) {
          v = cv;
          i = e;
        }
      }
    }
    warp_best(v, i);
    if ((i & 31) == lane) taken |= 1u << (i >> 5);
    if (lane == j) my_id = i;
  }
  __syncwarp();
  // Weights: the chosen experts' scores, summed in order (the CPU twin's float sum).
  float sum = 0.0f;
  for (int j = 0; j < p.top_k; ++j) sum += score_s[__shfl_sync(0xffffffffu, my_id, j)];
  if (lane < p.top_k) {
    float w = score_s[my_id];
    if (p.normalize) w /= sum + 1e-20f;
    w *= p.scaling_factor;
    p.topk_ids[t * p.top_k + lane] = my_id;
    p.topk_weights[t * p.top_k + lane] = w;
  }
  __syncwarp();  // every lane done with score_s before the warp's next token overwrites it
}

template <int QMAX>
__global__ void __launch_bounds__(kRouteWarps * 32) moe_route_kernel(MoeRouteParams p) {
  extern __shared__ float route_smem[];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  float bias[QMAX];
  load_route_bias<QMAX>(p, lane, bias);
  pdl_enter(p.pdl_early);
  const int64_t t = int64_t(blockIdx.x) * kRouteWarps + warp;
  if (t >= p.tokens) return;
  route_token<QMAX>(p, t, lane, bias, route_smem + warp * 2 * p.num_experts);
}

// Each launcher's checks; the router's also picks the split.
MoeRouterParams checked_router(const MoeRouterParams& p_in) {
  CHECK_MSG(p_in.tokens <= kMoeRouterMaxTokens, "moe router: {} tokens (max {}; cuBLAS above)",
            p_in.tokens, kMoeRouterMaxTokens);
  CHECK_MSG(p_in.hidden % 32 == 0 && uintptr_t(p_in.x) % 16 == 0 && uintptr_t(p_in.w) % 16 == 0,
            "moe router: hidden {} must be a multiple of 32, x and w 16-byte aligned", p_in.hidden);
  MoeRouterParams p = p_in;
  if (p.splits <= 0) p.splits = moe_router_splits(p.experts, p.hidden);
  CHECK(p.splits == 1 || (p.partials != nullptr && p.counters != nullptr));
  CHECK((p.experts + 15) / 16 <= 65535);
  return p;
}
void check_route(const MoeRouteParams& p) {
  CHECK_MSG(p.num_experts > 0 && p.num_experts <= kMoeRouteMaxExperts, "moe route: {} experts",
            p.num_experts);
  CHECK_MSG(p.top_k > 0 && p.top_k <= 32 && p.top_k <= p.num_experts, "moe route: top_k {}",
            p.top_k);
  CHECK_MSG(
      p.num_groups > 0 && p.num_groups <= kMoeRouteMaxGroups && p.num_experts % p.num_groups == 0 &&
          p.topk_groups > 0 && p.topk_groups <= p.num_groups,
      "moe route: {} groups, {} kept, {} experts", p.num_groups, p.topk_groups, p.num_experts);
}
// Calls go(std::integral_constant<int, QMAX>) with the route's register depth for E experts.
template <class Go>
void with_qmax(int experts, Go&& go) {
  const int nq = (experts + 31) / 32;
  if (nq <= 2)
    go(std::integral_constant<int, 2>{});
  else if (nq <= 4)
    go(std::integral_constant<int, 4>{});
  else if (nq <= 8)
    go(std::integral_constant<int, 8>{});
  else if (nq <= 16)
    go(std::integral_constant<int, 16>{});
  else
    go(std::integral_constant<int, 32>{});
}
// Calls go(std::integral_constant<int, NT>) with the router's token tiles for T tokens.
template <class Go>
void with_nt(int64_t tokens, Go&& go) {
  if (tokens <= 8)
    go(std::integral_constant<int, 1>{});
  else if (tokens <= 16)
    go(std::integral_constant<int, 2>{});
  else
    go(std::integral_constant<int, 4>{});
}

}  // namespace

int moe_router_splits(int64_t experts, int64_t hidden) {
  const int64_t tiles = (experts + 15) / 16, chunks = hidden / 32;
  // ~2 CTAs per SM, each warp of a CTA with two 32-column chunks at least.
  const int64_t by_sms = (2 * int64_t(num_sms()) + tiles - 1) / tiles;
  const int64_t by_k = std::max<int64_t>(1, chunks / (2 * kRouterWarps));
  return int(std::max<int64_t>(1, std::min(by_sms, by_k)));
}

void launch_moe_router(const MoeRouterParams& p_in, cudaStream_t stream) {
  if (p_in.tokens == 0) return;
  const MoeRouterParams p = checked_router(p_in);
  const dim3 grid(unsigned(p.splits), unsigned((p.experts + 15) / 16));
  with_nt(p.tokens, [&](auto nt) {
    launch_pdl(moe_router_kernel<decltype(nt)::value>, grid, dim3(kRouterWarps * 32), 0,
               Launch{stream}, p);
  });
  CUDA_LAUNCH_CHECK();
}

void launch_moe_route(const MoeRouteParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  check_route(p);
  const size_t smem = size_t(kRouteWarps) * 2 * size_t(p.num_experts) * sizeof(float);
  const unsigned blocks = unsigned((p.tokens + kRouteWarps - 1) / kRouteWarps);
  // smem <= 4 · 2 · 1024 floats = 32 KB: under the default 48 KB limit.
  with_qmax(p.num_experts, [&](auto q) {
    launch_pdl(moe_route_kernel<decltype(q)::value>, dim3(blocks), dim3(kRouteWarps * 32), smem,
               Launch{stream}, p);
  });
  CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
