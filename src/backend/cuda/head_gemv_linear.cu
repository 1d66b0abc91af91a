// A per-head GEMV and the linear on its output in one launch (head_gemv_linear.h says what, why,
// how the grid barrier works and why the bits are those of the two launches). CTA b: before the
// PDL wait, its linear rows and its per-head GEMV rows into shared memory by bulk copies; after
// it, its per-head outputs into `mid`, the grid barrier, `mid` into shared memory, its rows.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/grid_sync.cuh"
#include "backend/cuda/head_gemv_linear.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/per_head_gemv.h"

namespace strata::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int64_t kBarrierBytes = 16;  // the two mbarriers at the front of shared memory

// Output o of the per-head GEMV for M tokens as per_head_gemv.cu sums it (`lanes` lanes of the
// warp share it; sl: this lane's index among them), w_row its weights (shared or global memory),
// returned in every lane of the group. Every lane of the warp calls it (the shuffles).
template <int M>
__device__ __forceinline__ void head_output(const HeadGemvLinearParams& p, const bf16_bits* w_row,
                                            int64_t o, bool valid, int sl, float* acc) {
#pragma unroll
  for (int t = 0; t < M; ++t) acc[t] = 0.0f;
  if (valid) {
    const bf16_bits* xh = p.x + (o / p.n_head) * p.stride_x;
    for (int k0 = sl * 8; k0 < p.k_head; k0 += p.lanes * 8) {
      float wv[8];
      unpack8(*reinterpret_cast<const uint4*>(w_row + k0), wv);
#pragma unroll
      for (int t = 0; t < M; ++t) {
        float xv[8];
        unpack8(*reinterpret_cast<const uint4*>(xh + t * p.ldx + k0), xv);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[t] = fmaf(wv[e], xv[e], acc[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < M; ++t)
    for (int s = p.lanes / 2; s > 0; s >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], s);
}

template <int M>
__global__ void __launch_bounds__(kThreads, 1) head_gemv_linear_kernel(HeadGemvLinearParams p) {
  extern __shared__ __align__(16) char smem[];
  const int64_t k = int64_t(p.heads) * p.n_head, b = blockIdx.x, ctas = p.ctas;
  const int64_t r0 = b * p.n / ctas, r1 = (b + 1) * p.n / ctas;  // this CTA's linear rows
  const int64_t o0 = b * k / ctas, o1 = (b + 1) * k / ctas;      // and per-head outputs
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);
  bf16_bits* w_s = reinterpret_cast<bf16_bits*>(smem + kBarrierBytes);  // [rows_max, k]
  bf16_bits* wh_s = w_s + int64_t(p.rows_max) * k;                      // [outs_max, k_head]
  bf16_bits* mid_s = wh_s + int64_t(p.outs_max) * p.k_head;             // [M, k]
  const uint32_t bar_head = smem_addr(&bars[0]), bar_rows = smem_addr(&bars[1]);
  if (threadIdx.x == 0) {
    mbar_init(bar_head, 1);
    mbar_init(bar_rows, 1);
    mbar_init_fence();
  }
  __syncthreads();
  // Weights before the wait (never written by a kernel), streamed once: evict first from L2.
  if (threadIdx.x == 0) {
    const uint64_t policy = l2_evict_first_policy();
    bulk_copy_into_smem(smem_addr(wh_s), p.w_head + o0 * p.k_head,
                        uint32_t((o1 - o0) * p.k_head * 2), bar_head, policy);
    bulk_copy_into_smem(smem_addr(w_s), p.w + r0 * k, uint32_t((r1 - r0) * k * 2), bar_rows,
                        policy);
  }
  pdl_enter(p.pdl_early);

  // The per-head GEMV's outputs o0.. (a warp 32 / lanes of them at a time) into mid.
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int per_warp = 32 / p.lanes, sub = lane / p.lanes, sl = lane % p.lanes;
  const int outs = int(o1 - o0);
  mbar_wait(bar_head, 0);
  for (int base = warp * per_warp; base < outs; base += kWarps * per_warp) {  // warp-uniform
    const int j = base + sub;
    float acc[M];
    head_output<M>(p, wh_s + int64_t(j) * p.k_head, o0 + j, j < outs, sl, acc);
    if (j < outs && sl == 0) {
#pragma unroll
      for (int t = 0; t < M; ++t) p.mid[t * k + o0 + j] = float_to_bf16(acc[t]);
    }
  }
  const bool met = grid_barrier(p.barrier, uint64_t(p.barrier_timeout_us) * 1000);
  if (met) {
    // Every per-head output into shared memory (other CTAs wrote them: through L2, not L1).
    const int64_t pieces = M * k / 8;
    for (int64_t i = threadIdx.x; i < pieces; i += kThreads)
      reinterpret_cast<uint4*>(mid_s)[i] = __ldcg(reinterpret_cast<const uint4*>(p.mid) + i);
  } else {
    // The others are not all resident: every output made here, from global memory (the same
    // sums, so the same bits; slow, but no CTA waits on another).
    for (int64_t base = warp * per_warp; base < k; base += kWarps * per_warp) {
      const int64_t o = base + sub;
      float acc[M];
      head_output<M>(p, p.w_head + o * p.k_head, o, o < k, sl, acc);
      if (o < k && sl == 0) {
#pragma unroll
        for (int t = 0; t < M; ++t) mid_s[t * k + o] = float_to_bf16(acc[t]);
      }
    }
  }
  __syncthreads();
  mbar_wait(bar_rows, 0);
  // The linear's rows r0.. as gemv_kernel sums them: a warp a row, its ks parts in turn.
  const int rows = int(r1 - r0), ks = p.ks;
  for (int r = warp; r < rows; r += kWarps) {
    const bf16_bits* wr = w_s + int64_t(r) * k;
    float total[M];
#pragma unroll
    for (int m = 0; m < M; ++m) total[m] = 0.0f;
    for (int part = 0; part < ks; ++part) {
      float acc[M];
#pragma unroll
      for (int m = 0; m < M; ++m) acc[m] = 0.0f;
      for (int64_t kk = part * 256 + lane * 8; kk < k; kk += int64_t(ks) * 256) {
        float wf[8];
        unpack8(*reinterpret_cast<const uint4*>(wr + kk), wf);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float xf[8];
          unpack8(*reinterpret_cast<const uint4*>(mid_s + m * k + kk), xf);
          acc[m] += dot8(wf, xf);
        }
      }
#pragma unroll
      for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], s);
        total[m] += acc[m];  // gemv_kernel: 0, then the parts in order
      }
    }
    if (lane == 0) {
      const int64_t i = r0 + r;
      const float bias = p.bias ? p.bias[i] : 0.0f;
#pragma unroll
      for (int m = 0; m < M; ++m) p.out[m * p.n + i] = float_to_bf16(total[m] + bias);
    }
  }
}

