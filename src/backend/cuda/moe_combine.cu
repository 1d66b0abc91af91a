// The MoE combine (moe_experts.h launch_moe_combine): a token's output is the weighted sum of its
// experts' rows (plus the shared experts' `add`), and, with MoeCombineParams::norm_out, the next
// layer's residual add + RMSNorm in the same kernel.
//
// Sum order: threads 0..k-1 place assignment j at its rank under (expert id, j) (the CPU twin's
// ascending-id order), so the order is fixed; each thread then sums 8 columns over the token's
// valid assignments, its 16-byte loads of up to 8 y rows issued together (the old
// one-CTA-per-token loop waited on each in turn: 15 us at T = 1, hidden 7168).
//
// With the norm (CudaTunables::moe_combine_norm_fusion; graph mode merges the add_rms_norm
// recorded right after the experts, CudaBackend::merge_moe_combine_norm): ceil(hidden / 256)
// warps a token, thread i the columns [8i, 8i + 8), which is the thread layout and order of sums
// of launch_rms_norm's one-pass vec kernel (norm.h kVecOnePass): residual = bf16(out +
// residual), norm_out = w · (residual · rsqrt(Σ residual² / hidden + eps)), the same bits as the
// two launches. A token's warps are one CTA, or (a few tokens: MoeCombineParams::
// cluster_max_tokens) split over a cluster of C CTAs: CTA r holds warps [r W / C, (r + 1) W / C),
// and each CTA adds all W warp sums in warp order, reading the other CTAs' from their shared
// memory, so the sum is the one-CTA sum. Why: at batch 1 a single SM read the token's top-k expert
// rows, the shared experts' row and the residual alone (~140 KB at hidden 7,168).
//
// Every kernel issues the loads that do not depend on the assignments (the `add` row, the
// residual, the norm weight) with the assignments' own, so a token waits on two rounds of loads
// (assignments, then the expert rows), not five.
#include "backend/cuda/cluster.cuh"
#include "backend/cuda/moe_experts.cuh"
#include "backend/cuda/norm_weight.cuh"

namespace strata::cuda {
namespace {

constexpr int kCombineThreads = 128;
constexpr int kCombineCols = kCombineThreads * 8;

struct TokenAssignments {
  int ids[kMoeMaxTopK];
  int rows[kMoeMaxTopK];
  float weights[kMoeMaxTopK];
  int valid;
};

// Token t's valid assignments in rank order into a (shared); every thread of the block calls it.
__device__ __forceinline__ void load_assignments(const MoeCombineParams& p, int64_t t,
                                                 TokenAssignments& a) {
  const int k = p.top_k, tid = int(threadIdx.x);
  // The token's k ids, weights and rows, each loaded by its own thread (one round trip).
  int id = -1, row = -1;
  float w = 0.0f;
  if (tid < k) {
    id = p.topk_ids[t * k + tid];
    row = p.pos != nullptr ? p.pos[t * k + tid] : int(t * k + tid);
    w = p.topk_weights[t * k + tid];
    a.ids[tid] = id;
  }
  __syncthreads();
  if (tid < k) {
    int rank = 0, count = 0;  // rank among the valid assignments
    for (int j = 0; j < k; ++j) {
      const int o = a.ids[j];
      if (o < 0 || o >= p.num_experts) continue;
      ++count;
      rank += o < id || (o == id && j < tid);
    }
    if (id >= 0 && id < p.num_experts) {
      a.rows[rank] = row;
      a.weights[rank] = w;
    }
    if (tid == 0) a.valid = count;
  }
  __syncthreads();
}

// Token t's `add` values of column group v (zeros without `add`): loaded before the assignments.
__device__ __forceinline__ uint4 load_add(const MoeCombineParams& p, int64_t t, int64_t v) {
  if (p.add == nullptr) return make_uint4(0u, 0u, 0u, 0u);
  return __ldg(reinterpret_cast<const uint4*>(p.add + t * p.hidden) + v);
}

// Token t's 8 output values of 16-byte column group v, before their bf16 rounding; add_bits:
// load_add's.
__device__ __forceinline__ void combine_group(const MoeCombineParams& p, int64_t t, int64_t v,
                                              const TokenAssignments& a, uint4 add_bits,
                                              float* acc) {
  const int n = a.valid;
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
  for (int j0 = 0; j0 < n; j0 += 8) {
    uint4 yv[8];
#pragma unroll
    for (int u = 0; u < 8; ++u)
      if (j0 + u < n)
        yv[u] = __ldg(reinterpret_cast<const uint4*>(p.y + int64_t(a.rows[j0 + u]) * p.hidden) + v);
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      if (j0 + u >= n) break;
      float y[8];
      unpack8(yv[u], y);
      const float w = a.weights[j0 + u];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(w, y[i]));
    }
  }
  if (p.add != nullptr) {
    float ad[8];
    unpack8(add_bits, ad);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += ad[i];
  }
}

// CTA (token t, chunk of kCombineThreads · 8 columns).
__global__ void __launch_bounds__(kCombineThreads) moe_combine_kernel(MoeCombineParams p) {
  __shared__ TokenAssignments a;
  pdl_enter(p.pdl_early);
  const int64_t chunks = (p.hidden + kCombineCols - 1) / kCombineCols;
  const int64_t t = int64_t(blockIdx.x) / chunks, chunk = int64_t(blockIdx.x) % chunks;
  const int64_t v = chunk * kCombineThreads + int(threadIdx.x);  // this thread's column group
  const bool in = v < p.hidden / 8;
  const uint4 add_bits = in ? load_add(p, t, v) : make_uint4(0u, 0u, 0u, 0u);
  load_assignments(p, t, a);
  if (!in) return;
  float acc[8];
  combine_group(p, t, v, a, add_bits, acc);
  reinterpret_cast<uint4*>(p.out + t * p.hidden)[v] = pack8(acc);
}

