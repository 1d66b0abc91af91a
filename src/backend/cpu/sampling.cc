// The sampling op's reference (backend.h SampleRowParams): a sort of the candidates and the
// sequential sums of engine/sampler.h's original sampler, unchanged on finite logits, so the
// CPU backend keeps producing exactly the tokens it always did. The CUDA twin
// (backend/cuda/sampling.cu) reaches the same token without a sort.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"

namespace strata {

int32_t argmax_row_reference(const float* logits, int64_t vocab) {
  return int32_t(std::max_element(logits, logits + vocab) - logits);
}

int32_t sample_row_reference(const float* logits, int64_t vocab, const SampleRowParams& p,
                             std::vector<std::pair<float, int32_t>>& scratch) {
  if (sample_is_greedy(p)) return argmax_row_reference(logits, vocab);
  // Candidates sorted by logit, descending; top-k limits how many we sort. NaN sorts as -inf
  // (a NaN would break the strict weak order partial_sort needs).
  const int64_t k = (p.top_k > 0 && p.top_k < vocab) ? p.top_k : vocab;
  scratch.resize(size_t(vocab));
  for (int64_t i = 0; i < vocab; ++i) {
    const float v = logits[i];
    scratch[size_t(i)] = {std::isnan(v) ? -INFINITY : v, int32_t(i)};
  }
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  std::partial_sort(scratch.begin(), scratch.begin() + k, scratch.end(), by_logit);
  scratch.resize(size_t(k));
  // Softmax at temperature over the candidates. A non-finite maximum has no distribution
  // (inf - inf): the greedy token then.
  const float max_logit = scratch[0].first;
  if (!std::isfinite(max_logit)) return argmax_row_reference(logits, vocab);
  double total = 0;
  for (auto& [v, id] : scratch) {
    v = float(std::exp(double(v - max_logit) / p.temperature));
    total += v;
  }
  // min-p: drop tokens below min_p × the top probability; top-p: smallest prefix whose mass
  // reaches top_p.
  size_t keep = scratch.size();
  if (p.min_p > 0) {
    const float floor_p = scratch[0].first * p.min_p;
    keep = size_t(std::find_if(scratch.begin(), scratch.end(),
                               [&](const auto& c) { return c.first < floor_p; }) -
                  scratch.begin());
  }
  if (p.top_p < 1.0f) {
    double mass = 0;
    for (size_t i = 0; i < keep; ++i) {
      mass += scratch[i].first / total;
      if (mass >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  keep = std::max<size_t>(keep, 1);
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += scratch[i].first;
  double r = p.uniform * kept;
  for (size_t i = 0; i < keep; ++i) {
    r -= scratch[i].first;
    if (r < 0) return scratch[i].second;
  }
  return scratch[keep - 1].second;
}

float edit_logit_reference(float logit, const LogitEdit& e) {
  // Three separately rounded float32 operations (the build targets x86-64 without FMA, so nothing
  // is contracted); the CUDA twin spells them __fsub_rn, __fmul_rn / __fdiv_rn, __fadd_rn.
  float x = logit - e.subtract;
  x = x < 0.0f ? x * e.scale : x / e.scale;
  return x + e.bias;
}

namespace cpu {

void CpuBackend::edit_logits(const Tensor& logits, const LogitEdit* edits, int64_t num_edits) {
  CHECK_MSG(logits.dtype == DType::kF32 && logits.is_contiguous(),
            "edit_logits: expected contiguous float32 logits, got {}", dtype_name(logits.dtype));
  const int64_t rows = logits.numel() == 0 ? 0 : logits.dim(0), vocab = logits.dim(-1);
  float* base = logits.ptr<float>();
  for (int64_t i = 0; i < num_edits; ++i) {
    const LogitEdit& e = edits[i];
    CHECK_MSG(e.row >= 0 && e.row < rows && e.token >= 0 && e.token < vocab,
              "edit_logits: edit {} at row {} token {} outside [{}, {}]", i, e.row, e.token, rows,
              vocab);
    float& x = base[int64_t(e.row) * vocab + e.token];
    x = edit_logit_reference(x, e);
  }
}

void CpuBackend::sample(const Tensor& logits, const SampleRowParams* params, int32_t* out_ids) {
  CHECK_MSG(logits.dtype == DType::kF32 && logits.is_contiguous(),
            "sample: expected contiguous float32 logits, got {}", dtype_name(logits.dtype));
  const int64_t rows = logits.numel() == 0 ? 0 : logits.dim(0), vocab = logits.dim(-1);
  const float* base = logits.ptr<float>();
  // Rows are independent: a decode batch's rows over a 128K vocabulary take tens of ms on one core.
  parallel_for(rows, 8, [&](int64_t begin, int64_t end) {
    thread_local std::vector<std::pair<float, int32_t>> scratch;
    for (int64_t r = begin; r < end; ++r)
      out_ids[r] = sample_row_reference(base + r * vocab, vocab, params[r], scratch);
  });
}

}  // namespace cpu
}  // namespace strata