void init_head_gemv_linear_kernels() {
  allow_max_dynamic_smem(head_gemv_linear_kernel<1>);
  allow_max_dynamic_smem(head_gemv_linear_kernel<2>);
}

void init_once() {
  static PerDeviceOnce limits;  // the kernels' shared-memory limits
  limits.run(init_head_gemv_linear_kernels);
}

}  // namespace

void head_gemv_linear_set_grid(HeadGemvLinearParams& p) {
  const int64_t k = int64_t(p.heads) * p.n_head;
  p.ctas = int(std::max<int64_t>(1, std::min<int64_t>(num_sms(), std::max(p.n, k))));
  p.rows_max = int(ceil_div(p.n, int64_t(p.ctas)));
  p.outs_max = int(ceil_div(k, int64_t(p.ctas)));
}

size_t head_gemv_linear_smem_bytes(const HeadGemvLinearParams& p) {
  const int64_t k = int64_t(p.heads) * p.n_head;
  return size_t(kBarrierBytes + 2 * (int64_t(p.rows_max) * k + int64_t(p.outs_max) * p.k_head +
                                     int64_t(p.tokens) * k));
}

bool head_gemv_linear_one_wave(const HeadGemvLinearParams& p) {
  if (p.tokens < 1 || p.tokens > kHeadGemvLinearMaxTokens) return false;
  init_once();
  const size_t smem = head_gemv_linear_smem_bytes(p);
  const int allowed = p.tokens == 1 ? max_dynamic_smem(head_gemv_linear_kernel<1>)
                                    : max_dynamic_smem(head_gemv_linear_kernel<2>);
  if (smem > size_t(allowed)) return false;
  int per_sm = 0;
  const cudaError_t e = p.tokens == 1 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                            &per_sm, head_gemv_linear_kernel<1>, kThreads, smem)
                                      : cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                            &per_sm, head_gemv_linear_kernel<2>, kThreads, smem);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return int64_t(per_sm) * num_sms() >= p.ctas;
}

