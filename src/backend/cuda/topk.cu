// top_k on the GPU, one block per row: pass j (j < k) finds the largest entry that comes after
// entry j - 1 in the reference's order (larger first, ties to the lower index; NaNs never
// qualify), so the k ids equal backend/cpu/topk.cc's exactly (a row with fewer than k numbers
// leaves the rest of its ids unspecified, INT_MAX here); a last pass sums e^(x - max) in
// double for the log-probabilities (another summation order than the reference's: agreement to
// float rounding). Cost: k + 1 reads of the row; a drafter's rows (2K to 128K entries, k <= 8 as
// a rule) take microseconds, against a download of the whole row and a host sort per row before.
#include <cfloat>
#include <climits>
#include <cstring>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/logit_row.cuh"
#include "backend/cuda/topk.h"
#include "backend/top_k.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

using logit_row::load;
using logit_row::take_max;

template <bool F32>
__global__ void __launch_bounds__(kThreads) top_k_kernel(TopKParams p) {
  const int row = blockIdx.x;
  const void* x = static_cast<const char*>(p.logits) + int64_t(row) * p.vocab * (F32 ? 4 : 2);
  __shared__ float s_val[kWarps];
  __shared__ int s_idx[kWarps];
  __shared__ float s_prev_v;
  __shared__ int s_prev_i;
  __shared__ double s_sum[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int32_t* ids = p.out + int64_t(row) * 2 * p.k;
  float prev_v = INFINITY;
  int prev_i = -1;  // pass 0: everything qualifies (+inf ties at index >= 0)
  for (int j = 0; j < p.k; ++j) {
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads) {
      const float v = load<F32>(x, i);
      if (v < prev_v || (v == prev_v && int(i) > prev_i)) take_max(bv, bi, v, int(i));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      take_max(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    if (lane == 0) s_val[warp] = bv, s_idx[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kWarps; ++w) take_max(bv, bi, s_val[w], s_idx[w]);
      s_prev_v = bv;
      s_prev_i = bi;
      ids[j] = bi;
    }
    __syncthreads();
    prev_v = s_prev_v;
    prev_i = s_prev_i;
  }
  if (!p.logprobs) return;
  const double m = load<F32>(x, ids[0]);
  double s = 0;
  for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads) s += exp(double(load<F32>(x, i)) - m);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) s_sum[warp] = s;
  __syncthreads();
  if (threadIdx.x != 0) return;
  s = 0;
  for (int w = 0; w < kWarps; ++w) s += s_sum[w];
  // The reference's rounding: a float normalizer, then a float difference.
  const float log_z = float(m) + float(log(s));
  for (int j = 0; j < p.k; ++j) {
    const float lp = load<F32>(x, ids[j]) - log_z;
    ids[p.k + j] = __float_as_int(lp);
  }
}

}  // namespace

void launch_top_k(const TopKParams& p, const Launch& launch) {
  if (p.rows == 0) return;
  if (p.f32) {
    top_k_kernel<true><<<p.rows, kThreads, 0, launch.stream>>>(p);
  } else {
    top_k_kernel<false><<<p.rows, kThreads, 0, launch.stream>>>(p);
  }
  CUDA_LAUNCH_CHECK();
}

// ---- host entry ----
void CudaBackend::top_k(const Tensor& logits, int k, int32_t* ids, float* logprobs) {
  CHECK(logits.is_contiguous());
  CHECK_MSG(logits.dtype == DType::kBF16 || logits.dtype == DType::kF32,
            "top_k: logits must be bf16 or f32, got {}", dtype_name(logits.dtype));
  const int64_t rows = logits.numel() == 0 ? 0 : logits.dim(0), vocab = logits.dim(-1);
  CHECK_MSG(k >= 1 && k <= vocab && k <= kMaxTopK, "top_k: k {} for a vocabulary of {} (most {})",
            k, vocab, kMaxTopK);
  if (rows == 0) return;
  CHECK_MSG(vocab < (int64_t(1) << 31) && rows < (int64_t(1) << 31),
            "top_k: {} rows of {} too large", rows, vocab);
  auto o = alloc(DType::kI32, {rows, 2 * int64_t(k)});
  auto p = zeroed<TopKParams>();
  p.logits = logits.data;
  p.out = static_cast<int32_t*>(o->view().data);
  p.vocab = vocab;
  p.rows = int(rows);
  p.k = k;
  p.f32 = logits.dtype == DType::kF32;
  p.logprobs = logprobs != nullptr;
  record(kOpTopK, p, launch_top_k);
  end_step();
  std::vector<int32_t> host(size_t(rows) * 2 * size_t(k));
  CUDA_CHECK(cudaMemcpy(host.data(), o->view().data, host.size() * 4, cudaMemcpyDeviceToHost));
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(ids + r * k, host.data() + r * 2 * k, size_t(k) * 4);
    if (logprobs != nullptr)
      std::memcpy(logprobs + r * k, host.data() + r * 2 * k + k, size_t(k) * 4);
  }
}

}  // namespace strata::cuda
