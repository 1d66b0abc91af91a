// logit_stats (backend.h LogitStatsRow): eval-kv's per-position statistics, in double. The CUDA
// twin (backend/cuda/logit_stats.cu) computes the same sums in the same formula.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "core/check.h"
#include "core/thread_pool.h"

namespace strata {

LogitStatsRow logit_stats_reference(const float* ref, const float* cand, int64_t vocab,
                                    int32_t target) {
  CHECK_MSG(target >= 0 && target < vocab, "logit_stats: target {} outside the vocabulary of {}",
            target, vocab);
  int64_t ref_best = 0, cand_best = 0;  // first index of the max, as std::max_element
  for (int64_t i = 1; i < vocab; ++i) {
    if (ref[i] > ref[ref_best]) ref_best = i;
    if (cand[i] > cand[cand_best]) cand_best = i;
  }
  const double m = ref[ref_best];
  double s = 0, a = 0, b = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const double e = std::exp(double(ref[i]) - m);
    if (e == 0) {
      // p = 0 (a −inf or far-below logit) adds nothing to the KL's first sum but its candidate
      // mass e·e^(−d) = e^(cand − m) still counts in the candidate's normalizer.
      b += std::exp(double(cand[i]) - m);
      continue;
    }
    const double d = double(ref[i]) - double(cand[i]);
    s += e;
    a += e * d;
    b += e * std::expm1(-d);
  }
  const double log_ratio = std::log1p(b / s);  // lse(cand) − lse(ref)
  const double lse_ref = m + std::log(s), lse_cand = lse_ref + log_ratio;
  LogitStatsRow r;
  r.kl = float(std::max(0.0, a / s + log_ratio));  // rounding can leave −1e-17 where they agree
  r.top1_agree = ref_best == cand_best ? 1.0f : 0.0f;
  const double nll_ref = lse_ref - double(ref[target]), nll_cand = lse_cand - double(cand[target]);
  r.nll_ref = float(nll_ref);
  r.nll_cand = float(nll_cand);
  r.dp = float(std::exp(-nll_cand) - std::exp(-nll_ref));
  return r;
}

namespace cpu {

void CpuBackend::logit_stats(const Tensor& ref, const Tensor& cand, const int32_t* targets,
                             LogitStatsRow* out) {
  CHECK_MSG(ref.dtype == DType::kF32 && cand.dtype == DType::kF32,
            "logit_stats: expected float32 logits, got {} and {}", dtype_name(ref.dtype),
            dtype_name(cand.dtype));
  CHECK(ref.is_contiguous() && cand.is_contiguous() && ref.shape == cand.shape);
  const int64_t rows = ref.numel() == 0 ? 0 : ref.dim(0), vocab = ref.dim(-1);
  const float* r = ref.ptr<float>();
  const float* c = cand.ptr<float>();
  parallel_for(rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      out[i] = logit_stats_reference(r + i * vocab, c + i * vocab, vocab, targets[i]);
  });
}

}  // namespace cpu
}  // namespace strata