void launch_head_gemv_linear(const HeadGemvLinearParams& p, const Launch& launch) {
  CHECK(p.tokens >= 1 && p.tokens <= kHeadGemvLinearMaxTokens && p.ctas > 0);
  init_once();
  const size_t smem = head_gemv_linear_smem_bytes(p);
  if (p.tokens == 1)
    launch_pdl(head_gemv_linear_kernel<1>, dim3(unsigned(p.ctas)), dim3(kThreads), smem, launch, p);
  else
    launch_pdl(head_gemv_linear_kernel<2>, dim3(unsigned(p.ctas)), dim3(kThreads), smem, launch, p);
  CUDA_LAUNCH_CHECK();
}

// ---- host entry: graph mode's merge ----
// True when the launch just recorded is a per-head GEMV whose whole output is this plain GEMV's
// x [m, heads · n_head] (contiguous: the per-head outputs of a token side by side, as MLA's W_UV
// writes attn [T, heads, v] and o_proj reads it), m <= 2, neither output overlapping what the
// launch reads, and the grid fits the GPU at once. Then the merged launch replaces the per-head
// GEMV's.
bool CudaBackend::merge_head_gemv_linear(const GemvParams& p) {
  if (!tunables_.fusion || !tunables_.head_gemv_linear_fusion) return false;
  if (p.glu_inter != 0 || p.w2 != nullptr || p.norm.x != nullptr || p.m < 1 ||
      p.m > kHeadGemvLinearMaxTokens)
    return false;
  PerHeadGemvParams q;
  if (!recorder_.last(kOpPerHeadGemv, &q)) return false;
  const int64_t k = int64_t(q.heads) * q.n;
  if (q.out != p.x || q.tokens != p.m || q.ldo != k || q.stride_o != q.n || p.k != k) return false;
  const int64_t x_bytes =
      2 * ((q.tokens - 1) * q.ldx + int64_t(q.heads - 1) * q.stride_x + int64_t(q.k));
  const int64_t mid_bytes = 2 * p.m * k, out_bytes = 2 * int64_t(p.m) * p.n;
  if (byte_ranges_overlap(q.out, mid_bytes, q.x, x_bytes) ||
      byte_ranges_overlap(p.out, out_bytes, q.x, x_bytes) ||
      byte_ranges_overlap(p.out, out_bytes, q.out, mid_bytes))
    return false;
  auto h = zeroed<HeadGemvLinearParams>();
  h.x = q.x;
  h.w_head = q.w;
  h.mid = q.out;
  h.w = p.w;
  h.bias = p.bias;
  h.out = p.out;
  h.barrier = head_gemv_linear_barrier_;
  h.ldx = q.ldx;
  h.stride_x = q.stride_x;
  h.n = p.n;
  h.tokens = p.m;
  h.heads = q.heads;
  h.n_head = q.n;
  h.k_head = q.k;
  h.lanes = q.lanes;
  h.ks = gemv_ksplit(p, p.n);
  h.pdl_early = tunables_.pdl_early;
  h.barrier_timeout_us = tunables_.head_gemv_linear_barrier_timeout_us;
  head_gemv_linear_set_grid(h);
  // One wave (the CTAs wait on each other): asked of the driver once a shape, as this runs at
  // every layer's recording.
  const std::array<int64_t, 2> shape{h.tokens, int64_t(head_gemv_linear_smem_bytes(h))};
  auto wave = head_gemv_linear_one_wave_.find(shape);
  if (wave == head_gemv_linear_one_wave_.end())
    wave = head_gemv_linear_one_wave_.emplace(shape, head_gemv_linear_one_wave(h)).first;
  if (!wave->second) return false;
  recorder_.drop_last();
  record(kOpHeadGemvLinear, h, launch_head_gemv_linear);
  return true;
}

}  // namespace strata::cuda
