// top_k (backend/top_k.h): a row's k largest logits and their log-probabilities, the reference the
// CUDA twin (backend/cuda/topk.cu) must match: the ids exactly, the log-probabilities to float
// rounding (its normalizer sums in double too, in another order).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/top_k.h"
#include "core/check.h"
#include "core/thread_pool.h"

namespace strata {

void top_k_row_reference(const float* row, int64_t vocab, int k, int32_t* ids, float* logprobs) {
  CHECK_MSG(k >= 1 && k <= vocab && k <= kMaxTopK, "top_k: k {} for a vocabulary of {} (most {})",
            k, vocab, kMaxTopK);
  // Larger first, ties to the lower index; a NaN after every number.
  auto before = [row](int32_t a, int32_t b) {
    const float x = row[a], y = row[b];
    if (std::isnan(x) || std::isnan(y)) return !std::isnan(x) && std::isnan(y);
    return x != y ? x > y : a < b;
  };
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  std::copy(order.begin(), order.begin() + k, ids);
  if (logprobs == nullptr) return;
  const float max = row[ids[0]];
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - max);
  const float log_z = max + float(std::log(sum));
  for (int j = 0; j < k; ++j) logprobs[j] = row[ids[j]] - log_z;
}

namespace cpu {

void CpuBackend::top_k(const Tensor& logits, int k, int32_t* ids, float* logprobs) {
  CHECK_MSG(logits.dtype == DType::kF32, "top_k: expected float32 logits, got {}",
            dtype_name(logits.dtype));
  CHECK(logits.is_contiguous());
  const int64_t rows = logits.numel() == 0 ? 0 : logits.dim(0), vocab = logits.dim(-1);
  const float* x = logits.ptr<float>();
  parallel_for(rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      top_k_row_reference(x + i * vocab, vocab, k, ids + i * k,
                          logprobs == nullptr ? nullptr : logprobs + i * k);
  });
}

}  // namespace cpu
}  // namespace strata
