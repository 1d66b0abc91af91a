// logit_stats on the GPU: the reference's formula (backend/cpu/logit_stats.cc, backend.h
// LogitStatsRow) with the same double sums, one block per row. Pass 1 finds each row's max and
// first argmax (ties to the lowest id, as std::max_element; a NaN is never the max); pass 2 sums
// S = Σ e^(ref−m), A = Σ e^(ref−m)·d, B = Σ e^(ref−m)·expm1(−d) in double (d = ref − cand). The
// sums run in another order than the reference's, so results agree to rounding (relative ~1e-12
// before the final float conversion), not bit for bit. Cost: two reads of both rows; at 128K
// vocabulary in bf16 about 1 MB of traffic a row, so the forward pass dominates.
#include <cfloat>
#include <climits>
#include <cstddef>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/logit_row.cuh"
#include "backend/cuda/logit_stats.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

using logit_row::load;
using logit_row::take_max;

template <bool F32>
__global__ void __launch_bounds__(kThreads) logit_stats_kernel(LogitStatsParams p) {
  const int row = blockIdx.x;
  const int64_t stride = p.vocab * (F32 ? 4 : 2);
  const void* ref = static_cast<const char*>(p.ref) + int64_t(row) * stride;
  const void* cand = static_cast<const char*>(p.cand) + int64_t(row) * stride;
  __shared__ float s_val[2][kWarps];
  __shared__ int s_idx[2][kWarps];
  __shared__ double s_sum[3][kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  // Pass 1: max and first argmax of both rows.
  float rv = -INFINITY, cv = -INFINITY;
  int ri = INT_MAX, ci = INT_MAX;
  for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads) {
    take_max(rv, ri, load<F32>(ref, i), int(i));
    take_max(cv, ci, load<F32>(cand, i), int(i));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    take_max(rv, ri, __shfl_xor_sync(0xffffffffu, rv, o), __shfl_xor_sync(0xffffffffu, ri, o));
    take_max(cv, ci, __shfl_xor_sync(0xffffffffu, cv, o), __shfl_xor_sync(0xffffffffu, ci, o));
  }
  if (lane == 0) s_val[0][warp] = rv, s_idx[0][warp] = ri, s_val[1][warp] = cv, s_idx[1][warp] = ci;
  __syncthreads();
  rv = s_val[0][0], ri = s_idx[0][0], cv = s_val[1][0], ci = s_idx[1][0];
  for (int w = 1; w < kWarps; ++w) {
    take_max(rv, ri, s_val[0][w], s_idx[0][w]);
    take_max(cv, ci, s_val[1][w], s_idx[1][w]);
  }
  const double m = rv;

  // Pass 2: the three sums in double.
  double s = 0, a = 0, b = 0;
  for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads) {
    const double x = load<F32>(ref, i);
    const double e = exp(x - m);
    const double c = load<F32>(cand, i);
    if (e == 0) {  // p = 0: only the candidate's normalizer sees it (the reference's comment)
      b += exp(c - m);
      continue;
    }
    const double d = x - c;
    s += e;
    a += e * d;
    b += e * expm1(-d);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  if (lane == 0) s_sum[0][warp] = s, s_sum[1][warp] = a, s_sum[2][warp] = b;
  __syncthreads();
  if (threadIdx.x != 0) return;
  s = a = b = 0;
  for (int w = 0; w < kWarps; ++w) s += s_sum[0][w], a += s_sum[1][w], b += s_sum[2][w];
  const int t = p.targets[row];
  const double log_ratio = log1p(b / s);
  const double lse_ref = m + log(s), lse_cand = lse_ref + log_ratio;
  const double nll_ref = lse_ref - double(load<F32>(ref, t)),
               nll_cand = lse_cand - double(load<F32>(cand, t));
  float* o = p.out + int64_t(row) * 5;
  o[0] = float(fmax(0.0, a / s + log_ratio));
  o[1] = ri == ci ? 1.0f : 0.0f;
  o[2] = float(exp(-nll_cand) - exp(-nll_ref));
  o[3] = float(nll_ref);
  o[4] = float(nll_cand);
}

}  // namespace

void launch_logit_stats(const LogitStatsParams& p, const Launch& launch) {
  if (p.rows == 0) return;
  if (p.f32) {
    logit_stats_kernel<true><<<p.rows, kThreads, 0, launch.stream>>>(p);
  } else {
    logit_stats_kernel<false><<<p.rows, kThreads, 0, launch.stream>>>(p);
  }
  CUDA_LAUNCH_CHECK();
}

// ---- host entry ----
void CudaBackend::logit_stats(const Tensor& ref, const Tensor& cand, const int32_t* targets,
                              LogitStatsRow* out) {
  static_assert(sizeof(LogitStatsRow) == 5 * sizeof(float) &&
                offsetof(LogitStatsRow, nll_cand) == 16);
  CHECK(ref.is_contiguous() && cand.is_contiguous());
  CHECK_MSG(ref.shape == cand.shape && ref.dtype == cand.dtype,
            "logit_stats: ref {} {} and cand {} {} differ", dtype_name(ref.dtype),
            shape_str(ref.shape), dtype_name(cand.dtype), shape_str(cand.shape));
  CHECK_MSG(ref.dtype == DType::kBF16 || ref.dtype == DType::kF32,
            "logit_stats: logits must be bf16 or f32, got {}", dtype_name(ref.dtype));
  const int64_t rows = ref.numel() == 0 ? 0 : ref.dim(0), vocab = ref.dim(-1);
  if (rows == 0) return;
  CHECK_MSG(vocab < (int64_t(1) << 31) && rows < (int64_t(1) << 31),
            "logit_stats: {} rows of {} too large", rows, vocab);
  for (int64_t r = 0; r < rows; ++r)
    CHECK_MSG(targets[r] >= 0 && targets[r] < vocab,
              "logit_stats: target {} outside the vocabulary of {}", targets[r], vocab);
  const int32_t* dev_targets = stage_i32(targets, rows);
  auto o = alloc(DType::kF32, {rows, 5});
  auto p = zeroed<LogitStatsParams>();
  p.ref = ref.data;
  p.cand = cand.data;
  p.targets = dev_targets;
  p.out = static_cast<float*>(o->view().data);
  p.vocab = vocab;
  p.rows = int(rows);
  p.f32 = ref.dtype == DType::kF32;
  record(kOpLogitStats, p, launch_logit_stats);
  end_step();
  CUDA_CHECK(cudaMemcpy(out, o->view().data, size_t(rows) * sizeof(LogitStatsRow),
                        cudaMemcpyDeviceToHost));
}

}  // namespace strata::cuda