// Token blockIdx.x / C's row (C = 1, or CLUSTER: the cluster's CTAs, combine_norm_ctas), then the
// residual add and the RMSNorm (the vec kernel's layout; CTA r of a cluster: column groups from
// r · blockDim.x).
template <bool CLUSTER>
__global__ void __launch_bounds__(1024) moe_combine_norm_kernel(MoeCombineParams p) {
  __shared__ TokenAssignments a;
  __shared__ float warp_ss[32];
  pdl_enter(p.pdl_early);
  const int rank = CLUSTER ? int(cluster_rank()) : 0;
  const int ctas = CLUSTER ? int(gridDim.x / p.tokens) : 1;  // a token's CTAs
  const int64_t t = blockIdx.x / ctas, nchunk = p.hidden / 8;
  const int64_t v = int64_t(rank) * blockDim.x + threadIdx.x;
  const bool in = v < nchunk;
  // The loads the assignments do not decide, issued with theirs.
  uint4 add_bits = make_uint4(0u, 0u, 0u, 0u), res_bits = add_bits;
  float w[8];
  uint4* res = reinterpret_cast<uint4*>(p.norm_residual + t * p.hidden);
  if (in) {
    add_bits = load_add(p, t, v);
    res_bits = res[v];
    norm_weight8(p.norm_w, p.norm_w_f32, v, w);
  }
  load_assignments(p, t, a);
  float x[8];
  float ss = 0;
  if (in) {
    float acc[8], r[8];
    combine_group(p, t, v, a, add_bits, acc);
    const uint4 out_bits = pack8(acc);
    reinterpret_cast<uint4*>(p.out + t * p.hidden)[v] = out_bits;
    // add_rms_norm(out, residual, ...) as the vec kernel runs it: x = bf16(out + residual).
    unpack8(out_bits, x);
    unpack8(res_bits, r);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = bf16_to_float(float_to_bf16(x[e] + r[e]));
    res[v] = pack8(x);
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += x[e] * x[e];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, warps = blockDim.x / 32;
  if (lane == 0) warp_ss[warp] = ss;
  float total = 0;
  if constexpr (CLUSTER) {
    __shared__ float all_ss[32];
    total = cluster_sum_in_warp_order(warp_ss, warps, ctas, all_ss);
  } else {
    __syncthreads();
    for (int i = 0; i < warps; ++i) total += warp_ss[i];
  }
  const float inv = rsqrtf(total / float(p.hidden) + p.norm_eps);
  if (in) {
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = w[e] * (x[e] * inv);
    reinterpret_cast<uint4*>(p.norm_out + t * p.hidden)[v] = pack8(o);
  }
}

// The CTAs a token's combine + norm takes (cluster.cuh row_cluster_ctas: up to
// cluster_max_tokens tokens of rows of 16 warps or more, hidden >= 4,096). Measured
// (rank_step_bench, H200, 2026-12-04), one CTA a token against clusters: a Kimi-K2.5 rank (hidden
// 7,168, 7 CTAs of 4 warps) batch 1 4.706 / 4.778 against 4.599 / 4.655 ms a step (61 layers),
// batch 8 10.321 against 10.236; Moonlight (hidden 2,048) batch 1 2.325 / 2.314 against 2.360 (8
// CTAs of 1 warp) / 2.329 ms (4 of 2): a row of 8 warps reads too little for a cluster to pay.
int combine_norm_ctas(const MoeCombineParams& p, int64_t nchunk) {
  if (nchunk % 32 != 0) return 1;
  return row_cluster_ctas(p.tokens, nchunk / 32, p.cluster_max_tokens);
}

}  // namespace

void launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  CHECK_MSG(p.top_k > 0 && p.top_k <= kMoeMaxTopK, "moe combine: top_k {}", p.top_k);
  CHECK_MSG(p.num_experts > 0, "moe combine: num_experts {}", p.num_experts);
  CHECK(p.hidden % 8 == 0 && uintptr_t(p.y) % 16 == 0 && uintptr_t(p.out) % 16 == 0 &&
        uintptr_t(p.add) % 16 == 0);
  if (p.norm_out != nullptr) {
    const int64_t nchunk = p.hidden / 8;
    CHECK_MSG(nchunk <= 1024 && p.tokens < (int64_t(1) << 31) &&
                  uintptr_t(p.norm_residual) % 16 == 0 && uintptr_t(p.norm_out) % 16 == 0 &&
                  uintptr_t(p.norm_w) % 16 == 0,
              "moe combine + norm: hidden {} (at most 8,192), 16-byte aligned rows", p.hidden);
    // The vec norm kernel's block: ceil(nchunk / 32) warps (launch_rms_norm), split over `ctas`.
    const int ctas = combine_norm_ctas(p, nchunk);
    const dim3 block(unsigned(ceil_div(nchunk, 32) * 32 / ctas));
    if (ctas > 1)
      launch_pdl_cluster(moe_combine_norm_kernel<true>, dim3(unsigned(p.tokens * ctas)), block, 0,
                         Launch{stream}, ctas, p);
    else
      launch_pdl(moe_combine_norm_kernel<false>, dim3(unsigned(p.tokens)), block, 0, Launch{stream},
                 p);
    CUDA_LAUNCH_CHECK();
    return;
  }
  const int64_t blocks = p.tokens * ceil_div(p.hidden, kCombineCols);
  CHECK_MSG(blocks < (int64_t(1) << 31), "moe combine: {} tokens", p.tokens);
  launch_pdl(moe_combine_kernel, dim3(unsigned(blocks)), dim3(kCombineThreads), 0, Launch{stream},
             p);
  CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
